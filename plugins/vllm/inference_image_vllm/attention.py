"""Small decode batches through vLLM's Triton attention kernels inside its FlashAttention backend.

With vLLM's TRITON_ATTN backend a concurrency-1 decode step is shorter than with FA3, because for
one query per sequence Triton's split-KV kernel is quicker than FA3's, its KV-cache write is a
lighter kernel, and it can write the o_proj input in FP8 itself (vLLM's attention+quant fusion),
which removes a kernel per layer. FA3 is far quicker at prefill and at large batches, and vLLM
picks one backend for every batch (docs/decisions.md, "The plugin's own kernels at concurrency 1").

This keeps FA3 and its KV-cache layout (the same as Triton's in vLLM 0.26) and routes batches of at
most `max_tokens` tokens, one query token a sequence, through the Triton kernels. A speculative
verify step (1 + k tokens a sequence) stays on FA3 unless `verify` is set: vLLM's own choice for
it is Triton's 2D kernel, which does not split the context (one CTA per KV head), so a long
context makes it slower than FA3.
With `verify`, such a step runs Triton's split-KV (3D) kernel instead, which walks each
sequence's own query length under the causal mask as the 2D one does; vLLM only chooses it for one
query token a sequence. Whole-step FULL graphs ran verify steps that way by accident (their small
mixed graphs are captured from one token a request) and were quicker at c=1-2.
The choice is made when vLLM captures a CUDA graph for a batch size, so each graph holds one path;
a batch that runs eagerly (larger than every graph) goes to FA3. With the fusion on, FA3's path
writes bfloat16 into a scratch buffer and quantizes it, the same kernel vLLM would otherwise run
after attention.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from . import LOG_TRITON_DECODE, LOG_TRITON_VERIFY

logger = logging.getLogger("vllm.inference_image_vllm")

_installed = 0
# read at each call, not baked into the closure, so tests/gpu can check both routes in one process
_verify = False
# Triton's split-KV segments a sequence; None: vLLM's own count. Read at each call (a CUDA graph
# keeps the count it was captured with), so the proof's `attention` step can time several in one
# process
_segments: int | None = None


def install(max_tokens: int, verify: bool = False) -> None:
    global _installed, _verify
    if _installed or max_tokens < 1:
        return
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8StaticTensorSym
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import is_quantized_kv_cache
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends import flash_attn
    from vllm.v1.attention.backends.triton_attn import NUM_PAR_SOFTMAX_SEGMENTS
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention
    from vllm.v1.kv_cache_interface import KVQuantMode, get_kv_quant_mode

    impl_cls = flash_attn.FlashAttentionImpl
    fa_forward = impl_cls.forward
    fa_cache_update = impl_cls.do_kv_cache_update
    fp8 = current_platform.fp8_dtype()
    scratch: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def plain(impl: Any) -> bool:
        # what the Triton path covers: decoder self-attention with an FP8-per-tensor or
        # unquantized cache, no sliding window, sinks, ALiBi, cascade or context parallelism
        return (impl.attn_type == AttentionType.DECODER and impl.sinks is None
                and impl.alibi_slopes is None and tuple(impl.sliding_window) == (-1, -1)
                and getattr(impl, "dcp_world_size", 1) == 1
                and get_kv_quant_mode(impl.kv_cache_dtype) in (KVQuantMode.NONE,
                                                               KVQuantMode.FP8_PER_TENSOR))

    def segments(impl: Any, device: torch.device, count: int) -> tuple[
            torch.Tensor, torch.Tensor, torch.Tensor]:
        # Triton's split-KV partials: one set for every layer (they run one after another)
        key = (device, impl.num_heads, impl.head_size, count)
        if key not in scratch:
            pad = 1 << (impl.head_size - 1).bit_length()
            shape = (max_tokens, impl.num_heads, count)
            scratch[key] = (torch.empty((*shape, pad), dtype=torch.float32, device=device),
                            torch.empty(shape, dtype=torch.float32, device=device),
                            torch.empty(shape, dtype=torch.float32, device=device))
        return scratch[key]

    def caches(impl: Any, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # (blocks, heads, slots, 2 x head) -> keys and values (blocks, slots, heads, head), FP8-typed
        # for an FP8 cache: the layout both backends share in vLLM 0.26
        key_cache, value_cache = kv_cache.transpose(1, 2).split(impl.head_size, dim=-1)
        if is_quantized_kv_cache(impl.kv_cache_dtype):
            return key_cache.view(fp8), value_cache.view(fp8)
        return key_cache, value_cache

    def fused_output_quant_supported(self: Any, quant_key: Any) -> bool:
        return quant_key == kFp8StaticTensorSym and plain(self)

    def do_kv_cache_update(self: Any, layer: Any, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if key.shape[0] > max_tokens or not plain(self):
            return fa_cache_update(self, layer, key, value, kv_cache, slot_mapping)
        key_cache, value_cache = caches(self, kv_cache)
        triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
                                       self.kv_cache_dtype, layer._k_scale, layer._v_scale)
        return None

    def forward(self: Any, layer: Any, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: Any,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if attn_metadata is None:  # vLLM's memory-profiling run
            return output.fill_(0)
        n = attn_metadata.num_actual_tokens
        # one query token a sequence, unless _verify: with more (a speculative verify step, or a
        # prompt chunk small enough to fit) vLLM's own call would run Triton's unsplit kernel, one
        # CTA per KV head over the whole context; _verify sends them to the split one
        if n <= max_tokens and (attn_metadata.max_query_len == 1 or _verify) \
                and output_block_scale is None and plain(self) and not attn_metadata.use_cascade:
            key_cache, value_cache = caches(self, kv_cache)
            kv_mode = get_kv_quant_mode(self.kv_cache_dtype)
            qsl = attn_metadata.query_start_loc
            descale = (qsl.shape[0] - 1, key_cache.shape[2])
            count = _segments or NUM_PAR_SOFTMAX_SEGMENTS
            seg_out, seg_max, seg_sum = segments(self, query.device, count)
            unified_attention(
                q=query[:n], k=key_cache, v=value_cache, out=output[:n],
                # vLLM 0.26 reads max_seqlen_q only to pick the 2D kernel (> 1) or the split-KV
                # 3D one; the 3D kernel finds each sequence's query length in cu_seqlens_q
                cu_seqlens_q=qsl, max_seqlen_q=1,
                seqused_k=attn_metadata.seq_lens, max_seqlen_k=attn_metadata.max_seq_len,
                softmax_scale=self.scale, causal=attn_metadata.causal,
                window_size=self.sliding_window, block_table=attn_metadata.block_table,
                softcap=self.logits_soft_cap,
                q_descale=layer._q_scale if (kv_mode == KVQuantMode.FP8_PER_TENSOR
                                             and query.dtype == fp8) else None,
                k_descale=layer._k_scale.expand(descale), v_descale=layer._v_scale.expand(descale),
                seq_threshold_3D=max_tokens, num_par_softmax_segments=count,
                softmax_segm_output=seg_out, softmax_segm_max=seg_max, softmax_segm_expsum=seg_sum,
                output_scale=output_scale, kv_quant_mode=kv_mode,
            )
            return output
        if output_scale is None:
            return fa_forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                              None, output_block_scale)
        # fused output quant on FA3's path: FA3 into bfloat16, then the static FP8 quant
        out = torch.empty(output.shape, dtype=value.dtype, device=output.device)
        fa_forward(self, layer, query, key, value, kv_cache, attn_metadata, out)
        ops.scaled_fp8_quant(out[:n].reshape(n, -1), output_scale, output=output[:n].reshape(n, -1))
        return output

    impl_cls.forward = forward
    impl_cls.do_kv_cache_update = do_kv_cache_update
    impl_cls.fused_output_quant_supported = fused_output_quant_supported
    _installed, _verify = max_tokens, verify
    logger.info(LOG_TRITON_DECODE.format(max_tokens))
    if verify:
        logger.info(LOG_TRITON_VERIFY.format(max_tokens))
