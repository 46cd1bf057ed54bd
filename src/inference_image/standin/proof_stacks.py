"""A sampling profiler of Python stacks, for the servers `inference-image proof` starts (never on an
image): where a serving process's host time goes, which the torch profiler's trace only brackets.

Run 23 traced the h100 profile with its draft off at c=64: a decode step every 6.13 ms, the GPU
busy 5.64 ms of it, and 2.44 ms of host time inside vLLM's `execute_model` alone; what the engine
core does in the rest of its loop (scheduling, reading a step's output, handing it to the API
server) the trace cannot say. The torch profiler's own Python tracer (`with_stack`) times every
call and so inflates the many small ones it would have to explain; sampling does not.

sitecustomize.py starts it in every Python process of a proof server where
PROOF_STACKS_DIR is set (vLLM's engine core is forked from the API server: each child starts its
own). A daemon thread looks at every other thread's stack every PROOF_STACKS_INTERVAL_S while the
file `on` exists in that folder (the proof creates it for its window), adds up the time each
distinct stack was seen for (a sample weighs the time since the one before: a thread holding the
GIL delays the sampler, and counting samples alone would under-weigh exactly that thread), and
rewrites `<pid>.json` there every DUMP_EVERY_S while it samples and once the flag is gone. Its
cost is the GIL for one walk of the stacks a sample (tens of microseconds): a few per cent at 1 ms.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections import Counter
from typing import Any

DUMP_EVERY_S = 1.0
MAX_DEPTH = 80


def _title() -> str:
    """The process title vLLM sets (setproctitle rewrites argv: /proc shows it)."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return " ".join(fh.read().replace(b"\0", b" ").decode(errors="replace").split())[:120]
    except OSError:
        return " ".join(sys.argv)[:120]


def frame_name(code: Any, line: int) -> str:
    """`module path:qualified name:line`, the path cut to what follows site-packages."""
    path = code.co_filename
    for mark in ("site-packages/", "dist-packages/", "/lib/python3."):
        if mark in path:
            path = path.split(mark, 1)[1]
            if mark.startswith("/lib/"):
                path = path.split("/", 1)[-1]
            break
    return f"{path}:{getattr(code, 'co_qualname', code.co_name)}:{line}"


class Sampler:
    def __init__(self, folder: str, interval_s: float) -> None:
        self.folder = folder
        self.interval_s = interval_s
        # seconds each (thread, stack) was seen for: each sample stands for the time since the one
        # before, so a thread that holds the GIL (and keeps this one waiting) weighs what it took
        self.counts: Counter[tuple[str, str]] = Counter()
        self.samples = 0
        self.dumped = 0
        self.on_s = 0.0

    def sample(self, me: int, names: dict[int, str], weight_s: float) -> None:
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack: list[str] = []
            f: Any = frame
            while f is not None and len(stack) < MAX_DEPTH:
                stack.append(frame_name(f.f_code, f.f_lineno))
                f = f.f_back
            self.counts[(names.get(ident, str(ident)), ";".join(reversed(stack)))] += weight_s
        self.samples += 1

    def dump(self) -> None:
        doc = {"pid": os.getpid(), "title": _title(), "samples": self.samples,
               "interval_s": self.interval_s, "sampled_s": round(self.on_s, 3),
               "stacks": [[t, s, round(n, 6)] for (t, s), n in self.counts.most_common()]}
        path = os.path.join(self.folder, f"{os.getpid()}.json")
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
        self.dumped = self.samples

    def run(self) -> None:
        me = threading.get_ident()
        flag = os.path.join(self.folder, "on")
        last_dump = time.monotonic()
        names: dict[int, str] = {}
        names_at = 0.0
        last: float | None = None
        while True:
            now = time.monotonic()
            if os.path.exists(flag):
                if now - names_at > 1.0:
                    names = {t.ident: t.name for t in threading.enumerate() if t.ident}
                    names_at = now
                if last is not None:
                    self.sample(me, names, now - last)
                    self.on_s += now - last
                last = now
                time.sleep(self.interval_s)
            else:
                last = None
                time.sleep(0.05)
            if self.samples != self.dumped and (time.monotonic() - last_dump > DUMP_EVERY_S
                                                or not os.path.exists(flag)):
                with contextlib.suppress(OSError):  # a full disk must not end the sampler
                    self.dump()
                last_dump = time.monotonic()


def _start() -> None:
    folder = os.environ.get("PROOF_STACKS_DIR", "")
    if not folder or not os.path.isdir(folder):
        return
    interval = float(os.environ.get("PROOF_STACKS_INTERVAL_S", "0.001"))
    threading.Thread(target=Sampler(folder, interval).run, name="proof-stacks",
                     daemon=True).start()


def install() -> None:
    """Start now and in every child forked later (a forked child has no threads but the caller)."""
    if not os.environ.get("PROOF_STACKS_DIR"):
        return
    _start()
    os.register_at_fork(after_in_child=_start)
