"""Which FP8 GEMM kernel runs a [M, K] x [K, N] product, per batch size, from a measured table.

vLLM 0.26 runs every FP8 linear layer on one kernel family (Cutlass on Hopper unless told
otherwise). Measured inside CUDA graphs on an H200, Cutlass' tile configuration for 17-32 rows is
its slowest, while cuBLASLt (torch._scaled_mm) is slower at 1-16 rows and faster at some larger
ones; past 128 rows Cutlass' time jumps at every 256 rows plus one (a 513-row prefill step, a
512-token prompt beside one decoding stream, took twice a 512-row one; docs/benchmarks.md). The
table names the faster kernel for each weight shape and each batch size vLLM captures a CUDA graph
for, then for row ranges up to a step's token budget; a batch runs the entry of the smallest
measured size that holds it (the size vLLM pads it to, or the range it falls in). Shapes or sizes
the table does not cover run Cutlass, and so does everything on a GPU of another compute
capability than the table was measured on.

A table measured on the GPU by name (`tables/<name>.json`, e.g. `nvidia-h200.json`) is used before
the one for its architecture (`tables/hopper.json`): the H100 and H200 share compute capability 9.0
but not memory bandwidth or clocks, so a kernel's lead at one batch size may not carry over.

At 1-4 rows a table may also name a Triton GEMV block shape, `triton:BLOCK_N:BLOCK_K:WARPS:STAGES`
(gemv.py): at concurrency 1 the small projections are latency-bound in both library kernels.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING

from . import switches

if TYPE_CHECKING:
    import torch

# The kernel names and limits live in a torch-free module that gemv.py reads too (no import loop).
from .kernels import GEMV_CONFIGS, GEMV_MAX_M, KERNELS, FP8Operands, gemv_name, parse_gemv

__all__ = ["GEMV_CONFIGS", "GEMV_MAX_M", "KERNELS", "FP8Operands", "Table", "gemv_name",
           "parse_gemv", "run", "table"]


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
                for m, kern in pairs:
                    try:
                        gemv = parse_gemv(kern)
                    except ValueError as e:
                        raise ValueError(f"{path}: {key} at {m} rows: {e}") from None
                    if gemv is None and kern not in KERNELS:
                        raise ValueError(f"{path}: unknown kernel in {key}: {pairs}")
                    if gemv is not None and m > GEMV_MAX_M:
                        raise ValueError(f"{path}: {key}: {kern} at {m} rows; the Triton GEMV "
                                         f"serves at most {GEMV_MAX_M}")
                self.entries[(n, k)] = pairs

    def kernel(self, m: int, n: int, k: int) -> str:
        # bisected: an eager prefill step asks 320 times (the 70B), each over ~40 entries
        pairs = self.entries.get((n, k), [])
        i = bisect.bisect_left(pairs, m, key=itemgetter(0))
        return pairs[i][1] if i < len(pairs) else "cutlass"


def document(shapes: dict[str, list[list[object]]], *, device: str, capability: str,
             torch_version: str, vllm_version: str) -> dict[str, object]:
    """A table as `Table` reads it: the capability is what decides whether a GPU uses it."""
    return {"device": device, "capability": capability, "torch": torch_version,
            "vllm": vllm_version, "measured_by": "python -m inference_image_vllm.tune",
            "shapes": shapes}


_table: Table | None = None
TABLES = Path(__file__).with_name("tables")


# The table is read when the plugin installs, in vLLM's API server process too, which may fork its
# engine core (serving.engine_process): asked through vLLM's platform (NVML), the GPU's name and
# capability leave CUDA uninitialized there, where torch's would initialize it and make vLLM spawn
# the engine core, importing everything again (docs/decisions.md#ready-time).
def capability() -> str:
    from vllm.platforms import current_platform

    cap = current_platform.get_device_capability()
    if cap is None:
        raise RuntimeError("vLLM's platform reads no GPU compute capability")
    return f"{cap.major}.{cap.minor}"


def device_name() -> str:
    from vllm.platforms import current_platform

    return current_platform.get_device_name()


def table_file_name(device: str) -> str:
    """The packaged table of one GPU model: 'NVIDIA H100 80GB HBM3' -> nvidia-h100-80gb-hbm3.json."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") + ".json"


def packaged_table() -> Path | None:
    """This GPU's own table, else the architecture's, else none."""
    for f in (TABLES / table_file_name(device_name()), TABLES / "hopper.json"):
        if f.is_file():
            return f
    return None


def table() -> Table:
    global _table
    if _table is None:
        path = os.environ.get(switches.FP8_TABLE)
        if not path:
            packaged = packaged_table()
            path = str(packaged) if packaged else None
        t = Table(path)
        if t.entries and t.capability != capability():
            # Kernel speeds are a property of the chip: a table from another one is no guide.
            measured_on = t.capability or "?"
            t = Table(None)
            t.source = f"none: {path} was measured on compute capability {measured_on}"
        _table = t
    return _table


def run(kernel: str, ops: FP8Operands) -> torch.Tensor:
    """The product of `ops` on `kernel` (a name from the table; the GEMV falls back to Cutlass
    for operands it does not take)."""
    import torch

    if kernel.startswith("triton:"):
        from . import gemv

        if gemv.supports(ops):
            return gemv.fp8_gemv(kernel, ops)
        kernel = "cutlass"
    a, b, scale_a, scale_b, bias, out_dtype = ops
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
