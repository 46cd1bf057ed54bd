"""The plugin's draft schedule (plugins/vllm/inference_image_vllm/schedule.py) around a metadata
builder and an attention class shaped as vLLM 0.26's FlashAttention backend has them: the builder
computes FA3's schedule from the target's heads, and FA3 rejects a schedule of other heads, as
its `scheduler_metadata must have shape (metadata_size)` check does where the two would split
otherwise. On vLLM's own classes and kernels: tests/gpu/test_schedule_gpu.py."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "plugins/vllm"))
from inference_image_vllm import schedule

TARGET, DRAFT = (32, 4, 128), (24, 4, 128)  # Llama 3.3 70B and its EAGLE-3 head at TP=2


@dataclass
class Meta:
    num_actual_tokens: int
    scheduler_metadata: tuple[int, int, int] | None = None
    prefix_scheduler_metadata: tuple[int, int, int] | None = None


class Builder:
    """One builder a KV-cache group, its heads read from the target's config."""

    def __init__(self, aot: bool = True) -> None:
        self.num_heads_q, self.num_heads_kv, self.headdim = TARGET
        self.aot = aot

    def build(self, common_prefix_len: int, tokens: int) -> Meta:
        shape = (self.num_heads_q, self.num_heads_kv, self.headdim) if self.aot else None
        return Meta(tokens, shape, shape if common_prefix_len else None)


class Impl:
    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.num_heads, self.num_kv_heads, self.head_size = shape
        self.calls: list[Meta] = []

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None):
        if attn_metadata is None:  # vLLM's profiling run
            self.calls.append(None)
            return output
        own = (self.num_heads, self.num_kv_heads, self.head_size)
        for sched in (attn_metadata.scheduler_metadata, attn_metadata.prefix_scheduler_metadata):
            if sched is not None and sched != own:
                raise RuntimeError("scheduler_metadata must have shape (metadata_size)")
        self.calls.append(attn_metadata)
        return output


@pytest.fixture
def classes():
    builder = type("B", (Builder,), {})
    impl = type("I", (Impl,), {})
    return builder, impl


def test_unwrapped_a_draft_of_other_heads_is_refused_the_targets_schedule(classes):
    builder, impl = classes
    meta = builder().build(0, 528)
    with pytest.raises(RuntimeError, match="scheduler_metadata"):
        impl(DRAFT).forward(None, None, None, None, None, meta, "out")


@pytest.mark.parametrize("prefix", [0, 64], ids=["plain", "cascade"])
def test_the_draft_runs_without_the_schedule_and_the_target_keeps_it(classes, prefix):
    builder, impl = classes
    schedule.wrap(builder, impl)
    meta = builder().build(prefix, 528)
    target, draft = impl(TARGET), impl(DRAFT)
    assert target.forward(None, "q", "k", "v", "cache", meta, "out") == "out"
    assert draft.forward(None, "q", "k", "v", "cache", meta, "out", output_scale=None) == "out"
    assert target.calls == [meta] and target.calls[0] is meta  # the step's own metadata
    (seen,) = draft.calls
    assert seen.scheduler_metadata is None and seen.prefix_scheduler_metadata is None
    assert seen.num_actual_tokens == 528  # everything else as built
    # the target's layers after the draft's still see the schedule (the draft got a copy)
    assert meta.scheduler_metadata == TARGET
    assert (meta.prefix_scheduler_metadata == TARGET) == bool(prefix)


def test_a_step_without_a_schedule_is_passed_through(classes):
    """No ahead-of-time schedule (FA2, or vLLM turned it off): nothing to stamp or drop."""
    builder, impl = classes
    schedule.wrap(builder, impl)
    meta = builder(aot=False).build(0, 16)
    assert not hasattr(meta, schedule.STAMP)
    draft = impl(DRAFT)
    draft.forward(None, None, None, None, None, meta, "out")
    assert draft.calls[0] is meta


def test_a_profiling_step_has_no_metadata(classes):
    builder, impl = classes
    schedule.wrap(builder, impl)
    draft = impl(DRAFT)
    assert draft.forward(None, None, None, None, None, None, "out") == "out"
    assert draft.calls == [None]
