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

from inference_image.ops.cause import failure_cause
from inference_image.render import PATHS

PROFILE_JSON = PATHS["profile_json"]  # the one path a test must know before the host says


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("inference-image")
    g.addoption("--tier", default=None, help="fail unless the host was built from this tier")
    g.addoption("--no-serving", action="store_true",
                help="the stack does not run here (an image being built, a GPU tier without its "
                "GPU): skip what needs it")
    g.addoption("--stand-in-gpu", default=None, metavar="NAME",
                help="this machine's GPU (NAME, as nvidia-smi names it) stands in for the profile's "
                     "(the lab: an H200 serving the h100 tier); the gpu suite expects NAME, and a "
                     "DCGM exporter the lab could not install is left out of the scrape checks, "
                     "saying so")
    g.addoption("--load-once-sealed", action="store_true",
                help="on a machine not yet sealed (no image.json: molecule's verify before its "
                     "sysprep), skip what loads it or waits out one of its timeouts: the same "
                     "configuration is judged again on the sealed image's first boot")
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
    config.addinivalue_line("markers", "serving: needs the stack running, or the GPU itself")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--no-serving"):
        skip = pytest.mark.skip(reason="--no-serving: the stack is not started here (an image being "
                                "built serves on its first boot)")
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
def load_here(root: Any, profile: dict[str, Any], request: pytest.FixtureRequest) -> None:
    """What loads the machine or waits out one of its timeouts asks this first (--load-once-sealed)."""
    image_json = profile["paths"]["image_json"]
    if request.config.getoption("--load-once-sealed") and not root.file(image_json).exists:
        pytest.skip(f"--load-once-sealed: {image_json} is missing, so this machine is judged again "
                    "once sealed and booted, where this runs")


@pytest.fixture(scope="module")
def api_key(root: Any, profile: dict[str, Any]) -> HostKey:
    path = profile["paths"]["api_key"]
    assert root.file(path).exists, f"no API key at {path} (inference-firstboot makes it)"
    return HostKey(path)


@dataclass(frozen=True)
class Public:
    """The public port as a client on the machine reaches it: how first boot set it up
    (endpoint.json: TLS with this machine's certificate, or plain HTTP where asked)."""

    port: int
    tls: bool
    cacert: str

    def url(self, path: str = "", host: str = "127.0.0.1") -> str:
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}{path}"

    @property
    def curl(self) -> str:
        """curl's options to check the machine's certificate (no -k anywhere)."""
        return f"--cacert {shlex.quote(self.cacert)}" if self.tls else ""


@pytest.fixture(scope="module")
def public(root: Any, profile: dict[str, Any]) -> Public:
    path = profile["paths"]["endpoint"]
    f = root.file(path)
    assert f.exists, f"no {path}: inference-firstboot writes it when it makes the certificate"
    doc = json.loads(f.content_string)
    return Public(profile["router"]["port"], doc["tls"] != "off", doc["tls_cert"])


def http(root: Any, port: int | Public, path: str, key: str | HostKey | None = None,
         method: str = "GET", body: Any = None, timeout: int = 120, host: str = "127.0.0.1") -> Http:
    """A request made on the host itself with curl: to a loopback port (an instance, the router)
    in plain HTTP, or to the public port as first boot set it up."""
    url = port.url(path, host) if isinstance(port, Public) else f"http://{host}:{port}{path}"
    cmd = ["curl", "-sS", "-m", str(timeout), "-o", "-", "-w", "\n%{http_code}", "-X", method, url]
    if isinstance(port, Public) and port.tls:
        cmd += ["--cacert", port.cacert]
        if host != "127.0.0.1":  # the certificate names the machine's first-boot addresses
            cmd += ["--resolve", f"localhost:{port.port}:{host}"]
            cmd[cmd.index(url)] = port.url(path, "localhost")
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


def own_router_worker_fleet(profile: dict[str, Any]) -> dict[str, Any]:
    """A worker's fleet file whose router is this machine's own vllm-router: a real one of the
    fleet's version stands in for the fleet's router droplet (test_fleet.py, test_faults.py)."""
    return {"fleet": "test", "role": "worker",
            "router": f"http://127.0.0.1:{profile['router']['internal_port']}",
            "instance_ports": [i["port"] for i in profile["instances"]]}


def wait_for(fn: Any, timeout: float, every: float = 2.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > end:
            return v
        time.sleep(every)


def served_per_instance(root: Any, profile: dict[str, Any]) -> dict[str, float]:
    """Requests each instance has completed, from its own vLLM counter (loopback port); 0 for
    an instance that is down (its counter starts again from 0 when it comes back)."""
    out = {}
    for inst in profile["instances"]:
        if not port_open(root, inst["port"]):
            out[inst["name"]] = 0.0
            continue
        text = http(root, inst["port"], "/metrics").body
        out[inst["name"]] = sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                                if ln.startswith("vllm:request_success_total"))
    return out


WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"]


def send_spread(root: Any, profile: dict[str, Any], api_key: HostKey, public: Public,
                n: int) -> None:
    """n short completions at once through the public port, each with its own first word:
    cache-aware routing has no shared prefix to keep on one instance, so it balances by load."""
    model = profile["served_model_name"]
    script = f"key={api_key.shell}; " + " & ".join(
        f"curl -s {public.curl} -o /dev/null -H \"Authorization: Bearer $key\" "
        f"-H 'Content-Type: application/json' -d "
        f"'{{\"model\":\"{model}\",\"prompt\":\"{WORDS[i % len(WORDS)]} is the first word of "
        f"request {i}\",\"max_tokens\":8}}' {public.url('/v1/completions')}"
        for i in range(n))
    assert root.run(f"{script}; wait").rc == 0


def traffic_per_instance(root: Any, profile: dict[str, Any], api_key: HostKey, public: Public,
                         n: int = 12) -> dict[str, float]:
    """Send n spread requests; how many each instance served (waits up to 60 s for the counters)."""
    before = served_per_instance(root, profile)
    send_spread(root, profile, api_key, public, n)

    def grew() -> dict[str, float]:
        after = served_per_instance(root, profile)
        return {k: after[k] - before[k] for k in after}
    wait_for(lambda: sum(grew().values()) >= n, 60)
    return grew()


def seconds_until_balanced(root: Any, profile: dict[str, Any], api_key: HostKey, public: Public,
                           timeout: float) -> float | None:
    """Spread requests every few seconds until every instance has served some: how long that
    took, or None. (vllm-router takes an instance that failed requests back only a fixed while
    after the failure, whatever its health-check and circuit-breaker settings:
    docs/benchmarks.md#2026-11-23-faults-cpu.)"""
    t0 = time.monotonic()
    before = served_per_instance(root, profile)
    while time.monotonic() - t0 < timeout:
        send_spread(root, profile, api_key, public, 2 * len(profile["instances"]))
        now = served_per_instance(root, profile)
        if all(now[k] > before[k] for k in now):
            return round(time.monotonic() - t0, 1)
        time.sleep(3)
    return None

def pending_security_updates(root: Any) -> list[str]:
    """The security updates apt would install now. Package lists go to a scratch directory
    (sysprep removed the machine's, and the machine's own apt runs must not wait on this one),
    which is removed again."""
    lists = "/var/tmp/inference-image-apt-lists"
    # no binary caches either: on a sealed image the check must not leave files behind
    opts = (f"-o Dir::State::Lists={lists} -o Debug::NoLocking=1 -o Dir::Cache::pkgcache= "
            "-o Dir::Cache::srcpkgcache=")
    try:
        # a few tries: the archive is reached over the network (CI's through a proxy), and a
        # moment it does not answer says nothing about the image
        for attempt in range(3):
            upd = root.run(f"mkdir -p {lists}/partial && apt-get -qq {opts} update 2>&1")
            if upd.rc == 0 and "Err:" not in upd.stdout:
                break
            time.sleep(10 * (attempt + 1))
        assert upd.rc == 0, f"cannot read the package archive to check for updates: {upd.stdout[-300:]}"
        sim = root.run(f"apt-get -s {opts} upgrade")
        assert sim.rc == 0, sim.stdout[-300:]
    finally:
        root.run(f"rm -rf {lists}")
    return [ln for ln in sim.stdout.splitlines() if ln.startswith("Inst ") and "securi" in ln.lower()]


def unit_failure_cause(root: Any, unit: str, since: str | None = None) -> str | None:
    """The line of a unit's journal that says why it failed (cause.failure_cause), or None.
    since: a journalctl --since value ("@1700000000")."""
    window = f"--since {shlex.quote(since)}" if since else "-n 300"
    return failure_cause(root.run(f"journalctl -u {shlex.quote(unit)} {window} --no-pager -o cat")
                         .stdout)


def why_not_serving(root: Any, inst: dict[str, Any]) -> str | None:
    """None when the instance answers /health; else one line: the cause from its journal, the
    unit's state, where to look (what the smoke suite, and so verify, reports)."""
    if port_open(root, inst["port"]) and http(root, inst["port"], "/health").status == 200:
        return None
    unit = f"vllm@{inst['name']}.service"
    cause = unit_failure_cause(root, unit) or "no error in its journal"
    state = root.run(f"systemctl is-active {unit}").stdout.strip()
    return (f"{inst['name']} (port {inst['port']}) not serving: {cause} [{unit} {state}; "
            f"journalctl -u {unit}]")


def listen_addresses(root: Any, port: int) -> set[str]:
    """The addresses a TCP socket of the machine listens on at `port` (ss's local address, the
    port cut off); empty when nothing listens there."""
    out = root.run(f"ss -Hltn 'sport = :{port}'").stdout
    return {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}


def port_open(root: Any, port: int) -> bool:
    """Whether something listens on the machine's loopback port (curl would fail on a refusal)."""
    return bool(listen_addresses(root, port))


DCGM_UNIT = "nvidia-dcgm-exporter.service"


@pytest.fixture(scope="module")
def scrape_targets(root: Any, profile: dict[str, Any], request: pytest.FixtureRequest,
                   record_testsuite_property: Any) -> list[str]:
    """The /metrics/<target> pages to judge: router.scrape, all of them on a build. A machine
    with no DCGM exporter unit at all (the lab: it comes from NVIDIA's repository, which the lab
    cannot reach) has its GPU target and the DCGM rules left out, on any GPU, and the run says so;
    where the unit exists, its target is judged, and an exporter that is down fails."""
    targets = list(profile["router"]["scrape"])
    if "gpu" in targets and not root.run(f"systemctl cat {DCGM_UNIT}").succeeded:
        record_testsuite_property("not_judged", f"/metrics/gpu and the DCGM alert rules: no "
                                  f"{DCGM_UNIT} on this machine")
        targets.remove("gpu")
    return targets
