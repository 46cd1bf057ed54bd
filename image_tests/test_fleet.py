"""fleet: a worker of a fleet (issue 18) registers its instances with the fleet's router at boot and
every 30 s after (inference-join.timer). Here the machine's own vllm-router stands in for the
fleet's router, a real one of the same version: an instance taken out of it with vllm-router's
/remove_worker is back in its /list_workers once inference-join has run with a fleet file naming
it, a second run changes nothing, and the timer is there to run it. The fleet file is removed
afterwards (the machine is no fleet worker)."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from conftest import http

pytestmark = [pytest.mark.suite("fleet"), pytest.mark.serving]


def workers(root: Any, port: int) -> list[str]:
    r = http(root, port, "/list_workers")
    assert r.status == 200, f"vllm-router /list_workers: HTTP {r.status} {r.body[:200]}"
    return sorted(json.loads(r.body)["urls"])


def test_the_join_timer_is_enabled_and_waits_for_a_fleet_file(root: Any, profile: dict[str, Any]) -> None:
    assert root.run("systemctl is-enabled inference-join.timer").stdout.strip() == "enabled"
    assert root.run("systemctl is-active inference-join.timer").stdout.strip() == "active"
    unit = root.run("systemctl cat inference-join.service").stdout
    assert f"ConditionPathExists={profile['paths']['fleet']}" in unit.splitlines(), unit


def test_a_worker_removed_from_the_router_joins_it_again(root: Any, profile: dict[str, Any]) -> None:
    paths, rt = profile["paths"], profile["router"]
    before = workers(root, rt["internal_port"])
    inst = profile["instances"][-1]
    url = f"http://127.0.0.1:{inst['port']}"
    assert url in before, before
    fleet = {"fleet": "test", "role": "worker", "router": f"http://127.0.0.1:{rt['internal_port']}",
             "instance_ports": [i["port"] for i in profile["instances"]]}
    assert not root.file(paths["fleet"]).exists, "this machine already has a fleet file"
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
        # whatever happened above, the router gets its instance back
        http(root, rt["internal_port"], f"/add_worker?url={url}", method="POST")
