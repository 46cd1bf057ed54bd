"""The machine's contract: every path, user, unit, port, cache part, first-boot file and
environment variable the image's programs, the build host's render, the roles, the templates, the
image's tests, the lab and the scripts share, each written here once with a line saying what it
is. The render writes it whole into profile.json (`contract`) and the Ansible extra-vars; the
machine's programs read it from here; everything else reads it from the render.
tests/build/test_contract.py fails when one of these literals is restated elsewhere."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Where things live on the image. One place, so roles, units and tests agree.
PATHS = {
    "etc": "/etc/inference-image",
    "profile_json": "/etc/inference-image/profile.json",
    "image_json": "/etc/inference-image/image.json",
    "prometheus_targets": "/etc/inference-image/prometheus-targets.json",
    "state": "/var/lib/inference-image",
    "units": "/etc/inference-image/units",
    "api_key": "/etc/inference-image/api-key",
    "api_key_map": "/etc/inference-image/api-key.nginx",
    # the token a remote Prometheus scrapes the public port's /metrics/<target> with (root only,
    # made per machine by firstboot like the API key, and not the API key)
    "scrape_token": "/etc/inference-image/scrape-token",
    # nginx's line an answer of the public port, its HTTP status alone, which mtail counts
    "status_log": "/var/log/inference-image/http-status.log",
    "scrape_token_map": "/etc/inference-image/scrape-token.nginx",
    "models": "/var/lib/inference-image/models",
    "cache": "/var/cache/inference-image",
    "vllm_venv": "/opt/vllm",
    "router_venv": "/opt/vllm-router",
    "runner": "/usr/local/bin/inference-run",
    "firstboot": "/usr/local/sbin/inference-firstboot",
    # the public port's TLS, made per machine by firstboot (user-data may write tls_mode)
    "tls_cert": "/etc/inference-image/tls/cert.pem",
    "tls_key": "/etc/inference-image/tls/key.pem",
    "tls_mode": "/etc/inference-image/tls-mode",
    "public_listen": "/etc/inference-image/public-listen.nginx",
    "endpoint": "/etc/inference-image/endpoint.json",
    # a certificate from an ACME CA (Let's Encrypt) for a domain user-data names in acme_conf
    "acme_conf": "/etc/inference-image/acme",
    "acme_state": "/var/lib/inference-image/acme",
    "acme_run": "/usr/local/sbin/inference-acme",
    # what the build downloads for itself (wheels, the model hub CLI's home and token): sysprep
    # removes it and its check fails an image that still has it
    "build_stage": "/var/tmp/inference-image-build",
    # a fleet droplet's role (router or worker) and its peers, written by user-data (fleet.py)
    "fleet": "/etc/inference-image/fleet.json",
    # a fleet worker registers its instances with the fleet's router (inference-join.timer)
    "join": "/usr/local/sbin/inference-join",
    # the build's last command: SSH host and build keys go, then the power-off (sysprep installs it)
    "seal": "/usr/local/sbin/inference-seal",
    # an instance's start: the warm-cache bundle's check, the page-cache prefetch, the models'
    # inspection at build (inference_machine.cli)
    "startup": "/usr/local/sbin/inference-startup",
    # the machine's runtime (this package, machine/ in the source tree): a virtualenv of the
    # system's Python whose console scripts RUNTIME_PROGRAMS (below) name, linked at their paths
    "runtime_venv": "/opt/inference-machine",
    # an instance written to disk once it served, restored instead of started again
    # (inference_machine.checkpoint, root only): one folder per instance
    "checkpoints": "/var/lib/inference-image/checkpoints",
    # a start's word from its checkpoint helper to its main process, and its gate's flag
    # (inference_machine.unit_checkpoint)
    "checkpoint_run": "/run/inference-image/checkpoint",
    # CRIU, built from Debian's source of the pinned release (scripts/build-criu)
    "criu": "/usr/local/sbin/criu",
}
# the machine's runtime's programs: console scripts in PATHS["runtime_venv"]/bin, each linked at
# its path here (the inference_service role links them; the smoke suite checks the links)
RUNTIME_PROGRAMS = ("runner", "firstboot", "acme_run", "join", "startup")
# The nftables table the firewall role writes; inference-acme opens port 80 in it while a CA checks
# the machine (HTTP-01), and only then.
FIREWALL_TABLE = "inference_image"

# the router's definition on a fleet's router droplet (vllm-router.service runs it there)
FLEET_ROUTER_UNIT = "router-fleet"
# an instance's definition on a node of a multi-node instance (inference-run runs it there): its
# pipeline stage, headless
NODE_UNIT_SUFFIX = "-node"


# ---- users ------------------------------------------------------------------------------------

# the vLLM instances' user: it owns the instance cache and nothing else it could load code from
SERVICE_USER = "inference"
# The router runs as a user of its own: it cannot write (or read) the compile caches vLLM loads
# code from, nor signal vLLM's processes.
ROUTER_USER = "inference-router"


# ---- the instance cache -------------------------------------------------------------------------

@dataclass(frozen=True)
class CachePart:
    """A folder under PATHS["cache"] (the service user's, 0750) and the variable that points a
    start's libraries at it; `bundled`: a warm-cache bundle carries it (what a start compiled)."""

    name: str
    env: str
    bundled: bool
    what: str


CACHE_PARTS: tuple[CachePart, ...] = (
    CachePart("vllm", "VLLM_CACHE_ROOT", True, "vLLM's torch.compile artefacts, its start plan"),
    CachePart("inductor", "TORCHINDUCTOR_CACHE_DIR", True, "Inductor's generated kernels"),
    CachePart("triton", "TRITON_CACHE_DIR", True, "Triton's compiled kernels and launchers"),
    CachePart("xdg-cache", "XDG_CACHE_HOME", True, "what libraries keep in ~/.cache"),
    CachePart("xdg-config", "XDG_CONFIG_HOME", False, "what libraries keep in ~/.config"),
    CachePart("tmp", "TMPDIR", False, "a start's temporary files (its free space is checked)"),
)
CACHE_MODE = 0o750
# a fleet worker's instance that is leaving its router (a file named by its port, from its
# ExecStop until its next start): the join timer must not add it back while it drains. Beside the
# caches because the service user writes it.
PATHS["leaving"] = PATHS["cache"] + "/leaving"


def cache_env(root: str) -> dict[str, str]:
    """Each cache part's variable pointed at its folder under `root` (the image's PATHS["cache"],
    or a lab's own cache root)."""
    return {c.env: f"{root}/{c.name}" for c in CACHE_PARTS}


# ---- ports --------------------------------------------------------------------------------------

# The observability role's exporters, on loopback: node exporter, the public port's answers by
# status (mtail, from PATHS["status_log"]), NVIDIA's DCGM exporter (GPU tiers)
NODE_EXPORTER_PORT = 9100
STATUS_EXPORTER_PORT = 3903
DCGM_EXPORTER_PORT = 9400
# the label every scrape job this project writes carries (the one-machine configuration of
# docs/operations.md, `fleet scrape-config`'s job a droplet, the machine's own file_sd list):
# alert rules and the dashboard select it, since job names differ from one writer to the next
SCRAPE_LABEL = ("service", "inference-image")


# ---- units --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class UnitFact:
    """A unit the image ships, by what it is (`key`): enabled at the build (the machine's boot
    starts it), and the highest `systemd-analyze security` exposure its sandbox allows (0 closed
    .. 10 open; None: not the image's own sandbox)."""

    key: str
    name: str
    enabled: bool
    ceiling: float | None
    what: str


UNITS: tuple[UnitFact, ...] = (
    UnitFact("stack", "inference.target", True, None, "the stack: what the boot starts"),
    UnitFact("firstboot", "inference-firstboot.service", True, 3.5,
             "the machine's key, token and certificate"),
    UnitFact("instance", "vllm@.service", False, 4.0, "an instance (enabled as vllm@NAME)"),
    UnitFact("router", "vllm-router.service", True, 2.5, "the router in front of the instances"),
    UnitFact("public_socket", "nginx.socket", True, None,
             "the public port, held across nginx's restarts"),
    UnitFact("public", "nginx.service", True, 4.0, "the public port: TLS, the key, the rate limit"),
    UnitFact("acme", "inference-acme.service", False, 3.5, "a certificate from an ACME CA"),
    UnitFact("acme_timer", "inference-acme.timer", True, None,
             "inference-acme a minute after boot and hourly"),
    UnitFact("join", "inference-join.service", False, 3.5, "a fleet machine's part"),
    UnitFact("join_timer", "inference-join.timer", True, None,
             "inference-join every limits.join_every_s"),
)
UNIT = {u.key: u.name for u in UNITS}


def instance_unit(instance: str) -> str:
    """An instance's unit: vllm@NAME.service."""
    return UNIT["instance"].replace("@.", f"@{instance}.")


def enabled_units(instances: list[str]) -> list[str]:
    """The units the build enables, an instance's `vllm@NAME.service` each."""
    return [u.name for u in UNITS if u.enabled] + [instance_unit(i) for i in instances]


def exposure_ceilings() -> dict[str, float]:
    """{unit name without its suffix (vllm@ for the template): its exposure ceiling}."""
    return {u.name.removesuffix(".service"): u.ceiling for u in UNITS if u.ceiling is not None}


# ---- first boot ---------------------------------------------------------------------------------

# What first boot makes on each machine (and the ACME account, certificate and request that
# belong to one machine's domain, and the fleet role its user-data gave it), and sysprep removes
# before a snapshot: PATHS keys.
MACHINE_FILES = ("api_key", "api_key_map", "scrape_token", "scrape_token_map", "tls_cert",
                 "tls_key", "public_listen", "endpoint", "acme_conf", "acme_state", "fleet")
# What a machine writes of itself once it serves, not at first boot: its instances' CRIU
# checkpoints (keyed by its GPUs' UUIDs). Sysprep removes them too, and its check fails an image
# that holds one.
MACHINE_STATE = ("checkpoints",)


# ---- the environment the runtime reads -------------------------------------------------------

@dataclass(frozen=True)
class EnvNames:
    """The INFERENCE_* variables the machine's runtime reads, by what each says."""

    root: str = "INFERENCE_ROOT"  # a prefix of every path (a render or scratch root; tests)
    unit: str = "INFERENCE_UNIT"  # the instance a start is (vllm-0)
    host: str = "INFERENCE_HOST"  # the address an instance listens on
    python: str = "INFERENCE_PYTHON"  # the instance's Python (the image's vLLM)
    cache: str = "INFERENCE_CACHE"  # the instance cache's root (PATHS["cache"])
    prefetch: str = "INFERENCE_PREFETCH"  # "1": read what a start reads ahead
    extra_args: str = "INFERENCE_EXTRA_ARGS"  # vLLM flags a drop-in adds (the lab's dummy weights)
    cpu_slice: str = "INFERENCE_CPU_SLICE"  # the cpu tier: the cores an instance binds
    dry_run: str = "INFERENCE_DRY_RUN"  # "1": print the command a start would run
    head: str = "INFERENCE_HEAD"  # a node's head address (multi-node)
    node_rank: str = "INFERENCE_NODE_RANK"  # a node's rank (multi-node)
    node_addr: str = "INFERENCE_NODE_ADDR"  # this machine's address in its group (multi-node)
    checkpoint: str = "INFERENCE_CHECKPOINT"  # "1": the start asks its checkpoint helper
    checkpoint_token: str = "INFERENCE_CHECKPOINT_TOKEN"  # the gate's token for the helper
    checkpoint_gate: str = "INFERENCE_CHECKPOINT_GATE"  # the gate's flag file
    checkpoint_weights: str = "INFERENCE_CHECKPOINT_WEIGHTS"  # host or files
    criu: str = "INFERENCE_CRIU"  # CRIU's binary, where not PATHS["criu"]
    vllm: str = "INFERENCE_VLLM"  # the instance's vllm command (a node's stage runs `vllm serve`)
    vllm: str = "INFERENCE_VLLM"  # the instance's vllm command (a node's stage runs `vllm serve`)
    vllm: str = "INFERENCE_VLLM"  # the instance's vllm command (a node's stage runs `vllm serve`)


ENV = EnvNames()


def as_data() -> dict[str, Any]:
    """The contract as JSON data: what the render writes into profile.json and the extra-vars."""
    return {
        "schema": 1,
        "paths": dict(PATHS),
        "service_user": SERVICE_USER,
        "router_user": ROUTER_USER,
        "cache_parts": [asdict(c) for c in CACHE_PARTS],
        "cache_mode": f"{CACHE_MODE:04o}",
        "ports": {"node_exporter": NODE_EXPORTER_PORT, "status_exporter": STATUS_EXPORTER_PORT,
                  "dcgm_exporter": DCGM_EXPORTER_PORT},
        "units": [asdict(u) for u in UNITS],
        "unit": dict(UNIT),
        "machine_files": [PATHS[k] for k in MACHINE_FILES],
        "machine_state": [PATHS[k] for k in MACHINE_STATE],
        "runtime_programs": [PATHS[k] for k in RUNTIME_PROGRAMS],
        "env": asdict(ENV),
        "firewall_table": FIREWALL_TABLE,
        "scrape_label": {SCRAPE_LABEL[0]: SCRAPE_LABEL[1]},
    }
