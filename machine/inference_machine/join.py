"""inference-join: the machine's part in a fleet (`inference-image fleet`), from its fleet file
(PATHS["fleet"], written by user-data).

- a worker registers its instances with the fleet's router: for each instance port, vllm-router's
  POST /add_worker?url=http://ADDRESS:PORT, ADDRESS being the one this machine's kernel uses to
  reach the router (`ip route get`), so user-data need not know it. The router answers "Worker
  already exists" for one it has: that counts as done, so inference-join.timer runs this every
  limits.join_every_s, and a router that restarted and forgot its workers has them back within that.
- a router (no instance of its own; vllm-router on every address) lets its private networks reach
  vllm-router's port, so that workers, which join later and by themselves, can add their instances.
- `--leave PORT` (a worker's instance being stopped, its unit's ExecStop): the router removes the
  instance (POST /remove_worker), then the instance finishes what it serves, up to
  limits.drain_s, before systemd's SIGTERM; the next join after its next start adds it again
  (PATHS["leaving"]/PORT says it is leaving until inference-run starts it). A worker that shuts down
  or restarts an instance so costs no request. Anywhere else it does nothing.
- a head or a node of a multi-node instance (serving.nodes: one pipeline stage a machine, vLLM's
  own multi-node executor) lets the other machines of its private network reach every port (the
  stages' rendezvous, message queues and gloo/NCCL connections use ports vLLM picks): the network
  the head's file names, or a node's toward its head.

`--role` prints the role (worker, router, head, node or none) and changes nothing: the one reader
of the file, for inference-run; `--serves-instances` exits 1 on a router and 0 elsewhere (the
instances' ExecCondition); `--group` prints a head's or node's RANK HEAD ADDRESS INTERFACE
(inference-run's multi-node arguments) and `--open-group` opens the firewall to the group before
an instance starts (its ExecStartPre, as root). A file it cannot use is role none (the machine
serves alone, on loopback) and one error, here and in every timer run. INFERENCE_ROOT prefixes
the file's path (tests)."""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
import time
from pathlib import Path

from . import rendered, writers
from .bounded_http import fetch
from .contract import FIREWALL_TABLE
from .fleetfile import FleetFileError, role_line
from .inputs import IPAddress, IPNetwork, Port, Refused, finite, fleet_network, printable

USAGE = "usage: inference-join [--role | --serves-instances | --group | --open-group | --leave PORT]"
MODES = ("join", "--role", "--serves-instances", "--group", "--open-group", "--leave")
# vLLM's gauges of what an instance is serving (its drain is over when they read 0 twice)
IN_FLIGHT = re.compile(r"^vllm:num_requests_(running|waiting)[{ ].*?(\S+)$", re.M)


def say(msg: str) -> None:
    print(f"inference-join: {printable(msg)}", flush=True)


def warn(msg: str) -> None:
    print(f"inference-join: {printable(msg)}", file=sys.stderr, flush=True)


def has_file(path: Path) -> bool:
    """The fleet file is there and not empty (a machine outside a fleet has none)."""
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def nft(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nft", *args], capture_output=True, text=True, check=False,
                          timeout=30)


def let_in(nft_set: str, element: IPAddress | IPNetwork) -> bool:
    """`element` into the firewall's `nft_set` (True: it is there now; False: the error, said).
    A network must be a fleet's (inputs.fleet_network: private, no larger than a VPC) and an
    address a private one; the element is written by writers.nft_element, never pasted. `add`
    keeps an element that is there; a reload of the firewall empties the set, and the next run
    puts it back."""
    try:
        if isinstance(element, ipaddress.IPv4Network | ipaddress.IPv6Network):
            fleet_network(element)
        elif not element.is_private or element.is_link_local or element.is_unspecified:
            raise Refused(f"{element} is not a private address of the fleet")
        text = writers.nft_element(element)
    except Refused as exc:
        warn(f"refused to open the firewall (set {nft_set}): {exc}")
        return False
    try:
        r = nft("add", "element", "inet", FIREWALL_TABLE, nft_set, f"{{ {text} }}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        r = subprocess.CompletedProcess([], 1, "", str(exc))
    if r.returncode:
        warn(f"cannot let {element} through the firewall (table {FIREWALL_TABLE}, set {nft_set}): "
             f"{(r.stderr or r.stdout).strip()}")
        return False
    return True


def is_in(nft_set: str, element: IPAddress | IPNetwork) -> bool:
    try:
        return nft("get", "element", "inet", FIREWALL_TABLE, nft_set,
                   f"{{ {writers.nft_element(element)} }}").returncode == 0
    except Refused:
        return False
    except (OSError, subprocess.TimeoutExpired):
        return False


def route_source(host: str) -> str | None:
    """The address this machine's kernel uses to reach `host`, or None."""
    try:
        out = subprocess.run(["ip", "-o", "route", "get", host], capture_output=True, text=True,
                             check=False, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r" src ([0-9.]+)", out)
    return m.group(1) if m else None


def in_flight(port: str) -> int | None:
    """Requests the instance on `port` is serving or holding, from its /metrics; None when it
    does not answer."""
    try:
        a = fetch(f"http://127.0.0.1:{port}/metrics", deadline_s=1)
    except OSError:
        return None
    if a.status != 200:
        return None
    total = 0
    for m in IN_FLIGHT.finditer(a.body.decode(errors="replace")):
        # a gauge is a count: NaN, an infinity or a negative is no sample (skipped, as one that
        # is no number)
        try:
            total += int(finite(m.group(2), "gauge", 0, 1e9))
        except Refused:
            continue
    return total


def leave(router: str, src: str, port: str, doc: dict[str, object]) -> int:
    """The instance on `port` leaves the router and drains. Whatever fails here, the stop goes on
    (0): a worker the router cannot be told about is what its health checks and circuit breaker
    are for."""
    url = f"http://{src}:{port}"
    # first: a join that runs during the drain (the timer) would add the instance back
    leaving = rendered.here("leaving")
    try:
        leaving.mkdir(parents=True, exist_ok=True)
        (leaving / port).touch()
    except OSError:
        pass
    try:
        a = fetch(f"{router}/remove_worker?url={url}", deadline_s=3, method="POST")
        if a.status >= 400:
            raise OSError(f"HTTP {a.status}: {a.body[:200].decode(errors='replace')}")
        say(f"{url} left {router}; draining")
    except OSError as exc:
        warn(f"{router} did not remove {url} ({exc}); draining anyway")
    drain_s = float(doc["limits"]["drain_s"])  # type: ignore[index]
    zero, t0, n = 0, time.monotonic(), 0
    # Requests the router sent before it removed the instance: vLLM's own gauges, until they read
    # 0 twice in a row (one the router chose just before the removal may arrive between two reads).
    while time.monotonic() - t0 < drain_s:
        got = in_flight(port)
        if got is None:
            say(f"{url} does not answer: nothing to drain")
            return 0
        n = got
        zero = zero + 1 if n == 0 else 0
        if zero >= 2:
            say(f"{url} drained in {time.monotonic() - t0:.0f} s")
            return 0
        time.sleep(0.5)
    warn(f"{url} still serves {n} request(s) after {drain_s:.0f} s; stopping it")
    return 0


def join_router(router: str, ports: list[str], doc: dict[str, object]) -> int:
    """A worker's instances that are up, added to the router (0: all of them are there)."""
    host = ipaddress.IPv4Address(re.sub(r":[0-9]+$", "", router.removeprefix("http://")))
    src = route_source(str(host))
    every = doc["limits"]["join_every_s"]  # type: ignore[index]
    if src is None:
        warn(f"no route from this machine to the router {host}")
        return 1
    # The router's address in the firewall's set first, whatever the instances' state: its health
    # checks then find an instance the moment it is up again, not at the next run.
    if not let_in("fleet_router", host):
        return 1
    failed = 0
    for port in ports:
        url = f"http://{src}:{port}"
        if (rendered.here("leaving") / port).exists():
            say(f"{url} is leaving (stopping); it joins again once it has started")
            continue
        # Only an instance that is up: vllm-router would hold the call open until the instance is
        # healthy (up to its start-up timeout), and the timer comes back anyway.
        try:
            healthy = fetch(f"{url}/health", deadline_s=5).status < 400
        except OSError:
            healthy = False
        if not healthy:
            warn(f"{url} is not healthy yet; next try in {every} s")
            failed = 1
            continue
        try:
            a = fetch(f"{router}/add_worker?url={url}", deadline_s=60, method="POST", idle_s=60)
        except OSError as exc:
            warn(f"{router} unreachable for {url}: {exc}")
            failed = 1
            continue
        text = a.body.decode(errors="replace")
        if 200 <= a.status < 300:
            say(f"{url} joined {router}")
        elif "already exists" not in text:
            warn(f"{router} did not add {url} (HTTP {a.status}): {text[:300]}")
            failed = 1
    return failed


def open_group(role: str, text: str) -> int:
    try:
        net = fleet_network(text)
    except Refused as exc:
        warn(f"this {role} opens no network: {exc}")
        return 1
    if is_in("fleet_nodes", net):
        return 0
    if not let_in("fleet_nodes", net):
        return 1
    say(f"the machines of {net} may reach this {role}'s stage of the instance")
    return 0


def open_router(nets: list[str], doc: dict[str, object]) -> int:
    if not nets:
        warn("this fleet router has no private IPv4 address for its workers to reach it on")
        return 1
    port = doc["router"]["internal_port"]  # type: ignore[index]
    for text in nets:
        try:
            net = fleet_network(text)
        except Refused as exc:
            warn(f"workers are not let in from {printable(text, 60)}: {exc}")
            continue
        if is_in("fleet_workers", net):
            continue
        if not let_in("fleet_workers", net):
            return 1
        say(f"workers on {net} may join this router (port {port})")
    return 0


def read_role(mode: str = "--role") -> tuple[str, list[str]] | None:
    """(role, the rest of its line) from the fleet file, ("none", []) without one; None (said)
    when the file cannot be used."""
    fleet = rendered.here("fleet")
    if not has_file(fleet):
        return "none", []
    doc = rendered.profile()
    nodes = int(rendered.setting(doc, "serving.nodes", 1))
    try:
        line = role_line(fleet, mode, nodes)
    except FleetFileError as exc:
        warn(str(exc))
        warn(f"{fleet} cannot be used (above); this machine serves alone. Fix: write it as "
             "`inference-image fleet up --dry-run` shows")
        return None
    role, *rest = line.split()
    return role, rest


def role() -> str:
    """This machine's role in a fleet (inference-run's question): none without a usable file."""
    got = read_role()
    return got[0] if got else "none"


def group() -> tuple[str, str, str, str] | None:
    """A head's or node's RANK HEAD ADDRESS INTERFACE, None (said) on any other machine."""
    got = read_role("--group")
    if got is None:
        return None
    r, rest = got
    if r not in ("head", "node") or len(rest) < 4:
        warn(f"this machine is no head or node of a multi-node instance (role {r})")
        return None
    return rest[0], rest[1], rest[2], rest[3]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    mode = args[0] if args else "join"
    if mode not in MODES or len(args) > (2 if mode == "--leave" else 1) or (
            mode == "--leave" and len(args) < 2):
        print(USAGE, file=sys.stderr)
        return 2
    if mode == "--leave":
        try:
            args = [mode, str(Port.parse(args[1], "--leave port"))]
        except Refused as exc:
            print(f"inference-join: {exc}. {USAGE}", file=sys.stderr)
            return 2
    try:
        got = read_role(mode)
        if got is None:
            if mode == "--role":
                print("none")
                return 0
            return 0 if mode in ("--serves-instances", "--leave", "--open-group") else 1
        r, rest = got
        if mode == "--role":
            print(r)
            return 0
        if r == "none":
            return 0
        doc = rendered.profile()
        return act(mode, r, rest, args, doc)
    except rendered.RenderedError as exc:
        warn(str(exc))
        return 1


def act(mode: str, r: str, rest: list[str], args: list[str], doc: dict[str, object]) -> int:
    if mode == "--serves-instances":
        return 1 if r == "router" else 0
    if mode == "--leave" and r != "worker":
        return 0
    if mode == "--group":
        if r not in ("head", "node"):
            warn(f"this machine is no head or node of a multi-node instance (role {r})")
            return 1
        print(" ".join(rest[:4]))
        return 0
    if mode == "--open-group" and r not in ("head", "node"):
        return 0
    if r in ("head", "node"):
        return open_group(r, rest[4])
    if r == "router":
        return open_router(rest, doc)
    router, ports = rest[0], rest[1:]
    if mode == "--leave":
        host = re.sub(r":[0-9]+$", "", router.removeprefix("http://"))
        src = route_source(host)
        if src is None:
            warn(f"no route from this machine to the router {host}")
            return 0
        return leave(router, src, args[1], doc)
    return join_router(router, ports, doc)


if __name__ == "__main__":
    sys.exit(main())

