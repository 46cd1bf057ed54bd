"""Whole-step CUDA graphs for steps that read prompts, and decode steps keep graphs of their own.

vLLM 0.26 offers two ways to graph a model with FlashAttention 3 that matter here:
- FULL_AND_PIECEWISE (its default): a uniform decode step (every request reads 1 + k tokens) replays
  a whole-step graph captured for that many requests; a step that reads a prompt runs graphs split
  at each attention call, and the host runs attention in Python between them, layer by layer. On
  the h100 profile that host time is longer than the GPU's work for a prefix-cache hit, and for a
  512-token prompt joining 64 decoding streams.
- FULL: every step up to the capture size replays one whole-step graph, which ends that wait,
  but it has one routine for every step: a decode step
  replays the mixed-batch graph of its token count, captured for min(tokens, max_num_seqs)
  requests with the remainder in the last one. On the h100 profile a 64-request decode step (256
  tokens) replays a graph captured with 96 requests, one of them 66 tokens long, and FlashAttention
  3 baked its large-query tile (128 x 192, three warp groups) into it instead of the decode tile
  (64 x 96), and decode steps grew slower (docs/decisions.md, "Whole-step graphs, with decode
  graphs of their own").

This keeps FULL and adds FULL_AND_PIECEWISE's decode graphs beside its mixed ones, in vLLM's Model
Runner V2 (the runner vLLM 0.26 picks for the dense models of the FA3 tiers): its CUDA graph
manager builds its candidate graphs from the mode, and is handed FULL as a mode with a decode
routine of its own, so it lists a whole-step graph for each uniform decode shape (exactly as it
does for FULL_AND_PIECEWISE) ahead of the mixed one of the same token count. Its dispatcher picks
the first compatible candidate, and its capture builds each graph from its own descriptor, so a
decode step replays a graph captured for decode. vLLM's V1 runner (which vLLM picks where V2 does
not support a feature) keeps its own FULL dispatch.
"""

from __future__ import annotations

import logging
from typing import Any

from . import LOG_DECODE_GRAPHS, once

logger = logging.getLogger("vllm.inference_image_vllm")


class FullWithDecodeRoutine:
    """vLLM's FULL as its graph manager reads a mode while listing candidates: separate routines,
    both FULL."""

    def __init__(self, full: Any) -> None:
        self.full = full

    def __bool__(self) -> bool:
        return True

    def separate_routine(self) -> bool:
        return True

    def decode_mode(self) -> Any:
        return self.full

    def mixed_mode(self) -> Any:
        return self.full


def wrap(manager: type, mode: Any) -> None:
    """Give `manager` (vLLM's v1.worker.gpu CudaGraphManager) decode graphs where its mode is FULL.
    `mode` is vLLM's CUDAGraphMode."""
    init_candidates = manager._init_candidates

    def _init_candidates(self: Any) -> None:
        own = self.cudagraph_mode
        if own != mode.FULL:
            return init_candidates(self)
        # only while the candidates are listed: capture and replay read the real mode
        self.cudagraph_mode = FullWithDecodeRoutine(mode.FULL)
        try:
            return init_candidates(self)
        finally:
            self.cudagraph_mode = own

    manager._init_candidates = _init_candidates


@once
def install() -> None:
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    wrap(CudaGraphManager, CUDAGraphMode)
    logger.info(LOG_DECODE_GRAPHS)
