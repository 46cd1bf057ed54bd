"""fleet: a worker of a fleet registers its instances with the fleet's router at boot and
every 15 s after (inference-join.timer). Here the machine's own vllm-router stands in for the
fleet's router, a real one of the same version: an instance taken out of it with vllm-router's
/remove_worker is back in its /list_workers once inference-join has run with a fleet file naming
it, a second run changes nothing, and the timer is there to run it. A router's fleet file opens
vllm-router's port to the machine's private networks, skips its instances and restarts vllm-router
with no worker. The fleet file is removed afterwards (the machine is in no fleet)."""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import time
from typing import Any

import pytest
from conftest import http, listen_addresses, own_router_worker_fleet

from inference_image.render import FIREWALL_TABLE

pytestmark = pytest.mark.serving


def workers(root: Any, port: int) -> list[str]:
    r = http(root, port, "/list_workers")
    assert r.status == 200, f"vllm-router /list_workers: HTTP {r.status} {r.body[:200]}"
    return sorted(json.loads(r.body)["urls"])


def test_the_join_timer_is_enabled_and_waits_for_a_fleet_file(root: Any, profile: dict[str, Any]) -> None:
    assert root.run("systemctl is-enabled inference-join.timer").stdout.strip() == "enabled"
    assert root.run("systemctl is-active inference-join.timer").stdout.strip() == "active"
    unit = root.run("systemctl cat inference-join.service").stdout
    assert f"ConditionPathExists={profile['paths']['fleet']}" in unit.splitlines(), unit


def test_a_worker_removed_from_the_router_joins_it_again(root: Any, profile: dict[str, Any],
                                                        record_property: Any) -> None:
    paths, rt = profile["paths"], profile["router"]
    # Once in about ten runs of the suites after the faults suite's reboot (make test here, and
    # likely CI's failure), vllm-router did not listen at this point (connection refused); the
    # cause is not found yet. This test is about the join, so it waits for the router, and says
    # how long it waited and how often systemd had restarted it, where the report shows it.
    t0 = time.monotonic()
    up = _eventually(lambda: _workers_or_none(root, rt["internal_port"]) is not None)
    record_property("router_wait_s", round(time.monotonic() - t0, 1))
    record_property("router_restarts", root.run(
        "systemctl show -p NRestarts,ActiveEnterTimestamp vllm-router").stdout.split())
    assert up, "vllm-router did not listen within 60 s: " + root.run(
        "journalctl -u vllm-router -n 20 --no-pager -o cat").stdout[-1500:]
    before = workers(root, rt["internal_port"])
    inst = profile["instances"][-1]
    url = f"http://127.0.0.1:{inst['port']}"
    assert url in before, before
    fleet = own_router_worker_fleet(profile)
    assert not root.file(paths["fleet"]).exists, "this machine already has a fleet file"
    _timer_off(root)
    try:
        root.run_test(f"printf %s {shlex.quote(json.dumps(fleet))} > {paths['fleet']}")
        gone = http(root, rt["internal_port"], f"/remove_worker?url={url}", method="POST")
        assert gone.status == 200 and url not in workers(root, rt["internal_port"]), gone.body
        first = root.run(paths["join"])
        assert first.rc == 0, first.stderr
        assert f"{url} joined" in first.stdout, first.stdout
        assert workers(root, rt["internal_port"]) == before
        again = root.run(paths["join"])
        assert again.rc == 0 and again.stdout == "", (again.stdout, again.stderr)
    finally:
        root.run(f"rm -f {paths['fleet']}")
        root.run("systemctl start inference-join.timer")
        # whatever happened above, the router gets its instance back
        http(root, rt["internal_port"], f"/add_worker?url={url}", method="POST")


def test_a_fleet_router_opens_its_router_port_to_its_private_networks_only(
        root: Any, profile: dict[str, Any]) -> None:
    """With a router's fleet file: inference-join puts the machine's private networks in the
    firewall's fleet_workers set (the one rule that reaches vllm-router's port), the instances'
    ExecCondition says skip, and vllm-router restarts as router-fleet: every address, no worker
    until one joins. Then the machine is put back as it was (file gone, router restarted)."""
    paths, rt = profile["paths"], profile["router"]
    fleet = {"fleet": "test", "role": "router", "worker_tag": "test-worker"}
    assert not root.file(paths["fleet"]).exists, "this machine already has a fleet file"
    _timer_off(root)
    try:
        root.run_test(f"printf %s {shlex.quote(json.dumps(fleet))} > {paths['fleet']}")
        # the instances' ExecCondition, as systemd runs it (as the service user)
        assert f"ExecCondition={paths['join']} --serves-instances" in root.run(
            "systemctl cat vllm@vllm-0.service").stdout.splitlines()
        skip = root.run(f"runuser -u {profile['service_user']} -- {paths['join']} --serves-instances")
        assert skip.rc == 1, (skip.stdout, skip.stderr)
        first = root.run(paths["join"])
        assert first.rc == 0 and "may join this router" in first.stdout, (first.stdout, first.stderr)
        addr = root.run("ip -o -4 addr show scope global").stdout
        want = sorted({str(ipaddress.ip_interface(a).network)
                       for a in re.findall(r" inet ([0-9./]+)", addr)
                       if ipaddress.ip_interface(a).ip.is_private})
        assert want, f"the container has no private address: {addr}"
        assert first.stdout.splitlines() == [
            f"inference-join: workers on {n} may join this router (port {rt['internal_port']})"
            for n in want], first.stdout
        in_set = root.run(f"nft list set inet {FIREWALL_TABLE} fleet_workers").stdout
        assert all(n in in_set for n in want), in_set
        assert root.run(paths["join"]).stdout == "", "a second run must change nothing"
        root.run_test("systemctl restart vllm-router")

        # where it listens, not its argv: the router retitles itself (setproctitle) once it runs,
        # so /proc's cmdline says "vllm::router" or the flags depending on when it is read
        assert _eventually(lambda: listen_addresses(root, rt["internal_port"]) == {"0.0.0.0"}), \
            listen_addresses(root, rt["internal_port"])
        # (connection refused until the restarted router listens: _workers_or_none waits for it)
        assert _eventually(lambda: _workers_or_none(root, rt["internal_port"]) is not None)
        assert workers(root, rt["internal_port"]) == []
    finally:
        root.run(f"rm -f {paths['fleet']}")
        root.run("systemctl start inference-join.timer")
        root.run(f"nft flush set inet {FIREWALL_TABLE} fleet_workers")
        root.run("systemctl restart vllm-router")
    want = sorted(f"http://127.0.0.1:{i['port']}" for i in profile["instances"])
    assert _eventually(lambda: _workers_or_none(root, rt["internal_port"]) == want
                       and http(root, rt["internal_port"], "/v1/models", timeout=5).status == 200), \
        "vllm-router did not come back serving the machine's own instances"
    assert listen_addresses(root, rt["internal_port"]) == {"127.0.0.1"}, "the router kept every address"


def _timer_off(root: Any) -> None:
    """The join timer stopped while a test writes a fleet file and runs inference-join itself: a
    timer run in between (every 15 s once the file exists) would do the join first, and the
    test's own run would find nothing left to do (seen: 2 runs in about 16 of the router test)."""
    root.run_test("systemctl stop inference-join.timer inference-join.service")


def _workers_or_none(root: Any, port: int) -> list[str] | None:
    """workers(), or None while the router does not answer yet (a restart)."""
    up = root.run(f"curl -s -o /dev/null -m 5 http://127.0.0.1:{port}/health").rc == 0
    return workers(root, port) if up else None


def _eventually(check: Any, seconds: float = 60) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(1)
    return False
