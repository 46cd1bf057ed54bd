"""`inference-image soak`: steady load on a serving machine for minutes, through its public port,
from the machine itself (no network between, no rate limit on loopback): per minute, the
requests that succeeded and failed (by status), latency percentiles, and the resident memory of
every service on the request path. It ends with the two soak targets a long-running endpoint must meet: no
failed request, and no service's memory more than 10 % above its first-minute size (a leak shows
as steady growth past the warm-up).

The load runs on the machine as a detached process (stdlib Python), so a dropped SSH connection
does not end it; this side polls its output."""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from inference_machine.contract import PATHS

from ..tables import text_table
from .bench import positive_int, results_json
from .verify import PROFILE_JSON, VerifyError, parse_target, preflight, remote

GROWTH_LIMIT = 0.10  # more than this above minute 1 is a leak, not the warm-up's caches
POLL_TIMEOUT_S = 180
WORK = "/var/tmp/inference-image-soak"

# the load runs on the machine, with the machine's own runtime (its bounded HTTP client), from a
# copy of soak_load.py made for the soak and removed after: no image carries the load
LOAD_SOURCE = Path(__file__).with_name("soak_load.py")
LOAD = f"{PATHS['runtime_venv']}/bin/python {WORK}/load.py"


class SoakError(Exception):
    pass


def assess(minutes: list[dict[str, Any]]) -> list[str]:
    """The targets missed, one line each (empty: both met)."""
    missed = []
    failed: dict[str, int] = {}
    for m in minutes:
        for code, n in m["failed"].items():
            failed[code] = failed.get(code, 0) + n
    if failed:
        missed.append(f"failed requests: {failed}")
    if not any(m["ok"] for m in minutes):
        missed.append("no request succeeded")
    if len(minutes) >= 2:
        first, last = minutes[0]["rss_mib"], minutes[-1]["rss_mib"]
        for unit, base in first.items():
            if base and last.get(unit, 0) > base * (1 + GROWTH_LIMIT):
                missed.append(f"{unit}: resident memory {base} -> {last[unit]} MiB "
                              f"(+{(last[unit] / base - 1) * 100:.1f} %, limit "
                              f"{GROWTH_LIMIT * 100:.0f} %)")
    return missed


def table(minutes: list[dict[str, Any]]) -> str:
    units = list(minutes[0]["rss_mib"]) if minutes else []
    short = [u.removesuffix(".service").replace("vllm@", "") for u in units]
    head = ["min", "ok", "failed", "p50 ms", "p90 ms", "p99 ms", *[f"{s} MiB" for s in short]]
    rows = [head] + [[str(m["minute"]), str(m["ok"]), str(sum(m["failed"].values())),
                      str(m["p50_ms"]), str(m["p90_ms"]), str(m["p99_ms"]),
                      *[str(m["rss_mib"][u]) for u in units]] for m in minutes]
    return text_table(rows, align="r" * len(head))


def run(args: argparse.Namespace) -> dict[str, Any]:
    target = parse_target(args.host, args.user)
    identity = args.identity
    tier = preflight(target, identity)
    if args.profile and tier != args.profile:
        raise SoakError(f"{args.host} was built for tier {tier}, not {args.profile}")
    rc, text = remote(target, identity, f"cat {PROFILE_JSON}")
    if rc:
        raise SoakError(f"cannot read {PROFILE_JSON} on {args.host}")
    try:
        prof = json.loads(text)
        conc = args.concurrency or int(prof["profile"]["targets"]["concurrency"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise SoakError(f"{PROFILE_JSON} on {args.host} is not an inference-image profile "
                        "document (no profile.targets.concurrency). Fix: soak a machine built by "
                        "`make image`, or give --concurrency") from None
    cfg = {"profile_json": PROFILE_JSON, "out": f"{WORK}/minutes.jsonl",
           "minutes": args.minutes, "concurrency": conc, "max_tokens": args.max_tokens}
    source = base64.b64encode(LOAD_SOURCE.read_bytes()).decode()
    start = (f"rm -rf {WORK} && mkdir -p {WORK} && echo {source} | base64 -d > {WORK}/load.py && "
             f"setsid nohup {LOAD} {shlex.quote(json.dumps(cfg))} "
             f"> {WORK}/stdout 2>&1 < /dev/null &")
    rc, _ = remote(target, identity, start, timeout=POLL_TIMEOUT_S)
    if rc:
        raise SoakError(f"could not start the load on {args.host}")
    print(f"soak {args.host} ({tier}): {args.minutes} min at concurrency {conc}, "
          f"{args.max_tokens} tokens per request", flush=True)
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.minutes * 60 + 900
    try:
        while True:
            time.sleep(20)
            try:
                _, text = remote(target, identity, f"cat {WORK}/minutes.jsonl 2>/dev/null; "
                                 f"tail -c 600 {WORK}/stdout 2>/dev/null | sed 's/^/stdout: /'",
                                 timeout=POLL_TIMEOUT_S)
            except (subprocess.TimeoutExpired, VerifyError):
                # a machine at full load answers slowly (podman exec on the 2-core build host
                # outlasts the poll's timeout); the load runs on regardless: ask again
                continue
            lines = []
            for ln in text.splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    if ln.startswith("{") and isinstance(m := json.loads(ln), dict):
                        lines.append(m)
            for m in lines[len(seen):]:
                if "minute" in m:
                    seen.append(m)
                    print(f"  minute {m['minute']}: ok {m['ok']} failed {m['failed']} "
                          f"p50 {m['p50_ms']} ms p99 {m['p99_ms']} ms rss {m['rss_mib']}", flush=True)
            if any(m.get("done") for m in lines):
                break
            if time.monotonic() > deadline:
                err = "\n".join(ln for ln in text.splitlines() if ln.startswith("stdout: "))
                raise SoakError(f"the load did not finish in time on {args.host}: {err[-300:]}")
    finally:
        remote(target, identity, f"pkill -f {WORK}/load.py; rm -rf {WORK}", timeout=POLL_TIMEOUT_S)
    return {"host": args.host, "tier": tier, "minutes": args.minutes, "concurrency": conc,
            "max_tokens": args.max_tokens, "per_minute": seen, "missed": assess(seen)}


def cmd_soak(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if not args.out.strip() or out.is_symlink() or out.is_dir():
        print(f"error: --out {args.out!r}: empty, a symbolic link or a directory. Fix: give the "
              "path of the result file, e.g. build/soak/h100.json", file=sys.stderr)
        return 1
    try:
        res = run(args)
    except (SoakError, VerifyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(results_json(res, indent=2) + "\n")
    print(table(res["per_minute"]))
    print(f"\nresult: {out}")
    for line in res["missed"]:
        print(f"target missed: {line}")
    if not res["missed"]:
        print("targets met: no failed request, no service's memory +10 % over minute 1")
    return 1 if res["missed"] else 0


def register(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("soak", help="steady load on a serving machine for minutes: failures, "
                        "latency and memory per minute")
    sp.add_argument("--host", required=True, help="HOST[:PORT] (SSH), podman://NAME or local://")
    sp.add_argument("--profile", metavar="TIER", help="fail unless the machine is this tier")
    sp.add_argument("--minutes", type=positive_int, default=10)
    sp.add_argument("--concurrency", type=positive_int, help="default: the profile's target concurrency")
    sp.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per completion")
    sp.add_argument("--user", default="root")
    sp.add_argument("--identity", help="SSH private key")
    sp.add_argument("--out", default="build/soak/soak.json")
    sp.set_defaults(func=cmd_soak)
