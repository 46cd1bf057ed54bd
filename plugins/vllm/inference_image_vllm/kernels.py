"""Kernel names and limits of the FP8 dispatch: what a table may name, and the Triton GEMV's block
shapes. Imports nothing, so the table code and the kernels can both read it."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch


class FP8Operands(NamedTuple):
    """One FP8 GEMM's inputs, as vLLM's Cutlass kernel takes them and every kernel here runs them:
    a [M, K] FP8 row-major, b [K, N] FP8 column-major, a's scale per tensor or per token (row),
    b's per tensor or per channel (column), an optional bias over N, the output dtype."""

    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    bias: torch.Tensor | None
    out_dtype: torch.dtype


KERNELS = ("cutlass", "cublaslt", "cublaslt_fast")
GEMV_MAX_M = 4  # beyond a few rows a GEMV re-reads its weight tile per row: a GEMM kernel's job


def parse_gemv(kernel: str) -> tuple[int, int, int, int] | None:
    """`triton:BLOCK_N:BLOCK_K:WARPS:STAGES` -> the four integers; None for a library kernel."""
    if not kernel.startswith("triton:"):
        return None
    fields = kernel.split(":")[1:]
    if len(fields) != 4 or not all(f.isdigit() and int(f) > 0 for f in fields):
        raise ValueError(f"{kernel!r}: want triton:BLOCK_N:BLOCK_K:WARPS:STAGES")
    bn, bk, warps, stages = (int(f) for f in fields)
    if any(v & (v - 1) for v in (bn, bk, warps)):
        raise ValueError(f"{kernel!r}: BLOCK_N, BLOCK_K and WARPS must be powers of two")
    return bn, bk, warps, stages


def gemv_name(bn: int, bk: int, warps: int, stages: int) -> str:
    return f"triton:{bn}:{bk}:{warps}:{stages}"


# The GEMV block shapes `tune` tries: rows per program x bytes of K per load, 4-8 KB of weights
# in flight per program and stage, at most 64 float32 values of the tile per thread.
GEMV_CONFIGS = [gemv_name(bn, bk, warps, stages)
                for bn, bk, warps in ((2, 2048, 4), (4, 1024, 4), (8, 512, 4), (8, 1024, 4), (16, 512, 4))
                for stages in (2, 4)]
