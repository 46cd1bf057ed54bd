"""A machine's part in a fleet, read from its fleet file (user-data writes it; `inference-image
fleet` makes it): the one reader of that file, for inference-join and, through it, inference-run.
Everything in it is checked before it is used: a head opens every port of the machine to its
`network`, so that must be a private IPv4 network; addresses are private IPv4 addresses, ports
and ranks integers in range."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from .inputs import Refused, fleet_network, printable
from .prepare import read_small

FLEET_FILE_MAX = 64 * 1024


class FleetFileError(Exception):
    """What is wrong with the fleet file, in one line."""


# Python's is_private also holds addresses that are never another machine of the fleet: this
# machine (loopback, 0.0.0.0/8), link-local (the cloud's metadata service at 169.254.169.254),
# multicast and the reserved block
NEVER_A_PEER = tuple(ipaddress.IPv4Network(n) for n in
                     ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4"))


def private_ipv4(text: object) -> ipaddress.IPv4Address | None:
    """An IPv4 address of a private network that another machine of the fleet may have (not
    routed on the internet, none of NEVER_A_PEER), or None."""
    try:
        a = ipaddress.IPv4Address(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return a if a is not None and a.is_private and not any(a in n for n in NEVER_A_PEER) \
        else None


def _is_fleet_network(net: ipaddress.IPv4Network) -> bool:
    try:
        fleet_network(net)
    except Refused:
        return False
    return True


def _loopback(text: str) -> bool:
    try:
        return ipaddress.IPv4Address(text).is_loopback
    except ValueError:
        return False


def addresses() -> list[tuple[str, ipaddress.IPv4Interface]]:
    """(interface, address/prefix) of each global IPv4 address of this machine."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"],
                         capture_output=True, text=True, check=True).stdout
    return [(dev, ipaddress.IPv4Interface(a))
            for dev, a in re.findall(r"^\d+: (\S+)\s+inet ([0-9./]+)", out, re.M)]


def _group(d: dict[str, Any], role: str, nodes: int) -> str:
    if nodes == 1:
        raise FleetFileError(f"'role' is {role!r}, but this image's instance serves on one "
                             "machine (serving.nodes: 1): write worker or router")
    if role == "head":
        # every port of this machine opens to it: a private network no larger than a VPC (none
        # of the machine's public addresses, nobody's on the internet)
        raw = d.get("network")
        try:
            net = fleet_network(raw if isinstance(raw, str) else repr(raw))
        except Refused as exc:
            raise FleetFileError(f"'network' is {printable(repr(raw), 60)}: {exc}") from None
        if net.version != 4:
            raise FleetFileError(f"'network' is {net}, not IPv4: vLLM's nodes meet over IPv4. "
                                 "Fix: write the private IPv4 network the nodes share")
        mine = [(dev, a) for dev, a in addresses() if a.ip in net]
        if not mine:
            raise FleetFileError(f"no address of this machine is in 'network' {net}. Fix: write "
                                 "the network of this machine's private interface")
        rank, head = 0, str(mine[0][1].ip)
    else:
        rank, head = d.get("rank"), d.get("head", "")
        if type(rank) is not int or not 0 < rank < nodes:
            raise FleetFileError(f"'rank' is {printable(repr(rank), 40)}, not a node's place. "
                                 f"Fix: write this node's place, 1 to {nodes - 1}")
        if private_ipv4(head) is None:
            raise FleetFileError(f"'head' is {printable(repr(head), 60)}, not a private IPv4 "
                                 "address of another machine. Fix: write the head's private IPv4 "
                                 "address")
        route = subprocess.run(["ip", "-o", "route", "get", str(head)], capture_output=True,
                               text=True, check=False).stdout
        m = re.search(r" src ([0-9.]+)", route)
        if not m:
            raise FleetFileError(f"no route from this machine to the head {head}. Fix: give the "
                                 "head's address on the network this machine shares with it")
        mine = [(dev, a) for dev, a in addresses() if str(a.ip) == m.group(1)]
        if not mine:
            raise FleetFileError(f"no interface has this machine's address {m.group(1)}")
        # the network this node opens every port to: the one its route to the head leaves by,
        # which must hold the head (a route through a gateway, e.g. the public interface's,
        # would open a network the head is not on) and be a fleet's private network
        net = mine[0][1].network
        if ipaddress.IPv4Address(head) not in net:
            raise FleetFileError(f"the route to the head {head} leaves by {mine[0][0]} "
                                 f"({net}), a network the head is not on: this node opens no "
                                 "network. Fix: give the head's address on the private network "
                                 "both machines share")
        try:
            fleet_network(str(net), f"network of {mine[0][0]}")
        except Refused as exc:
            raise FleetFileError(str(exc)) from None
    dev, a = mine[0]
    return f"{role} {rank} {head} {a.ip} {dev} {a.network}"


def role_line(fleet: Path, mode: str, nodes: int) -> str:
    """One line: ROLE [ROUTER PORT... | NETWORK... | RANK HEAD ADDRESS INTERFACE NETWORK]."""
    try:
        d = json.loads(read_small(fleet, "fleet file", FLEET_FILE_MAX))
    except (ValueError, RecursionError) as exc:
        raise FleetFileError(f"not a JSON object: {exc}") from None
    except Exception as exc:  # BundleError: not a file it can read
        raise FleetFileError(str(exc)) from None
    if not isinstance(d, dict):
        raise FleetFileError(f"not a JSON object: {type(d).__name__}")
    role, router, ports = d.get("role"), d.get("router", ""), d.get("instance_ports", [])
    if role == "router":
        if mode != "join":
            return "router"  # the role alone: the networks are the join's, not every start's
        # the fleet networks of its addresses (a DigitalOcean VPC, a podman net): never a public
        # one, nor a private one larger than a VPC
        return " ".join(["router", *sorted({str(a.network) for _, a in addresses()
                                            if _is_fleet_network(a.network)})])
    if role in ("head", "node"):
        return _group(d, role, nodes)
    if role != "worker":
        raise FleetFileError(f"'role' is {printable(repr(role), 40)}, not a role. Fix: write "
                             "worker, router, head or node")
    m = re.fullmatch(r"http://([0-9.]{7,15}):([0-9]{1,5})", router) \
        if isinstance(router, str) else None
    # the router is a private address of the fleet's network, or this machine's own loopback
    # (which reaches no other machine); never link-local (the cloud's metadata service), 0.0.0.0
    # or a public address
    if not m or (private_ipv4(m[1]) is None and not _loopback(m[1])) or \
            not 0 < int(m[2]) < 65536:
        raise FleetFileError(f"'router' is {printable(repr(router), 80)}, not the router's "
                             "private address and port (never link-local, 0.0.0.0 or public). "
                             "Fix: write http://ROUTER_PRIVATE_IPV4:PORT")
    if not isinstance(ports, list) or not ports or len(set(ports)) != len(ports) or \
            not all(type(p) is int and 0 < p < 65536 for p in ports):
        raise FleetFileError(f"'instance_ports' is {printable(repr(ports), 80)}, not a list of "
                             "distinct ports 1-65535. Fix: write the instance ports, e.g. [8100]")
    return " ".join(["worker", router, *(str(p) for p in ports)])
