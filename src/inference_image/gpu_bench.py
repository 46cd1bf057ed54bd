"""GPU measurements the proof makes beside serving (each in a child process of the proof, so the
CUDA memory it takes is given back before the next server starts): HBM read bandwidth for the
roofline, and the decode-shaped GEMMs of Llama 3.1 8B, bf16 against FP8, which bound what one
stream can do."""

from __future__ import annotations

import statistics
from typing import Any

# (K, N) of each GEMM of one Llama-3.1-8B layer, and the lm_head
LLAMA_8B_GEMMS = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
                  "down": (14336, 4096), "lm_head": (4096, 128256)}


def time_ms(fn: Any, reps: int = 30) -> float:
    """Median of CUDA-event timings, after three warm-up calls."""
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


def bandwidth() -> dict[str, Any]:
    """HBM read bandwidth (a 4 GiB reduction, far past L2), median of CUDA-event timings."""
    import torch

    x = torch.randn(4 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda")
    ms = time_ms(lambda: x.sum(dtype=torch.float32))
    nbytes = x.numel() * 2
    return {"gpu": torch.cuda.get_device_name(0), "bytes": nbytes,
            "read_bw_tbs": round(nbytes / ms / 1e9, 3)}


def gemm(rows_m: tuple[int, ...] = (1, 64)) -> list[dict[str, Any]]:
    """Each GEMM at M rows: bf16 (F.linear), FP8 per-tensor through Cutlass and through
    torch._scaled_mm (cuBLASLt), and the activation quantization FP8 adds; time per GEMM and the
    weight-read bandwidth achieved. Each timing runs over >= 400 MB of weight copies back to back,
    so neither the 50 MB L2 nor launch gaps count. Then the sum for one token (32 layers + the
    lm_head, which stays bf16 in every served config)."""
    import torch
    import torch.nn.functional as F
    from vllm import _custom_ops as ops

    out: list[dict[str, Any]] = []
    for m in rows_m:
        total = {"bf16": 0.0, "fp8": 0.0, "fp8_torch": 0.0, "act_quant": 0.0}
        for name, (k, n) in LLAMA_8B_GEMMS.items():
            copies = max(2, -(-400 * 2**20 // (k * n)))
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
                  for _ in range(copies)]
            q = [ops.scaled_fp8_quant(w) for w in ws]
            xq, xs = ops.scaled_fp8_quant(x)
            runs = {
                "bf16": lambda ws=ws, x=x: [F.linear(x, w) for w in ws],
                "fp8": lambda q=q, xq=xq, xs=xs: [
                    ops.cutlass_scaled_mm(xq, wq.t(), xs, s, out_dtype=torch.bfloat16)
                    for wq, s in q],
                "fp8_torch": lambda q=q, xq=xq, xs=xs: [
                    torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=s, out_dtype=torch.bfloat16)
                    for wq, s in q],
                "act_quant": lambda x=x, copies=copies: [ops.scaled_fp8_quant(x)
                                                         for _ in range(copies)],
            }
            per: dict[str, float] = {}
            for label, fn in runs.items():
                try:
                    per[label] = time_ms(fn, reps=10) / copies
                except Exception as exc:  # one kernel missing on this GPU is a finding, not a stop
                    print(f"gemm {name} {label}: {exc!r}")
                    per[label] = float("nan")
            del ws, q
            layers = 1 if name == "lm_head" else 32
            for key in total:
                total[key] += layers * (per["bf16"] if name == "lm_head" else per[key])
            out.append({"m": m, "gemm": name, "k": k, "n": n,
                        **{f"{lab}_us": round(t * 1e3, 1) for lab, t in per.items()},
                        "bf16_gbs": round(2 * k * n / per["bf16"] / 1e6),
                        "fp8_gbs": round(k * n / per["fp8"] / 1e6),
                        "fp8_torch_gbs": round(k * n / per["fp8_torch"] / 1e6)})
        out.append({"m": m, "gemm": "per token: 32 layers + lm_head (ms)",
                    "bf16_ms": round(total["bf16"], 3),
                    "fp8_cutlass_ms": round(total["fp8"] + total["act_quant"], 3),
                    "fp8_torch_ms": round(total["fp8_torch"] + total["act_quant"], 3)})
    return out
