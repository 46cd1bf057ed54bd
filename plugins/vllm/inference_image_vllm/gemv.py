"""An FP8 GEMV in Triton for decode batches of 1-4 rows.

At concurrency 1 the weight GEMMs are most of a decode step, and vLLM's kernels read the small
projections below the memory bandwidth (docs/decisions.md, "The plugin's own kernels at
concurrency 1"). A GEMV has nothing to tile for: each program streams
BLOCK_N whole weight rows (contiguous in vLLM's column-major [K, N] layout) and keeps a float32
partial sum per row, so the grid is as wide as N / BLOCK_N and every load is a full-width row
segment. Which block shape, if any, beats Cutlass is measured per weight shape and batch size by
`tune` (dispatch.GEMV_CONFIGS), and the table names it as `triton:BLOCK_N:BLOCK_K:WARPS:STAGES`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernels import GEMV_MAX_M, FP8Operands, parse_gemv


@triton.jit
def _fp8_gemv_kernel(
    a_ptr, b_ptr, out_ptr, sa_ptr, sb_ptr, bias_ptr,
    M, N, K, stride_am, stride_bn, stride_om,
    M_PAD: tl.constexpr, SA_ROWS: tl.constexpr, SB_COLS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, M_PAD)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_m = offs_m < M
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        kk = k0 + offs_k
        mask_k = kk < K
        w = tl.load(b_ptr + offs_n[:, None] * stride_bn + kk[None, :],
                    mask=mask_n[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        # One row of activations at a time: a [M_PAD, BLOCK_N, BLOCK_K] product would not fit
        # in registers, and the weight tile is loaded once for all rows either way.
        for mi in tl.static_range(M_PAD):
            x = tl.load(a_ptr + mi * stride_am + kk, mask=mask_k & (mi < M), other=0.0).to(tl.float32)
            part = tl.sum(w * x[None, :], axis=1)
            acc = tl.where(offs_m[:, None] == mi, acc + part[None, :], acc)
    if SA_ROWS:  # per-token activation scales
        acc *= tl.load(sa_ptr + offs_m, mask=mask_m, other=0.0)[:, None]
    else:
        acc *= tl.load(sa_ptr)
    if SB_COLS:  # per-channel weight scales
        acc *= tl.load(sb_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    else:
        acc *= tl.load(sb_ptr)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def supports(ops: FP8Operands) -> bool:
    a, b, scale_a, scale_b = ops.a, ops.b, ops.scale_a, ops.scale_b
    m, n = a.shape[0], b.shape[1]
    # The kernel indexes a per-token or per-channel scale as a dense vector: a strided view (a
    # column of a wider tensor) read that way gave a relative error of 0.37.
    return (m <= GEMV_MAX_M and a.stride(1) == 1 and b.stride(0) == 1
            and scale_a.numel() in (1, m) and scale_b.numel() in (1, n)
            and scale_a.is_contiguous() and scale_b.is_contiguous())


def fp8_gemv(kernel: str, ops: FP8Operands) -> torch.Tensor:
    """`ops` with at most GEMV_MAX_M rows, on the block shape `kernel` names."""
    a, b, scale_a, scale_b, bias, out_dtype = ops
    cfg = parse_gemv(kernel)
    assert cfg is not None, kernel
    bn, bk, warps, stages = cfg
    m, k = a.shape
    n = b.shape[1]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    m_pad = 1 << (m - 1).bit_length()
    _fp8_gemv_kernel[(triton.cdiv(n, bn),)](
        a, b, out, scale_a, scale_b, bias if bias is not None else out,
        m, n, k, a.stride(0), b.stride(1), out.stride(0),
        M_PAD=m_pad, SA_ROWS=scale_a.numel() > 1, SB_COLS=scale_b.numel() > 1,
        HAS_BIAS=bias is not None, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, num_warps=warps,
    )
    return out
