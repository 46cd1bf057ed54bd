"""GPU measurements the proof makes beside serving (each in a child process of the proof, so the
CUDA memory it takes is given back before the next server starts): HBM read bandwidth for the
roofline, and the decode-shaped GEMMs of Llama 3.1 8B, bf16 against FP8, which bound what one
stream can do."""

from __future__ import annotations

import functools
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


# The attention step's split-KV segment counts: vLLM's own (NUM_PAR_SOFTMAX_SEGMENTS in vLLM
# 0.26's Triton backend, what the plugin ships) first
VLLM_SEGMENTS = 16
ATTENTION_SEGMENTS = (VLLM_SEGMENTS, 32, 64, 128)
# calls a timed CUDA graph holds (one layer each, as many as Llama 8B's layers)
ATTENTION_CALLS = 32
# the most splits vLLM's FA3 metadata builder allows inside full CUDA graphs (0.26's
# attention_config.flash_attn_max_num_splits_for_cuda_graph)
FA3_GRAPH_SPLITS = 32


# the steps the plugin's Triton route takes on a tier that speculates k tokens: a verify step of
# one and of two sequences (c=1, c=2), and the draft head's one-token passes
def attention_steps(k: int, max_tokens: int) -> dict[str, list[int]]:
    steps = {f"decode-{n}": [1] * n for n in sorted({1, min(4, max_tokens), max_tokens})}
    for seqs in (1, 2):
        if seqs * (k + 1) <= max_tokens:
            steps[f"verify-{seqs}x{k + 1}"] = [k + 1] * seqs
    return steps


def attention_route(heads: int, kv_heads: int, head: int, max_tokens: int, k: int,
                    contexts: list[int], segments: tuple[int, ...] = ATTENTION_SEGMENTS,
                    layers: int = ATTENTION_CALLS,
                    fa3_splits: int = FA3_GRAPH_SPLITS) -> dict[str, Any]:
    """One layer's attention, FA3 (vLLM's FlashAttentionImpl as shipped) against the plugin's Triton
    split-KV route (verify on) at each split count, for each step shape at each cached context, on
    an FP8 KV cache in vLLM's layout. Each timing replays a CUDA graph of `layers` calls, each on a
    KV cache of its own (as a served step's layers read theirs: from HBM, not from L2), so neither
    the host's launch time nor a cache left warm by the layer before counts; microseconds a call,
    the mean of 20 replays (the plugin's tuner's timing). FA3 gets what vLLM's metadata builder
    gives it for a step inside a full CUDA graph: a scheduler plan made ahead with at most
    `fa3_splits` splits. Returns the rows and the GPU that timed them (as `bandwidth` does)."""
    import torch
    from vllm.v1.attention.backends import flash_attn
    from vllm.v1.attention.backends.fa_utils import get_scheduler_metadata

    from inference_image_vllm import attention
    from inference_image_vllm.tune import graph_us

    block = 16
    cls = flash_attn.FlashAttentionImpl
    fa_forward = cls.forward
    attention.install(max_tokens, verify=True)
    route = cls.forward
    impl = cls(heads, head, head ** -0.5, kv_heads, None, None, "fp8")
    layer = torch.nn.Module().cuda()
    for name in ("_q_scale", "_k_scale", "_v_scale"):
        layer.register_buffer(name, torch.tensor(0.02, dtype=torch.float32, device="cuda"))
    steps = attention_steps(k, max_tokens)
    per_seq = (max(contexts) + k + 1 + block - 1) // block
    seqs = max(len(q) for q in steps.values())
    # bytes below 0x78 are finite FP8 (e4m3fn has no infinity; 0x7f is NaN): the values do not
    # change either kernel's work
    caches = [torch.empty(seqs * per_seq, block, kv_heads, 2 * head, dtype=torch.uint8,
                          device="cuda").random_(0, 0x78).permute(0, 2, 1, 3)
              for _ in range(layers)]
    table = torch.randperm(seqs * per_seq, device="cuda", dtype=torch.int32).reshape(seqs, per_seq)

    def timed(forward: Any, call: tuple[Any, ...], meta: Any, result: Any) -> float:
        return round(graph_us([functools.partial(forward, *call, cache, meta, result)
                               for cache in caches]), 2)

    out: list[dict[str, Any]] = []
    for name, q_lens in steps.items():
        n = sum(q_lens)
        qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                           device="cuda")
        call = (impl, layer, (torch.randn(n, heads, head, device="cuda") * 4).to(torch.float8_e4m3fn),
                torch.randn(n, kv_heads, head, device="cuda", dtype=torch.bfloat16),
                torch.randn(n, kv_heads, head, device="cuda", dtype=torch.bfloat16))
        result = torch.empty(n, heads, head, device="cuda", dtype=torch.bfloat16)
        for ctx in contexts:
            seq_lens = [ctx + q for q in q_lens]
            lens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
            plan = get_scheduler_metadata(
                batch_size=len(q_lens), max_seqlen_q=max(q_lens), max_seqlen_k=max(seq_lens),
                num_heads_q=heads, num_heads_kv=kv_heads, headdim=head, cache_seqlens=lens,
                qkv_dtype=torch.float8_e4m3fn, cu_seqlens_q=qsl, page_size=block, causal=True,
                window_size=(-1, -1), num_splits=fa3_splits)
            meta = flash_attn.FlashAttentionMetadata(
                num_actual_tokens=n, max_query_len=max(q_lens), query_start_loc=qsl,
                max_seq_len=max(seq_lens), seq_lens=lens,
                block_table=table[: len(q_lens)], slot_mapping=torch.full(
                    (n,), -1, dtype=torch.int64, device="cuda"),
                use_cascade=False, common_prefix_len=0, cu_prefix_query_lens=None,
                prefix_kv_lens=None, suffix_kv_lens=None, scheduler_metadata=plan,
                max_num_splits=fa3_splits)
            row: dict[str, Any] = {"step": name, "context": ctx,
                                   "fa3_us": timed(fa_forward, call, meta, result)}
            for count in segments:
                attention._segments = count
                row[f"triton_{count}_us"] = timed(route, call, meta, result)
            attention._segments = None
            out.append(row)
            print(row, flush=True)
    return {"gpu": torch.cuda.get_device_name(0), "rows": out}
