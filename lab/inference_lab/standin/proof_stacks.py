"""A sampling profiler of Python stacks, for the servers `inference-lab proof` starts (never on an
image): where a serving process's host time goes, which the torch profiler's trace only brackets.

A trace of a serving process shows the GPU's steps and the host time inside vLLM's
`execute_model`; what the engine core does in the rest of its loop (scheduling, reading a step's
output, handing it to the API server) the trace cannot say. The torch profiler's own Python
tracer (`with_stack`) times every call and so inflates the many small ones it would have to
explain; sampling does not.

sitecustomize.py installs it in every Python process of a proof server where PROOF_STACKS_DIR is
set (vLLM's engine core is forked from the API server: a forked child re-arms it). While the file
`on` exists in that folder (the proof creates it for its window), a wall-clock timer interrupts
the process every PROOF_STACKS_INTERVAL_S, and the signal's handler, which Python runs in the main
thread between two bytecodes, adds the time since its last run to the main thread's stack as it
stands (and to every other thread's, as they stand at that moment). A thread watching from the side
would be no good here: it needs the GIL to look, so it sees the engine's thread only where that
thread lets go of the GIL, and the Python work before (scheduling, all GIL-bound) would be
booked to the next call into C (the first version did that, booking a step's scheduling to one
CUDA copy).
Time the main thread spends blocked in C (a CUDA sync, a lock) is booked to the line that called
it: the handler runs when the call returns. `<pid>.json` is rewritten every DUMP_EVERY_S while it
samples and once the flag is gone, with the garbage collector's pauses and each thread's CPU time
over the window beside the stacks.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
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
        # seconds each (thread, stack) was seen for
        self.counts: Counter[tuple[str, str]] = Counter()
        self.samples = 0
        self.dumped = 0
        self.on_s = 0.0
        self.last: float | None = None
        self.watcher = 0
        # thread names, kept by the watcher: the handler must not take threading's locks, which
        # the main thread it interrupted may be holding
        self.names: dict[int, str] = {}
        # the garbage collector while sampling (its pauses land on whatever line allocated):
        # seconds and collections per generation
        self.gc_s = [0.0, 0.0, 0.0]
        self.gc_n = [0, 0, 0]
        self._gc_t0 = 0.0
        self.on = False  # the timer is armed (the watcher's state; on_gc reads it)
        # each thread's CPU seconds over the window (/proc: utime + stime), by native id
        self.cpu_at_on: dict[str, tuple[str, float]] = {}
        self.cpu_s: dict[str, list[Any]] = {}

    def sample(self, frame: Any, weight_s: float) -> None:
        """The main thread at `frame`, the others where they stand; each weighs weight_s."""
        main = threading.main_thread().ident
        names = self.names
        for ident, f in sys._current_frames().items():
            if ident == self.watcher:
                continue
            if ident == main:
                f = frame
            stack: list[str] = []
            while f is not None and len(stack) < MAX_DEPTH:
                stack.append(frame_name(f.f_code, f.f_lineno))
                f = f.f_back
            self.counts[(names.get(ident, str(ident)), ";".join(reversed(stack)))] += weight_s
        self.samples += 1

    def on_signal(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.last is not None and frame is not None:
            self.sample(frame, now - self.last)
            self.on_s += now - self.last
        self.last = now

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0:
            g = info.get("generation", 0)
            self.gc_s[g] += time.perf_counter() - self._gc_t0
            self.gc_n[g] += 1
            self._gc_t0 = 0.0

    def dump(self) -> None:
        doc = {"pid": os.getpid(), "title": _title(), "samples": self.samples,
               "interval_s": self.interval_s, "sampled_s": round(self.on_s, 3),
               "gc_s": [round(x, 4) for x in self.gc_s], "gc_collections": self.gc_n,
               # by thread id; the main thread's is the pid
               "thread_cpu_s": self.cpu_s,
               "stacks": [[t, s, round(n, 6)] for (t, s), n in self.counts.most_common()]}
        path = os.path.join(self.folder, f"{os.getpid()}.json")
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
        self.dumped = self.samples

    def watch(self) -> None:
        """Arms the timer while the flag is there, disarms it and writes the file after."""
        self.watcher = threading.get_ident()
        flag = os.path.join(self.folder, "on")
        last_dump = time.monotonic()
        while True:
            self.names = {t.ident: t.name for t in threading.enumerate() if t.ident}
            on = os.path.exists(flag)
            if on and not self.on:
                self.last = None
                self.cpu_at_on = thread_cpu()
                self.on = True
                signal.setitimer(signal.ITIMER_REAL, self.interval_s, self.interval_s)
            elif self.on and not on:
                signal.setitimer(signal.ITIMER_REAL, 0)
                self.on = False
                now = thread_cpu()
                # threads that used any (a server has a hundred that never run)
                self.cpu_s = {tid: [name, round(cpu - self.cpu_at_on[tid][1], 3)]
                              for tid, (name, cpu) in now.items()
                              if tid in self.cpu_at_on and cpu > self.cpu_at_on[tid][1]}
            time.sleep(0.05)
            if self.samples != self.dumped and (time.monotonic() - last_dump > DUMP_EVERY_S
                                                or not on):
                with contextlib.suppress(OSError):  # a full disk must not end the sampler
                    self.dump()
                last_dump = time.monotonic()


def thread_cpu() -> dict[str, tuple[str, float]]:
    """Each thread of this process: its name (comm) and CPU seconds so far, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, tuple[str, float]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)  # utime, stime
    return out


_sampler: Sampler | None = None


def _watch() -> None:
    """A watcher thread for this process (a forked child has none, and no timer: re-armed)."""
    if _sampler is not None:
        threading.Thread(target=_sampler.watch, name="proof-stacks", daemon=True).start()


def _child() -> None:
    global _sampler
    if _sampler is None:
        return
    old = _sampler
    _sampler = Sampler(old.folder, old.interval_s)  # the parent's samples are not its
    try:
        signal.signal(signal.SIGALRM, _sampler.on_signal)
    except ValueError:  # forked from a thread other than the main one: no handler to run
        _sampler = None
        return
    gc.callbacks[:] = [cb for cb in gc.callbacks if cb != old.on_gc] + [_sampler.on_gc]
    _watch()


def install() -> None:
    """In the main thread at start-up: the handler (a forked child keeps it), a watcher thread, and
    again in every child forked later."""
    global _sampler
    folder = os.environ.get("PROOF_STACKS_DIR", "")
    if not folder or not os.path.isdir(folder) or threading.current_thread() is not \
            threading.main_thread():
        return
    _sampler = Sampler(folder, float(os.environ.get("PROOF_STACKS_INTERVAL_S", "0.001")))
    signal.signal(signal.SIGALRM, _sampler.on_signal)
    # system calls interrupted by the timer resume instead of failing with EINTR
    signal.siginterrupt(signal.SIGALRM, False)
    gc.callbacks.append(_sampler.on_gc)
    _watch()
    os.register_at_fork(after_in_child=_child)
