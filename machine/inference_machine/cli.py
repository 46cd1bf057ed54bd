"""inference-startup's command line."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from . import __doc__ as USAGE
from . import notify, rendered, unit_checkpoint, version_info
from .anatomy import anatomy, journal_lines, ready, status
from .banner import Machine, motd
from .bounded_http import fetch
from .bundle import BundleError, NothingCompiled, check, describe, install, machine_key, make, seal
from .fleetfile import FleetFileError, role_line
from .inputs import Port, Refused, finite, printable
from .prepare import inspect_models, precompile_kernels, prefetch, prefetch_roots

# ---- command line ----------------------------------------------------------------------------

def _say(*parts: object, file: object = None, flush: bool = False) -> None:
    """One line of what a command found, which holds text from files (a bundle's manifest, the
    journal, a fleet file): printable alone (inputs.printable), never a terminal's control."""
    print(printable(" ".join(str(p) for p in parts)), file=file or sys.stdout, flush=flush)


def _key_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", required=True, type=Path, help="the instance cache root")
    p.add_argument("--profile-json", type=Path, help="the render's profile.json")


def _port_or_none(s: str) -> str:
    """notify's port: 1-65535, or '' for an instance with none (a pipeline stage's node)."""
    try:
        return str(Port.parse(s)) if s else s
    except Refused as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(s: str) -> int:
    try:
        return Port.parse(s)
    except Refused as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _pid(s: str) -> int:
    """A process id: 1 or more (0 and -1 name process groups and every process to kill())."""
    if not (s.isascii() and s.isdigit() and len(s) <= 10 and int(s) >= 1):
        raise argparse.ArgumentTypeError(f"{printable(s, 20)!r} is not a process id. Fix: a "
                                         "whole number of 1 or more")
    return int(s)


def _pid_or_zero(s: str) -> int:
    return 0 if s == "0" else _pid(s)


def _seconds(s: str) -> float:
    """A time in seconds from the command line: finite, 0 or more (never nan, inf or negative,
    which would make a wait end at once or never)."""
    try:
        return finite(s, "time in seconds", 0.0, 10 * 365 * 86400.0)
    except Refused as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _interval(s: str) -> float:
    """A poll interval: as _seconds, and more than 0 (a loop of 0 s spins)."""
    v = _seconds(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"the interval {printable(s, 20)!r} is not more than 0 "
                                         "seconds. Fix: give a positive number")
    return v


# ---- each command: its arguments' parser, then what it does (0 or an exit status) ------------

def _key(args: argparse.Namespace) -> int:
    print(json.dumps(machine_key(args.cache, args.profile_json), indent=1))
    return 0


def _make(args: argparse.Namespace) -> int:
    if not os.environ.get("MODEL_PATH"):
        _say("inference-startup: make: MODEL_PATH is not set, so the bundle's key would name no "
             "model and every machine would refuse it. Fix: run it with the unit's environment "
             "(MODEL_PATH, DRAFT_PATH, as inference-run exports them)", file=sys.stderr)
        return 1
    m = make(args.cache, args.out, machine_key(args.cache, args.profile_json))
    _say(f"inference-startup: {args.out}: {len(m['files'])} files, "
         f"{m['bytes'] / 2**20:.0f} MiB of cache")
    return 0


def _install(args: argparse.Namespace) -> int:
    m = install(args.bundle, args.cache, args.owner)
    done = "already installed" if m.get("already") else "installed"
    if m.get("rejected"):
        done += f" (a start here did not use it: {m['rejected']})"
    _say(f"inference-startup: {done}: {len(m['files'])} files in {args.cache} "
         f"(made {m.get('made', '?')} for {m['key'].get('gpu', '?')})")
    return 0


def _seal(args: argparse.Namespace) -> int:
    try:
        m = seal(args.cache, machine_key(args.cache, args.profile_json), args.owner)
    except NothingCompiled as exc:  # a start run eager: the image starts as before
        _say(f"inference-startup: {exc}; nothing sealed")
        return 0
    gpu = m["key"].get("gpu", "none")
    _say(f"inference-startup: {args.cache}: " + (
        f"a bundle made {m.get('made', '?')} is installed already; kept" if m.get("already") else
        f"sealed {len(m['files'])} files, {m['bytes'] / 2**20:.0f} MiB of cache, for "
        + (f"{gpu} machines" if gpu != "none" else "machines without a GPU")))
    return 0


def _version_info(args: argparse.Namespace) -> int:
    text = version_info.write(args.profile_json, args.file)
    if text:
        sys.stdout.write(text)
    return 0


def _show(args: argparse.Namespace) -> int:
    _say(f"inference-startup: {describe(args.bundle)}")
    return 0


def _check(args: argparse.Namespace) -> int:
    try:
        key = machine_key(args.cache, args.profile_json)
    except BundleError as exc:
        key = {}
        _say(f"inference-startup: {exc}", file=sys.stderr)
    try:
        line = check(args.cache, key)[1] if key else "no key: the bundle was not read"
    except Exception as exc:
        line = f"the warm-cache check failed ({type(exc).__name__}: {exc}); starting"
    _say(f"inference-startup: {line}", flush=True)
    return 0


def _prefetch(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    reads, models = prefetch_roots()
    try:
        n, total = prefetch(reads, models)
    except BundleError as exc:
        _say(f"inference-startup: prefetch: {exc}", file=sys.stderr)
        return 1
    _say(f"inference-startup: read ahead {n} files, {total / 2**30:.1f} GiB, in "
         f"{time.monotonic() - t0:.1f} s" + ("" if reads else
         " (the models only: no record of what a start reads; the build's "
         "`inference-startup inspect` writes it)"), flush=True)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    _say(f"inference-startup: {inspect_models(args.env, args.args, args.owner)}")
    return 0


def _precompile(args: argparse.Namespace) -> int:
    _say(f"inference-startup: {precompile_kernels(args.env, args.owner)}")
    return 0


def _notify(args: argparse.Namespace) -> int:
    if not os.environ.get("NOTIFY_SOCKET") or not re.fullmatch(
            r"|head|node:[A-Za-z0-9._-]{1,255}:[0-9]{1,5}", args.watch):
        _say("inference-startup: notify: runs beside a Type=notify unit (NOTIFY_SOCKET set), "
             "--watch '', head or node:HOST:PORT. Fix: let the unit's inference-run start it",
             file=sys.stderr)
        return 2
    if args.watch.startswith("node:"):
        try:
            Port.parse(args.watch.rsplit(":", 1)[1], "head's rendezvous port")
        except Refused as exc:
            _say(f"inference-startup: notify: --watch: {exc}", file=sys.stderr)
            return 2
    elif not args.port:
        # READY=1 says the instance answers: only a node's stage, which serves no port, is ready
        # without asking one
        _say("inference-startup: notify: no port to ask /health on, and this is no node's stage "
             "(--watch node:HOST:PORT). Fix: give the instance's port (its --port argument)",
             file=sys.stderr)
        return 2
    notify.run(args.port, args.watch, args.pid, args.model,
               notify.Limits(args.stall_s, args.probe_every_s, args.poll_s, args.stop_timeout_s))
    return 0


def _fleet_role(args: argparse.Namespace) -> int:
    try:
        _say(role_line(args.fleet, args.mode, args.nodes))
    except FleetFileError as exc:
        _say(exc, file=sys.stderr)
        return 1
    return 0


def _ready(args: argparse.Namespace) -> int:
    try:
        line = ready(args.instance, args.endpoint)
    except Exception as exc:  # a report never fails a start
        line = f"{args.instance}: ready; no report ({type(exc).__name__}: {exc})"
    _say(f"inference-startup: {line}", flush=True)
    return 0


def _status(args: argparse.Namespace) -> int:
    try:
        _say(status(args.instance))
    except (OSError, subprocess.SubprocessError):
        _say("starting")
    return 0


def _motd(args: argparse.Namespace) -> int:
    """The banner; what is not given comes from the render's profile.json (the image's
    update-motd.d script gives nothing)."""
    if None in (args.instance, args.endpoint, args.tier, args.router_port, args.tls_mode_file,
                args.acme_conf):
        try:
            doc = rendered.profile()
        except rendered.RenderedError:
            return 0  # no render: no banner, and no error at a login
        # a profile.json edited by hand: each field taken where it is of its type, else left
        # empty (no banner line for it), never a traceback at a login
        def text(v: object) -> str:
            return v if isinstance(v, str) else ""

        paths = doc.get("paths") if isinstance(doc.get("paths"), dict) else {}
        first = (doc.get("instances") or [{}])[0] if isinstance(doc.get("instances"), list) else {}
        router = doc.get("router") if isinstance(doc.get("router"), dict) else {}
        args.instance = args.instance or text(first.get("name") if isinstance(first, dict) else "")
        endpoint = text(paths.get("endpoint"))
        if not args.endpoint and not endpoint:
            return 0
        args.endpoint = args.endpoint or Path(rendered.root() + endpoint)
        args.tier = args.tier or text(doc.get("tier"))
        try:
            args.router_port = args.router_port or Port.parse(router.get("internal_port"))
        except Refused:
            args.router_port = 0
        args.tls_mode_file = args.tls_mode_file or text(paths.get("tls_mode"))
        args.acme_conf = args.acme_conf or text(paths.get("acme_conf"))
    print(motd(args.endpoint, Machine(args.tier, args.instance, args.router_port,
                                      args.tls_mode_file, args.acme_conf)), end="")
    return 0


def _public_health(args: argparse.Namespace) -> int:
    """/health on this machine's public port as a client reaches it: TLS checked against the
    machine's certificate, or plain HTTP where first boot chose it (endpoint.json); the status,
    or the error, in one line, within the deadline."""
    import ssl
    try:
        doc = rendered.profile()
        ep = rendered.read_endpoint(doc)
        tls = ep.get("tls") != "off"
        ctx = (ssl.create_default_context(cafile=rendered.root() + str(ep.get("tls_cert")))
               if tls else None)
        url = f"{'https' if tls else 'http'}://127.0.0.1:{doc['router']['port']}/health"
        print(fetch(url, deadline_s=args.deadline_s, context=ctx).status)
    except Exception as exc:
        _say(f"ERROR {type(exc).__name__}: {exc}")
        return 1
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    return unit_checkpoint.helper(args.instance, args.units, args.store, args.run, args.criu,
                                  args.pid, args.start_timeout_s)


def _follow(args: argparse.Namespace) -> int:
    return unit_checkpoint.follow(args.pid)


def _phases(args: argparse.Namespace) -> int:
    lines = journal_lines(sys.stdin.read(), args.since_monotonic)
    print(json.dumps(anatomy(lines, args.ready_s)))
    return 0


def _unit_file_args(p: argparse.ArgumentParser, args_file: bool = False) -> None:
    p.add_argument("--env", required=True, type=Path, help="the unit's environment file")
    if args_file:
        p.add_argument("--args", type=Path, help="the unit's arguments file")
    p.add_argument("--owner", help="the user the instances run as")


def _bundle_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("key", help="this machine's key (JSON)")
    _key_args(p)
    p.set_defaults(handler=_key)
    p = sub.add_parser("make", help="pack the cache into a bundle")
    _key_args(p)
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(handler=_make)
    p = sub.add_parser("show", help="what a bundle holds and which machine it is for")
    p.add_argument("bundle", type=Path)
    p.set_defaults(handler=_show)
    p = sub.add_parser("install", help="unpack a bundle into the cache")
    p.add_argument("bundle", type=Path)
    p.add_argument("--cache", required=True, type=Path)
    p.add_argument("--owner", help="the user the instances run as")
    p.set_defaults(handler=_install)
    p = sub.add_parser("seal", help="make the cache as it stands a bundle installed in place, "
                       "keyed for this machine (a build that served on the tier's own GPU)")
    _key_args(p)
    p.add_argument("--owner", help="the user the instances run as")
    p.set_defaults(handler=_seal)
    p = sub.add_parser("check", help="keep a bundle that is this machine's, remove one that "
                       "is not (one line; exit 0 whatever it finds)")
    _key_args(p)
    p.set_defaults(handler=_check)
    p = sub.add_parser("prefetch", help="read what a start will read into the page cache (what "
                       "the build's inspection recorded, then MODEL_PATH and DRAFT_PATH)")
    p.set_defaults(handler=_prefetch)
    p = sub.add_parser("version-info", help="what a snapshot of this machine holds, as JSON "
                       "(kernel, driver, CUDA, vLLM, torch, router, models, profile hash): printed, "
                       "or written to FILE (0644, atomically; sysprep's image.json)")
    p.add_argument("profile_json", type=Path)
    p.add_argument("file", type=Path, nargs="?")
    p.set_defaults(handler=_version_info)
    p = sub.add_parser("inspect", help="inspect the models' architectures with the unit's vLLM, "
                       "as its start would, into vLLM's cache (the build, once)")
    _unit_file_args(p, args_file=True)
    p.set_defaults(handler=_inspect)
    p = sub.add_parser("precompile", help="compile the Triton kernels a start of the unit's tier "
                       "compiles (recorded on a GPU) into its Triton cache (the build, once)")
    _unit_file_args(p)
    p.set_defaults(handler=_precompile)


def _start_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("fleet-role", help="this machine's part in a fleet, from its fleet file, "
                       "as one line (inference-join's reading)")
    p.add_argument("fleet", type=Path)
    p.add_argument("--mode", default="join", help="inference-join's mode (join, --role, ...)")
    p.add_argument("--nodes", type=int, default=1, help="machines one instance spans")
    p.set_defaults(handler=_fleet_role)
    p = sub.add_parser("notify", help="beside a Type=notify instance: READY=1 once it answers, "
                       "then the watch of a multi-machine instance's other stages")
    p.add_argument("port", type=_port_or_none, help="the instance's port ('' if it has none)")
    p.add_argument("--watch", default="", help='"", "head" or "node:HOST:PORT"')
    p.add_argument("--pid", type=_pid, required=True, help="the instance's process")
    p.add_argument("--model", default="", help="the served model name (the head's probe)")
    for name, default in (("stall-s", 60.0), ("probe-every-s", 30.0), ("poll-s", 5.0),
                          ("stop-timeout-s", 15.0)):
        p.add_argument(f"--{name}", type=_interval, default=default)
    p.set_defaults(handler=_notify)
    p = sub.add_parser("ready", help="a vLLM unit's start that just became ready: its phases to "
                       "the journal and the machine's endpoint.json (ExecStartPost)")
    p.add_argument("instance")
    p.add_argument("--endpoint", type=Path, required=True)
    p.set_defaults(handler=_ready)
    p = sub.add_parser("status", help="what a vLLM unit's start is doing now (the login banner)")
    p.add_argument("instance")
    p.set_defaults(handler=_status)
    p = sub.add_parser("motd", help="the login banner: the API's address, key and certificate "
                       "from endpoint.json, and what the instance is doing (update-motd.d); "
                       "what is not given, from the render's profile.json")
    p.add_argument("instance", nargs="?")
    p.add_argument("--endpoint", type=Path)
    p.add_argument("--tier")
    p.add_argument("--router-port", type=_port, help="the router's loopback port")
    p.add_argument("--tls-mode-file", help="where a machine's TLS mode is chosen")
    p.add_argument("--acme-conf", help="where an ACME certificate's domain is set")
    p.set_defaults(handler=_motd)
    p = sub.add_parser("public-health", help="/health on the public port as a client reaches "
                       "it (TLS checked against the machine's certificate): the status, one line")
    p.add_argument("--deadline-s", type=float, default=5.0)
    p.set_defaults(handler=_public_health)
    p = sub.add_parser("checkpoint", help="beside a start of an instance that checkpoints "
                       "(serving.checkpoint; root): restore its checkpoint, or take one once the "
                       "cold start answers, and say which to the start's main process")
    p.add_argument("instance")
    for name, what in (("units", "the units' folder"), ("store", "the checkpoints' folder"),
                       ("run", "where the word to the main process and the gate's flag go")):
        p.add_argument(f"--{name}", type=Path, required=True, help=what)
    p.add_argument("--criu", required=True, help="CRIU's binary")
    p.add_argument("--pid", type=_pid_or_zero, default=0, help="the start's main process (without "
                   "systemd; default: vllm@INSTANCE's MainPID)")
    p.add_argument("--start-timeout-s", type=_interval, default=1800.0)
    p.set_defaults(handler=_checkpoint)
    p = sub.add_parser("follow", help="stand for a restored instance (not this process's child) "
                       "until it exits, handing it the stop signals")
    p.add_argument("pid", type=_pid)
    p.set_defaults(handler=_follow)
    p = sub.add_parser("phases", help="a start's phases from `journalctl -o short-monotonic`")
    p.add_argument("--since-monotonic", type=_seconds, default=0.0)
    p.add_argument("--ready-s", type=_seconds)
    p.set_defaults(handler=_phases)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="inference-startup",
                                 description=(USAGE or "").split("\n\n")[0],
                                 epilog="\n".join((USAGE or "").split("\n\n")[-1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    _bundle_parsers(sub)
    _start_parsers(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (BundleError, rendered.RenderedError, FleetFileError, Refused) as exc:
        _say(f"inference-startup: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        # a path that is not what it must be (boundary's refusals), a full or read-only disk, a
        # process gone or another user's: one line naming it, never a traceback
        _say(f"inference-startup: {args.cmd}: {exc}. Fix: the cause named above", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
