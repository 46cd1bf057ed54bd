"""inference-image fleet: several droplets of one snapshot behind one endpoint.

A fleet file names a tier, how many droplets of it serve (workers), where (region, VPC) and from
which snapshot (an id, or the Packer manifest of a DigitalOcean build). One more droplet, the
router, runs the same image in a router role: nginx checks the API key there and only there, and
vllm-router spreads requests over every instance of every worker with its cache-aware policy, so
prompts that share a prefix keep meeting the same instance across droplets. The workers' instance
ports are open to the router's droplet only (a DigitalOcean cloud firewall whose source is the
router's tag); nothing of a worker but SSH is reachable from the internet.

`plan` prints all of that in one screen; `up --dry-run` prints the DigitalOcean API calls (pydo,
DigitalOcean's official client) with their bodies and each role's user-data. A worker acts on its
role (PATHS["fleet"]): its instances listen on every address, its firewall lets only the router's
address reach them, and inference-join registers them with the router every 15 s. The router
droplet runs no instance, and its vllm-router listens on every address with no worker until one
joins, its port open to the machine's private networks only.

`up` makes those calls with pydo (DIGITALOCEAN_TOKEN from the environment, never written; an
`up` that fails part-way removes what it made), `status` lists the fleet's droplets and firewalls,
`scrape-config` writes a Prometheus job for each droplet, and `down --yes` removes them. One API
call and its answer's checks: fleet_api. DIGITALOCEAN_API_URL points pydo elsewhere than
https://api.digitalocean.com: the unit tests' stand-in of the API, since none is reachable there.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tenacity
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    StringConstraints,
    ValidationError,
    field_validator,
)

from inference_machine import contract, writers
from inference_machine.inputs import InputError, read_json

from ..profiles import ProfileError, ProfileErrors, Resolved, pydantic_errors, read_yaml, resolve
from ..render import PATHS, scrape_targets
from ..schema import Name, Slug, Strict
from ..tables import text_table
from .fleet_api import FleetError, client
from .fleet_api import address as _address
from .fleet_api import call as _call

Uuid = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$")]
# a snapshot id, or the path of a Packer manifest.json that names one
SnapshotRef = Annotated[str, StringConstraints(pattern=r"^([0-9]{1,19}|[A-Za-z0-9._/-]{1,1024}\.json)$")]
SshKey = Annotated[str, StringConstraints(pattern=r"^([0-9]+|[0-9a-f]{2}(:[0-9a-f]{2}){15})$")]
ROUTER_PLACEHOLDER = "<the router's private IPv4, once it exists>"


class FleetSpec(Strict):
    name: Slug = Field(description="prefix of every droplet, tag and firewall of the fleet")
    tier: Name = Field(description="the profile every worker serves")
    workers: int = Field(ge=1, le=64, description="droplets of the tier behind the router")
    snapshot: SnapshotRef = Field(
        description="the image: a DigitalOcean snapshot id, or build/images/<tier>-digitalocean/"
        "manifest.json from `make image GPU=<tier>`")
    region: Slug | None = Field(None, description="default: the tier's digitalocean.region")
    vpc_uuid: Uuid | None = Field(None, description="default: the region's default VPC")
    router_tier: Name = Field(
        "cpu", description="the profile whose droplet size the router gets (it needs no GPU)")
    ssh_keys: list[SshKey] = Field(default_factory=list,
                                   description="SSH key ids or MD5 fingerprints on the account")
    scrape_from: list[IPvAnyNetwork] = Field(
        default_factory=list, max_length=16,
        description="networks (CIDR) of the Prometheus that scrapes the fleet: the workers' "
        "firewall lets them reach the public port, whose /metrics/<target> answers only each "
        "machine's scrape token (`fleet scrape-config` writes the configuration)")

    @field_validator("scrape_from")
    @classmethod
    def _a_network_not_everyone(cls, v: list[Any]) -> list[Any]:
        # each opens the workers' public port (the API too, behind its key): a Prometheus's
        # network, never everyone's
        for n in v:
            if n.prefixlen < (8 if n.version == 4 else 16):
                raise ValueError(f"{n} would open the workers' public port to "
                                 f"{'everyone' if n.prefixlen == 0 else 'a network that wide'}"
                                 ": name the network of the Prometheus that scrapes the fleet")
        return v


@dataclass(frozen=True)
class Droplet:
    name: str
    role: str  # "router" | "worker", or for a tier over several machines "head" | "node"
    size: str
    usd_per_hour: float


@dataclass(frozen=True)
class Plan:
    spec: FleetSpec
    tier: Resolved
    router_tier: Resolved
    snapshot_id: int
    snapshot_source: str
    region: str
    droplets: tuple[Droplet, ...]
    firewalls: tuple[dict[str, Any], ...]

    @property
    def usd_per_hour(self) -> float:
        return sum(d.usd_per_hour for d in self.droplets)

    @property
    def instance_ports(self) -> list[int]:
        return instance_ports(self.tier)


def instance_ports(r: Resolved) -> list[int]:
    return [i.port for i in r.instances]


def tags(spec: FleetSpec, role: str) -> list[str]:
    """A droplet's tags: the fleet's (what `status` and `down` find) and its role's (what the
    firewalls name as their target and source); a head's and nodes' also their group's."""
    group = [role_tag(spec, "group")] if role in ("head", "node") else []
    return [fleet_tag(spec), role_tag(spec, role), *group]


def fleet_tag(spec: FleetSpec) -> str:
    return f"inference-image-fleet-{spec.name}"


def role_tag(spec: FleetSpec, role: str) -> str:
    return f"{spec.name}-{role}"


def load(path: Path) -> FleetSpec:
    """The fleet file, validated: ProfileErrors (one line per problem, naming the field)."""
    data = read_yaml(path)
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as exc:
        raise ProfileErrors(pydantic_errors(exc, FleetSpec, {}, str(path))) from None


class PackerBuild(BaseModel):
    """One build of Packer's manifest post-processor (only what a fleet reads of it)."""
    model_config = ConfigDict(extra="ignore")
    builder_type: str = Field("", max_length=200, description="the builder (digitalocean, qemu)")
    artifact_id: str = Field("", max_length=4096, description="digitalocean: REGIONS:SNAPSHOT_ID")


class PackerManifest(BaseModel):
    """Packer's manifest.json, as `make image` writes it."""
    model_config = ConfigDict(extra="ignore")
    builds: list[PackerBuild] = Field(default_factory=list, max_length=10_000,
                                      description="every build the manifest records, oldest first")


def _first_error(exc: ValidationError) -> str:
    e = exc.errors()[0]
    return f"{'.'.join(str(x) for x in e['loc']) or 'the file'}: {e['msg']}"


def snapshot_id(ref: str, region: str, base: Path) -> tuple[int, str]:
    """The snapshot's id and where it came from. A manifest must name a DigitalOcean build whose
    snapshot is in the fleet's region (a droplet is made only where its image is)."""
    if ref.isdigit():
        return int(ref), "given"
    path = base / ref  # an absolute ref stays itself
    fix = "give the snapshot id, or the manifest.json of `make image GPU=<tier> BUILDER=digitalocean`"
    try:
        manifest = PackerManifest.model_validate(read_json(path, "snapshot", 16 * 2**20, fix))
    except InputError as exc:
        raise FleetError(str(exc)) from None
    except ValidationError as exc:
        raise FleetError(f"snapshot: {path} is not a Packer manifest ({_first_error(exc)}). Fix: "
                         f"{fix}") from None
    builds = [b.model_dump() for b in manifest.builds if b.builder_type == "digitalocean"]
    if not builds:
        raise FleetError(f"snapshot: {path} names no DigitalOcean build. Fix: give the manifest of a "
                         "BUILDER=digitalocean build, or the snapshot id")
    # packer-plugin-digitalocean's artifact id: "region[,region...]:snapshot_id"
    regions, _, sid = str(builds[-1].get("artifact_id", "")).rpartition(":")
    if not sid.isdigit():
        raise FleetError(f"snapshot: {path}'s artifact_id {builds[-1].get('artifact_id')!r} is not "
                         "REGIONS:ID")
    if region not in regions.split(","):
        raise FleetError(f"snapshot: {sid} is in {regions}, the fleet is in {region}. Fix: set "
                         f"region: {regions.split(',')[0]}, or copy the snapshot to {region}")
    return int(sid), str(path)


# a cloud firewall's sources or destinations: every address; and its rules letting everything out
ANYWHERE = {"addresses": ["0.0.0.0/0", "::/0"]}
OUT_ALL = [*({"protocol": p, "ports": "all", "destinations": ANYWHERE} for p in ("tcp", "udp")),
           {"protocol": "icmp", "destinations": ANYWHERE}]  # icmp has no ports


def _scrape_rules(spec: FleetSpec, tier: Resolved) -> list[dict[str, Any]]:
    """The public port open to the fleet's Prometheus (scrape_from), where the edge does not open
    it to everyone already."""
    if not spec.scrape_from:
        return []
    return [{"protocol": "tcp", "ports": str(tier.profile.router.port),
             "sources": {"addresses": [str(n) for n in spec.scrape_from]}}]


def spans_nodes(p: Plan) -> int:
    """How many droplets the tier's one instance spans (serving.nodes); 1: a router and workers."""
    return p.tier.profile.serving.nodes


def plan(spec: FleetSpec, base: Path = Path(".")) -> Plan:
    tier, router_tier = resolve(spec.tier), resolve(spec.router_tier)
    region = spec.region or tier.profile.digitalocean.region
    sid, source = snapshot_id(spec.snapshot, region, base)
    if tier.profile.serving.nodes > 1:
        return _group_plan(spec, tier, router_tier, sid, source, region)
    rtag, wtag = role_tag(spec, "router"), role_tag(spec, "worker")
    droplets = [Droplet(f"{spec.name}-router", "router", router_tier.profile.digitalocean.size,
                        router_tier.usd_per_hour)]
    droplets += [Droplet(f"{spec.name}-worker-{i}", "worker", tier.profile.digitalocean.size,
                         tier.usd_per_hour) for i in range(1, spec.workers + 1)]
    ports = instance_ports(tier)
    span = str(ports[0]) if len(ports) == 1 else f"{min(ports)}-{max(ports)}"
    firewalls = (
        {"name": f"{spec.name}-edge", "tags": [rtag],
         "inbound_rules": [{"protocol": "tcp", "ports": str(router_tier.profile.router.port),
                            "sources": ANYWHERE},
                           # the workers' add-worker calls to vllm-router
                           {"protocol": "tcp", "ports": str(router_tier.profile.router.internal_port),
                            "sources": {"tags": [wtag]}},
                           {"protocol": "tcp", "ports": "22", "sources": ANYWHERE}],
         "outbound_rules": OUT_ALL},
        {"name": f"{spec.name}-workers", "tags": [wtag],
         "inbound_rules": [{"protocol": "tcp", "ports": span, "sources": {"tags": [rtag]}},
                           *_scrape_rules(spec, tier),
                           {"protocol": "tcp", "ports": "22", "sources": ANYWHERE}],
         "outbound_rules": OUT_ALL},
    )
    return Plan(spec, tier, router_tier, sid, source, region, tuple(droplets), firewalls)


def _group_plan(spec: FleetSpec, tier: Resolved, router_tier: Resolved, sid: int, source: str,
                region: str) -> Plan:
    """A tier whose instance spans serving.nodes droplets: a head (the API: nginx, vllm-router,
    pipeline stage 0) and nodes (the other stages, headless). The edge is the head's; the stages
    reach each other on every port (vLLM picks them) through the group's tag only."""
    n = tier.profile.serving.nodes
    if spec.workers != 1:
        raise FleetError(f"workers: {spec.workers}, but {spec.tier}'s instance spans {n} droplets "
                         "(serving.nodes), which serve it as one. Fix: set workers: 1")
    size, usd = tier.profile.digitalocean.size, tier.usd_per_hour
    droplets = [Droplet(f"{spec.name}-head", "head", size, usd)]
    droplets += [Droplet(f"{spec.name}-node-{i}", "node", size, usd) for i in range(1, n)]
    group = {"tags": [role_tag(spec, "group")]}
    firewalls = (
        {"name": f"{spec.name}-edge", "tags": [role_tag(spec, "head")],
         "inbound_rules": [{"protocol": "tcp", "ports": str(tier.profile.router.port),
                            "sources": ANYWHERE}], "outbound_rules": OUT_ALL},
        {"name": f"{spec.name}-group", "tags": [role_tag(spec, "group")],
         "inbound_rules": [{"protocol": "tcp", "ports": "all", "sources": group},
                           *_scrape_rules(spec, tier),
                           {"protocol": "tcp", "ports": "22", "sources": ANYWHERE}],
         "outbound_rules": OUT_ALL},
    )
    return Plan(spec, tier, router_tier, sid, source, region, tuple(droplets), firewalls)


def endpoint(p: Plan, address: str) -> str:
    """The fleet's public URL: nginx on the router droplet."""
    rt = (p.tier if spans_nodes(p) > 1 else p.router_tier).profile.router
    try:
        where = writers.host_port(ipaddress.ip_address(address), rt.port)
    except ValueError:  # the plan's placeholder for an address the droplet does not have yet
        where = f"{address}:{rt.port}"
    return f"{'https' if rt.tls != 'off' else 'http'}://{where}"


def scrape_address(d: dict[str, Any]) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A droplet's public address as a Prometheus target may name it: one that names that
    machine (never 0.0.0.0, loopback, link-local, multicast or reserved); None (said) else."""
    text = _address(d, "public")
    if not text:
        return None
    try:
        a = ipaddress.ip_address(text)
    except ValueError:
        a = None
    if a is None or a.is_unspecified or a.is_loopback or a.is_link_local or a.is_multicast or \
            a.is_reserved:
        print(f"warning: droplet {d.get('name')}: its public address {text} names no machine "
              "Prometheus can reach; it gets no scrape job", file=sys.stderr)
        return None
    return a


NETWORK_PLACEHOLDER = "<the VPC's ip_range>"
HEAD_PLACEHOLDER = "<the head's private IPv4, once it exists>"


def fleet_json(p: Plan, role: str, router: str | None = None, *, rank: int = 0,
               network: str | None = None) -> dict[str, Any]:
    """What user-data writes to PATHS["fleet"] on a droplet of `role`. The router knows no worker
    up front: each worker registers its instances with the router's vllm-router at boot (its
    add-worker call, on the router's private address), so a worker added later joins the running
    router, and one that comes back after a failure joins again. A head is told the VPC's range
    (its own address is the one in it); a node its rank and the head's address (`router` here)."""
    doc: dict[str, Any] = {"fleet": p.spec.name, "role": role}
    if role == "head":
        doc["network"] = network or NETWORK_PLACEHOLDER
    elif role == "node":
        doc["rank"], doc["head"] = rank, router or HEAD_PLACEHOLDER
    elif role == "router":
        doc["worker_tag"] = role_tag(p.spec, "worker")
    else:
        doc["router"] = (f"http://{router}:{p.router_tier.profile.router.internal_port}"
                         if router else ROUTER_PLACEHOLDER)
        doc["instance_ports"] = p.instance_ports
    return doc


def user_data(p: Plan, role: str, router: str | None = None, *, rank: int = 0,
              network: str | None = None) -> str:
    """cloud-config: the fleet role file, nothing secret (the router makes its API key itself at
    first boot, as every machine of the image does)."""
    content = json.dumps(fleet_json(p, role, router, rank=rank, network=network), sort_keys=True)
    doc = {"write_files": [{"path": PATHS["fleet"], "permissions": "0644", "content": content}]}
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False, width=200)


def api_calls(p: Plan, router_ip: str | None = None,
              network: str | None = None) -> list[tuple[str, dict[str, Any], str]]:
    """Every DigitalOcean API call of `up`, in order: (pydo method, its keyword arguments, why).
    The router is made first: the workers' user-data names its private address (router_ip, once
    it is known; a placeholder in a dry run). For a tier over several droplets the VPC's range
    comes first (the head's user-data names it), then the head, then each node, whose user-data
    names the head's private address (router_ip) and its rank."""
    def body(names: list[str], d: Droplet, role: str, rank: int = 0) -> dict[str, Any]:
        b: dict[str, Any] = {"names": names, "region": p.region, "size": d.size,
                             "image": p.snapshot_id, "tags": tags(p.spec, d.role), "ipv6": True,
                             "monitoring": True,
                             "user_data": user_data(p, role, router_ip, rank=rank, network=network)}
        if p.spec.ssh_keys:
            b["ssh_keys"] = list(p.spec.ssh_keys)
        if p.spec.vpc_uuid:
            b["vpc_uuid"] = p.spec.vpc_uuid
        return b
    if spans_nodes(p) > 1:
        head = p.droplets[0]
        vpc: tuple[str, dict[str, Any], str] = (
            ("vpcs.get", {"vpc_id": p.spec.vpc_uuid}, "the VPC's ip_range, for the head")
            if p.spec.vpc_uuid else
            ("vpcs.list", {}, f"the ip_range of {p.region}'s default VPC, for the head"))
        return [
            vpc,
            ("droplets.create", {"body": body([head.name], head, "head")}, "the head"),
            ("droplets.get", {"droplet_id": "<the head's id, from the call above>"},
             "again until the head is active, for its private IPv4"),
            *(("droplets.create", {"body": body([d.name], d, "node", i)},
               f"node {i}, its user-data naming the head")
              for i, d in enumerate(p.droplets[1:], 1)),
            *(("firewalls.create", {"body": fw}, "") for fw in p.firewalls),
        ]
    workers = [d for d in p.droplets if d.role == "worker"]
    router = next(d for d in p.droplets if d.role == "router")
    return [
        ("droplets.create", {"body": body([router.name], router, "router")}, "the router"),
        ("droplets.get", {"droplet_id": "<the router's id, from the call above>"},
         "again until the router is active, for its private IPv4"),
        ("droplets.create", {"body": body([d.name for d in workers], workers[0], "worker")},
         "the workers, their user-data naming the router"),
        *(("firewalls.create", {"body": fw}, "") for fw in p.firewalls),
    ]


def _describe_group(p: Plan, table: list[str]) -> str:
    s, t = p.spec, p.tier.profile
    head = f"<{s.name}-head's public IPv4>"
    return "\n".join([
        f"fleet {s.name}: one {t.tier} instance ({t.description}) over {spans_nodes(p)} droplets: "
        f"pipeline parallel {spans_nodes(p)}, tensor parallel {t.serving.tensor_parallel_size} "
        "inside each (vLLM's multi-node executor)",
        f"region {p.region}, VPC {s.vpc_uuid or 'the region default'}, snapshot {p.snapshot_id} "
        f"({p.snapshot_source})",
        *table,
        f"  per month (730 h): ${p.usd_per_hour * 730:,.0f}; GPUs "
        f"{t.hardware.gpu_count * spans_nodes(p)} at ${t.digitalocean.price_per_gpu_hour:.2f}/GPU-hour",
        f"endpoint  {endpoint(p, head)}  (API key: ssh root@<head> cat {PATHS['api_key']})",
        f"stages    the head serves the API and stage 0; node k runs stage k headless; the stages "
        f"meet at the head's port {t.serving.node_port} on the VPC",
        f"firewall  {p.firewalls[0]['name']}: {t.router.port}/tcp from anywhere to the head",
        f"          {p.firewalls[1]['name']}: every TCP port between the group's droplets, 22/tcp "
        "from anywhere",
        f"user-data head: {PATHS['fleet']} = {json.dumps(fleet_json(p, 'head'))}",
        f"user-data node: {PATHS['fleet']} = {json.dumps(fleet_json(p, 'node', rank=1))} "
        "(rank 1, 2, ...)",
        "commands  fleet up (DIGITALOCEAN_TOKEN), fleet status, fleet down --yes; "
        "up --dry-run prints the API calls",
    ])


def describe(p: Plan) -> str:
    """The plan in one screen."""
    s, t = p.spec, p.tier.profile
    def usd(x: float) -> str:
        return f"{x:.3f}" if x < 1 else f"{x:.2f}"
    shown = p.droplets if len(p.droplets) <= 6 else p.droplets[:5]
    rows = [("droplet", "role", "size", "$/hour")]
    rows += [(d.name, d.role, d.size, usd(d.usd_per_hour)) for d in shown]
    if len(shown) < len(p.droplets):
        rows.append((f"... {len(p.droplets) - len(shown)} more workers", "worker",
                     p.droplets[-1].size, f"{usd(p.droplets[-1].usd_per_hour)} each"))
    rows.append(("total", "", "", usd(p.usd_per_hour)))
    table = text_table(rows, indent="  ").split("\n")
    if spans_nodes(p) > 1:
        return _describe_group(p, table)
    n_inst = len(p.tier.instances) * s.workers
    per = t.digitalocean.price_per_gpu_hour
    router_ip = f"<{s.name}-router's public IPv4>"
    lines = [
        f"fleet {s.name}: {s.workers} x {t.tier} ({t.description}) behind one router",
        f"region {p.region}, VPC {s.vpc_uuid or 'the region default'}, snapshot {p.snapshot_id} "
        f"({p.snapshot_source})",
        *table,
        f"  per month (730 h): ${p.usd_per_hour * 730:,.0f}; GPUs {t.hardware.gpu_count * s.workers} "
        f"at ${per:.2f}/GPU-hour",
        f"endpoint  {endpoint(p, router_ip)}  (API key: ssh root@<router> cat {PATHS['api_key']})",
        f"routing   vllm-router on the router, {p.router_tier.profile.router.policy} over {n_inst} "
        f"instances ({s.workers} workers x {len(p.tier.instances)}), ports "
        f"{', '.join(map(str, p.instance_ports))} on the workers' private addresses",
        f"firewall  {p.firewalls[0]['name']}: {p.router_tier.profile.router.port}/tcp and 22/tcp "
        f"from anywhere to the router, {p.router_tier.profile.router.internal_port}/tcp from the "
        "workers' tag (they join by vllm-router's add-worker call)",
        f"          {p.firewalls[1]['name']}: {p.firewalls[1]['inbound_rules'][0]['ports']}/tcp from "
        "the router's tag only, 22/tcp from anywhere" + (
            f"; {t.router.port}/tcp (the workers' public port) from "
            f"{', '.join(map(str, s.scrape_from))} (scrape_from: their /metrics)"
            if s.scrape_from else ""),
        f"user-data router: {PATHS['fleet']} = {json.dumps(fleet_json(p, 'router'))}",
        f"user-data worker: {PATHS['fleet']} = {json.dumps(fleet_json(p, 'worker'))}",
        "commands  fleet up (DIGITALOCEAN_TOKEN), fleet status, fleet down --yes; "
        "up --dry-run prints the API calls",
    ]
    return "\n".join(lines)


def _load_plan(path: str) -> Plan | None:
    """The fleet file's plan, or None after one line per problem on stderr."""
    try:
        return plan(load(Path(path)), Path(path).parent)
    except ProfileErrors as exc:
        errors: list[ProfileError | str] = list(exc.errors)
    except FleetError as exc:
        errors = [f"{path}: {exc}"]
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return None


def cmd_plan(args: Any) -> int:
    p = _load_plan(args.fleet)
    if p is None:
        return 1
    print(describe(p))
    return 0


READY_S = 600  # a droplet from a snapshot is active in 1-3 minutes; a GPU one may take longer
POLL_S = 5.0


def _fleet_droplets(c: Any, spec: FleetSpec) -> list[dict[str, Any]]:
    return list(_call(c, "droplets.list", tag_name=fleet_tag(spec), per_page=200)
                .get("droplets", []))


def _fleet_firewalls(c: Any, p: Plan) -> list[dict[str, Any]]:
    names = {fw["name"] for fw in p.firewalls}
    return [f for f in _call(c, "firewalls.list", per_page=200).get("firewalls", [])
            if f.get("name") in names]


def up(p: Plan, c: Any, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Make the fleet: the calls of api_calls(), in order. A fleet that has droplets already is
    refused; a failure part-way removes what this run made (by the fleet's tag and the firewalls'
    ids) before it is raised, so nothing is left half-built."""
    spec = p.spec
    have = _fleet_droplets(c, spec)
    if have:
        names = ", ".join(sorted(str(d.get("name")) for d in have))
        raise FleetError(f"fleet {spec.name} has droplets already ({names}). Fix: `fleet status` "
                         "shows them, `fleet down --yes` removes them")
    if spans_nodes(p) > 1:
        return _up_group(p, c, say)
    calls = api_calls(p)
    made_fw: list[str] = []
    before = {f["id"] for f in _fleet_firewalls(c, p)}
    try:
        method, kwargs, why = calls[0]
        router = _call(c, method, **kwargs)["droplets"][0]
        say(f"made {router['name']} ({why}), id {router['id']}; waiting until it is active")
        d, ip = _active_private(c, router)
        public = _address(d, "public")
        say(f"{router['name']} is active: private {ip}, public {public}")
        method, kwargs, why = api_calls(p, ip)[2]
        workers = _call(c, method, **kwargs)["droplets"]
        say(f"made {', '.join(w['name'] for w in workers)} ({why})")
        for method, kwargs, _ in calls[3:]:
            fw = _call(c, method, **kwargs)["firewall"]
            made_fw.append(fw["id"])
            say(f"made firewall {fw['name']}")
    except FleetError as exc:
        raise _undo(c, p, made_fw, exc, before) from None
    return {"router": router["name"], "public": public, "private": ip,
            "workers": [w["name"] for w in workers]}


class _NotYet(Exception):
    """A droplet not active with a private address yet (tenacity asks again)."""


def _active_private(c: Any, d: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The droplet once it is active, and its private IPv4 (asked every POLL_S for READY_S; an
    API error ends the wait at once)."""
    def once() -> tuple[dict[str, Any], str]:
        got = _call(c, "droplets.get", droplet_id=d["id"])["droplet"]
        ip = _address(got, "private") if got.get("status") == "active" else None
        if not ip:
            raise _NotYet(str(got.get("status")))
        return got, ip
    try:
        return tenacity.Retrying(stop=tenacity.stop_after_delay(READY_S),
                                 wait=tenacity.wait_fixed(POLL_S),
                                 retry=tenacity.retry_if_exception_type(_NotYet),
                                 reraise=True)(once)
    except _NotYet as exc:
        raise FleetError(f"{d['name']} not active with a private address after {READY_S} s "
                         f"(status {exc})") from None


def _vpc_range(p: Plan, c: Any) -> str:
    if p.spec.vpc_uuid:
        return str(_call(c, "vpcs.get", vpc_id=p.spec.vpc_uuid)["vpc"]["ip_range"])
    for v in _call(c, "vpcs.list", per_page=200).get("vpcs", []):
        if v.get("region") == p.region and v.get("default"):
            return str(v["ip_range"])
    raise FleetError(f"no default VPC in {p.region}. Fix: set vpc_uuid in the fleet file")


def _up_group(p: Plan, c: Any, say: Callable[[str], None]) -> dict[str, Any]:
    """up() for a tier over several droplets: the head, then each node naming it, then the
    firewalls; a failure part-way removes what this run made."""
    made_fw: list[str] = []
    before = {f["id"] for f in _fleet_firewalls(c, p)}
    try:
        network = _vpc_range(p, c)
        calls = api_calls(p, network=network)
        head = _call(c, "droplets.create", **calls[1][1])["droplets"][0]
        say(f"made {head['name']} (the head, VPC {network}), id {head['id']}; waiting until it "
            "is active")
        got, ip = _active_private(c, head)
        public = _address(got, "public")
        say(f"{head['name']} is active: private {ip}, public {public}")
        nodes = []
        for method, kwargs, why in api_calls(p, ip, network)[3:]:
            if method == "droplets.create":
                nodes += _call(c, method, **kwargs)["droplets"]
                say(f"made {nodes[-1]['name']} ({why})")
            else:
                fw = _call(c, method, **kwargs)["firewall"]
                made_fw.append(fw["id"])
                say(f"made firewall {fw['name']}")
    except FleetError as exc:
        raise _undo(c, p, made_fw, exc, before) from None
    return {"router": head["name"], "public": public, "private": ip,
            "workers": [n["name"] for n in nodes]}


def _undo(c: Any, p: Plan, made_fw: list[str], exc: FleetError, before: set[str]) -> FleetError:
    """Remove what a failed `up` made (its firewalls, by id and, where an answer did not say the
    id, by the plan's names less those there before; the fleet's droplets by tag): the error to
    raise."""
    def firewalls() -> None:
        for fid in [*made_fw, *(f["id"] for f in _fleet_firewalls(c, p)
                                if f["id"] not in before and f["id"] not in made_fw)]:
            _cleanup(lambda fid=fid: _call(c, "firewalls.delete", firewall_id=fid))

    _cleanup(firewalls)
    _cleanup(lambda: _call(c, "droplets.destroy_by_tag", tag_name=fleet_tag(p.spec)))
    return FleetError(f"{exc}; what this run had made is removed again")


def _cleanup(undo: Callable[[], Any]) -> None:
    try:
        undo()
    except FleetError as exc:
        print(f"error: while removing what `up` made: {exc}", file=sys.stderr)


def status(p: Plan, c: Any) -> str:
    spec = p.spec
    droplets = sorted(_fleet_droplets(c, spec), key=lambda d: str(d.get("name")))
    if not droplets:
        return f"fleet {spec.name}: no droplet (`fleet up` makes it)"
    roles = ("head", "node") if spans_nodes(p) > 1 else ("router", "worker")
    router = next((d for d in droplets if role_tag(spec, roles[0]) in d.get("tags", [])), None)
    rows = [("droplet", "role", "status", "private", "public")]
    for d in droplets:
        rows.append((str(d.get("name")), roles[0] if d is router else roles[1],
                     str(d.get("status")), _address(d, "private") or "-",
                     _address(d, "public") or "-"))
    lines = [f"fleet {spec.name}: {len(droplets)} droplet(s), {p.region}"]
    lines += text_table(rows, indent="  ").split("\n")
    fws = _fleet_firewalls(c, p)
    lines.append(f"firewalls {', '.join(sorted(f['name'] for f in fws)) or 'none'}")
    if router and (public := _address(router, "public")):
        lines.append(f"endpoint  {endpoint(p, public)}")
    return "\n".join(lines)


def scrape_targets_of(p: Plan, role: str) -> list[str]:
    """The /metrics/<target> names a droplet of `role` answers: a router serves no model, and its
    droplet (router_tier's size) may have no GPU; a node's stage serves no API."""
    names = [t["name"] for t in scrape_targets(p.tier)]
    if role == "router":
        return [n for n in names if n in ("router", "node", "nginx")]
    if role == "node":
        return [n for n in names if n in ("node", "gpu")]
    return names


def scrape_config(p: Plan, c: Any) -> str:
    """A Prometheus configuration that scrapes every droplet of the fleet through its public port
    (docs/operations.md): a job a droplet, each with that machine's scrape token and certificate
    (copied into /etc/prometheus/inference-image/<droplet>/)."""
    scheme = "https" if p.tier.profile.router.tls != "off" else "http"
    label, value = contract.SCRAPE_LABEL
    jobs = []
    droplets = sorted(_fleet_droplets(c, p.spec), key=lambda d: (str(d.get("name")), d.get("id")))
    names = collections.Counter(str(d.get("name")) for d in droplets)
    for d in droplets:
        name, public = str(d.get("name")), scrape_address(d)
        role = next((r for r in ("router", "worker", "head", "node")
                     if role_tag(p.spec, r) in d.get("tags", [])), "worker")
        if public is None:
            continue
        # DigitalOcean lets two droplets share a name: a job and a folder each, by its id too
        if names[name] > 1:
            name = f"{name}-{d.get('id')}"
        where = f"/etc/prometheus/inference-image/{name}"
        job: dict[str, Any] = {
            "job_name": f"inference-image-{name}", "scheme": scheme,
            "authorization": {"credentials_file": f"{where}/scrape-token"},
            "static_configs": [{"targets": [writers.host_port(public, p.tier.profile.router.port)],
                                "labels": {"__metrics_path__": f"/metrics/{t}", "target": t,
                                           "droplet": name, "role": role, label: value}}
                               for t in scrape_targets_of(p, role)]}
        if scheme == "https":
            job["tls_config"] = {"ca_file": f"{where}/cert.pem"}
        if job["static_configs"]:
            jobs.append(job)
    if not jobs:
        raise FleetError(f"fleet {p.spec.name}: no droplet with a public address to scrape "
                         "(`fleet up` makes them)")
    if not p.spec.scrape_from:
        print(f"warning: fleet {p.spec.name} names no scrape_from: the workers' firewall keeps "
              "their public port closed to a Prometheus elsewhere", file=sys.stderr)
    return yaml.safe_dump({"scrape_configs": jobs}, sort_keys=False)


def down(p: Plan, c: Any, dry_run: bool = False) -> list[str]:
    """Remove the fleet's droplets (by its tag) and firewalls (by name): what was removed, or with
    dry_run what would be."""
    droplets, firewalls = _fleet_droplets(c, p.spec), _fleet_firewalls(c, p)
    if not dry_run:
        if droplets:
            _call(c, "droplets.destroy_by_tag", tag_name=fleet_tag(p.spec))
        for f in firewalls:
            _call(c, "firewalls.delete", firewall_id=f["id"])
    return [str(d.get("name")) for d in droplets] + [f"firewall {f['name']}" for f in firewalls]


def _with_client(args: Any, act: Callable[[Plan, Any], int]) -> int:
    p = _load_plan(args.fleet)
    if p is None:
        return 1
    try:
        return act(p, client())
    except FleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def cmd_status(args: Any) -> int:
    return _with_client(args, lambda p, c: print(status(p, c)) or 0)


def cmd_scrape_config(args: Any) -> int:
    return _with_client(args, lambda p, c: print(scrape_config(p, c), end="") or 0)


def cmd_down(args: Any) -> int:
    def act(p: Plan, c: Any) -> int:
        if not args.yes:
            print(f"error: `fleet down` would remove {', '.join(down(p, c, dry_run=True)) or 'nothing'}. "
                  "Fix: add --yes", file=sys.stderr)
            return 1
        gone = down(p, c)
        print(f"fleet {p.spec.name}: removed {', '.join(gone) or 'nothing (no droplet)'}")
        return 0
    return _with_client(args, act)


def cmd_up(args: Any) -> int:
    if not args.dry_run:
        def act(p: Plan, c: Any) -> int:
            made = up(p, c)
            when = ("its stages have met" if spans_nodes(p) > 1 else "the workers have joined")
            print(f"fleet {p.spec.name}: endpoint {endpoint(p, made['public'])} once {when} "
                  f"(their models load first); API key: ssh root@{made['public']} cat "
                  f"{PATHS['api_key']}")
            return 0
        return _with_client(args, act)
    p = _load_plan(args.fleet)
    if p is None:
        return 1
    for i, (method, kwargs, why) in enumerate(api_calls(p), 1):
        body = kwargs.get("body", {})
        plain = {b: v for b, v in body.items() if b != "user_data"}  # user_data: shown below
        args = ", ".join(f"{k}={json.dumps(plain, sort_keys=True) if k == 'body' else repr(v)}"
                         for k, v in kwargs.items())
        print(f"{i}. client.{method}({args}){f'  # {why}' if why else ''}")
        if "user_data" in body:
            print(re.sub(r"(?m)^", "     | ", body["user_data"].rstrip()))
    return 0


def register(sub: Any) -> None:
    fp = sub.add_parser("fleet", help="several droplets of one snapshot behind one endpoint")
    fsub = fp.add_subparsers(dest="fleet_cmd", required=True, metavar="ACTION")
    p = fsub.add_parser("plan", help="the droplets, their cost, the endpoint, firewalls and "
                        "user-data of a fleet file, in one screen")
    p.add_argument("fleet", help="fleet file (YAML): name, tier, workers, snapshot, region, ...")
    p.set_defaults(func=cmd_plan)
    p = fsub.add_parser("up", help="make the fleet's droplets and firewalls (DigitalOcean API, "
                        "DIGITALOCEAN_TOKEN)")
    p.add_argument("fleet")
    p.add_argument("--dry-run", action="store_true",
                   help="print every API call with its body and user-data; change nothing")
    p.set_defaults(func=cmd_up)
    p = fsub.add_parser("status", help="the fleet's droplets, their addresses, its firewalls")
    p.add_argument("fleet")
    p.set_defaults(func=cmd_status)
    p = fsub.add_parser("scrape-config", help="a Prometheus configuration scraping every droplet "
                        "of the fleet through its public port (each with its own scrape token)")
    p.add_argument("fleet")
    p.set_defaults(func=cmd_scrape_config)
    p = fsub.add_parser("down", help="remove the fleet's droplets and firewalls")
    p.add_argument("fleet")
    p.add_argument("--yes", action="store_true", help="remove them (without it: what would go)")
    p.set_defaults(func=cmd_down)
