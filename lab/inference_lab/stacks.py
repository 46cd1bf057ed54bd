"""Where a serving process's host time goes, from the proof's stack samples (proof_stacks.py: one
JSON document per process, each distinct stack of each thread with the seconds it was seen for).

A sample is one look at every thread of a process. Per thread this gives the share of the window
it spent waiting (its innermost frame one of WAITS: a lock, a queue, a poll, a future), waiting for
the GPU (GPU_WAITS: a CUDA event or stream synchronised), the innermost frames that took the rest
(a line calling into C shows as that line: a blocking `.tolist()` reads as the line that calls
it), and for the functions that took the most, what they called. Torch-free: it reads JSON.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

# innermost frames that wait rather than work: a Python frame that blocks in C on a lock, a queue,
# a socket or a future. A GPU wait inside C (a CUDA sync behind .tolist()) shows as its caller's
# line instead, and reads as work here.
WAITS = re.compile(
    r"threading\.py:(Condition\.wait|Event\.wait|Thread\.join|Semaphore\.acquire)|"
    r"queue\.py:Queue\.get|selectors\.py:|multiprocessing/connection\.py:|"
    r"concurrent/futures/_base\.py:Future\.result|zmq/.*:(Socket\.)?(poll|recv\w*)|"
    r"zmq/.*:Poller\.poll|asyncio/base_events\.py:BaseEventLoop\.run_forever|"
    r"uvloop/")

# innermost frames that wait for the GPU: a CUDA event or stream synchronised from Python (a sync
# hidden in C, behind .item() or .tolist(), shows as its caller's line and reads as work)
GPU_WAITS = re.compile(r"torch/cuda/(streams|__init__)\.py:(Event\.synchronize|Stream\.synchronize|"
                       r"synchronize):")


def function(frame: str) -> str:
    """`path:qualname` of a `path:qualname:line` frame."""
    return frame.rsplit(":", 1)[0]


def load(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def thread_summary(stacks: list[tuple[list[str], float]], total: float, top: int = 12,
                   children_of: int = 8) -> dict[str, Any]:
    """stacks: (frames outermost first, seconds seen) of one thread; total: the process's sampled
    seconds (each share below is of those)."""
    seen = waiting = gpu = 0.0
    leaves: dict[str, float] = defaultdict(float)
    inclusive: dict[str, float] = defaultdict(float)
    kids: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for frames, n in stacks:
        seen += n
        if not frames:
            continue
        leaves[frames[-1]] += n
        if WAITS.search(frames[-1]):
            waiting += n
        elif GPU_WAITS.search(frames[-1]):
            gpu += n
        funcs = [function(f) for f in frames]
        for f in set(funcs):
            inclusive[f] += n
        # what each function called, once a sample however deep the recursion
        pairs = {(funcs[i], function(frames[i + 1])) for i in range(len(frames) - 1)}
        for parent, child in pairs:
            kids[parent][child] += n
        kids[funcs[-1]]["(itself)"] += n

    def share(n: float) -> float:
        return round(n / total, 4) if total else 0.0

    def most(d: dict[str, float], n: int) -> list[tuple[str, float]]:
        return sorted(d.items(), key=lambda kv: -kv[1])[:n]

    busiest = [f for f, _ in most(inclusive, len(inclusive)) if not WAITS.search(f + ":")]
    return {
        "seen": share(seen), "waiting": share(waiting), "gpu_waiting": share(gpu),
        "working": share(seen - waiting - gpu),
        "leaves": [[f, share(n)] for f, n in most(leaves, top)],
        "inclusive": [[f, share(n)] for f, n in most(inclusive, top * 2)],
        "children": {f: [[c, share(n)] for c, n in most(kids[f], 6)]
                     for f in busiest[:children_of * 3] if len(kids[f]) > 1}}


def summarize(docs: list[dict[str, Any]], min_working: float = 0.02) -> dict[str, Any]:
    """Per process (by title and pid), per thread that worked at least `min_working` of the
    window: thread_summary. Processes never sampled (the flag never seen) are left out."""
    out: dict[str, Any] = {}
    for doc in docs:
        samples, total = doc.get("samples", 0), doc.get("sampled_s") or 0.0
        if not samples or not total:
            continue
        by_thread: dict[str, list[tuple[list[str], float]]] = defaultdict(list)
        for thread, stack, n in doc["stacks"]:
            by_thread[thread].append((stack.split(";") if stack else [], n))
        threads = {t: thread_summary(s, total) for t, s in by_thread.items()}
        threads = {t: s for t, s in threads.items() if s["working"] >= min_working}
        # CPU time a thread used over the window, as a share of it (the main thread's id is the
        # pid): near 1, it computed all along; well below, it waited (for the GPU, the GIL)
        cpu = {("main" if tid == str(doc["pid"]) else f"{name} {tid}"): round(s / total, 3)
               for tid, (name, s) in doc.get("thread_cpu_s", {}).items() if s / total >= 0.01}
        out[f"{doc['pid']} {doc['title']}"] = {
            "samples": samples, "sampled_s": doc.get("sampled_s"),
            "interval_s": doc.get("interval_s"), "cpu": cpu,
            "gc_share": round(sum(doc.get("gc_s", [])) / total, 4),
            "gc_collections": doc.get("gc_collections"), "threads": threads}
    return out


def table(summary: dict[str, Any], leaves: int = 8, children: int = 6) -> str:
    """A short text report: per busy thread, waiting vs working, the innermost frames, and the
    children of the busiest functions."""
    lines: list[str] = []
    for proc, p in summary.items():
        lines.append(f"{proc[:60]}: CPU over the window {p['cpu']}; garbage collection "
                     f"{p['gc_share']:.1%} ({p['gc_collections']} collections by generation)")
        for thread, t in p["threads"].items():
            lines.append(f"{proc[:60]} | {thread}: working {t['working']:.0%}, waiting "
                         f"{t['waiting']:.0%}, on the GPU {t['gpu_waiting']:.0%} of "
                         f"{p['samples']} samples ({p['sampled_s']} s)")
            for f, s in t["leaves"][:leaves]:
                lines.append(f"    {s:6.1%}  {f[-100:]}")
            for parent, kids in list(t["children"].items())[:children]:
                lines.append(f"  {parent[-90:]}")
                lines.append("      " + ", ".join(f"{c.rsplit(':', 1)[-1]} {s:.1%}"
                                                  for c, s in kids))
    return "\n".join(lines)
