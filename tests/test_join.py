"""inference-join as rendered: how a machine reads its fleet file, and what a worker does with it before
it reaches a router. Joining a real vllm-router, and a router opening its firewall, are checked on the
molecule container (image_tests/test_fleet.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

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
    return subprocess.run([root / PATHS["join"].lstrip("/"), *args],
                          env={"INFERENCE_ROOT": str(root), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
                          capture_output=True, text=True)


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


def test_an_unknown_option_is_refused(machine: Path) -> None:
    r = join(machine, WORKER, "--rol")
    assert r.returncode == 2 and "usage: inference-join [--role | --serves-instances]" in r.stderr


@pytest.mark.parametrize(("fleet", "why"), [
    ("{not json", "not a JSON object"),
    ({"fleet": "f", "role": "boss"}, "'role' is 'boss': write worker or router"),
    ({"role": "worker", "router": "http://10.0.0.2:8001; reboot", "instance_ports": [8100]},
     "'router' is 'http://10.0.0.2:8001; reboot': write http://ROUTER_PRIVATE_IPV4:PORT"),
    ({"role": "worker", "router": "<the router's private IPv4, once it exists>",
      "instance_ports": [8100]}, "'router' is"),
    ({"role": "worker", "router": "http://10.0.0.2:8001", "instance_ports": ["8100"]},
     "'instance_ports' is ['8100']"),
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
    moment it is up); an instance not up is not registered, and the timer tries again. `nft` here
    is a stand-in that records its arguments: the real one is the container's, in
    image_tests/test_fleet.py."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "nft.calls"
    bin_dir.mkdir()
    (bin_dir / "nft").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (bin_dir / "nft").chmod(0o755)
    f = machine / PATHS["fleet"].lstrip("/")
    f.write_text(json.dumps({"role": "worker", "router": "http://127.0.0.1:9",
                             "instance_ports": [9, 19]}))
    # nothing listens on these ports here: the router is never asked
    r = subprocess.run([machine / PATHS["join"].lstrip("/")], capture_output=True, text=True,
                       env={"INFERENCE_ROOT": str(machine),
                            "PATH": f"{bin_dir}:/usr/bin:/bin:/usr/sbin:/sbin"})
    every = LIMITS["join_every_s"]
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"inference-join: http://127.0.0.1:{p} is not healthy yet; next try in {every} s"
        for p in (9, 19)]
    assert calls.read_text() == f"add element inet {FIREWALL_TABLE} fleet_router {{ 127.0.0.1 }}\n"
