"""Check and tune the FP8 decode kernel on this GPU against vLLM's Cutlass path.

    python -m inference_image_vllm.tune --tuning OUT.json [--report REPORT.json]

1. Correctness: per-tensor and per-channel scales, with and without bias, every M bucket,
   split-K on and off, against a float32 reference.
2. For each Llama-3.1-8B projection (qkv, o, gate_up, down) and M bucket: the fastest config.
3. Per projection and M (1..64): this kernel vs activation quant + Cutlass, both timed inside
   one CUDA graph over enough weight copies to defeat the L2 (as vLLM serves decode); max_m is
   the largest M up to which this kernel is never slower.
"""

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable

import torch
import triton

from . import fp8_gemv
from .fp8_gemv import Config

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
MS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
FP8 = torch.float8_e4m3fn


def candidates(b: int) -> list[Config]:
    if b == 16:
        grid = itertools.product((16, 32, 64), (128, 256, 512), (1, 2, 4), (4,), (3, 5))
        return [Config(16, bn, bk, sk, w, st) for bn, bk, sk, w, st in grid]
    if b == 32:
        grid = itertools.product((32, 64, 128), (128, 256), (1, 2), (4,), (3, 4))
        return [Config(32, bn, bk, sk, w, st) for bn, bk, sk, w, st in grid]
    grid = itertools.product((64, 128), (64, 128), (1, 2), (4, 8), (3,))
    return [Config(64, bn, bk, sk, w, st) for bn, bk, sk, w, st in grid]


def quantize(w: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] bf16 -> ([K, N] fp8 view of an [N, K] tensor, as vLLM stores it; scale)."""
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax()
    s = (amax.float() / torch.finfo(FP8).max).clamp(min=1e-12)
    q = (w.float() / s).clamp(-448, 448).to(FP8)
    return q.t(), (s.reshape(-1) if per_channel else s.reshape(1))


def check() -> list[dict]:
    rows = []
    torch.manual_seed(0)
    for (name, (k, n)), per_channel, with_bias in itertools.product(
            [("o", SHAPES["o"]), ("odd", (1000, 272))], (False, True), (False, True)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        wq, s = quantize(w, per_channel)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if with_bias else None
        ref_w = wq.float() * (s if per_channel else s[0])
        for m, sk in itertools.product((1, 5, 16, 33, 64), (1, 2, 4)):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ ref_w + (bias.float() if bias is not None else 0)
            b = fp8_gemv.bucket(m)
            cfg = Config(b, 32 if b == 16 else 64, 128, sk)
            got = fp8_gemv.w8a16_mm(x, wq, s, bias, cfg).float()
            err = ((got - ref).norm() / ref.norm()).item()
            rows.append({"shape": name, "m": m, "split_k": sk, "per_channel": per_channel,
                         "bias": with_bias, "rel_err": err, "ok": err < 1e-2})
    bad = [r for r in rows if not r["ok"]]
    print(f"correctness: {len(rows) - len(bad)}/{len(rows)} within 1e-2 of the float32 reference;"
          f" worst {max(r['rel_err'] for r in rows):.2e}")
    for r in bad[:10]:
        print("  FAIL", r)
    return rows


def graph_us(fns: list[Callable[[], object]], reps: int = 20) -> float:
    """Mean time of one call, replayed inside a CUDA graph (no launch gaps from Python)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(reps):
        g.replay()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) * 1e3 / reps / len(fns)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tuning", required=True, help="where to write the tuning JSON")
    ap.add_argument("--report", help="full measurements as JSON")
    args = ap.parse_args()
    from vllm import _custom_ops as ops

    t_start = time.time()
    report: dict = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
                    "torch": torch.__version__, "check": check()}
    if not all(r["ok"] for r in report["check"]):
        sys.exit("tune: the kernel is wrong on this GPU; not tuning")
    configs: dict[str, list[int]] = {}
    max_m: dict[str, int] = {}
    rows = []
    for name, (k, n) in SHAPES.items():
        copies = max(2, -(-512 * 2**20 // (k * n)))  # >= 512 MB of fp8 weights (L2: 50-60 MB)
        ws = [quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02, False)
              for _ in range(copies)]
        xs = {m: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for m in MS}

        def ours(m: int, cfg: Config, ws=ws, xs=xs) -> float:
            return graph_us([lambda w=w, s=s: fp8_gemv.w8a16_mm(xs[m], w, s, None, cfg) for w, s in ws])

        def cutlass(m: int, quant: bool, ws=ws, xs=xs) -> float:
            xq, xsc = ops.scaled_fp8_quant(xs[m])
            if quant:
                def one(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
                    q, qs = ops.scaled_fp8_quant(xs[m])
                    return ops.cutlass_scaled_mm(q, w, qs, s, out_dtype=torch.bfloat16)

                return graph_us([lambda w=w, s=s: one(w, s) for w, s in ws])
            return graph_us([lambda w=w, s=s: ops.cutlass_scaled_mm(
                xq, w, xsc, s, out_dtype=torch.bfloat16) for w, s in ws])

        best: dict[int, Config] = {}
        for b in fp8_gemv.BUCKETS:
            probe = (1, 16) if b == 16 else (b,)
            scored = []
            for cfg in candidates(b):
                try:
                    scored.append((sum(ours(m, cfg) for m in probe), cfg))
                except Exception as exc:  # out of shared memory and the like: not a candidate
                    print(f"  {name} {cfg}: {type(exc).__name__}", file=sys.stderr)
            scored.sort(key=lambda t: t[0])
            best[b] = scored[0][1]
            configs[f"{b},{n},{k}"] = list(best[b].__dict__.values())
            print(f"{name} bucket {b}: best {best[b]} ({scored[0][0]:.1f} us over {probe})", flush=True)
        winning, still = 0, True
        for m in MS:
            t_ours = ours(m, best[fp8_gemv.bucket(m)])
            t_cq, t_c = cutlass(m, True), cutlass(m, False)
            rows.append({"gemm": name, "k": k, "n": n, "m": m, "ours_us": round(t_ours, 2),
                         "cutlass_quant_us": round(t_cq, 2), "cutlass_us": round(t_c, 2),
                         "ours_gbs": round(k * n / t_ours / 1e3), "cutlass_gbs": round(k * n / t_c / 1e3),
                         "speedup": round(t_cq / t_ours, 2)})
            print(json.dumps(rows[-1]), flush=True)
            still = still and t_ours <= t_cq
            if still:
                winning = m
        max_m[f"{n},{k}"] = winning
        del ws
        torch.cuda.empty_cache()
    tuning = {"device": report["device"], "triton": triton.__version__, "configs": configs,
              "max_m": max_m, "measured_by": "python -m inference_image_vllm.tune"}
    with open(args.tuning, "w") as fh:
        json.dump(tuning, fh, indent=1)
    report["rows"], report["tuning"] = rows, tuning
    report["seconds"] = round(time.time() - t_start, 1)
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report, fh, indent=1)
    print(f"{'gemm':8} {'m':>3} {'ours us':>8} {'cutlass+q us':>12} {'x':>5} {'ours GB/s':>9}")
    for r in rows:
        print(f"{r['gemm']:8} {r['m']:>3} {r['ours_us']:>8} {r['cutlass_quant_us']:>12} "
              f"{r['speedup']:>5} {r['ours_gbs']:>9}")
    print("max_m:", max_m, f"({report['seconds']} s)")


if __name__ == "__main__":
    main()
