"""Where a start's engine core spends its time, from py-spy's samples of the whole server.

A start sampled by py-spy (run under `PROOF_SERVER_WRAP="py-spy record --subprocesses
--nonblocking --idle --threads --format raw --rate 40 -o FILE --"`: every process, idle frames
too, one stack a thread) is a file of collapsed stacks, `frame;frame;... COUNT` a line, each
beginning with its process and thread. This reads the engine core's main thread (the process
whose stacks run vLLM's run_engine_core) and says how many seconds of it fell inside each of the
start's known parts; the parts overlap (Triton's compiles happen inside the warm-up and inside
Inductor's compile). The sampled start runs slower than an unsampled one: its seconds say where
the time goes, not how long a start takes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .proof_plan import ProofError

ENGINE = "EngineCoreProc.run_engine_core"
# part -> a frame (as py-spy names it, "function (file:line)") whose presence puts a sample in it
PARTS: dict[str, str] = {
    "weights": "load_model (",
    "dynamo_and_inductor": "aot_compile_fullgraph (",
    "inductor": "compile_fx (",
    "aot_save": "save_aot_compiled_function (",
    "eagle_head": "Eagle",
    "graph_capture": "capture_model (",
    "warmup": "warmup_kernels (",
    "triton_compile": "compile (triton/compiler/compiler.py",
    "ptxas": "make_cubin (",
    # the C module Triton builds with the system's compiler for each kernel's signature
    "triton_launcher": "CudaLauncher.__init__ (",
    "inductor_in_process": "CachingAutotuner.precompile (",
    "sampler_topk_topp": "apply_top_k_top_p_triton (",
}
_LINE = re.compile(r"^(?P<stack>.*) (?P<n>\d+)$")
_THREAD = re.compile(r";thread \((?P<tid>\d+)\): MainThread;")
_PROCESS = re.compile(r"process (?P<pid>\d+):")


def main_thread_stacks(lines: Iterable[str]) -> dict[str, list[tuple[str, int]]]:
    """Each process's main-thread stacks (the frames below its thread) with their counts."""
    out: dict[str, list[tuple[str, int]]] = {}
    for line in lines:
        m = _LINE.match(line.rstrip("\n"))
        t = _THREAD.search(line)
        if not m or not t:
            continue
        pids = _PROCESS.findall(line[:t.start()])
        # the thread's own process: py-spy names it last, after the processes it descends from
        if pids and pids[-1] == t.group("tid"):
            out.setdefault(pids[-1], []).append((m.group("stack")[t.end():], int(m.group("n"))))
    return out


def engine_parts(lines: Iterable[str], rate: float) -> dict[str, Any]:
    """The engine core's main thread: its sampled seconds in all and in each of PARTS."""
    stacks = main_thread_stacks(lines)
    engine = [pid for pid, rows in stacks.items() if any(ENGINE in s for s, _ in rows)]
    if len(engine) != 1:
        raise ValueError(f"{len(engine)} processes run {ENGINE} in these samples; want one "
                         "(sample a single start, with --subprocesses)")
    rows = stacks[engine[0]]
    seconds = {part: round(sum(n for s, n in rows if frame in s) / rate, 1)
               for part, frame in PARTS.items()}
    return {"pid": int(engine[0]), "rate_hz": rate,
            "sampled_s": round(sum(n for _, n in rows) / rate, 1), "parts_s": seconds}


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:  # type: ignore[operator]
        return f.readlines()


def cmd_spy(args: argparse.Namespace) -> int:
    try:
        parts = engine_parts(read_lines(args.samples), args.rate)
    except (OSError, ValueError) as exc:
        raise ProofError(f"{args.samples}: {exc}") from None
    print(json.dumps(parts, indent=1))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spy", help="where a sampled start's engine core spent its time (py-spy's "
                       "raw samples of one start; seconds a part)")
    p.add_argument("samples", type=Path, help="py-spy record --format raw output (.gz or not)")
    p.add_argument("--rate", type=float, default=40.0, help="the samples a second it was recorded at")
    p.set_defaults(func=cmd_spy)
