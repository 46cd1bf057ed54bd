"""inference-image fleet (issue 18): a fleet file's plan (droplets, cost, endpoint, firewalls,
each role's user-data), the DigitalOcean API calls `up` would make, and one clear line for each
bad field. No API is reachable from here, and `up` makes nothing yet (pydo's calls are printed,
not made): these test the plan and the dry run. The droplets' side: tests/test_join.py and
image_tests/test_fleet.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from inference_image import cli, fleet
from inference_image.profiles import ProfileErrors
from inference_image.render import PATHS

EXAMPLE = ROOT / "docs/examples/fleet-h100x8.yaml"


def _spec(tmp_path: Path, **over: object) -> Path:
    data = {**yaml.safe_load(EXAMPLE.read_text()), **over}
    p = tmp_path / "fleet.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_the_example_plan_fits_one_screen_and_prices_every_droplet(capsys) -> None:
    assert cli.main(["fleet", "plan", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 200, out
    p = fleet.plan(fleet.load(EXAMPLE))
    # 4 x 8 H100 at the tier's $2.99/GPU-hour, and the router on the cpu tier's droplet
    assert [d.size for d in p.droplets] == ["s-4vcpu-16gb-amd"] + ["gpu-h100x8-640gb"] * 4
    assert p.usd_per_hour == pytest.approx(0.125 + 4 * 8 * 2.99)
    assert "total" in out and "95.81" in out and "16 instances (4 workers x 4)" in out
    assert "https://<llama70b-router's public IPv4>:8000" in out
    edge, workers = p.firewalls
    assert edge["tags"] == ["llama70b-router"] and edge["inbound_rules"][0]["ports"] == "8000"
    # vllm-router's own port, for the workers' add-worker calls only
    assert edge["inbound_rules"][1] == {"protocol": "tcp", "ports": "8001",
                                        "sources": {"tags": ["llama70b-worker"]}}
    assert workers["inbound_rules"][0] == {"protocol": "tcp", "ports": "8100-8103",
                                           "sources": {"tags": ["llama70b-router"]}}
    assert "not built yet" in out


def test_user_data_is_cloud_config_naming_the_role_and_the_router_to_join() -> None:
    """The router knows no worker up front; each worker is told the router's private address
    and its own instance ports, so that it can join (and join again after a restart)."""
    p = fleet.plan(fleet.load(EXAMPLE))
    ud = fleet.user_data(p, "worker", "10.10.0.2")
    assert ud.startswith("#cloud-config\n")
    (f,) = yaml.safe_load(ud)["write_files"]
    assert f["path"] == PATHS["fleet"]
    assert json.loads(f["content"]) == {"fleet": "llama70b", "role": "worker",
                                        "router": "http://10.10.0.2:8001",
                                        "instance_ports": [8100, 8101, 8102, 8103]}
    assert json.loads(yaml.safe_load(fleet.user_data(p, "router"))["write_files"][0]["content"]) \
        == {"fleet": "llama70b", "role": "router", "worker_tag": "llama70b-worker"}


def test_up_dry_run_prints_the_calls_in_order_and_up_makes_nothing_yet(capsys) -> None:
    calls = fleet.api_calls(fleet.plan(fleet.load(EXAMPLE)))
    assert [c[0] for c in calls] == ["droplets.create", "droplets.list", "droplets.create",
                                     "firewalls.create", "firewalls.create"]
    assert calls[0][1]["body"]["names"] == ["llama70b-router"]
    assert calls[0][1]["body"]["size"] == "s-4vcpu-16gb-amd"
    workers = calls[2][1]["body"]
    assert workers["names"] == [f"llama70b-worker-{i}" for i in range(1, 5)]
    assert workers["image"] == 123456789 and workers["region"] == "nyc2"
    assert workers["tags"] == ["inference-image-fleet-llama70b", "llama70b-worker"]
    assert "vpc_uuid" not in workers and "ssh_keys" not in workers
    assert cli.main(["fleet", "up", "--dry-run", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.count("client.") == 5
    assert cli.main(["fleet", "up", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not call DigitalOcean's API itself yet" in err[0]


def test_snapshot_from_the_builds_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"builds": [{"builder_type": "qemu", "artifact_id": "x"},
                                               {"builder_type": "digitalocean",
                                                "artifact_id": "nyc2,sfo3:987654"}]}))
    p = fleet.plan(fleet.load(_spec(tmp_path, snapshot="manifest.json")), tmp_path)
    assert p.snapshot_id == 987654 and p.snapshot_source == str(manifest)
    with pytest.raises(fleet.FleetError, match="987654 is in nyc2,sfo3, the fleet is in tor1"):
        fleet.plan(fleet.load(_spec(tmp_path, snapshot="manifest.json", region="tor1")), tmp_path)
    manifest.write_text(json.dumps({"builds": [{"builder_type": "qemu", "artifact_id": "x"}]}))
    with pytest.raises(fleet.FleetError, match="names no DigitalOcean build"):
        fleet.plan(fleet.load(_spec(tmp_path, snapshot="manifest.json")), tmp_path)


@pytest.mark.parametrize(("over", "field"), [
    ({"workers": 0}, "workers"),
    ({"name": "Llama 70B"}, "name"),
    ({"tiers": "h100"}, "tiers"),
    ({"vpc_uuid": "not-a-uuid"}, "vpc_uuid"),
    ({"snapshot": "$(reboot)"}, "snapshot"),
    ({"ssh_keys": ["ssh-ed25519 AAAA"]}, "ssh_keys.0"),
])
def test_a_bad_field_is_one_line_naming_it(tmp_path: Path, capsys, over: dict[str, object],
                                           field: str) -> None:
    path = _spec(tmp_path, **over)
    with pytest.raises(ProfileErrors):
        fleet.load(path)
    assert cli.main(["fleet", "plan", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f": {field}: " in err[0] and str(path) in err[0], err


def test_an_unknown_tier_or_a_missing_file_is_one_line(tmp_path: Path, capsys) -> None:
    assert cli.main(["fleet", "plan", str(_spec(tmp_path, tier="h900"))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "h900" in err[0]
    assert cli.main(["fleet", "plan", str(tmp_path / "none.yaml")]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
