"""Batch-size padding for vLLM's Cutlass FP8 GEMM (Hopper), chosen by measurement.

vLLM 0.26 picks a Cutlass tile configuration by the token count M. On an H200 the one it uses for
M in 17..32 is slower than the next one up: a decode step of 32 sequences ran its GEMMs ~1.2x
slower than a step of 64 (docs/benchmarks.md). Padding such batches with zero rows so that
Cutlass takes the faster configuration, then dropping the extra rows, is cheaper than the loss.

The table (M -> padded M, per weight shape) comes from `python -m inference_image_vllm.tune` on
the GPU; with no table nothing is padded.
"""

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

MAX_M = 128


class Tuning:
    def __init__(self, path: str | None) -> None:
        self.source = path or "none (no padding)"
        self.pad: dict[tuple[int, int], list[int]] = {}
        if path:
            with open(path) as fh:
                data = json.load(fh)
            for key, targets in data.get("pad_to", {}).items():
                n, k = (int(v) for v in key.split(","))
                self.pad[(n, k)] = [int(t) for t in targets]


_tuning: Tuning | None = None


def tuning() -> Tuning:
    global _tuning
    if _tuning is None:
        path = os.environ.get("INFERENCE_IMAGE_FP8_PAD_TUNING")
        if not path:
            packaged = Path(__file__).with_name("tuning") / "hopper.json"
            path = str(packaged) if packaged.is_file() else None
        _tuning = Tuning(path)
    return _tuning


def padded_m(m: int, n: int, k: int) -> int:
    """The row count to run Cutlass at for an [m, k] x [k, n] product (m when not tuned)."""
    targets = tuning().pad.get((n, k))
    if not targets or m < 1 or m > len(targets):
        return m
    return max(m, targets[m - 1])


def pad_rows(a: torch.Tensor, rows: int, value: float = 0.0) -> torch.Tensor:
    """a with `rows` more rows of `value` (FP8 through its bytes: pad has no FP8 kernel)."""
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        assert value == 0.0
        return F.pad(a.view(torch.uint8), (0, 0, 0, rows)).view(a.dtype)
    return F.pad(a, (0, 0, 0, rows), value=value)
