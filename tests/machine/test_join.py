"""inference-join as rendered: how a machine reads its fleet file, and what a worker does with it before
it reaches a router. Joining a real vllm-router, and a router opening its firewall, are checked on the
molecule container (image_tests/ops/test_fleet.py)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import runtime

from inference_image.profiles import resolve
from inference_image.render import FIREWALL_TABLE, LIMITS, PATHS, render


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("machine")
    render(resolve("cpu"), root)
    return root


def join(root: Path, fleet: object | None, *args: str) -> subprocess.CompletedProcess[str]:
    f = root / PATHS["fleet"].lstrip("/")
    f.unlink(missing_ok=True)
    if fleet is not None:
        f.write_text(fleet if isinstance(fleet, str) else json.dumps(fleet))
    return subprocess.run([*runtime("inference-join"), *args],
                          env={"INFERENCE_ROOT": str(root), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
                          capture_output=True, text=True)


def join_recording_nft(root: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """inference-join with the fleet file as it is and an `nft` stand-in that records its
    arguments (the real one is the container's, in image_tests/ops/test_fleet.py): the run, the record."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "nft.calls"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nft").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (bin_dir / "nft").chmod(0o755)
    r = subprocess.run(runtime("inference-join"), capture_output=True, text=True,
                       env={"INFERENCE_ROOT": str(root),
                            "PATH": f"{bin_dir}:/usr/bin:/bin:/usr/sbin:/sbin"})
    return r, calls


WORKER = {"fleet": "f", "role": "worker", "router": "http://10.0.0.2:8001", "instance_ports": [8100]}
ROUTER = {"fleet": "f", "role": "router", "worker_tag": "f-worker"}


def test_a_machine_with_no_fleet_file_does_nothing(machine: Path) -> None:
    r = join(machine, None)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@pytest.mark.parametrize(("fleet", "role", "serves"), [
    (None, "none", 0), (WORKER, "worker", 0), (ROUTER, "router", 1), ("{not json", "none", 0),
    ({"fleet": "f", "role": "boss"}, "none", 0),
])
def test_the_role_is_read_in_one_place_and_a_bad_file_serves_alone(
        machine: Path, fleet: object, role: str, serves: int) -> None:
    """inference-run asks --role (which unit, which address); the instances' ExecCondition asks
    --serves-instances (exit 1 only on a router, so a file it cannot use never stops a model)."""
    r = join(machine, fleet, "--role")
    assert (r.returncode, r.stdout) == (0, role + "\n"), r.stderr
    assert (r.stderr != "") == (role == "none" and fleet is not None)
    assert join(machine, fleet, "--serves-instances").returncode == serves
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [("--rol",), ("--leave",), ("--leave", "8100; reboot")])
def test_an_unknown_option_is_refused(machine: Path, args: tuple[str, ...]) -> None:
    r = join(machine, WORKER, *args)
    assert r.returncode == 2, r.stderr
    assert "usage: inference-join [--role | --serves-instances | --group | --open-group | --leave PORT]" \
        in r.stderr


@pytest.mark.parametrize(("fleet", "why"), [
    ("{not json", "not a JSON object"),
    ({"fleet": "f", "role": "boss"}, "'role' is 'boss', not a role. Fix: write worker, router, head or node"),
    ({"role": "worker", "router": "http://10.0.0.2:8001; reboot", "instance_ports": [8100]},
     "'router' is 'http://10.0.0.2:8001; reboot', not the router's private address"),
    ({"role": "worker", "router": "<the router's private IPv4, once it exists>",
      "instance_ports": [8100]}, "'router' is"),
    ({"role": "worker", "router": "http://10.0.0.2:8001", "instance_ports": ["8100"]},
     "'instance_ports' is ['8100']"),
    # typed: a boolean is no port, nor an address out of range or on the internet
    ({"role": "worker", "router": "http://10.0.0.2:8001", "instance_ports": [True]},
     "'instance_ports' is [True]"),
    ({"role": "worker", "router": "http://10.0.0.2:8001", "instance_ports": 8100},
     "'instance_ports' is 8100"),
    ({"role": "worker", "router": "http://999.1.1.1:8001", "instance_ports": [8100]},
     "'router' is 'http://999.1.1.1:8001'"),
    ({"role": "worker", "router": "http://8.8.8.8:8001", "instance_ports": [8100]},
     "'router' is 'http://8.8.8.8:8001'"),
    ({"role": "worker", "router": "http://10.0.0.2:0", "instance_ports": [8100]},
     "'router' is 'http://10.0.0.2:0'"),
    ({"role": "worker", "router": ["http://10.0.0.2:8001"], "instance_ports": [8100]},
     "'router' is ['http://10.0.0.2:8001']"),
    ("[1, 2]", "not a JSON object"),
])
def test_a_fleet_file_it_cannot_use_is_one_error_naming_the_field(machine: Path, fleet: object,
                                                                 why: str) -> None:
    r = join(machine, fleet)
    assert r.returncode == 1 and why in r.stderr, r.stderr
    assert "this machine serves alone. Fix: write it as `inference-image fleet up --dry-run` shows" \
        in r.stderr
    assert "Traceback" not in r.stderr


def test_an_instance_not_up_yet_is_left_for_the_next_run(machine: Path, tmp_path: Path) -> None:
    """The router is let through the firewall first (its health checks then find an instance the
    moment it is up); an instance not up is not registered, and the timer tries again."""
    f = machine / PATHS["fleet"].lstrip("/")
    f.write_text(json.dumps({"role": "worker", "router": "http://127.0.0.1:9",
                             "instance_ports": [9, 19]}))
    # nothing listens on these ports here: the router is never asked
    r, calls = join_recording_nft(machine, tmp_path)
    every = LIMITS["join_every_s"]
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"inference-join: http://127.0.0.1:{p} is not healthy yet; next try in {every} s"
        for p in (9, 19)]
    assert calls.read_text() == f"add element inet {FIREWALL_TABLE} fleet_router {{ 127.0.0.1 }}\n"


class Standin:
    """A stand-in for the fleet's vllm-router (what it was asked) and for one instance, whose
    vLLM gauges read `running` requests until `busy_until` (time.monotonic())."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.busy_until = 0.0
        self.answer = (200, "Successfully removed worker")  # what a POST gets
        standin = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _send(self, body: str, status: int = 200) -> None:
                b = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def do_POST(self) -> None:
                standin.calls.append(self.path)
                self._send(standin.answer[1], standin.answer[0])

            def do_GET(self) -> None:
                n = 1 if time.monotonic() < standin.busy_until else 0
                self._send('# TYPE vllm:num_requests_running gauge\n'
                           f'vllm:num_requests_running{{engine="0",model_name="m"}} {n}.0\n'
                           'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
                           'vllm:num_requests_running_total 7.0\n')

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


@pytest.fixture
def standin() -> Iterator[Standin]:
    s = Standin()
    yield s
    s.srv.shutdown()
    s.srv.server_close()


def test_a_leaving_instance_is_removed_from_the_router_and_drained(machine: Path, standin: Standin,
                                                                   tmp_path: Path) -> None:
    """A worker's instance being stopped (its unit's ExecStop): the router removes it first, then
    the stop waits until vLLM's gauges read no request running or waiting, so none is aborted.
    One stand-in plays both the router and the instance (the router's address and the instance's
    are both 127.0.0.1 here)."""
    fleet = {**WORKER, "router": f"http://127.0.0.1:{standin.port}",
             "instance_ports": [standin.port]}
    standin.busy_until = time.monotonic() + 2
    t0 = time.monotonic()
    r = join(machine, fleet, "--leave", str(standin.port))
    took = time.monotonic() - t0
    url = f"http://127.0.0.1:{standin.port}"
    assert r.returncode == 0, r.stderr
    assert standin.calls == [f"/remove_worker?url={url}"]
    assert r.stdout.splitlines()[0] == f"inference-join: {url} left http://127.0.0.1:{standin.port}; draining"
    assert r.stdout.splitlines()[-1].startswith(f"inference-join: {url} drained in ")
    assert took >= 2, f"returned after {took:.1f} s while a request was still running"
    # until it starts again, a join (the timer, during the drain) does not add it back
    marker = machine / PATHS["leaving"].lstrip("/") / str(standin.port)
    assert marker.exists()
    standin.calls.clear()
    again, _ = join_recording_nft(machine, tmp_path)
    assert again.returncode == 0 and standin.calls == [], (again.stdout, again.stderr)
    assert f"{url} is leaving (stopping); it joins again once it has started" in again.stdout


def test_the_drain_fits_in_the_stop_timeout_systemd_gives_it() -> None:
    """systemd ends an ExecStop at TimeoutStopSec: the router call (3 s) plus the drain, polled
    at most 1500 ms past its end, must fit, or a drain would be cut where the leave said it waits."""
    assert 3 + LIMITS["drain_s"] + 1.5 < LIMITS["stop_timeout_s"]


def test_a_leave_that_cannot_reach_the_router_or_the_instance_lets_the_stop_go_on(
        machine: Path, standin: Standin) -> None:
    port = standin.port
    standin.srv.shutdown()
    standin.srv.server_close()  # nothing listens there now: neither router nor instance answers
    r = join(machine, {**WORKER, "router": f"http://127.0.0.1:{port}"}, "--leave", str(port))
    assert r.returncode == 0, r.stderr
    assert f"http://127.0.0.1:{port} did not remove http://127.0.0.1:{port}" in r.stderr
    assert r.stdout.strip().endswith("does not answer: nothing to drain")


@pytest.mark.parametrize("fleet", [None, ROUTER, "{not json"])
def test_leave_does_nothing_off_a_worker(machine: Path, fleet: object) -> None:
    r = join(machine, fleet, "--leave", "8100")
    assert r.returncode == 0 and r.stdout == "", r.stderr


def test_an_instance_stop_leaves_through_its_own_port(machine: Path, standin: Standin,
                                                      tmp_path: Path) -> None:
    """vllm@'s ExecStop is `inference-run --leave UNIT`: the port the router knows the instance by
    is the one its rendered command line serves on."""
    f = machine / PATHS["fleet"].lstrip("/")
    f.write_text(json.dumps({**WORKER, "router": f"http://127.0.0.1:{standin.port}"}))
    run = runtime("inference-run")[0]
    env = {"INFERENCE_ROOT": str(machine), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    r = subprocess.run([run, "--leave", "vllm-1"], env=env, capture_output=True, text=True)
    port = resolve("cpu").instances[1].port
    assert r.returncode == 0, r.stderr
    assert standin.calls == [f"/remove_worker?url=http://127.0.0.1:{port}"]
    marker = machine / PATHS["leaving"].lstrip("/") / str(port)
    assert marker.exists()
    # its next start clears it (`true` stands in for the instance's Python: nothing is served)
    start = subprocess.run([run, "vllm-1"], capture_output=True, text=True,
                           env={**env, "INFERENCE_PYTHON": "true", "TMPDIR": str(tmp_path)})
    assert start.returncode == 0, start.stderr
    assert not marker.exists()
    f.unlink()
    r = subprocess.run([run, "--leave", "vllm-1"], env=env, capture_output=True, text=True)
    assert (r.returncode, r.stdout, r.stderr, len(standin.calls)) == (0, "", "", 1)


def test_what_a_router_answers_is_printed_without_its_control_characters(
        machine: Path, standin: Standin, tmp_path: Path) -> None:
    """A router's error body reaches the journal and a terminal: its escape sequences do not."""
    (machine / PATHS["fleet"].lstrip("/")).write_text(json.dumps(
        {**WORKER, "router": f"http://127.0.0.1:{standin.port}", "instance_ports": [standin.port]}))
    (machine / PATHS["leaving"].lstrip("/") / str(standin.port)).unlink(missing_ok=True)
    standin.answer = (500, "\x1b]0;owned\x07bad\x1b[2J request\r\n")
    r, _ = join_recording_nft(machine, tmp_path)
    assert r.returncode == 1
    assert "did not add" in r.stderr and "bad" in r.stderr and "request" in r.stderr
    assert not any(ch in r.stderr for ch in "\x1b\x07\r"), repr(r.stderr)


@pytest.mark.parametrize("kind", ["fifo", "huge", "directory"])
def test_the_fleet_file_is_read_bounded_by_its_one_reader(tmp_path: Path, kind: str) -> None:
    """inference-join's reading is inference_machine.fleetfile: a FIFO, a huge file or a
    folder written where the fleet file belongs is one error, never a hang."""
    from inference_machine.fleetfile import FleetFileError, role_line
    f = tmp_path / "fleet.json"
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "huge":
        f.write_text(json.dumps({**WORKER, "pad": "x" * 2**20}))
    else:
        f.mkdir()
    with pytest.raises(FleetFileError, match=str(f)):
        role_line(f, "join", 1)
    f2 = tmp_path / "ok.json"
    f2.write_text(json.dumps(WORKER))
    assert role_line(f2, "join", 1) == "worker http://10.0.0.2:8001 8100"


def test_a_router_lets_workers_in_only_from_a_fleet_network(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet router opens vllm-router's port to the networks of its addresses: a VPC's, never
    its public interface's nor a private one larger than a VPC."""
    import ipaddress

    from inference_machine import fleetfile
    monkeypatch.setattr(fleetfile, "addresses", lambda: [
        ("eth0", ipaddress.IPv4Interface("203.0.113.7/20")),
        ("eth1", ipaddress.IPv4Interface("10.110.0.5/20")),
        ("eth2", ipaddress.IPv4Interface("10.7.0.1/8")),
        ("eth3", ipaddress.IPv4Interface("100.64.0.9/10"))])
    f = tmp_path / "fleet.json"
    f.write_text(json.dumps(ROUTER))
    assert fleetfile.role_line(f, "join", 1) == "router 10.110.0.0/20"
