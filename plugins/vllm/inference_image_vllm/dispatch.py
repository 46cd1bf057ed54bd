"""Which FP8 GEMM kernel runs a [M, K] x [K, N] product, per batch size, from a measured table.

vLLM 0.26 runs every FP8 linear layer on one kernel family (Cutlass on Hopper unless told
otherwise). Measured inside CUDA graphs on an H200, Cutlass' tile configuration for 17-32 rows is
its slowest, while cuBLASLt (torch._scaled_mm) is slower at 1-16 rows and faster at some larger
ones (docs/benchmarks.md). The table names the faster kernel for each weight shape and each batch
size vLLM captures a CUDA graph for; a batch runs the entry of the smallest measured size that
holds it (the size vLLM pads it to). Shapes or sizes the table does not cover run Cutlass, and
so does everything on a GPU of another compute capability than the table was measured on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

KERNELS = ("cutlass", "cublaslt", "cublaslt_fast")


class Table:
    def __init__(self, path: str | None) -> None:
        self.source = path or "none (Cutlass everywhere)"
        self.device = ""
        self.capability = ""
        self.entries: dict[tuple[int, int], list[tuple[int, str]]] = {}
        if path:
            data = json.loads(Path(path).read_text())
            self.device = data.get("device", "")
            self.capability = str(data.get("capability", ""))
            for key, rows in data.get("shapes", {}).items():
                n, k = (int(v) for v in key.split(","))
                pairs = sorted((int(m), str(kern)) for m, kern in rows)
                if any(kern not in KERNELS for _, kern in pairs):
                    raise ValueError(f"{path}: unknown kernel in {key}: {pairs}")
                self.entries[(n, k)] = pairs

    def kernel(self, m: int, n: int, k: int) -> str:
        for size, kern in self.entries.get((n, k), ()):
            if m <= size:
                return kern
        return "cutlass"


def document(shapes: dict[str, list[list[object]]], *, device: str, capability: str,
             torch_version: str, vllm_version: str) -> dict[str, object]:
    """A table as `Table` reads it: the capability is what decides whether a GPU uses it."""
    return {"device": device, "capability": capability, "torch": torch_version,
            "vllm": vllm_version, "measured_by": "python -m inference_image_vllm.tune",
            "shapes": shapes}


_table: Table | None = None


def capability() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def table() -> Table:
    global _table
    if _table is None:
        path = os.environ.get("INFERENCE_IMAGE_FP8_TABLE")
        if not path:
            packaged = Path(__file__).with_name("tables") / "hopper.json"
            path = str(packaged) if packaged.is_file() else None
        t = Table(path)
        if t.entries and t.capability != capability():
            # Kernel speeds are a property of the chip: a table from another one is no guide.
            measured_on = t.capability or "?"
            t = Table(None)
            t.source = f"none: {path} was measured on compute capability {measured_on}"
        _table = t
    return _table


def run(
    kernel: str,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """a [M, K] FP8 row-major, b [K, N] FP8 column-major (vLLM's layout for both kernels)."""
    import torch

    if kernel != "cutlass" and scale_a.numel() == 1 and scale_b.numel() == 1:
        return torch._scaled_mm(
            a,
            b,
            scale_a=scale_a.reshape(1),
            scale_b=scale_b.reshape(1),
            bias=bias,
            out_dtype=out_dtype,
            use_fast_accum=kernel == "cublaslt_fast",
        )
    from vllm import _custom_ops as ops

    return ops.cutlass_scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, bias=bias)
