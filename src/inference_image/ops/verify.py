"""`inference-image verify`: run the image_tests suites against a launched droplet, the local
qemu image or a container, print a summary table and write a JUnit XML report.

Targets: HOST[:PORT] (SSH via paramiko: the user's agent or --identity), podman://CONTAINER,
local:// (this machine). A wrong host, a refused key or a host that is not an image of this
project give one line each, before any test runs."""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import tenacity

from ..profiles import ProfileErrors, default_profiles_dir, project_root, resolve
from ..render import PATHS
from ..tables import text_table

T = TypeVar("T")

SUITES = ("smoke", "security", "hygiene", "gpu", "throughput", "fleet", "faults", "marketplace",
          "acme", "readme")
PROFILE_JSON = PATHS["profile_json"]


class VerifyError(Exception):
    pass


@dataclass(frozen=True)
class Target:
    kind: str  # ssh | podman | local
    host: str
    port: int = 22
    user: str = "root"

    def testinfra_url(self, identity: str | None) -> str:
        if self.kind == "podman":
            return f"podman://{self.host}"
        if self.kind == "local":
            return "local://"
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6 in a URL
        url = f"paramiko://{self.user}@{host}:{self.port}"
        return url + (f"?ssh_identity_file={identity}" if identity else "")


HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]")
CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def parse_target(spec: str, user: str) -> Target:
    if spec.startswith("podman://"):
        name = spec.removeprefix("podman://")
        if not CONTAINER.fullmatch(name):
            raise VerifyError(f"--host {spec!r}: not a container name. Fix: podman://NAME takes "
                              "a container's name (letters, digits, _ . -)")
        return Target("podman", name)
    if spec in ("local://", "localhost://"):
        return Target("local", "localhost")
    host, port = spec, 22
    if spec.count(":") == 1 or (spec.startswith("[") and "]:" in spec):
        host, _, p = spec.rpartition(":")
        if not (p.isascii() and p.isdigit() and 1 <= int(p) <= 65535):
            raise VerifyError(f"--host {spec!r}: the port must be a number 1-65535 (HOST:PORT)")
        port = int(p)
    if not host:
        raise VerifyError("--host is empty: give HOST[:PORT], podman://NAME or local://")
    if not HOST_NAME.fullmatch(host) and not _ipv6(host):
        raise VerifyError(f"--host {spec!r}: a host name or address (letters, digits, . - _, "
                          "or [IPv6]), then :PORT if not 22")
    if host.startswith("["):
        if not _ipv6(host[1:-1]):
            raise VerifyError(f"--host {spec!r}: {host} is not an IPv6 address")
        host = host[1:-1]  # the address itself: what a socket connects to
    return Target("ssh", host, port, user)


def _ipv6(s: str) -> bool:
    import ipaddress
    try:
        return ipaddress.ip_address(s).version == 6 and "%" not in s
    except ValueError:
        return False


def remote(t: Target, identity: str | None, command: str, timeout: float = 30.0) -> tuple[int, str]:
    """Run one command on the target (exit code, stdout)."""
    if t.kind == "podman":
        r = subprocess.run(["podman", "exec", t.host, "sh", "-c", command], capture_output=True,
                           text=True, timeout=timeout)
        return r.returncode, r.stdout
    if t.kind == "local":
        r = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout
    import paramiko

    # paramiko's transport thread logs a traceback for every refused or half-open connection,
    # which is what a booting machine gives; the error that counts is raised below.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    client = paramiko.SSHClient()
    # A droplet made from the snapshot has new host keys: nothing to pin them against yet.
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        client.connect(t.host, port=t.port, username=t.user, key_filename=identity, timeout=timeout,
                       allow_agent=True, look_for_keys=identity is None)
        _, out, _ = client.exec_command(command, timeout=timeout)
        text = out.read().decode()
        return out.channel.recv_exit_status(), text
    except paramiko.AuthenticationException:
        raise VerifyError(f"{t.user}@{t.host}:{t.port} refused the SSH key "
                          f"({'--identity ' + identity if identity else 'agent and default keys'}); "
                          "pass --identity or --user") from None
    except (paramiko.SSHException, OSError) as exc:
        raise VerifyError(f"SSH to {t.host}:{t.port} failed: {exc}") from None
    finally:
        client.close()


# /health on the public port, run on the machine: TLS checked against the machine's certificate,
# or plain HTTP where first boot chose it (endpoint.json), the whole answer within 5 s (the
# machine's own `inference-startup public-health`). Prints the status or the error.
PUBLIC_HEALTH = f"{PATHS['startup']} public-health --deadline-s 5"


def wait_ready(t: Target, identity: str | None, seconds: int, serving: bool = True,
               interval: float = 10.0) -> None:
    """Wait until the machine has booted and, when it serves, until the public port answers
    /health (a cold start compiles). Without serving, a finished boot is enough: systemd says
    "running", or "degraded" (a GPU tier baked without its GPU cannot start its instances)."""
    if serving:
        probe, done, what = PUBLIC_HEALTH, {"200"}, "the router on {host} did not answer /health"
    else:
        probe = "systemctl is-system-running"
        done, what = {"running", "degraded"}, "{host} did not finish booting"

    def once() -> None:
        try:
            _, out = remote(t, identity, probe)
        except Exception as exc:  # a machine that is still booting fails in many ways
            out = str(exc)
        if out.strip() not in done:
            raise VerifyError(f"{what.format(host=t.host)} within {seconds} s "
                              f"(last: {out.strip() or 'no answer'})")

    until(seconds, interval, once)


def until(seconds: float, interval: float, attempt: Callable[[], T]) -> T:
    """attempt() until it returns, for up to `seconds`; its last VerifyError is the one raised
    (any other error at once)."""
    retrying = tenacity.Retrying(stop=tenacity.stop_after_delay(seconds),
                                 wait=tenacity.wait_fixed(interval),
                                 retry=tenacity.retry_if_exception_type(VerifyError), reraise=True)
    return retrying(attempt)


def preflight(t: Target, identity: str | None, timeout: float = 10.0) -> str:
    """One clear line for the usual ways a verify run cannot start. Returns the tier the machine
    was built for (from its profile.json)."""
    if t.kind == "podman":
        if not shutil.which("podman"):
            raise VerifyError("podman is not installed here")
        r = subprocess.run(["podman", "container", "inspect", "-f", "{{.State.Running}}", t.host],
                           capture_output=True, text=True)
        if r.returncode or r.stdout.strip() != "true":
            raise VerifyError(f"no running container named {t.host}")
    elif t.kind == "ssh":
        try:
            socket.create_connection((t.host, t.port), timeout=timeout).close()
        except socket.gaierror:
            raise VerifyError(f"{t.host}: no such host (DNS lookup failed)") from None
        except OSError as exc:
            where = f"[{t.host}]" if ":" in t.host else t.host
            raise VerifyError(f"cannot reach {where}:{t.port} over SSH ({exc.strerror or exc})"
                              ) from None
    read_tier = "import json; print(json.load(open('" + PROFILE_JSON + "'))['tier'])"
    rc, tier = remote(t, identity, f'python3 -c "{read_tier}" 2>/dev/null', timeout=timeout)
    if rc != 0 or not tier.strip():
        what = "this machine" if t.kind == "local" else t.host
        raise VerifyError(f"{what} is not an inference-image build (no {PROFILE_JSON})")
    return tier.strip()


def summarize(junit: Path) -> tuple[str, bool]:
    """A table of passed/failed/skipped per suite from pytest's JUnit XML; ok when something
    passed and nothing failed."""
    root = ET.parse(junit).getroot()
    counts: dict[str, Counter[str]] = {}
    reasons: dict[str, str] = {}
    failures: list[str] = []
    # what a suite left unjudged on this machine, and why (a `not_judged` property of its run)
    unjudged = sorted({prop.get("value", "") for prop in root.iter("property")
                       if prop.get("name") == "not_judged"})
    for case in root.iter("testcase"):
        suite = case.get("classname", "").rsplit(".", 1)[-1].removeprefix("test_") or "?"
        c = counts.setdefault(suite, Counter())
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if bad is not None:
            c["failed"] += 1
            msg = (bad.get("message") or "").strip().splitlines()
            failures.append(f"  {suite}::{case.get('name')}: {(msg[0] if msg else '')[:200]}")
        elif skipped is not None:
            c["skipped"] += 1
            reasons.setdefault(suite, (skipped.get("message") or "").removeprefix("Skipped: ")[:90])
        else:
            c["passed"] += 1
    order = [s for s in SUITES if s in counts] + sorted(set(counts) - set(SUITES))
    rows = [["SUITE", "PASSED", "FAILED", "SKIPPED", "NOTE"]]
    rows += [[s, str(counts[s]["passed"]), str(counts[s]["failed"]), str(counts[s]["skipped"]),
              reasons.get(s, "") if counts[s]["skipped"] else ""] for s in order]
    lines = text_table(rows).split("\n")
    # A suite that passed nothing proved nothing: it fails the run, whatever its skips say.
    empty = [f"  {s}: nothing passed ({counts[s]['skipped']} skipped: {reasons.get(s, '')})"
             for s in order if counts[s]["passed"] == 0 and not counts[s]["failed"]]
    ok = not failures and not empty and bool(counts)
    extra = (["", "not judged here:", *(f"  {u}" for u in unjudged)] if unjudged else []) + (
        ["", "failures:", *failures] if failures else []) + (
        ["", "suites that passed nothing:", *empty] if empty else [])
    return "\n".join(lines + extra), ok


def preflight_until(t: Target, identity: str | None, seconds: int, interval: float = 10.0) -> str:
    """preflight, retried for up to `seconds`: a machine that was just started refuses SSH, or
    accepts the connection before sshd or cloud-init (the key) is ready. The last error wins."""
    return until(seconds, interval, lambda: preflight(t, identity))


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        pdir = Path(args.profiles_dir) if args.profiles_dir else default_profiles_dir()
        try:
            r = resolve(args.profile, pdir)
        except ProfileErrors as exc:
            raise VerifyError(str(exc.errors[0])) from None
        # gpu only where the tier has one: on cpu every gpu test skips, and a suite that passes
        # nothing fails the run.
        suites = args.suite or ["smoke", "security", "hygiene"] + (
            ["gpu"] if r.profile.hardware.gpu_count else [])
        bad = [s for s in suites if s not in SUITES]
        if bad:
            raise VerifyError(f"--suite {bad[0]}: no such suite (have: {', '.join(SUITES)})")
        target = parse_target(args.host, args.user)
        identity = os.path.expanduser(args.identity) if args.identity else None
        if identity and not Path(identity).is_file():
            raise VerifyError(f"--identity {args.identity}: no such file")
        built = preflight_until(target, identity, args.wait)
        if built != args.profile:
            raise VerifyError(f"{args.host} was built for tier {built}, not {args.profile}")
        if args.wait:
            wait_ready(target, identity, args.wait, serving=not args.no_serving)
    except VerifyError as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return 1
    tests = project_root() / "image_tests"
    junit = Path(args.junit).resolve()
    junit.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tests),
           f"--hosts={target.testinfra_url(identity)}", f"--tier={args.profile}",
           f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    if args.api_host:
        cmd.append(f"--api-host={args.api_host}")
    if args.no_serving:
        cmd.append("--no-serving")
    if args.stand_in_gpu:
        cmd.append(f"--stand-in-gpu={args.stand_in_gpu}")
    if target.kind == "ssh" and target.user != "root":
        cmd.append("--sudo")
    cmd += [str(tests / f"test_{s}.py") for s in suites]
    env = dict(os.environ, PYTHONPATH=str(tests) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, env=env, stdout=None if args.verbose else subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if not junit.is_file():
        print(f"verify: the test run ended before writing {junit} (exit {proc.returncode}):\n"
              f"{(proc.stdout or '')[-2000:]}", file=sys.stderr)
        return 1
    table, ok = summarize(junit)
    print(f"verify {args.host} as tier {args.profile}: suites {', '.join(suites)}\n{table}\n"
          f"JUnit XML: {junit}")
    return 0 if ok and proc.returncode == 0 else 1


def register(sub: argparse._SubParsersAction) -> None:
    vp = sub.add_parser("verify", help="run the image test suites against a machine or container",
                        description=__doc__)
    vp.add_argument("--host", required=True, metavar="HOST[:PORT]",
                    help="SSH target (port 22 by default), podman://CONTAINER or local://")
    vp.add_argument("--profile", required=True, metavar="TIER", help="the tier the machine should be")
    vp.add_argument("--suite", action="append", choices=SUITES, metavar="SUITE",
                    help=f"repeatable; one of {', '.join(SUITES)} (default: smoke, security, "
                         "hygiene, and gpu on GPU tiers; faults, marketplace and acme only when asked)")
    vp.add_argument("--user", default="root", help="SSH user (sudo is used when not root)")
    vp.add_argument("--identity", help="SSH private key (default: the agent, then ~/.ssh keys)")
    vp.add_argument("--api-host", help="address of the API port from here, if not the SSH host")
    vp.add_argument("--wait", type=int, default=0, metavar="SECONDS",
                    help="first wait this long for the router to answer /health (after a boot); "
                    "with --no-serving, for the boot to finish")
    vp.add_argument("--no-serving", action="store_true",
                    help="the stack does not run there (an image being built, a GPU tier "
                    "without its GPU)")
    vp.add_argument("--stand-in-gpu", metavar="NAME",
                    help="the machine's GPU stands in for the profile's (the lab: an H200 serving the "
                    "h100 tier): the gpu suite expects NAME, as nvidia-smi names it, and the report says so")
    vp.add_argument("--junit", default="build/verify/junit.xml", help="JUnit XML report path")
    vp.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    vp.set_defaults(func=cmd_verify)
