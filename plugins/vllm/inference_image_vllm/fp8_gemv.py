"""FP8-weight GEMMs for decode-sized batches (Hopper), as a vLLM linear kernel.

Why: at batch 1-64 a decode step is bound by reading the weights, and vLLM 0.26's Cutlass FP8
kernel reads the narrow projections of an 8B model (qkv: N=6144, o: N=4096) at only 0.9-1.3 TB/s
on an H200 (docs/benchmarks.md): a 4096-wide output gives too few tiles to keep 132 SMs
streaming, and it has no split-K. This kernel reads the FP8 weight once, dequantizes it in
registers and multiplies by the bf16 activations (no activation quantization: two fewer launches
per layer, and more accurate), splitting K over several CTAs where N alone is too narrow.

Above `max_m` tokens the layer is exactly vLLM's Cutlass path (activation quant + Cutlass GEMM).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def _w8a16_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, ws_ptr,
    M, N, K,
    stride_xm, stride_wk, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_per = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
    k0 = pid_k * k_per
    m_ok = rm[:, None] < M
    n_ok = rn[None, :] < N
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :]
    w_ptrs = w_ptr + (k0 + rk)[:, None] * stride_wk + rn[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_per, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_ok, other=0.0)
            w = tl.load(w_ptrs, mask=n_ok, other=0.0)
        else:
            k_ok = (k0 + k + rk) < K
            x = tl.load(x_ptrs, mask=m_ok & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok, other=0.0)
        acc += tl.dot(x, w.to(tl.bfloat16))
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    if PER_CHANNEL:
        acc *= tl.load(s_ptr + rn, mask=rn < N, other=0.0)[None, :]
    else:
        acc *= tl.load(s_ptr)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(o_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(o_ptr.dtype.element_ty),
                 mask=m_ok & n_ok)
    else:
        tl.atomic_add(ws_ptr + rm[:, None] * N + rn[None, :], acc, mask=m_ok & n_ok, sem="relaxed")


@triton.jit
def _finalize_kernel(ws_ptr, b_ptr, o_ptr, M, N, stride_om, BLOCK: tl.constexpr,
                     HAS_BIAS: tl.constexpr):
    # Sum of the split-K partials -> output dtype; the workspace is zeroed again here, so the
    # next layer needs no memset (the pair stays two launches, also inside a CUDA graph).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    v = tl.load(ws_ptr + offs, mask=ok, other=0.0)
    tl.store(ws_ptr + offs, tl.zeros_like(v), mask=ok)
    m = offs // N
    n = offs % N
    if HAS_BIAS:
        v += tl.load(b_ptr + n, mask=ok, other=0.0).to(tl.float32)
    tl.store(o_ptr + m * stride_om + n, v.to(o_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4


DEFAULTS: dict[int, Config] = {
    16: Config(16, 32, 256, 2),
    32: Config(32, 64, 128, 1),
    64: Config(64, 64, 128, 1),
}
DEFAULT_MAX_M = 16
BUCKETS = (16, 32, 64)


def bucket(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


class Tuning:
    """Measured choices (`python -m inference_image_vllm.tune`): per (M bucket, N, K) the fastest
    config, and per (N, K) the largest M at which this kernel beat vLLM's Cutlass path."""

    def __init__(self, path: str | None) -> None:
        self.source = path or "built-in defaults"
        self.configs: dict[tuple[int, int, int], Config] = {}
        self.max_m: dict[tuple[int, int], int] = {}
        if path:
            with open(path) as fh:
                data = json.load(fh)
            for key, c in data.get("configs", {}).items():
                b, n, k = (int(v) for v in key.split(","))
                self.configs[(b, n, k)] = Config(*c)
            for key, m in data.get("max_m", {}).items():
                n, k = (int(v) for v in key.split(","))
                self.max_m[(n, k)] = int(m)


_tuning: Tuning | None = None


def tuning() -> Tuning:
    global _tuning
    if _tuning is None:
        path = os.environ.get("INFERENCE_IMAGE_FP8_GEMV_TUNING")
        if not path:
            packaged = Path(__file__).with_name("tuning") / "hopper.json"
            path = str(packaged) if packaged.is_file() else None
        _tuning = Tuning(path)
    return _tuning


def tuning_source() -> str:
    return tuning().source


def pick(m: int, n: int, k: int) -> Config:
    b = bucket(m)
    return tuning().configs.get((b, n, k), DEFAULTS[b])


def threshold(n: int, k: int) -> int:
    """Batches of up to this many tokens use this kernel for an (N, K) weight; the
    INFERENCE_IMAGE_FP8_GEMV_MAX_M environment variable caps it (0: never)."""
    cap = int(os.environ.get("INFERENCE_IMAGE_FP8_GEMV_MAX_M", "64"))
    return min(cap, tuning().max_m.get((n, k), DEFAULT_MAX_M))


_workspace: dict[torch.device, torch.Tensor] = {}


def workspace(device: torch.device, numel: int) -> torch.Tensor:
    ws = _workspace.get(device)
    if ws is None or ws.numel() < numel:
        # Zeroed once; every use leaves it zeroed (finalize). Allocated in vLLM's profiling
        # run, before any CUDA graph is captured.
        ws = torch.zeros(max(numel, 64 * 32768), dtype=torch.float32, device=device)
        _workspace[device] = ws
    return ws


def w8a16_mm(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
             cfg: Config | None = None) -> torch.Tensor:
    """x [M, K] bf16/fp16; w [K, N] float8_e4m3fn (any strides); w_scale: 1 or N values.
    Returns x @ (w * w_scale) + bias in x's dtype."""
    m, k = x.shape
    n = w.shape[1]
    cfg = cfg or pick(m, n, k)
    if bias is not None and cfg.split_k > 1:  # split-K + bias measured wrong on an H200: not used
        cfg = Config(cfg.block_m, cfg.block_n, cfg.block_k, 1, cfg.num_warps, cfg.num_stages)
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    per_channel = w_scale.numel() > 1
    ws = workspace(x.device, m * n) if cfg.split_k > 1 else out
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    _w8a16_kernel[grid](
        x, w, w_scale, bias if bias is not None else out, out, ws,
        m, n, k, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        PER_CHANNEL=per_channel, HAS_BIAS=bias is not None and cfg.split_k == 1,
        EVEN_K=k % (cfg.split_k * cfg.block_k) == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.split_k > 1:
        block = 1024
        _finalize_kernel[(triton.cdiv(m * n, block),)](
            ws, bias if bias is not None else out, out, m, n, out.stride(0),
            BLOCK=block, HAS_BIAS=bias is not None, num_warps=4)
    return out
