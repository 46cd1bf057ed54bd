"""Measure vLLM's Cutlass FP8 GEMM at every batch size and choose the padding table.

    python -m inference_image_vllm.tune --tuning OUT.json [--report REPORT.json]

For each Llama-3.1-8B projection (qkv, o, gate_up, down) and M = 1..128: Cutlass' time with the
activations already in FP8 (as vLLM serves them), inside one CUDA graph over enough weight copies
to defeat the L2. Where a larger M runs faster, the padded path (zero rows + Cutlass + slice) is
timed too, and M pads only where that whole path wins. Padding is also checked for correctness.
"""

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

from . import fp8_pad

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
FP8 = torch.float8_e4m3fn


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
    ap.add_argument("--tuning", required=True, help="where to write the padding table (JSON)")
    ap.add_argument("--report", help="every measurement, as JSON")
    ap.add_argument("--max-m", type=int, default=fp8_pad.MAX_M)
    args = ap.parse_args()
    from vllm import _custom_ops as ops

    t_start = time.time()
    torch.manual_seed(0)
    ms = range(1, args.max_m + 1)
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    pad_to: dict[str, list[int]] = {}
    for name, (k, n) in SHAPES.items():
        copies = max(2, -(-512 * 2**20 // (k * n)))  # >= 512 MB of FP8 weights (L2: 50-60 MB)
        ws = []
        for _ in range(copies):
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            q, s = ops.scaled_fp8_quant(w)
            ws.append((q.t(), s))  # [K, N] column-major, as vLLM stores it for Cutlass
        x = torch.randn(args.max_m, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = ops.scaled_fp8_quant(x)

        def plain(m: int, ws=ws, xq=xq, xs=xs) -> float:
            return graph_us([lambda w=w, s=s: ops.cutlass_scaled_mm(xq[:m], w, xs, s, torch.bfloat16)
                             for w, s in ws])

        def padded(m: int, p: int, ws=ws, xq=xq, xs=xs) -> float:
            def one(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
                a = fp8_pad.pad_rows(xq[:m], p - m)
                return ops.cutlass_scaled_mm(a, w, xs, s, torch.bfloat16)[:m]
            return graph_us([lambda w=w, s=s: one(w, s) for w, s in ws])

        t = {m: plain(m) for m in ms}
        # Correctness of the padded path on this shape: same rows as the plain product.
        w0, s0 = ws[0]
        ref = ops.cutlass_scaled_mm(xq[:20], w0, xs, s0, torch.bfloat16)
        got = ops.cutlass_scaled_mm(fp8_pad.pad_rows(xq[:20], 44), w0, xs, s0, torch.bfloat16)[:20]
        if not torch.equal(ref, got):
            sys.exit(f"tune: padded Cutlass differs from plain on {name}; not writing a table")
        targets, rows = [], []
        for m in ms:
            best = min((p for p in ms if p >= m), key=lambda p: t[p])
            chosen, t_pad = m, None
            if best > m and t[best] < 0.97 * t[m]:
                t_pad = padded(m, best)
                if t_pad < 0.97 * t[m]:
                    chosen = best
            targets.append(chosen)
            rows.append({"m": m, "cutlass_us": round(t[m], 2), "gbs": round(k * n / t[m] / 1e3),
                         "pad_to": chosen, "padded_us": None if t_pad is None else round(t_pad, 2)})
        pad_to[f"{n},{k}"] = targets
        report["shapes"][name] = {"k": k, "n": n, "rows": rows}
        changed = [(r["m"], r["pad_to"], r["cutlass_us"], r["padded_us"])
                   for r in rows if r["pad_to"] != r["m"]]
        print(f"{name} (K={k}, N={n}): M=1 {t[1]:.1f} us, M=16 {t[16]:.1f}, M=32 {t[32]:.1f}, "
              f"M=64 {t[64]:.1f}; padded: {changed}", flush=True)
        del ws
        torch.cuda.empty_cache()
    tuning = {"device": report["device"], "pad_to": pad_to,
              "measured_by": "python -m inference_image_vllm.tune"}
    with open(args.tuning, "w") as fh:
        json.dump(tuning, fh)
    report["seconds"] = round(time.time() - t_start, 1)
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report, fh, indent=1)
    print(f"{'M':>4}" + "".join(f"{s:>16}" for s in SHAPES))
    for m in (1, 8, 16, 17, 24, 32, 33, 40, 48, 64, 96, 128):
        if m > args.max_m:
            continue
        cells = []
        for s in SHAPES:
            r = report["shapes"][s]["rows"][m - 1]
            padded = f"{r['padded_us']:>6}" if r["padded_us"] else " " * 6
            cells.append(f"{r['cutlass_us']:>7}->{r['pad_to']:<3}{padded}")
        print(f"{m:>4}" + "".join(f"{c:>16}" for c in cells))
    print(f"tuned in {report['seconds']} s")


if __name__ == "__main__":
    main()
