"""FlashAttention 3's ahead-of-time schedule, used only by the layers it was computed for.

vLLM 0.26 computes FA3's scheduler metadata once a step for each KV-cache group, from the target
model's per-GPU heads (its metadata builder reads the model config), and hands it to every layer
of the group. An EAGLE-3 head whose KV heads match the target's joins the target's group, though
its query heads differ: Llama 3.3 70B's head has 48 to the target's 64 (24 and 32 a GPU at TP=2).
FA3 checks the schedule against the call's own heads and splits, and where that head's call would
split its keys otherwise than the target's, the draft's forward raises "scheduler_metadata must
have shape (metadata_size)" and the engine dies: the h100x8 tier's instance with EAGLE-3 at
TP=2 died at its first chat prompt alone, and a probe of prompt lengths found such lengths at
TP=2 and none at TP=1 (docs/decisions.md#a-draft-of-other-heads-gets-fa3s-schedule-of-its-own).
A step replayed from a CUDA graph does not check: it hands the head's call the schedule computed
for the target's heads.

This stamps each metadata with the heads its schedule was computed for, and a FlashAttention layer
of another shape runs without it: FA3 then schedules that call itself, as it does everywhere vLLM
turns the ahead-of-time schedule off (FA2, mixed sliding windows). The target's layers keep theirs.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from . import LOG_DRAFT_SCHEDULE, once

logger = logging.getLogger("vllm.inference_image_vllm")

# the metadata attribute holding (query heads, KV heads, head size) of its schedule
STAMP = "inference_image_schedule_shape"


def wrap(builder: type, impl: type) -> None:
    """Keep `builder`'s (vLLM's FlashAttentionMetadataBuilder) FA3 schedule to the layers of
    `impl` (FlashAttentionImpl) that share its shape."""
    build = builder.build

    def build_stamped(self: Any, *args: Any, **kwargs: Any) -> Any:
        meta = build(self, *args, **kwargs)
        if meta.scheduler_metadata is not None or meta.prefix_scheduler_metadata is not None:
            setattr(meta, STAMP, (self.num_heads_q, self.num_heads_kv, self.headdim))
        return meta

    forward = impl.forward

    def forward_own_schedule(self: Any, layer: Any, query: Any, key: Any, value: Any,
                             kv_cache: Any, attn_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        shape = getattr(attn_metadata, STAMP, None)
        if shape is not None and shape != (self.num_heads, self.num_kv_heads, self.head_size):
            attn_metadata = dataclasses.replace(attn_metadata, scheduler_metadata=None,
                                                prefix_scheduler_metadata=None)
        return forward(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)

    builder.build = build_stamped
    impl.forward = forward_own_schedule


@once
def install() -> None:
    from vllm.v1.attention.backends import flash_attn

    wrap(flash_attn.FlashAttentionMetadataBuilder, flash_attn.FlashAttentionImpl)
    logger.info(LOG_DRAFT_SCHEDULE)
