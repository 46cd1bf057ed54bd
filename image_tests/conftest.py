"""Shared fixtures of the image suites. They run against any testinfra host (SSH/paramiko, podman,
an Ansible inventory, local) and learn what to expect from the host itself:
/etc/inference-image/profile.json, written by the render that built the image."""

from __future__ import annotations

import json
import shlex
import socket
import time
from dataclasses import dataclass
from typing import Any

import pytest

PROFILE_JSON = "/etc/inference-image/profile.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("inference-image")
    g.addoption("--tier", default=None, help="fail unless the host was built from this tier")
    g.addoption("--no-serving", action="store_true",
                help="the stack cannot run here (a GPU tier baked without its GPU): skip what needs it")
    g.addoption("--api-host", default=None,
                help="address the host is reached at from here (default: the SSH host, or the "
                     "container's address)")


@dataclass
class Http:
    status: int
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "suite(name): smoke, gpu, hygiene, security, throughput, faults")
    config.addinivalue_line("markers", "serving: needs the stack running, or the GPU itself")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--no-serving"):
        skip = pytest.mark.skip(reason="built without the tier's GPU: the stack is not started")
        for item in items:
            if "serving" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="module")
def root(host: Any) -> Any:
    """The host with root rights (sudo when logged in as someone else)."""
    return host if host.user().name == "root" else host.sudo()


@pytest.fixture(scope="module")
def profile(root: Any, request: pytest.FixtureRequest) -> dict[str, Any]:
    f = root.file(PROFILE_JSON)
    if not f.exists:
        pytest.fail(f"{PROFILE_JSON} is missing: this host is not an inference-image build")
    doc = json.loads(f.content_string)
    want = request.config.getoption("--tier")
    if want and doc["tier"] != want:
        pytest.fail(f"host was built for tier {doc['tier']}, expected {want}")
    return doc


@dataclass(frozen=True)
class HostKey:
    """The machine's API key, used where it lies: commands read it with $(cat FILE), so the key
    never appears in a command line (which some backends log, e.g. Ansible to the journal)."""

    path: str

    @property
    def shell(self) -> str:
        return f'"$(cat {shlex.quote(self.path)})"'


@pytest.fixture(scope="module")
def api_key(root: Any, profile: dict[str, Any]) -> HostKey:
    path = profile["paths"]["api_key"]
    assert root.file(path).exists, f"no API key at {path} (inference-firstboot makes it)"
    return HostKey(path)


def http(root: Any, port: int, path: str, key: str | HostKey | None = None, method: str = "GET",
         body: Any = None, timeout: int = 120, host: str = "127.0.0.1") -> Http:
    """A request made on the host itself with curl (the instances listen on its loopback)."""
    cmd = ["curl", "-sS", "-m", str(timeout), "-o", "-", "-w", "\n%{http_code}", "-X", method,
           f"http://{host}:{port}{path}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    line = shlex.join(cmd)
    if isinstance(key, HostKey):
        line += f' -H "Authorization: Bearer "{key.shell}'
    elif key is not None:
        line += " " + shlex.join(["-H", f"Authorization: Bearer {key}"])
    out = root.run(line)
    assert out.rc == 0, f"curl {method} {path} on port {port} failed: {out.stderr.strip()}"
    text, _, code = out.stdout.rpartition("\n")
    return Http(int(code), text)


@pytest.fixture(scope="module")
def outside_address(host: Any, request: pytest.FixtureRequest) -> str:
    """Where a client off the machine would connect: the SSH host name, or the container's
    first non-loopback IPv4 address."""
    given = request.config.getoption("--api-host")
    if given:
        return given
    backend = host.backend
    name = getattr(backend, "host", None)
    hostname = getattr(name, "name", None) if name is not None else None
    if backend.NAME in ("paramiko", "ssh", "safe-ssh") and hostname:
        return hostname
    out = host.run("ip -4 -o addr show scope global")
    for line in out.stdout.splitlines():
        return line.split()[3].split("/")[0]
    pytest.skip("the host has no global IPv4 address to test from outside")
    raise AssertionError  # unreachable


def tcp_open(addr: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for(fn: Any, timeout: float, every: float = 2.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > end:
            return v
        time.sleep(every)
