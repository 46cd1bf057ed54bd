# inference-image: `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
GPU ?= cpu
OUT ?= build/$(GPU)

.PHONY: help setup test lint render validate-profiles profiles golden gpu-proof-help clean

help: ## this list
	@grep -hE '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(BIN)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

setup: $(BIN)/.installed ## create .venv with the pinned Python tools and the inference-image CLI

test: setup ## unit tests (exit code 5, no tests collected, fails too)
	@rc=0; $(BIN)/pytest -q tests || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

lint: setup ## ruff (ansible-lint and packer validate join as roles/ and packer/ land)
	$(BIN)/ruff check src tests scripts
	bash -n scripts/gpu-proof

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

clean: ## remove build outputs (not .venv)
	rm -rf build .pytest_cache .ruff_cache
