#!/usr/bin/env python3
"""Helpers for scripts/gpu-proof, run on the GPU machine.

  prep-models SRC          weightless draft (Llama-3.2-1B shapes) and FP8-checkpoint copies of SRC
  bandwidth OUT.json       HBM read and copy bandwidth, CUDA events, median of repeats
  gemm OUT.json            decode-shaped (M=1) GEMMs: bf16 vs FP8 Cutlass, achieved GB/s
  greedy URL MODEL OUT     greedy completions of fixed prompts (for the speculative check)
  metrics URL OUT.json     the speculative-decoding counters from /metrics
  assemble DIR OUT.json    one JSON of the whole proof + the comparison table (printed last)
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any

from inference_image import proof  # scripts/gpu-proof puts src/ on PYTHONPATH
from inference_image.bench import spec_counters
from inference_image.proof import PROMPTS, ct_fp8, make_models

# The "-FP8-dynamic" scheme: per-channel static weight scales, per-token dynamic activations.
CT_FP8 = ct_fp8("channel", "token", dynamic=True)


def prep_models(src: str) -> None:
    made = make_models(Path(src), {"fp8ct": {"quantization_config": CT_FP8}})
    print(f"made {', '.join(made.values())} (config + tokenizer of {src})")


def _time_ms(fn: Any, reps: int = 30) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def bandwidth(out: str) -> None:
    import torch

    n = 4 * 1024**3 // 2  # 4 GiB of bf16: far past the 50 MB L2
    x = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    read_ms = _time_ms(lambda: x.sum(dtype=torch.float32))
    copy_ms = _time_ms(lambda: y.copy_(x))
    nbytes = x.numel() * 2
    res = {"gpu": torch.cuda.get_device_name(0), "bytes": nbytes,
           "read_bw_tbs": round(nbytes / read_ms / 1e9, 3),
           "copy_bw_tbs": round(2 * nbytes / copy_ms / 1e9, 3)}
    Path(out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


def gemm(out: str) -> None:
    """Llama-3.1-8B decode GEMMs at M=1 and M=64: time per GEMM and achieved weight-read
    bandwidth. Each timing runs over enough weight copies to defeat the 50 MB L2 and back to
    back, so launch gaps do not count."""
    import torch
    import torch.nn.functional as F

    try:
        from vllm import _custom_ops as ops
    except Exception as exc:  # report, do not die: this explains c=1, it is not the proof
        Path(out).write_text(json.dumps({"error": repr(exc)}))
        print("gemm: vllm ops unavailable:", exc)
        return
    shapes = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
              "down": (14336, 4096), "lm_head": (4096, 128256)}
    rows = []
    for m in (1, 64):
        total = {"bf16": 0.0, "fp8": 0.0, "fp8_torch": 0.0, "act_quant": 0.0}
        for name, (k, n) in shapes.items():
            copies = max(2, -(-400 * 2**20 // (k * n)))  # >= 400 MB of fp8 weights
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
                  for _ in range(copies)]
            q = [ops.scaled_fp8_quant(w) for w in ws]  # per-tensor, what online fp8 does
            xq, xs = ops.scaled_fp8_quant(x)
            one = torch.ones(1, device="cuda")

            def run_bf16(ws=ws, x=x) -> None:
                for w in ws:
                    F.linear(x, w)

            def run_fp8(q=q, xq=xq, xs=xs) -> None:
                for wq, s in q:
                    ops.cutlass_scaled_mm(xq, wq.t(), xs, s, out_dtype=torch.bfloat16)

            def run_torch(q=q, xq=xq, xs=xs) -> None:
                for wq, s in q:
                    torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=s, out_dtype=torch.bfloat16)

            def run_quant(x=x, copies=copies) -> None:
                for _ in range(copies):
                    ops.scaled_fp8_quant(x)

            per = {}
            for label, fn in (("bf16", run_bf16), ("fp8", run_fp8), ("fp8_torch", run_torch),
                              ("act_quant", run_quant)):
                try:
                    per[label] = _time_ms(fn, reps=10) / copies
                except Exception as exc:
                    print(f"gemm {name} {label}: {exc!r}")
                    per[label] = float("nan")
            del ws, q, one
            mult = 1 if name == "lm_head" else 32
            for key in total:
                # lm_head stays bf16 in every served config
                total[key] += mult * (per["bf16"] if name == "lm_head" else per[key])
            rows.append({"m": m, "gemm": name, "k": k, "n": n,
                         **{f"{lab}_us": round(t * 1e3, 1) for lab, t in per.items()},
                         "bf16_gbs": round(2 * k * n / per["bf16"] / 1e6),
                         "fp8_gbs": round(k * n / per["fp8"] / 1e6),
                         "fp8_torch_gbs": round(k * n / per["fp8_torch"] / 1e6)})
        rows.append({"m": m, "gemm": "per token: 32 layers + lm_head (ms)",
                     "bf16_ms": round(total["bf16"], 3),
                     "fp8_cutlass_ms": round(total["fp8"] + total["act_quant"], 3),
                     "fp8_torch_ms": round(total["fp8_torch"] + total["act_quant"], 3)})
    Path(out).write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(json.dumps(r))


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def greedy(url: str, model: str, out: str) -> None:
    res = proof.greedy(url, model)
    Path(out).write_text(json.dumps(res, indent=1))
    print(f"greedy: {len(res)} completions -> {out}")


def metrics(url: str, out: str) -> None:
    keep = spec_counters(url) or {}
    Path(out).write_text(json.dumps(keep, indent=1, sort_keys=True))
    print(json.dumps(keep, sort_keys=True))

# Kernel families in a decode step, by the name CUPTI reports (first match wins).
KERNEL_FAMILIES = [
    ("kv-cache write", r"reshape_and_cache|cache_kernel|concat_and_cache"),
    ("rope", r"rotary|rope"),
    ("attention", r"flash|fwd_kernel|FlashAttn|attention|paged"),
    ("gemm", r"gemm|Gemm|cutlass|cublas|nvjet|xmma|sm90|scaled_mm"),
    ("fused elementwise (Inductor)", r"^triton_"),
    ("quant", r"quant"),
    ("norm", r"norm"),
    ("sampling", r"sampl|argmax|topk|top_k|softmax|gumbel|exponential"),
]


def _family(name: str) -> str:
    for fam, pat in KERNEL_FAMILIES:
        if re.search(pat, name):
            return fam
    return "other"


def profile(url: str, model: str, trace_dir: str, out: str, tokens: str = "128") -> None:
    """One c=1 request under vLLM's torch profiler, then where the GPU time of a step goes."""
    n = int(tokens)
    _post(f"{url}/v1/completions", {"model": model, "prompt": PROMPTS[0], "max_tokens": 32,
                                    "ignore_eos": True})  # warm
    urllib.request.urlopen(urllib.request.Request(f"{url}/start_profile", method="POST"), timeout=60)
    _post(f"{url}/v1/completions", {"model": model, "prompt": PROMPTS[0], "max_tokens": n,
                                    "ignore_eos": True, "temperature": 0})
    urllib.request.urlopen(urllib.request.Request(f"{url}/stop_profile", method="POST"), timeout=900)
    events: list[dict[str, Any]] = []
    for f in sorted(Path(trace_dir).rglob("*.json*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            evs = json.load(fh).get("traceEvents", [])
        ks = [e for e in evs if e.get("cat") == "kernel" and "dur" in e]
        if len(ks) > len(events):
            events = ks
    if not events:
        print(f"profile: no kernel events under {trace_dir}")
        return
    events.sort(key=lambda e: e["ts"])
    # Decode steps: the request's tokens, one step each (the prompt is a few tokens, so its prefill
    # step is as short as a decode step). Span = first to last kernel.
    span = events[-1]["ts"] + events[-1]["dur"] - events[0]["ts"]
    busy, end = 0.0, events[0]["ts"]
    for e in events:  # union of kernel intervals: overlapping kernels count once
        s, t = max(e["ts"], end), e["ts"] + e["dur"]
        if t > s:
            busy += t - s
        end = max(end, t)
    fams: dict[str, list[float]] = {}
    names: dict[str, list[float]] = {}
    for e in events:
        fams.setdefault(_family(e["name"]), []).append(e["dur"])
        names.setdefault(e["name"][:90], []).append(e["dur"])
    per = {k: {"us_per_step": round(sum(v) / n, 1), "kernels_per_step": round(len(v) / n, 1)}
           for k, v in sorted(fams.items(), key=lambda kv: -sum(kv[1]))}
    top = [{"kernel": k, "us_per_step": round(sum(v) / n, 1), "count_per_step": round(len(v) / n, 2),
            "mean_us": round(sum(v) / len(v), 2)}
           for k, v in sorted(names.items(), key=lambda kv: -sum(kv[1]))[:30]]
    doc = {"tokens": n, "kernels": len(events), "kernels_per_step": round(len(events) / n, 1),
           "step_us": round(span / n, 1), "kernel_busy_us_per_step": round(busy / n, 1),
           "idle_us_per_step": round((span - busy) / n, 1), "families": per, "top_kernels": top}
    Path(out).write_text(json.dumps(doc, indent=1))
    print(f"profile: {doc['kernels_per_step']} kernels/step, step {doc['step_us']} us, "
          f"kernels busy {doc['kernel_busy_us_per_step']} us, idle {doc['idle_us_per_step']} us")
    for k, v in per.items():
        print(f"  {k:32s} {v['us_per_step']:8.1f} us  {v['kernels_per_step']:6.1f} kernels")
    for t in top[:15]:
        print(f"  {t['us_per_step']:8.1f} us {t['count_per_step']:6.2f}x {t['mean_us']:7.2f} us",
              t["kernel"])


def _load(p: Path) -> Any:
    return json.loads(p.read_text()) if p.exists() else None


def _compare_greedy(a: Any, b: Any) -> dict[str, Any]:
    if not a or not b:
        return {"checked": 0}
    same = 0
    first_div = []
    for x, y in zip(a, b, strict=False):
        ta, tb = x.get("token_ids") or x["text"], y.get("token_ids") or y["text"]
        if ta == tb:
            same += 1
            first_div.append(None)
        else:
            first_div.append(next((i for i, (u, v) in enumerate(zip(ta, tb, strict=False))
                                   if u != v), min(len(ta), len(tb))))
    return {"checked": len(a), "identical": same, "first_divergence": first_div}


def assemble(d: str, out: str) -> None:
    from inference_image.memory import decode_bytes_per_token
    from inference_image.profiles import resolve

    w = Path(d)
    bw = _load(w / "bandwidth.json") or {}
    info = _load(w / "info.json") or {}
    runs = []
    # Every config benchmarked in this run: vanilla first, then the profile, then the variants.
    names = sorted((p.stem for p in (w / "bench").glob("*.json")),
                   key=lambda n: (n != "vanilla", n != "optimized", n))
    for cfg in names:
        data = _load(w / "bench" / f"{cfg}.json")
        for r in (data or {}).get("runs", []):
            runs.append({k: r[k] for k in ("config", "scenario", "concurrency", "output_tok_s",
                                           "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99",
                                           "tpot_ms_mean", "itl_ms_p99")})
    r = resolve("h100")
    ctx = 512 + 256  # mean context over a 512-in / 512-out request
    # Bytes per token: bf16 for vanilla, the profile's FP8 weights and KV cache for the rest.
    quant = {cfg: ("none", "auto") if cfg == "vanilla" else
             (r.profile.model.quantization, r.profile.model.kv_cache_dtype)
             for cfg in names if not cfg.startswith(("spec", "two"))}
    roofline = {}
    for cfg, (q, kv) in quant.items():
        c1 = next((x for x in runs if x["config"] == cfg and x["scenario"] == "chat"
                   and x["concurrency"] == 1), None)
        if not c1 or not bw:
            continue
        bpt = decode_bytes_per_token(r.target, q, kv, ctx)
        ceiling = bw["read_bw_tbs"] * 1e12 / bpt
        decode = 1000 / c1["tpot_ms_mean"] if c1["tpot_ms_mean"] else 0
        roofline[cfg] = {"read_bw_tbs": bw["read_bw_tbs"], "bytes_per_token": round(bpt),
                         "roofline_tok_s": round(ceiling, 1), "decode_tok_s": round(decode, 1),
                         "c1_fraction": round(decode / ceiling, 3)}
    doc = {
        "gpu": info.get("gpu"), "driver": info.get("driver"),
        "vllm_version": info.get("vllm"), "torch_version": info.get("torch"),
        "profile": "h100", "profile_sha256": r.digest, "model": "dummy Llama-3.1-8B (random weights)",
        "bandwidth": bw, "runs": runs, "roofline": roofline,
        "ready_s": _load(w / "ready.json") or {},
        "backends": _load(w / "backends.json") or {},
        "gemm": _load(w / "gemm.json"),
        "speculative": {"greedy": _compare_greedy(_load(w / "greedy-optimized.json"),
                                                  _load(w / "greedy-spec.json")),
                        "counters": _load(w / "spec-metrics.json") or {}},
        # variants' greedy text against the profile's (same dummy weights in every start)
        "greedy_vs_optimized": {
            p.stem.removeprefix("greedy-"): _compare_greedy(_load(w / "greedy-optimized.json"),
                                                            _load(p))
            for p in sorted(w.glob("greedy-*.json"))
            if p.stem not in ("greedy-optimized", "greedy-spec")},
    }
    Path(out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    # The table last: that is what the device reply shows.
    van = {(x["scenario"], x["concurrency"]): x for x in runs if x["config"] == "vanilla"}
    print(f"\n{doc['gpu']}  vLLM {doc['vllm_version']}  read BW {bw.get('read_bw_tbs')} TB/s")
    print(f"{'cfg':<20}{'scen':<14}{'c':>3}{'tok/s':>9}{'x van':>7}{'TTFT':>8}{'TTFTp99':>9}"
          f"{'TPOT':>7}")
    for x in runs:
        v = van.get((x["scenario"], x["concurrency"]))
        ratio = x["output_tok_s"] / v["output_tok_s"] if v and v["output_tok_s"] else 0
        print(f"{x['config']:<20}{x['scenario']:<14}{x['concurrency']:>3}{x['output_tok_s']:>9.1f}"
              f"{ratio:>7.2f}{x['ttft_ms_mean']:>8.1f}{x['ttft_ms_p99']:>9.1f}"
              f"{x['tpot_ms_mean']:>7.2f}")
    for cfg, rf in roofline.items():
        print(f"roofline {cfg}: {rf['decode_tok_s']} of {rf['roofline_tok_s']} tok/s "
              f"= {rf['c1_fraction']:.0%}")
    print("ready_s", json.dumps(doc["ready_s"]), "spec", json.dumps(doc["speculative"]["greedy"]))
    for label, g in doc["greedy_vs_optimized"].items():
        print(f"greedy {label} vs optimized: {g.get('identical', 0)} of {g['checked']} identical, "
              f"first divergence {g.get('first_divergence')}")


def better(bench_dir: str, base: str, variant: str, gain: str = "0.02") -> None:
    """Exit 0 when VARIANT's chat c=1 output tok/s beats BASE's by GAIN (a fraction), else 1:
    lets one device call decide whether a variant earns a full run before the machine goes back."""
    def c1(label: str) -> float:
        data = _load(Path(bench_dir) / f"{label}.json") or {}
        return next((r["output_tok_s"] for r in data.get("runs", [])
                     if r["scenario"] == "chat" and r["concurrency"] == 1), 0.0)
    a, b = c1(base), c1(variant)
    won = a > 0 and b >= a * (1 + float(gain))
    print(f"c=1: {base} {a:.1f} tok/s, {variant} {b:.1f} tok/s -> "
          f"{'run ' + variant + ' in full' if won else 'keep ' + base}")
    sys.exit(0 if won else 1)


def main() -> None:
    cmd, *rest = sys.argv[1:]
    {"prep-models": prep_models, "bandwidth": bandwidth, "gemm": gemm, "greedy": greedy,
     "metrics": metrics, "profile": profile, "assemble": assemble, "better": better}[cmd](*rest)


if __name__ == "__main__":
    main()
