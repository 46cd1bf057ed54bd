"""security: the API key is required on every route but /health; the instances, the router's own
port and the metrics ports are unreachable from outside; vLLM's dev mode is off; the services do
not run as root; the key is not visible to other users."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import HostKey, http, tcp_open

pytestmark = [pytest.mark.suite("security"), pytest.mark.serving]

# Every route vLLM's OpenAI server and vllm-router expose (and one that exists nowhere): each must
# ask for the key on the public port. /metrics is included on purpose: metrics are scraped on the
# loopback ports (see /etc/inference-image/prometheus-targets.json), never without a key from outside.
ROUTES = [
    ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"), ("POST", "/v1/responses"), ("POST", "/tokenize"),
    ("POST", "/detokenize"), ("GET", "/metrics"), ("GET", "/version"), ("GET", "/get_server_info"),
    ("GET", "/server_info"), ("GET", "/ping"), ("POST", "/invocations"), ("POST", "/pooling"),
    ("POST", "/score"), ("POST", "/v1/score"), ("POST", "/rerank"), ("POST", "/v1/rerank"),
    ("POST", "/reset_prefix_cache"), ("POST", "/sleep"), ("POST", "/wake_up"),
    ("POST", "/collective_rpc"), ("POST", "/v1/load_lora_adapter"), ("GET", "/load"),
    ("GET", "/liveness"), ("GET", "/readiness"), ("GET", "/workers"), ("POST", "/flush_cache"),
    ("GET", "/no/such/route"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_key_required(root: Any, profile: dict[str, Any], method: str, path: str) -> None:
    port = profile["router"]["port"]
    body = {} if method == "POST" else None
    assert http(root, port, path, method=method, body=body).status == 401, "no key accepted"
    assert http(root, port, path, key="0" * 64, method=method, body=body).status == 401, \
        "a wrong key accepted"


# Routes of vllm-router and vLLM that are not OpenAI's: even the key does not reach them from
# outside (they clear caches, list workers, show internals).
INTERNAL = [("GET", "/workers"), ("POST", "/flush_cache"), ("GET", "/metrics"), ("POST", "/tokenize"),
            ("GET", "/get_server_info"), ("GET", "/list_workers"), ("POST", "/v1/load_lora_adapter")]


@pytest.mark.parametrize(("method", "path"), INTERNAL, ids=[f"{m} {p}" for m, p in INTERNAL])
def test_internal_routes_not_public_even_with_the_key(root: Any, profile: dict[str, Any],
                                                      api_key: HostKey, method: str, path: str) -> None:
    body = "{}" if method == "POST" else None
    assert http(root, profile["router"]["port"], path, key=api_key, method=method,
                body=body).status == 404


def test_health_needs_no_key(root: Any, profile: dict[str, Any]) -> None:
    assert http(root, profile["router"]["port"], "/health").status == 200


def test_right_key_accepted(root: Any, profile: dict[str, Any], api_key: HostKey) -> None:
    assert http(root, profile["router"]["port"], "/v1/models", key=api_key).status == 200


def _behind_nat(addr: str) -> None:
    if addr.startswith("127."):
        pytest.skip(f"reached through a port forward on {addr} (qemu user networking): only forwarded "
                    "ports exist from here; the bound addresses and the firewall are checked on the machine")


def test_public_port_reachable_from_outside(profile: dict[str, Any], outside_address: str) -> None:
    _behind_nat(outside_address)
    assert tcp_open(outside_address, profile["router"]["port"]), \
        f"{outside_address}:{profile['router']['port']} refuses connections"


def test_internal_ports_unreachable_from_outside(profile: dict[str, Any], outside_address: str) -> None:
    _behind_nat(outside_address)
    internal = [i["port"] for i in profile["instances"]]
    internal += [profile["router"]["internal_port"], profile["router"]["metrics_port"],
                 profile["limits"]["node_exporter_port"]]
    open_ = [p for p in internal if tcp_open(outside_address, p, timeout=2)]
    assert not open_, f"reachable from outside on {outside_address}: {open_}"


def test_firewall_denies_by_default(root: Any) -> None:
    rules = root.run("nft list chain inet inference_image input")
    assert rules.rc == 0, "no inference_image input chain loaded"
    assert "policy drop" in rules.stdout


def _main_pid(root: Any, unit: str) -> tuple[str, str]:
    """(pid, user) of a unit's main process, from systemd (process titles change: vllm-router
    calls itself vllm::router)."""
    pid = root.run(f"systemctl show -p MainPID --value {unit}").stdout.strip()
    assert pid and pid != "0", f"{unit} has no main process"
    return pid, root.run(f"ps -o user:32= -p {pid}").stdout.strip()


def _units(profile: dict[str, Any]) -> list[str]:
    return [f"vllm@{i['name']}.service" for i in profile["instances"]] + ["vllm-router.service"]


def test_dev_mode_off(root: Any, profile: dict[str, Any]) -> None:
    units_dir = profile["paths"]["units"]
    assert root.run(f"grep -rl VLLM_SERVER_DEV_MODE {units_dir}").stdout.strip() == "", \
        f"a unit file in {units_dir} sets VLLM_SERVER_DEV_MODE"
    for unit in _units(profile):
        pid, _ = _main_pid(root, unit)
        env = root.run(f"tr '\\0' '\\n' < /proc/{pid}/environ")
        # Without CAP_SYS_PTRACE (a container) root cannot read another user's environment.
        if env.rc == 0:
            assert "VLLM_SERVER_DEV_MODE=1" not in env.stdout, f"{unit} runs with VLLM_SERVER_DEV_MODE=1"
    # Dev-mode routes exist only with VLLM_SERVER_DEV_MODE=1.
    inst = profile["instances"][0]
    assert http(root, inst["port"], "/reset_prefix_cache", method="POST").status == 404


def test_services_not_root(root: Any, profile: dict[str, Any]) -> None:
    user = profile["service_user"]
    for unit in _units(profile):
        pid, owner = _main_pid(root, unit)
        assert owner == user, f"{unit} (pid {pid}) runs as {owner}"
    workers = root.run("ps -o user= -C nginx").stdout.split()
    assert workers and set(workers) - {"root"}, "nginx has no unprivileged workers"


def test_api_key_private(root: Any, profile: dict[str, Any], api_key: HostKey) -> None:
    for path in (profile["paths"]["api_key"], profile["paths"]["api_key_map"]):
        f = root.file(path)
        assert f.user == "root" and f.mode & 0o077 == 0, f"{path} is {oct(f.mode)} {f.user}:{f.group}"
    key = root.file(api_key.path).content_string.strip()
    assert len(key) >= 32, "the API key is shorter than 32 characters"
    args = root.run("ps -eo args").stdout
    assert key not in args, "the API key is on a command line (visible to every user)"
