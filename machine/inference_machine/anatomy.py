"""A start's anatomy: its moments and phases from vLLM's log, and what the machine says of it."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import boundary
from .bundle import _now
from .inputs import Refused, finite

# ---- a start's anatomy ------------------------------------------------------------------------

# The moments a vLLM 0.26 start passes, in the order they come, each the first log line matching
# its pattern (`last`: the last such line before the next moment). A moment a start skips (a
# cache hit compiles nothing) leaves its time to the next.
MOMENTS: tuple[tuple[str, str, bool], ...] = (
    ("api_imported", r"\(APIServer pid=\d+\)|vLLM API server version", False),
    ("engine_started", r"\(EngineCore[^ ]* pid=\d+\)", False),
    ("weights_loaded", r"Model loading took", False),
    ("compiled", r"torch\.compile took|Directly load", True),
    ("kv_profiled", r"Available KV cache memory|GPU KV cache size", False),
    ("graphs_captured", r"Graph capturing finished", True),
    ("engine_ready", r"init engine \(profile, create kv cache, warmup model\) took", False),
    ("api_ready", r"Application startup complete", False),
)
# the phase that ends at each moment (a stacked bar's segments, in order)
PHASES = {"api_imported": "api_imports", "engine_started": "engine_process",
          "weights_loaded": "weights", "compiled": "compile", "kv_profiled": "kv_profile",
          "graphs_captured": "graph_capture", "engine_ready": "warmup",
          "api_ready": "api_startup", "ready": "health", "answered": "first_answer"}
# what vLLM says each part took, summed over its lines (the target's and the draft's)
REPORTED = (
    ("weights_s", r"Loading weights took ([0-9.]+) s"),
    ("dynamo_s", r"Dynamo bytecode transform time: ([0-9.]+) s"),
    ("inductor_s", r"Compiling a graph for compile range .* takes ([0-9.]+) s"),
    ("compile_s", r"torch\.compile took ([0-9.]+) s in total"),
    ("graph_capture_s", r"Graph capturing finished in ([0-9.]+) secs"),
    ("engine_init_s", r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)"),
)
# lines that say what the start reused or redid
SAID = (
    ("warm_cache", r"inference-startup: (warm-cache bundle.*|no warm-cache bundle.*)"),
    ("loaded_compiled", r"Directly load"),
    ("spawned", r"Overriding VLLM_WORKER_MULTIPROC_METHOD to 'spawn'.*"),
    ("startup_plan", r"Applying persisted startup plan|Saved startup plan"),
)


def anatomy(lines: Iterable[tuple[float, str]], ready_s: float | None = None,
            answered_s: float | None = None) -> dict[str, Any]:
    """A start's moments (seconds from its process start), the phases between them, what vLLM
    reported for each part, and what it said it reused: from (seconds, line) pairs, e.g. the
    journal's monotonic stamps less the unit's start, or the lab's own clock."""
    moments: dict[str, float] = {}
    reported: dict[str, float] = {}
    said: dict[str, Any] = {}
    order = [m[0] for m in MOMENTS]
    for t, line in lines:
        for i, (name, pat, last) in enumerate(MOMENTS):
            if not re.search(pat, line):
                continue
            later = [n for n in order[i + 1:] if n in moments]
            if name not in moments or (last and not later):
                moments[name] = round(t, 2)
        for name, pat in REPORTED:
            if (m := re.search(pat, line)) and (v := _number(m.group(1))) is not None:
                reported[name] = round(reported.get(name, 0.0) + v, 2)
        for name, pat in SAID:
            if m := re.search(pat, line):
                if name == "loaded_compiled":
                    said[name] = int(said.get(name, 0)) + 1
                else:
                    said.setdefault(name, m.group(0)[:200])
    if ready_s is not None:
        moments["ready"] = round(ready_s, 2)
    if answered_s is not None:
        moments["answered"] = round(answered_s, 2)
    # [name, seconds] in the order a start passes them (JSON objects lose their order in a record
    # written with sorted keys)
    phases: list[list[Any]] = []
    prev = 0.0
    for name in [*order, "ready", "answered"]:
        if name in moments and moments[name] >= prev:
            phases.append([PHASES[name], round(moments[name] - prev, 2)])
            prev = moments[name]
        elif name in ("ready", "answered") and name in moments:
            # measured by the caller, not read from the log: a log line stamped by a reader that
            # lagged behind it still leaves the phase, at no time
            phases.append([PHASES[name], 0.0])
    return {"moments": moments, "phases": phases, "reported": reported, "said": said}


_MONO = re.compile(r"^\[\s*([0-9]+\.[0-9]+)\]\s?(.*)$")


def _number(text: str) -> float | None:
    """A finite number of seconds from a log line, None for what is not one (a 400-digit stamp
    is an infinity, '1.2.3' no number): such a line is skipped, never an error or NaN in JSON."""
    try:
        return finite(text, "time", 0.0, 1e12)
    except Refused:
        return None


def journal_lines(text: str, since: float) -> list[tuple[float, str]]:
    """(seconds after `since`, message) from `journalctl -o short-monotonic` output."""
    out = []
    for raw in text.splitlines():
        # what the phases read sits at a line's start: a longer line is cut, so a start that logs
        # long lines cannot slow the banner that reads them
        raw = raw[:MAX_LINE]
        if (m := _MONO.match(raw)) and (t := _number(m.group(1))) is not None:
            rest = m.group(2)
            # short-monotonic: "[ 123.456789] host unit[pid]: message"
            msg = rest.split(": ", 1)[1] if ": " in rest else rest
            out.append((t - since, msg))
    return out


# ---- a start that became ready, on the machine -------------------------------------------------

def _systemctl_show(unit: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, "-p", "InvocationID",
                          "-p", "ExecMainStartTimestampMonotonic"],
                         capture_output=True, text=True, errors="replace", timeout=30,
                         check=False).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _monotonic_now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def ready_report(journal: str, start_s: float, now_s: float) -> dict[str, Any]:
    """A start that just became ready: when, how long since its process started,
    its phases from its journal (`journalctl -o short-monotonic` of this invocation)."""
    a = anatomy(journal_lines(journal, start_s), ready_s=now_s - start_s)
    return {"at": _now(), "s": round(now_s - start_s, 1), "phases": a["phases"],
            "warm_cache": a["said"].get("warm_cache", "").removeprefix("inference-startup: ")}


def record_ready(endpoint: Path, instance: str, report: dict[str, Any]) -> None:
    """Add the instance's ready report to the machine's endpoint.json (one writer at a time)."""
    lock_fd = boundary.open_regular(endpoint.with_name(endpoint.name + ".lock"),
                                    os.O_WRONLY | os.O_CREAT)
    with os.fdopen(lock_fd, "wb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            doc = boundary.read_json(endpoint, 1 << 20)
        except (OSError, ValueError):  # missing, not a regular file, not JSON: written anew
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        ready = doc.get("ready") if isinstance(doc.get("ready"), dict) else {}
        doc["ready"] = {**ready, instance: report}
        boundary.write_file(endpoint, (json.dumps(doc) + "\n").encode(), 0o644)


# what a start is doing once it has passed each moment (the login banner says it)
DOING = {"": "importing Python", "api_imported": "configuring the engine",
         "engine_started": "loading the weights", "weights_loaded": "compiling (torch.compile)",
         "compiled": "sizing the KV cache", "kv_profiled": "capturing CUDA graphs",
         "graphs_captured": "warming up", "engine_ready": "starting the API",
         "api_ready": "answering its health check"}


def _invocation(instance: str) -> tuple[float, str] | None:
    show = _systemctl_show(f"vllm@{instance}.service")
    us = show.get("ExecMainStartTimestampMonotonic", "")
    # systemd's microseconds; anything else is no start time (the unit not started)
    start = int(us) / 1e6 if re.fullmatch(r"[0-9]{1,19}", us) else 0.0
    inv = show.get("InvocationID", "")
    return (start, inv) if start and re.fullmatch(r"[0-9a-f]{32}", inv) else None


def _journal(inv: str) -> str:
    return subprocess.run(["journalctl", f"_SYSTEMD_INVOCATION_ID={inv}", "-o",
                           "short-monotonic", "--no-pager", "-n", str(MAX_LINES)],
                          capture_output=True, text=True, errors="replace", timeout=60,
                          check=False).stdout


# how much of a start's journal is read: its phases' marks are a few dozen lines
MAX_LINE = 2000
MAX_LINES = 20_000


def doing(journal: str, start_s: float, now_s: float) -> str:
    """What a start is doing now, and for how long it has been starting."""
    moments = anatomy(journal_lines(journal, start_s))["moments"]
    last = max(moments, key=moments.__getitem__) if moments else ""
    return f"{DOING.get(last, 'starting')}, {now_s - start_s:.0f} s into its start"


def status(instance: str) -> str:
    found = _invocation(instance)
    if found is None:
        return "not started"
    start, inv = found
    return doing(_journal(inv), start, _monotonic_now())


def ready(instance: str, endpoint: Path) -> str:
    """Run by a vLLM unit once it answers (ExecStartPost, as root): log the start's phases to the
    journal and record them in endpoint.json. One line, whatever it finds."""
    found = _invocation(instance)
    if found is None:
        return f"{instance}: ready (no start time or invocation from systemd)"
    start, inv = found
    report = ready_report(_journal(inv), start, _monotonic_now())
    record_ready(endpoint, instance, report)
    phases = ", ".join(f"{n} {sec:.1f}" for n, sec in report["phases"])
    return f"{instance}: ready after {report['s']} s ({phases})"
