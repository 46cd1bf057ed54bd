"""Where a serving step's GPU time goes, from a torch profiler trace (the Chrome trace JSON vLLM's
`--profiler-config` writes): GPU busy and idle time over the window, kernel time per kind
(GEMM, attention, quantization, norm, rotary, sampling, memory copies, other), the kernels that
take the most, vLLM's own annotations (forward, sample, draft proposal, ...) with their mean
time, and how work was launched (CUDA graphs against single kernel launches). Torch-free: it
reads JSON."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inference_image.tables import text_table

# First match wins: a GEMM with an FP8 epilogue is a GEMM, not a quantization; FA3's kernels are
# Cutlass device kernels of flash:: types, attention before the GEMM rule sees "cutlass".
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash::|FlashAttn", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|cublas|xmma|nvjet|matmul|_mm_|sm90_|sm80_", re.I)),
    ("attention", re.compile(r"flash|fmha|attn|attention|reshape_and_cache|paged", re.I)),
    ("quant", re.compile(r"quant|fp8|e4m3", re.I)),
    ("norm", re.compile(r"rms|norm", re.I)),
    ("rotary", re.compile(r"rotary|rope", re.I)),
    ("sampling", re.compile(r"sampl|topk|top_k|argmax|softmax|rejection|gumbel|multinomial|"
                            r"logit|penalt", re.I)),
)
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
FULL_NAME = 2000
# the op vLLM runs between piecewise CUDA graphs for each layer's attention
ATTENTION_OP = "vllm::unified_attention_with_output"
# vLLM's step annotation: execute_context_N(prompt tokens)_generation_M(tokens), N prompts being
# read and M requests decoding
STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


def step_held(name: str) -> tuple[int, int, int, int] | None:
    """(prompts, prompt tokens, decoding requests, decode tokens) of a step annotation; None for
    any other name."""
    m = STEP.match(name)
    return (int(m[1]), int(m[2]), int(m[3]), int(m[4])) if m else None


def is_decode_step(name: str) -> bool:
    """A step with no prompt token in it, decoding at least one request."""
    held = step_held(name)
    return held is not None and held[:2] == (0, 0) and held[2] > 0


def middle(v: list[float]) -> float:
    """The median as a measured value: the upper middle one of an even count, not a mean of two."""
    return sorted(v)[len(v) // 2]


def kind_of(name: str, cat: str = "kernel") -> str:
    if cat != "kernel":
        return "memory"
    for kind, pat in KINDS:
        if pat.search(name):
            return kind
    return "other"


def load(path: Path) -> list[dict[str, Any]]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    doc = json.loads(raw)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def union_us(spans: list[tuple[float, float]]) -> float:
    """Total length covered by [start, end) spans (kernels on several streams overlap)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def short(name: str, n: int = 90) -> str:
    """Kernel names run to hundreds of characters of template arguments."""
    name = re.sub(r"<.*", "<...>", name) if len(name) > n else name
    return name[:n]


def summarize(events: list[dict[str, Any]], top: int = 20) -> dict[str, Any]:
    gpu = [e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X" and "dur" in e]
    if not gpu:
        return {"error": "no GPU events in the trace (was the CUDA activity recorded?)"}
    start = min(e["ts"] for e in gpu)
    window = max(e["ts"] + e["dur"] for e in gpu) - start
    busy = union_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in gpu:
        by_kind[kind_of(e["name"], e["cat"])] += e["dur"]
        by_name[(e["name"], e["cat"])].append(e["dur"])
    kernel_total = sum(by_kind.values())
    kernels = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    notes: dict[str, list[float]] = defaultdict(list)
    host: dict[str, list[float]] = defaultdict(list)  # record_function ranges: time on the CPU
    starts: list[float] = []  # when each decode step began on the GPU
    for e in events:
        if e.get("cat") == "gpu_user_annotation" and "dur" in e:
            notes[e["name"]].append(e["dur"])
            if is_decode_step(e["name"]):
                starts.append(e["ts"])
        elif e.get("cat") == "user_annotation" and "dur" in e:
            host[e["name"]].append(e["dur"])
    launches: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") == "cuda_runtime" and e.get("name") in (
                "cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                "cuLaunchKernelEx", "cudaMemcpyAsync"):
            launches[e["name"]] += 1
    # decode steps (no prompt token in them): with a steady batch, what one step costs by kind
    decode = [d for n, d in notes.items() if is_decode_step(n)]
    steps = sum(len(d) for d in decode)
    # how often a step starts: above the step's own GPU time by what the GPU waited for the host
    # between steps
    starts.sort()
    period = ({"decode_step_period_ms": round((starts[-1] - starts[0]) / (len(starts) - 1) / 1e3, 3)}
              if len(starts) > 1 else {})
    per_step = ({"decode_steps": steps, **period,
                 "decode_step_ms": round(sum(map(sum, decode)) / steps / 1e3, 3),
                 "per_decode_step_ms": {k: round(v / steps / 1e3, 3) for k, v in
                                        sorted(by_kind.items(), key=lambda kv: -kv[1])},
                 "gpu_busy_per_decode_step_ms": round(busy / steps / 1e3, 3)} if steps else {})
    return {
        **per_step,
        "window_ms": round(window / 1e3, 3),
        "gpu_busy_ms": round(busy / 1e3, 3),
        "gpu_idle_share": round(1 - busy / window, 4) if window else 0.0,
        "by_kind_ms": {k: round(v / 1e3, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "by_kind_share": {k: round(v / kernel_total, 4) for k, v in
                          sorted(by_kind.items(), key=lambda kv: -kv[1])},
        # the whole name too: a Cutlass kernel's tile and cluster shapes are in its template
        # arguments, and two configurations of one kernel differ nowhere else
        "top_kernels": [{"name": short(n), "kind": kind_of(n, c), "calls": len(d),
                         "total_ms": round(sum(d) / 1e3, 3), "mean_us": round(sum(d) / len(d), 2),
                         **({"full_name": n[:FULL_NAME]} if short(n) != n else {})}
                        for (n, c), d in kernels],
        "annotations": {n: {"calls": len(d), "mean_ms": round(sum(d) / len(d) / 1e3, 3)}
                        for n, d in sorted(notes.items(), key=lambda kv: -sum(kv[1]))[:top]},
        "host_annotations": {n: {"calls": len(d), "mean_ms": round(sum(d) / len(d) / 1e3, 3)}
                             for n, d in sorted(host.items(), key=lambda kv: -sum(kv[1]))[:top]},
        "launches": dict(launches),
    }


def bursts(events: list[dict[str, Any]], gap_us: float = 3000.0) -> list[dict[str, Any]]:
    """The GPU timeline cut where it idles longer than gap_us: with requests sent one at a time,
    each piece is one request's engine steps (a first-token trace: its prefill and the head's
    first proposals). For each: its span, the GPU busy inside it, its kernels by kind, and the
    launches the host made in it (a span much longer than its busy time is host time)."""
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"
                  and "dur" in e), key=lambda e: e["ts"])
    runtime = sorted((e for e in events if e.get("cat") == "cuda_runtime" and "ts" in e),
                     key=lambda e: e["ts"])
    pieces: list[list[dict[str, Any]]] = []
    end = float("-inf")
    for e in gpu:
        if e["ts"] - end > gap_us:
            pieces.append([])
        pieces[-1].append(e)
        end = max(end, e["ts"] + e["dur"])
    out = []
    for piece in pieces:
        s0 = piece[0]["ts"]
        s1 = max(e["ts"] + e["dur"] for e in piece)
        kinds: dict[str, float] = defaultdict(float)
        for e in piece:
            kinds[kind_of(e["name"], e["cat"])] += e["dur"]
        # a launch belongs to the piece whose work it started: after the previous piece ended
        launched = [e["name"] for e in runtime if s0 - gap_us < e["ts"] <= s1]
        out.append({"span_ms": round((s1 - s0) / 1e3, 3),
                    "busy_ms": round(union_us([(e["ts"], e["ts"] + e["dur"]) for e in piece]) / 1e3, 3),
                    "kernels": sum(1 for e in piece if e["cat"] == "kernel"),
                    "graph_launches": launched.count("cudaGraphLaunch"),
                    "kernel_launches": sum(1 for n in launched if "LaunchKernel" in n),
                    "by_kind_ms": {k: round(v / 1e3, 3) for k, v in
                                   sorted(kinds.items(), key=lambda kv: -kv[1])}})
    return out


def median_burst(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """The middle piece by span: one request's steps, typical of the trace."""
    if not pieces:
        return {}
    return sorted(pieces, key=lambda p: p["span_ms"])[len(pieces) // 2]


def table(s: dict[str, Any]) -> str:
    if "error" in s:
        return s["error"]
    lines = [f"GPU busy {s['gpu_busy_ms']} of {s['window_ms']} ms ({s['gpu_idle_share']:.0%} idle)",
             "by kind: " + ", ".join(f"{k} {v:.0%}" for k, v in s["by_kind_share"].items()),
             "launches: " + ", ".join(f"{k} {v}" for k, v in s["launches"].items())]
    if top := s["top_kernels"][:12]:
        lines.append(text_table(
            [("total ms", "calls", "mean us", "kind", "kernel"),
             *((f"{k['total_ms']:.2f}", k["calls"], f"{k['mean_us']:.1f}", k["kind"], k["name"])
               for k in top)], indent="  ", align="rrrll"))
    lines += [f"  step {n}: {a['calls']}x {a['mean_ms']} ms" for n, a in
              list(s["annotations"].items())[:10]]
    lines += [f"  host {n}: {a['calls']}x {a['mean_ms']} ms" for n, a in
              list(s.get("host_annotations", {}).items())[:10]]
    if n := s.get("decode_steps"):
        every = (f", one every {s['decode_step_period_ms']} ms" if "decode_step_period_ms" in s
                 else "")
        lines.append(f"{n} decode steps of {s['decode_step_ms']} ms{every}, GPU busy "
                     f"{s['gpu_busy_per_decode_step_ms']} ms a step: " + ", ".join(
                         f"{k} {v}" for k, v in s["per_decode_step_ms"].items()))
    if m := s.get("prompt_pass"):
        attn = (f", vLLM's attention op {m['attention_host_us']} us a layer"
                if m["attention_host_us"] is not None else "")
        lines.append(f"prompt pass (median of {m['passes']}): {m['prompt_tokens']} tokens, GPU "
                     f"{m['gpu_ms']} ms with {m['busy_ms']} ms busy, host {m['host_ms']} ms to "
                     f"issue it{attn}: " + ("the GPU waits on the host" if m["host_bound"]
                                            else "the host runs ahead"))
    if m := s.get("median_burst"):
        lines.append(f"one request (median of {len(s.get('bursts', []))}): span {m['span_ms']} ms, "
                     f"GPU busy {m['busy_ms']} ms, {m['kernels']} kernels, "
                     f"{m['graph_launches']} graph + {m['kernel_launches']} kernel launches; "
                     + ", ".join(f"{k} {v}" for k, v in m["by_kind_ms"].items()))
    return "\n".join(lines)


def gpu_steps(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                     list[tuple[int, int, int, int]]]:
    """vLLM's step annotations on the GPU timeline, in order, and what each step held."""
    steps = sorted(((e, h) for e in events if e.get("cat") == "gpu_user_annotation" and "dur" in e
                    and (h := step_held(e.get("name", ""))) is not None), key=lambda eh: eh[0]["ts"])
    return [e for e, _ in steps], [h for _, h in steps]


def host_steps(events: list[dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """For a step on the GPU, the host range that launched it: the latest of its name to begin
    before it ran (None where the trace began after it)."""
    host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation" and "dur" in e and STEP.match(e.get("name", "")):
            host[e["name"]].append(e)
    for spans in host.values():
        spans.sort(key=lambda e: e["ts"])

    def launched_by(e: dict[str, Any]) -> dict[str, Any] | None:
        launched = [h for h in host.get(e["name"], []) if h["ts"] <= e["ts"]]
        return launched[-1] if launched else None
    return launched_by


def prompt_passes(events: list[dict[str, Any]], min_tokens: int) -> list[dict[str, Any]]:
    """Each step that reads at least min_tokens prompt tokens with nothing decoding beside it (a
    first-token probe's forward pass): its span on the GPU, the GPU busy inside that span, the
    host's time issuing it, and the host's median time in vLLM's attention op a layer inside it.
    Where the host takes longer than the GPU is busy, the GPU waits on the host (docs/decisions.md,
    "Whole-step graphs, with decode graphs of their own")."""
    gpu, held = gpu_steps(events)
    launched_by = host_steps(events)
    work = [(e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("cat") in GPU_CATS and e.get("ph") == "X" and "dur" in e]
    attention = [e for e in events if e.get("cat") == "cpu_op" and "dur" in e
                 and e.get("name") == ATTENTION_OP]
    out = []
    for e, h in zip(gpu, held, strict=True):
        if h[1] < min_tokens or h[2]:
            continue
        s0, s1 = e["ts"], e["ts"] + e["dur"]
        busy = union_us([(max(a, s0), min(b, s1)) for a, b in work if a < s1 and b > s0])
        host = launched_by(e)
        calls = [a["dur"] for a in attention
                 if host and host["ts"] <= a["ts"] < host["ts"] + host["dur"]]
        out.append({"prompt_tokens": h[1], "gpu_ms": round(e["dur"] / 1e3, 3),
                    "busy_ms": round(busy / 1e3, 3),
                    "host_ms": round(host["dur"] / 1e3, 3) if host else None,
                    "attention_host_us": round(float(middle(calls)), 1) if calls else None})
    return out


def median_pass(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """The middle of each figure over the passes, and whether the host took longer to issue a
    pass than the GPU was busy running it (the GPU then waits on the host)."""
    if not passes:
        return {}
    out: dict[str, Any] = {"passes": len(passes)}
    for key in ("prompt_tokens", "gpu_ms", "busy_ms", "host_ms", "attention_host_us"):
        vals = [p[key] for p in passes if p[key] is not None]
        out[key] = middle(vals) if vals else None
    out["host_bound"] = out["host_ms"] is not None and out["host_ms"] > out["busy_ms"]
    return out


def prompt_steps(events: list[dict[str, Any]], min_tokens: int, before: int = 3,
                 after: int = 4) -> list[dict[str, Any]]:
    """Each engine step that reads at least min_tokens prompt tokens, with the steps around it on
    the GPU: where a first token sent beside decoding streams waits. For
    each such step: the steps from `before` ahead of it to `after` past it, each with its start
    (ms from the prompt step's), its GPU span, what it held, the GPU idle before it, and the host's
    time in vLLM's execute_model for it."""
    gpu, held = gpu_steps(events)
    launched_by = host_steps(events)

    def host_ms(e: dict[str, Any]) -> float | None:
        h = launched_by(e)
        return round(h["dur"] / 1e3, 3) if h else None

    out = []
    for i, e in enumerate(gpu):
        if held[i][1] < min_tokens:
            continue
        around = []
        for j in range(max(0, i - before), min(len(gpu), i + after + 1)):
            s = gpu[j]
            prev_end = gpu[j - 1]["ts"] + gpu[j - 1]["dur"] if j else None
            around.append({"at_ms": round((s["ts"] - e["ts"]) / 1e3, 3),
                           "gpu_ms": round(s["dur"] / 1e3, 3),
                           "prompts": held[j][0], "prompt_tokens": held[j][1],
                           "decoding": held[j][2], "decode_tokens": held[j][3],
                           "idle_before_ms": (round((s["ts"] - prev_end) / 1e3, 3)
                                              if prev_end is not None else None),
                           "host_ms": host_ms(s), "this": j == i})
        out.append({"prompt_tokens": held[i][1], "gpu_ms": round(e["dur"] / 1e3, 3),
                    "steps": around})
    return out


def prompt_steps_table(pieces: list[dict[str, Any]]) -> list[str]:
    lines = []
    for k, p in enumerate(pieces):
        lines.append(f"prompt step {k + 1} ({p['prompt_tokens']} prompt tokens): GPU {p['gpu_ms']} ms")
        lines += [f"  {'>' if s['this'] else ' '} at {s['at_ms']:>9.3f} ms  GPU {s['gpu_ms']:>8.3f} ms  "
                  f"idle before {s['idle_before_ms'] if s['idle_before_ms'] is not None else '-':>7}"
                  f"  host {s['host_ms'] if s['host_ms'] is not None else '-':>7}  "
                  f"prompt {s['prompt_tokens']:>5} ({s['prompts']})  decode {s['decode_tokens']:>4} "
                  f"({s['decoding']})" for s in p["steps"]]
    return lines
