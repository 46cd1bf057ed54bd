"""An instance over several nodes (serving.nodes) served on one multi-GPU machine, as the image's
droplets would serve it: each node is a copy of the render with its own fleet file (the head's
names the network, a node's its rank and the head's address), started by the render's own
`inference-run`, which asks the render's `inference-join --group` for the rank, the addresses
and the interface, exactly as on a droplet. Node k takes the k-th block of the machine's GPUs.
The stages meet over this machine's own address, so the link between them is faster than a VPC's:
what a run here measures is the layout's cost on the GPUs, not the network's."""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from inference_machine.contract import ENV

from .proof_machine import runtime

STANDIN_BIN = Path(__file__).resolve().parent / "standin" / "bin"


class NodesError(Exception):
    """A machine on which the nodes cannot meet, with the fix."""


@dataclass(frozen=True)
class Node:
    rank: int
    root: Path
    gpus: tuple[int, ...]

    def runner(self, unit: str) -> list[str]:
        return runtime("run", unit)

    def env(self) -> dict[str, str]:
        gpus = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus)} if self.gpus else {}
        return {ENV.root: str(self.root), **gpus}


def host_address() -> tuple[str, str]:
    """This machine's first global IPv4 address and its network, as `inference-join` finds them
    (`ip -o -4 addr show scope global`)."""
    ip = shutil.which("ip") or str(STANDIN_BIN / "ip")
    out = subprocess.run([ip, "-o", "-4", "addr", "show", "scope", "global"], capture_output=True,
                         text=True, check=False).stdout
    found = re.findall(r"^\d+: (\S+)\s+inet ([0-9./]+)", out, re.M)
    if not found:
        raise NodesError("this machine has no global IPv4 address for the nodes to meet on "
                         "(`ip -o -4 addr show scope global` lists none); run on a machine with one")
    iface = ipaddress.ip_interface(found[0][1])
    return str(iface.ip), str(iface.network)


def prepare(render: Path, nodes: int, gpu_ids: list[int]) -> list[Node]:
    """The head (rank 0, `render` itself) and nodes 1..nodes-1 (copies beside it), each with its
    fleet file; node k on gpu_ids shifted by k blocks. Returns them in rank order."""
    addr, net = host_address()
    block = len(gpu_ids)
    out = []
    for rank in range(nodes):
        root = render if rank == 0 else render.with_name(f"{render.name}-node{rank}")
        if rank:
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(render, root, symlinks=True)
        fleet = ({"role": "head", "network": net} if rank == 0
                 else {"role": "node", "rank": rank, "head": addr})
        (root / "etc/inference-image/fleet.json").write_text(json.dumps(fleet) + "\n")
        out.append(Node(rank, root, tuple(g + rank * block for g in gpu_ids)))
    return out


def vllm_script(where: Path, python: str) -> Path:
    """vLLM's console script for `python` (`vllm serve ...`), written where the wheels lack it."""
    where.mkdir(parents=True, exist_ok=True)
    script = where / "vllm"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} -m vllm.entrypoints.cli.main "$@"\n')
    script.chmod(0o755)
    return script


def path_with_ip(env_path: str) -> str:
    """PATH for the nodes' processes: the stand-in `ip` last, used only where the machine has no
    iproute2 (a container image without it); the image always has the real one."""
    return f"{env_path}:{STANDIN_BIN}" if env_path else str(STANDIN_BIN)
