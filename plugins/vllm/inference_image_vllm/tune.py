"""Measure Cutlass, cuBLASLt and (at 1-4 rows) Triton GEMV FP8 kernels at every batch size vLLM
captures, and over the row ranges of prefill steps; write the table.

    python -m inference_image_vllm.tune --table OUT.json [--report REPORT.json]
        [--model HIDDEN,INTERMEDIATE,HEADS,KV_HEADS,HEAD_DIM[,TP] ...] [--prefill-to ROWS]

For each projection (qkv, o, gate_up, down) of each --model (default Llama-3.1-8B; Llama 3.3 70B
is 8192,28672,64,8,128) and each CUDA-graph batch size up to
--max-m: every kernel's time with the activations already in FP8 (as vLLM serves them), inside one
CUDA graph over enough weight copies to defeat the L2 cache. A kernel other than Cutlass is chosen
only where it is at least --margin faster and its result is as accurate as Cutlass' (checked
against a float32 product of the same FP8 values).

Past --max-m, up to --prefill-to rows (a step's token budget), the table covers row ranges: a
prefill step's GEMMs run at its exact token count (a 512-token prompt beside one decoding stream
is 513 rows), and vLLM 0.26's Cutlass tile for more than 128 rows is 128 rows in clusters of two,
so its time jumps at each 256 rows plus one (docs/decisions.md, "The FP8 table covers prefill
steps too, in row ranges"). Each range is measured at its
first and its last row and goes to the kernel with the least time of the two together.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import dispatch

if TYPE_CHECKING:
    import torch

LLAMA_8B = (4096, 14336, 32, 8, 128, 1)


def shapes(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
           tp: int = 1) -> dict[str, tuple[int, int]]:
    """(K, N) of a Llama layer's four FP8 projections on one of `tp` tensor-parallel GPUs: the
    column-parallel ones (qkv, gate_up) split N, the row-parallel ones (o, down) split K."""
    for name, v in (("heads", heads), ("kv_heads", kv_heads), ("intermediate", intermediate)):
        if v % tp:
            raise ValueError(f"{name} {v} does not split over {tp} GPUs")
    return {"qkv": (hidden, (heads + 2 * kv_heads) * head_dim // tp),
            "o": (heads * head_dim // tp, hidden),
            "gate_up": (hidden, 2 * intermediate // tp),
            "down": (intermediate // tp, hidden)}


SHAPES = shapes(*LLAMA_8B)


def model_arg(s: str) -> tuple[int, ...]:
    try:
        v = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give HIDDEN,INTERMEDIATE,HEADS,KV_HEADS,"
                                         "HEAD_DIM[,TP] as integers") from None
    if len(v) not in (5, 6) or min(v) < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: give HIDDEN,INTERMEDIATE,HEADS,KV_HEADS,"
                                         "HEAD_DIM[,TP], each >= 1")
    try:
        shapes(*v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{s!r}: {e}") from None
    return v


def all_shapes(models: list[tuple[int, ...]]) -> dict[str, tuple[int, int]]:
    """Every distinct (K, N) of the models, named by projection (and model where several are)."""
    out: dict[str, tuple[int, int]] = {}
    for i, m in enumerate(models):
        for name, kn in shapes(*m).items():
            if kn not in out.values():
                out[name if len(models) == 1 else f"{name}@{i}"] = kn
    return out


def capture_sizes(max_m: int) -> list[int]:
    """vLLM 0.26's default CUDA-graph sizes (1, 2, 4, then steps of 8) up to max_m."""
    return [m for m in [1, 2, 4, *range(8, max_m + 1, 8)] if m <= max_m]


def prefill_ranges(max_m: int, to: int) -> list[tuple[int, int]]:
    """The row ranges (first, last) past the CUDA-graph sizes up to `to`: 64 rows wide up to 1024,
    then 128, 256 and 512 (Cutlass's steps are 256 rows; a range's width bounds how far its two
    measured ends may stand from a batch inside it, where the relative cost of a jump is smaller
    the more rows there are)."""
    out, last = [], max_m
    while last < to:
        width = 64 if last < 1024 else 128 if last < 2048 else 256 if last < 4096 else 512
        top = min(to, (last // width + 1) * width)
        out.append((last + 1, top))
        last = top
    return out


def accurate(err: dict[str, float]) -> list[str]:
    """The kernels as accurate as Cutlass: at most twice its error, plus 1e-3."""
    return [kk for kk in err if err[kk] <= 2 * err["cutlass"] + 1e-3]


def pick(t: dict[str, float], err: dict[str, float], margin: float) -> str:
    """The kernel of least time among the accurate ones; Cutlass unless that one is at least
    `margin` faster."""
    best = min(accurate(err), key=lambda kk: t[kk])
    return "cutlass" if best != "cutlass" and t[best] > (1 - margin) * t["cutlass"] else best


def measure_at(m: int, kernels: list[str], x: tuple[torch.Tensor, torch.Tensor],
               ws: list[tuple[torch.Tensor, torch.Tensor]], ref: tuple[torch.Tensor, float],
               reps: int = 20) -> tuple[dict[str, float], dict[str, float]]:
    """Each kernel's time (us) and error at the first m rows of FP8 activations x (values, scale)
    against weights ws, the error relative to ref (the float32 product with ws[0], its largest
    magnitude)."""
    import torch

    xq, xs = x
    t, err = {}, {}
    a = xq[:m].contiguous()
    # one weight's operands each; the first is the weight `ref` was computed for
    each = [dispatch.FP8Operands(a, w, xs, s, None, torch.bfloat16) for w, s in ws]
    for kern in kernels:
        out = dispatch.run(kern, each[0])
        err[kern] = ((out.float() - ref[0][:m]).abs().max() / ref[1]).item()
        t[kern] = graph_us([lambda o=o, kern=kern: dispatch.run(kern, o) for o in each], reps)
    return t, err


def graph_us(fns: list[Callable[[], object]], reps: int = 20) -> float:
    """Mean time of one call, replayed inside a CUDA graph (no launch gaps from Python)."""
    import torch  # here, not at the top: the shape helpers are used (and tested) without a GPU

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
    ap.add_argument("--table", required=True, help="where to write the kernel table (JSON)")
    ap.add_argument("--report", help="every measurement, as JSON")
    ap.add_argument("--max-m", type=int, default=128)
    ap.add_argument("--prefill-to", type=int, default=0, metavar="ROWS",
                    help="also cover prefill steps of up to ROWS rows (the largest "
                         "max_num_batched_tokens served): row ranges past --max-m")
    ap.add_argument("--margin", type=float, default=0.03, help="how much faster than Cutlass")
    ap.add_argument("--model", type=model_arg, action="append", default=[],
                    metavar="HIDDEN,INTERMEDIATE,HEADS,KV_HEADS,HEAD_DIM[,TP]",
                    help="a Llama model's shapes, repeatable (default Llama-3.1-8B)")
    args = ap.parse_args()
    todo = all_shapes(args.model or [LLAMA_8B])
    import torch
    import vllm
    from vllm import _custom_ops as ops

    t_start = time.time()
    torch.manual_seed(0)
    sizes = capture_sizes(args.max_m)
    ranges = prefill_ranges(args.max_m, args.prefill_to)
    report: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "sizes": sizes,
        "prefill_ranges": ranges,
        "shapes": {},
    }
    table: dict[str, list[list[object]]] = {}
    rows_x = max([args.max_m, *(last for _, last in ranges)])
    for name, (k, n) in todo.items():
        copies = max(2, -(-512 * 2**20 // (k * n)))  # >= 512 MB of FP8 weights (L2: 50-60 MB)
        ws = []
        for _ in range(copies):
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            q, s = ops.scaled_fp8_quant(w)
            ws.append((q.t(), s))  # [K, N] column-major, as vLLM stores it
        x = torch.randn(rows_x, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = ops.scaled_fp8_quant(x)
        w0, s0 = ws[0]
        ref = (xq.float() * xs) @ (w0.float() * s0)  # the exact product of the FP8 values
        scale = ref.abs().max().item()

        x_ops, ref_ops = (xq, xs), (ref, scale)
        rows, chosen = [], []
        for m in sizes:
            gemvs = dispatch.GEMV_CONFIGS if m <= dispatch.GEMV_MAX_M else []
            t, err = measure_at(m, [*dispatch.KERNELS, *gemvs], x_ops, ws, ref_ops)
            best = pick(t, err, args.margin)
            chosen.append([m, best])
            row = {
                "m": m,
                **{f"{kk}_us": round(t[kk], 2) for kk in dispatch.KERNELS},
                **{f"{kk}_err": round(err[kk], 5) for kk in dispatch.KERNELS},
                "chosen": best,
            }
            if gemvs:  # the fastest accurate block shape, and every one's time
                ok = [kk for kk in accurate(err) if kk in gemvs]
                g = min(ok, key=lambda kk: t[kk], default=gemvs[0])
                row.update(triton=g, triton_us=round(t[g], 2), triton_err=round(err[g], 5),
                           triton_all_us={kk: round(t[kk], 2) for kk in gemvs})
            rows.append(row)
        for first, last in ranges:
            # prefill GEMMs take 0.1-2 ms: a few replays are as steady as 20 of a decode GEMV
            (t1, e1), (t2, e2) = (measure_at(m, list(dispatch.KERNELS), x_ops, ws, ref_ops, reps=5)
                                  for m in (first, last))
            both = {kk: t1[kk] + t2[kk] for kk in t1}
            best = pick(both, {kk: max(e1[kk], e2[kk]) for kk in e1}, args.margin)
            chosen.append([last, best])
            rows.append({"m": last, "first": first,
                         **{f"{kk}_us": round(t2[kk], 2) for kk in dispatch.KERNELS},
                         **{f"{kk}_first_us": round(t1[kk], 2) for kk in dispatch.KERNELS},
                         **{f"{kk}_err": round(max(e1[kk], e2[kk]), 5) for kk in dispatch.KERNELS},
                         "chosen": best})
        table[f"{n},{k}"] = chosen
        report["shapes"][name] = {"k": k, "n": n, "rows": rows}
        del ws, ref, x_ops, ref_ops
        torch.cuda.empty_cache()
    if not table:
        sys.exit("tune: nothing measured")
    with open(args.table, "w") as fh:
        json.dump(
            dispatch.document(
                table,
                device=report["device"],
                capability=dispatch.capability(),
                torch_version=torch.__version__,
                vllm_version=vllm.__version__,
            ),
            fh,
            indent=1,
        )
    report["seconds"] = round(time.time() - t_start, 1)
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report, fh, indent=1)
    print(f"{'M':>9}" + "".join(f"{s:>31}" for s in todo)
          + "   (us: cutlass/cublaslt/fast/triton -> chosen; a range: its last row)")
    for i, (m, first) in enumerate([*((m, m) for m in sizes), *((b, a) for a, b in ranges)]):
        cells = []
        for s in todo:
            r = report["shapes"][s]["rows"][i]
            tri = f"/{r['triton_us']:.1f}" if "triton_us" in r else ""
            cells.append(
                f"{r['cutlass_us']:.1f}/{r['cublaslt_us']:.1f}/{r['cublaslt_fast_us']:.1f}{tri}"
                f"->{r['chosen'][:4]}{'F' if r['chosen'].endswith('fast') else ''}"
            )
        print(f"{m if first == m else f'{first}-{m}':>9}" + "".join(f"{c:>31}" for c in cells))
    print(f"tuned in {report['seconds']} s")


if __name__ == "__main__":
    main()
