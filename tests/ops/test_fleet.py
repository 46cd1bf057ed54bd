"""inference-image fleet: a fleet file's plan (droplets, cost, endpoint, firewalls,
each role's user-data), the DigitalOcean API calls `up` makes, and one clear line for each bad
field. No API is reachable from here: `up`, `status` and `down` run their real pydo client
against a stand-in of DigitalOcean's API (StandinApi, HTTPS on loopback, the few routes they
call), which records the calls. The droplets' side: tests/machine/test_join.py and
image_tests/ops/test_fleet.py."""

from __future__ import annotations

import http.server
import itertools
import json
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from conftest import ROOT

from inference_image import cli
from inference_image.ops import fleet, fleet_api
from inference_image.profiles import ProfileErrors
from inference_image.render import PATHS
from inference_machine import contract

EXAMPLE = ROOT / "docs/examples/fleet-h100x8.yaml"
GROUP = ROOT / "docs/examples/fleet-cpu-2node.yaml"


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
    assert "fleet up (DIGITALOCEAN_TOKEN), fleet status, fleet down --yes" in out


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


def test_up_dry_run_prints_the_calls_in_order(capsys) -> None:
    calls = fleet.api_calls(fleet.plan(fleet.load(EXAMPLE)))
    assert [c[0] for c in calls] == ["droplets.create", "droplets.get", "droplets.create",
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


class StandinApi:
    """A stand-in of DigitalOcean's API (none is reachable here): the routes `fleet` calls, over
    HTTPS (pydo sends its token only over TLS) with a certificate made for the test. A droplet is
    "new" at its first read and active, with a private and a public address, from the second;
    `fail` maps "METHOD /path" to an HTTP status answered once, as the API answers an error."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.droplets: dict[int, dict[str, Any]] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.fail: dict[str, int] = {}
        # "METHOD /path" -> what that route answers instead, once (a misbehaving API)
        self.mangle: dict[str, Any] = {}
        self.dribble: set[str] = set()  # routes whose answer comes a byte a second
        self.raw: dict[str, bytes] = {}  # "METHOD /path" -> a body sent as it is, once
        self.reads: dict[int, int] = {}
        self.active_after = 2  # a droplet is active from its this-many-th read
        ids = itertools.count(1001)
        api = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _send(self, code: int, doc: Any = None) -> None:
                key = f"{self.command} {urlparse(self.path).path}"
                if key in api.mangle:
                    doc = api.mangle.pop(key)
                b = json.dumps(doc).encode() if doc is not None else b""
                if key in api.raw:
                    b = api.raw.pop(key)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                if key in api.dribble:
                    for i in range(len(b)):
                        self.wfile.write(b[i:i + 1])
                        self.wfile.flush()
                        time.sleep(1)
                    return
                self.wfile.write(b)

            def _route(self, method: str) -> None:
                assert self.headers["Authorization"] == "Bearer dop_v1_standin"
                u = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(u.query).items()}
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                api.calls.append((method, u.path, body if body is not None else q))
                if (code := api.fail.pop(f"{method} {u.path}", None)) is not None:
                    return self._send(code, {"id": "unprocessable_entity", "message": "stand-in says no"})
                if (method, u.path) == ("POST", "/v2/droplets"):
                    made = [api.droplets.setdefault(i, {"id": i, "name": name, "status": "new",
                                                        "tags": body["tags"], "networks": {"v4": []}})
                            for name, i in zip(body["names"], ids, strict=False)]
                    return self._send(202, {"droplets": made})
                if (method, u.path) == ("GET", "/v2/droplets"):
                    ds = [d for d in api.droplets.values() if q.get("tag_name") in d["tags"]]
                    return self._send(200, {"droplets": ds, "links": {}, "meta": {"total": len(ds)}})
                if (method, u.path) == ("DELETE", "/v2/droplets"):
                    for i in [i for i, d in api.droplets.items() if q["tag_name"] in d["tags"]]:
                        del api.droplets[i]
                    return self._send(204)
                if method == "GET" and u.path.startswith("/v2/droplets/"):
                    d = api.droplets[int(u.path.rsplit("/", 1)[1])]
                    api.reads[d["id"]] = api.reads.get(d["id"], 0) + 1
                    if api.reads[d["id"]] >= api.active_after:
                        d["status"] = "active"
                        d["networks"]["v4"] = [
                            {"ip_address": f"10.10.0.{d['id'] - 1000 + 1}", "type": "private"},
                            {"ip_address": f"203.0.113.{d['id'] - 1000}", "type": "public"}]
                    return self._send(200, {"droplet": d})
                if (method, u.path) == ("GET", "/v2/vpcs"):
                    vpcs = [{"id": "5a4981aa-9653-4bd1-bef5-d6bff28cbd9b", "region": "tor1",
                             "default": True, "ip_range": "10.10.0.0/20"},
                            {"id": "0b1e1c33-0000-4bd1-bef5-d6bff28cbd9b", "region": "tor1",
                             "default": False, "ip_range": "10.20.0.0/20"}]
                    return self._send(200, {"vpcs": vpcs, "links": {}, "meta": {"total": 2}})
                if (method, u.path) == ("POST", "/v2/firewalls"):
                    fw = {**body, "id": f"fw-{len(api.firewalls) + 1}", "status": "succeeded"}
                    api.firewalls[fw["id"]] = fw
                    return self._send(202, {"firewall": fw})
                if (method, u.path) == ("GET", "/v2/firewalls"):
                    return self._send(200, {"firewalls": list(api.firewalls.values()), "links": {},
                                            "meta": {"total": len(api.firewalls)}})
                if method == "DELETE" and u.path.startswith("/v2/firewalls/"):
                    api.firewalls.pop(u.path.rsplit("/", 1)[1])
                    return self._send(204)
                return self._send(404, {"id": "not_found", "message": f"{method} {u.path}"})

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.srv.server_address[1]}"

    def made(self) -> list[str]:
        return [f"{m} {p}" for m, p, _ in self.calls if m != "GET"]


@pytest.fixture(scope="module")
def api_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("api")
    cert, key = d / "api.pem", d / "api.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture
def api(api_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[StandinApi]:
    cert, key = api_cert
    a = StandinApi(cert, key)
    monkeypatch.setenv("DIGITALOCEAN_API_URL", a.url)
    monkeypatch.setenv("DIGITALOCEAN_TOKEN", "dop_v1_standin")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # pydo's transport (requests) trusts it
    monkeypatch.setattr(fleet, "POLL_S", 0.01)
    yield a
    a.srv.shutdown()
    a.srv.server_close()


def test_up_makes_the_router_then_workers_that_name_it_then_the_firewalls(api: StandinApi,
                                                                          capsys) -> None:
    assert cli.main(["fleet", "up", str(EXAMPLE)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert api.made() == ["POST /v2/droplets", "POST /v2/droplets", "POST /v2/firewalls",
                          "POST /v2/firewalls"]
    router_body, workers_body = (b for m, p, b in api.calls if (m, p) == ("POST", "/v2/droplets"))
    assert router_body["names"] == ["llama70b-router"]
    assert workers_body["names"] == [f"llama70b-worker-{i}" for i in range(1, 5)]
    # the workers' user-data names the router's private address, read once it was active
    ud = yaml.safe_load(workers_body["user_data"])["write_files"][0]
    assert json.loads(ud["content"])["router"] == "http://10.10.0.2:8001"
    want = [c[1].get("body") for c in fleet.api_calls(fleet.plan(fleet.load(EXAMPLE)), "10.10.0.2")]
    assert workers_body == want[2] and router_body == want[0]
    assert [b["name"] for m, p, b in api.calls if p == "/v2/firewalls" and m == "POST"] == \
        ["llama70b-edge", "llama70b-workers"]
    assert "endpoint https://203.0.113.1:8000 once the workers have joined" in out
    # a second `up` of the same fleet is refused, naming what is there
    assert cli.main(["fleet", "up", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fleet llama70b has droplets already (llama70b-router, " in err[0]
    assert len(api.made()) == 4


def test_status_then_down_removes_every_droplet_and_firewall(api: StandinApi, capsys) -> None:
    assert cli.main(["fleet", "up", str(EXAMPLE)]) == 0
    capsys.readouterr()
    assert cli.main(["fleet", "status", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "fleet llama70b: 5 droplet(s), nyc2"
    assert out[2].split() == ["llama70b-router", "router", "active", "10.10.0.2", "203.0.113.1"]
    assert any(line.split()[:2] == ["llama70b-worker-4", "worker"] for line in out)
    assert "firewalls llama70b-edge, llama70b-workers" in out
    assert cli.main(["fleet", "down", str(EXAMPLE)]) == 1  # without --yes: what would go
    assert "would remove llama70b-router" in capsys.readouterr().err
    assert api.droplets and api.firewalls
    assert cli.main(["fleet", "down", "--yes", str(EXAMPLE)]) == 0
    assert not api.droplets and not api.firewalls
    assert cli.main(["fleet", "status", str(EXAMPLE)]) == 0
    assert "no droplet" in capsys.readouterr().out


def test_an_up_that_fails_part_way_leaves_nothing(api: StandinApi, capsys) -> None:
    api.fail["POST /v2/firewalls"] = 422
    assert cli.main(["fleet", "up", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "DigitalOcean API firewalls.create" in err[0] and "stand-in says no" in err[0]
    assert "what this run had made is removed again" in err[0]
    assert not api.droplets and not api.firewalls
    assert api.made()[-1] == "DELETE /v2/droplets"


def test_a_droplet_never_active_ends_the_wait_and_leaves_nothing(
        api: StandinApi, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet up` asks after a new droplet until READY_S: one never active is one line naming
    it and its status, and what the run made is removed."""
    monkeypatch.setattr(fleet, "READY_S", 0.3)
    api.active_after = 10**9
    assert cli.main(["fleet", "up", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not active with a private address after 0.3 s (status new)" in err[0], err
    assert not api.droplets and not api.firewalls
    assert sum(1 for m, p, _ in api.calls if m == "GET" and p.startswith("/v2/droplets/")) > 2


def test_no_token_is_one_line_naming_it(api: StandinApi, monkeypatch: pytest.MonkeyPatch,
                                        capsys) -> None:
    monkeypatch.delenv("DIGITALOCEAN_TOKEN")
    assert cli.main(["fleet", "up", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: DIGITALOCEAN_TOKEN is not set. Fix: export DIGITALOCEAN_TOKEN=<a token "
                   "with droplet, tag and firewall scopes> (read from the environment only)"]
    assert api.calls == []


# --- a tier whose one instance spans several droplets (serving.nodes) ---------------------------

def test_a_multi_node_tier_plans_a_head_and_its_nodes(capsys) -> None:
    assert cli.main(["fleet", "plan", str(GROUP)]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 24, out
    p = fleet.plan(fleet.load(GROUP))
    assert [(d.name, d.role) for d in p.droplets] == [("tiny2-head", "head"), ("tiny2-node-1", "node")]
    assert "one cpu-2node instance" in out and "over 2 droplets: pipeline parallel 2" in out
    assert "https://<tiny2-head's public IPv4>:8000" in out
    edge, group = p.firewalls
    assert edge["tags"] == ["tiny2-head"] and edge["inbound_rules"] == [
        {"protocol": "tcp", "ports": "8000", "sources": {"addresses": ["0.0.0.0/0", "::/0"]}}]
    assert group["tags"] == ["tiny2-group"]
    assert group["inbound_rules"][0] == {"protocol": "tcp", "ports": "all",
                                         "sources": {"tags": ["tiny2-group"]}}
    assert fleet.tags(p.spec, "node") == ["inference-image-fleet-tiny2", "tiny2-node", "tiny2-group"]
    calls = fleet.api_calls(p)
    assert [c[0] for c in calls] == ["vpcs.list", "droplets.create", "droplets.get",
                                     "droplets.create", "firewalls.create", "firewalls.create"]
    head_ud = yaml.safe_load(calls[1][1]["body"]["user_data"])["write_files"][0]["content"]
    node_ud = yaml.safe_load(calls[3][1]["body"]["user_data"])["write_files"][0]["content"]
    assert json.loads(head_ud) == {"fleet": "tiny2", "role": "head",
                                   "network": "<the VPC's ip_range>"}
    assert json.loads(node_ud) == {"fleet": "tiny2", "role": "node", "rank": 1,
                                   "head": "<the head's private IPv4, once it exists>"}


def test_a_multi_node_fleet_of_several_instances_is_one_line(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "g.yaml"
    spec.write_text(GROUP.read_text().replace("workers: 1", "workers: 2"))
    assert cli.main(["fleet", "plan", str(spec)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "workers: 2, but cpu-2node's instance spans 2 droplets" in err[0]
    assert "Fix: set workers: 1" in err[0]


def test_up_makes_the_head_then_nodes_that_name_it(api: StandinApi, capsys) -> None:
    assert cli.main(["fleet", "up", str(GROUP)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert api.made() == ["POST /v2/droplets", "POST /v2/droplets", "POST /v2/firewalls",
                          "POST /v2/firewalls"]
    head, node = (b for m, p, b in api.calls if (m, p) == ("POST", "/v2/droplets"))
    content = [json.loads(yaml.safe_load(b["user_data"])["write_files"][0]["content"])
               for b in (head, node)]
    # the region's default VPC's range for the head; the head's private address for the node
    assert content == [{"fleet": "tiny2", "role": "head", "network": "10.10.0.0/20"},
                       {"fleet": "tiny2", "role": "node", "rank": 1, "head": "10.10.0.2"}]
    assert "endpoint https://203.0.113.1:8000 once its stages have met" in out
    assert cli.main(["fleet", "status", str(GROUP)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[2].split()[:2] == ["tiny2-head", "head"]
    assert rows[3].split()[:2] == ["tiny2-node-1", "node"]
    assert cli.main(["fleet", "down", "--yes", str(GROUP)]) == 0
    assert not api.droplets and not api.firewalls


def test_a_multi_node_up_that_fails_part_way_leaves_nothing(api: StandinApi, capsys) -> None:
    api.fail["POST /v2/firewalls"] = 422
    assert cli.main(["fleet", "up", str(GROUP)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "what this run had made is removed again" in err[0], err
    assert not api.droplets and not api.firewalls


@pytest.mark.parametrize(("route", "answer", "why"), [
    ("POST /v2/droplets", {"droplet": {}}, "droplets.create: an answer this tool cannot use "
     "(droplets: Field required)"),
    ("POST /v2/droplets", {"droplets": []}, "droplets.create: an answer this tool cannot use "
     "(droplets: List should have at least 1 item"),
    ("POST /v2/droplets", {"droplets": [{"id": 1, "name": "r\x1b[2J"}]},
     "droplets.create: an answer this tool cannot use (droplets.0.name"),
    ("POST /v2/firewalls", {"firewall": {"id": 7}}, "firewalls.create: an answer this tool "
     "cannot use (firewall.id"),
    ("POST /v2/firewalls", [1, 2], "firewalls.create: an answer this tool cannot use"),
])
def test_an_api_answer_without_what_up_reads_is_one_error_and_leaves_nothing(
        api: StandinApi, capsys, route: str, answer: object, why: str) -> None:
    api.mangle[route] = answer
    assert cli.main(["fleet", "up", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0], err
    assert "what this run had made is removed again" in err[0] and "\x1b" not in err[0]
    assert not api.droplets and not api.firewalls


def test_an_api_that_trickles_its_answer_is_given_up_on(api: StandinApi, capsys,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_api, "API_DEADLINE_S", 2.0)
    api.dribble.add("GET /v2/droplets")
    t0 = time.monotonic()
    assert cli.main(["fleet", "status", str(EXAMPLE)]) == 1
    assert time.monotonic() - t0 < 5
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: DigitalOcean API droplets.list: no whole answer within 2 s"], err


NOT_JSON, CANNOT_USE = "an answer that is not JSON it can read", "an answer this tool cannot use"


@pytest.mark.parametrize(("body", "why"), [
    (b'{"droplets": [', NOT_JSON),
    (b'{"droplets": [{"id": 1' + b"9" * 5000 + b'}]}', NOT_JSON),
    (b'\x1b[2J\x1b]0;owned\x07<html>', NOT_JSON),
    (b'{"droplets": NaN, "links": {}, "meta": {"total": 1}}', CANNOT_USE),
    (b'{"droplets": "x", "links": {}, "meta": {"total": 1}}', CANNOT_USE),
    (json.dumps({"droplets": [{"id": 7, "name": "w\x1b[31m-red\x1b]0;owned\x07",
                               "status": "active", "tags": ["llama70b"],
                               "networks": {"v4": []}}], "links": {},
                 "meta": {"total": 1}}).encode(), CANNOT_USE),
], ids=["cut-short", "5000-digits", "html-with-escapes", "nan", "wrong-shape", "escapes-in-name"])
def test_an_api_answer_that_is_no_answer_is_one_line_and_nothing_raw_reaches_the_terminal(
        api: StandinApi, capsys, body: bytes, why: str) -> None:
    """A stand-in API that answers broken JSON, a number of 5,000 digits, an HTML page with
    terminal escapes, NaN, the wrong shape, or a droplet whose name carries escape sequences:
    `fleet status` says what is wrong in one line, never a traceback or a raw ESC or BEL."""
    api.raw["GET /v2/droplets"] = body
    assert cli.main(["fleet", "status", str(EXAMPLE)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "\x1b" not in out + err and "\x07" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and "droplets.list" in lines[0], lines


def test_scrape_config_scrapes_every_droplet_with_its_own_token_and_prometheus_takes_it(
        api: StandinApi, capsys, tmp_path: Path) -> None:
    """`fleet scrape-config` after `fleet up`: a job a droplet, each with that machine's token
    and certificate; the router droplet listed for what it serves (the router and node; its
    droplet is the router tier's size, no GPU), each worker for every target of its tier. Debian's
    promtool takes it. The workers' firewall opens the public port to scrape_from only."""
    import shutil
    import subprocess

    spec = tmp_path / "fleet.yaml"
    spec.write_text(EXAMPLE.read_text() + 'scrape_from: ["198.51.100.0/24"]\n')
    assert cli.main(["fleet", "up", str(spec)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    for d in api.droplets.values():  # the workers are up too by the time one scrapes them
        d["status"] = "active"
        d["networks"]["v4"] = [{"ip_address": f"10.10.0.{d['id'] - 999}", "type": "private"},
                               {"ip_address": f"203.0.113.{d['id'] - 1000}", "type": "public"}]
    assert cli.main(["fleet", "scrape-config", str(spec)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    jobs = yaml.safe_load(out)["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["inference-image-llama70b-router"] + [
        f"inference-image-llama70b-worker-{i}" for i in range(1, 5)]
    router, worker = jobs[0], jobs[1]
    assert [s["labels"]["target"] for s in router["static_configs"]] == ["router", "node",
                                                                        "nginx"]
    assert [s["labels"]["target"] for s in worker["static_configs"]] == [
        "vllm-0", "vllm-1", "vllm-2", "vllm-3", "router", "node", "nginx", "gpu"]
    assert worker["authorization"]["credentials_file"] == \
        "/etc/prometheus/inference-image/llama70b-worker-1/scrape-token"
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package, `make deps`)"
    for j in jobs:  # promtool reads the files a configuration names
        d = Path(j["authorization"]["credentials_file"]).parent
        j["authorization"]["credentials_file"] = str(tmp_path / d.name / "scrape-token")
        if "tls_config" in j:
            j["tls_config"]["ca_file"] = str(tmp_path / d.name / "cert.pem")
        (tmp_path / d.name).mkdir()
        (tmp_path / d.name / "scrape-token").write_text("t\n")
        (tmp_path / d.name / "cert.pem").write_text("")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({"scrape_configs": jobs}))
    check = subprocess.run([promtool, "check", "config", "--syntax-only", str(cfg)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    workers_fw = next(b for m, p, b in api.calls if p == "/v2/firewalls" and m == "POST"
                      and b["name"] == "llama70b-workers")
    assert {"protocol": "tcp", "ports": "8000",
            "sources": {"addresses": ["198.51.100.0/24"]}} in workers_fw["inbound_rules"]


def _fleet_series(api: StandinApi, capsys, tmp_path: Path) -> list[dict[str, str]]:
    """The `up` series a Prometheus run from `fleet scrape-config` stores: a job's static labels
    (the double-underscore ones dropped, as Prometheus drops them), its job and the instance."""
    spec = tmp_path / "fleet.yaml"
    spec.write_text(EXAMPLE.read_text())
    assert cli.main(["fleet", "up", str(spec)]) == 0, capsys.readouterr().err
    for d in api.droplets.values():
        d["status"] = "active"
        d["networks"]["v4"] = [{"ip_address": f"203.0.113.{d['id'] - 1000}", "type": "public"}]
    capsys.readouterr()
    assert cli.main(["fleet", "scrape-config", str(spec)]) == 0
    jobs = yaml.safe_load(capsys.readouterr().out)["scrape_configs"]
    return [{**{k: v for k, v in s["labels"].items() if not k.startswith("__")},
             "job": j["job_name"], "instance": s["targets"][0]}
            for j in jobs for s in j["static_configs"]]


def test_the_shipped_alert_rules_fire_on_the_series_a_fleets_scrape_config_makes(
        api: StandinApi, capsys, tmp_path: Path) -> None:
    """`promtool test rules` on docs/operations/alerts.yml with the `up` series of a fleet scraped
    as `fleet scrape-config` writes it: a worker's instance down fires InferenceTargetDown for it
    alone; every droplet up fires nothing. The rules select the label every job carries, not a job
    name: the same test on rules that select `job="inference-image"` fails."""
    import shutil
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package, `make deps`)"
    series = _fleet_series(api, capsys, tmp_path)
    down = next(s for s in series if s["role"] == "worker" and s["target"] == "vllm-1")
    assert len({s["job"] for s in series}) > 1  # a job a droplet: no one job name to select

    def sel(s: dict[str, str]) -> str:
        return "up{" + ", ".join(f'{k}="{v}"' for k, v in sorted(s.items())) + "}"
    tests = {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": [
        {"interval": "1m",
         "input_series": [{"series": sel(s), "values": "0x10" if s is down else "1x10"}
                          for s in series],
         "alert_rule_test": [
             {"eval_time": "5m", "alertname": "InferenceTargetDown", "exp_alerts": [
                 {"exp_labels": {**down, "severity": "critical"},
                  "exp_annotations": {"summary": f"{down['instance']} {down['target']}: "
                                                 "its metrics do not answer"}}]}]},
        {"interval": "1m",
         "input_series": [{"series": sel(s), "values": "1x10"} for s in series],
         "alert_rule_test": [{"eval_time": "5m", "alertname": "InferenceTargetDown",
                              "exp_alerts": []}]}]}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    shipped = (ROOT / "docs/operations/alerts.yml").read_text()

    def run(rules: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "alerts.yml").write_text(rules)
        return subprocess.run([promtool, "test", "rules", str(tmp_path / "tests.yml")],
                              capture_output=True, text=True, check=False)
    ok = run(shipped)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    label, value = contract.SCRAPE_LABEL
    by_job = shipped.replace(f'up{{{label}="{value}"}}', 'up{job="inference-image"}')
    assert by_job != shipped and run(by_job).returncode != 0


def test_a_scrape_from_that_is_no_network_is_one_line(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "fleet.yaml"
    spec.write_text(EXAMPLE.read_text() + 'scrape_from: ["0.0.0.0/0; rm -rf /"]\n')
    assert cli.main(["fleet", "plan", str(spec)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scrape_from.0" in err[0], err


def test_scrape_config_writes_targets_as_data_and_one_job_a_droplet(
        api: StandinApi, capsys, tmp_path: Path) -> None:
    """What DigitalOcean answers becomes a target by one writer: an IPv6 address in brackets, an
    address that names no machine (0.0.0.0, loopback) no job (said), and two droplets of one name
    two jobs and two folders."""
    spec = tmp_path / "fleet.yaml"
    spec.write_text(EXAMPLE.read_text())
    assert cli.main(["fleet", "up", str(spec)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    publics = iter(["2001:db8::7", "0.0.0.0", "127.0.0.1", "203.0.113.4", "203.0.113.5"])
    for d in sorted(api.droplets.values(), key=lambda d: d["id"]):
        d["status"] = "active"
        d["networks"]["v4"] = [{"ip_address": next(publics), "type": "public"}]
    workers = sorted((d for d in api.droplets.values() if "worker" in d["name"]),
                     key=lambda d: d["id"])
    workers[-1]["name"] = workers[-2]["name"]
    assert cli.main(["fleet", "scrape-config", str(spec)]) == 0
    out, err = capsys.readouterr()
    jobs = yaml.safe_load(out)["scrape_configs"]
    targets = [s["targets"][0] for j in jobs for s in j["static_configs"][:1]]
    assert "[2001:db8::7]:8000" in targets and not any(t.startswith(("0.0.0.0", "127.")) for t in targets)
    assert err.count("names no machine Prometheus can reach") == 2, err
    names = [j["job_name"] for j in jobs]
    assert len(names) == len(set(names)) == 3, names
    folders = {j["authorization"]["credentials_file"] for j in jobs}
    assert len(folders) == 3
