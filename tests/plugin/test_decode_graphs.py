"""The plugin's decode graphs (plugins/vllm/inference_image_vllm/decode_graphs.py) around a CUDA
graph manager that lists, dispatches and captures graphs as vLLM 0.26's Model Runner V2 does
(vllm/v1/worker/gpu/cudagraph_utils.py: _init_candidates, dispatch, and the dummy batch each graph
is captured from, InputBatch.make_dummy). What the graphs do on a GPU is measured by
`inference-lab proof`
(docs/decisions.md#whole-step-graphs-with-decode-graphs-of-their-own-servingcudagraph_mode-h100)."""

from __future__ import annotations

import enum
import sys
from collections import defaultdict
from dataclasses import dataclass

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "plugins/vllm"))
from inference_image_vllm import decode_graphs


class Mode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (2, 0)
    FULL_AND_PIECEWISE = (2, 1)

    def __bool__(self) -> bool:
        return self != Mode.NONE

    def separate_routine(self) -> bool:
        return isinstance(self.value, tuple)

    def decode_mode(self) -> Mode:
        return Mode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> Mode:
        return Mode(self.value[1]) if self.separate_routine() else self


@dataclass(frozen=True)
class Desc:
    cg_mode: Mode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None


# EAGLE-3 with 3 drafted tokens (the h100 profile): capture sizes are multiples of 4
SIZES = [4, 8, 16, 24, 32, 64, 128, 256, 384, 512, 1024, 2048]
QUERY_LEN = 4
MAX_NUM_SEQS = 96  # profiles/h100.yaml


class Manager:
    """vLLM 0.26's CudaGraphManager reduced to one LoRA case and one decode query length."""

    def __init__(self, mode: Mode) -> None:
        self.cudagraph_mode = mode
        self.max_num_reqs = MAX_NUM_SEQS
        self.decode_query_len = QUERY_LEN
        self.candidates: dict[int, list[Desc]] = {}
        self.capture_descs: dict[Mode, list[Desc]] = defaultdict(list)
        self._init_candidates()

    def _init_candidates(self) -> None:
        if not self.cudagraph_mode:
            return
        decode_mode = self.cudagraph_mode.decode_mode()
        mixed_mode = self.cudagraph_mode.mixed_mode()
        by_tokens: dict[int, list[Desc]] = defaultdict(list)
        for n in SIZES:
            if (self.cudagraph_mode.separate_routine() and decode_mode
                    and n <= self.max_num_reqs * self.decode_query_len):
                d = Desc(decode_mode, n, n // self.decode_query_len, self.decode_query_len)
                self.capture_descs[decode_mode].append(d)
                by_tokens[n].append(d)
            if mixed_mode:
                reqs = min(n, self.max_num_reqs) if mixed_mode == Mode.FULL else None
                d = Desc(mixed_mode, n, reqs)
                self.capture_descs[mixed_mode].append(d)
                by_tokens[n].append(d)
        start = 0
        for n in sorted(by_tokens):
            for i in range(start, n + 1):
                self.candidates[i] = by_tokens[n]
            start = n + 1

    def dispatch(self, num_reqs: int, num_tokens: int, uniform: int | None) -> Desc:
        for d in self.candidates.get(num_tokens, []):
            if ((d.uniform_token_count is None or d.uniform_token_count == uniform)
                    and (d.num_reqs is None or d.num_reqs >= num_reqs)):
                return d
        return Desc(Mode.NONE, num_tokens, num_reqs)


def captured_max_query_len(d: Desc) -> int:
    """The longest query in the dummy batch a graph is captured from: make_dummy spreads the
    tokens evenly over the requests and puts the remainder in the last one. FlashAttention 3 picks
    its tile from it, and the graph keeps that tile."""
    reqs = d.num_reqs or min(d.num_tokens, MAX_NUM_SEQS)
    return d.num_tokens // reqs + d.num_tokens % reqs


class Planted(Manager):
    pass


decode_graphs.wrap(Planted, Mode)


def decode_step(m: Manager, reqs: int) -> Desc:
    return m.dispatch(reqs, reqs * QUERY_LEN, QUERY_LEN)


def test_vllms_full_mode_replays_a_decode_step_in_a_graph_captured_for_a_long_query():
    d = decode_step(Manager(Mode.FULL), 64)
    assert (d.cg_mode, d.num_reqs, d.uniform_token_count) == (Mode.FULL, 96, None)
    assert captured_max_query_len(d) == 66  # FA3's 128 x 192 tile


def test_a_decode_step_replays_a_whole_step_graph_captured_for_decode():
    for reqs in (1, 5, 16, 64, 96):
        d = decode_step(Planted(Mode.FULL), reqs)
        assert d.cg_mode == Mode.FULL and d.uniform_token_count == QUERY_LEN
        assert captured_max_query_len(d) == QUERY_LEN


def test_the_decode_graphs_are_the_ones_vllms_default_mode_captures():
    planted = Planted(Mode.FULL).capture_descs[Mode.FULL]
    decode = [d for d in planted if d.uniform_token_count]
    assert decode == Manager(Mode.FULL_AND_PIECEWISE).capture_descs[Mode.FULL]
    assert [d for d in planted if not d.uniform_token_count] == \
        Manager(Mode.FULL).capture_descs[Mode.FULL]


def test_steps_that_read_prompts_keep_whole_step_graphs():
    m = Planted(Mode.FULL)
    # a 512-token prompt beside 64 decoding requests; a prefix-cache hit's 336-token step
    assert m.dispatch(65, 768, None) == Desc(Mode.FULL, 1024, 96)
    assert m.dispatch(1, 336, None) == Desc(Mode.FULL, 384, 96)
    assert m.dispatch(65, 768, None) == Manager(Mode.FULL).dispatch(65, 768, None)


def test_the_mode_is_restored_for_capture_and_replay():
    assert Planted(Mode.FULL).cudagraph_mode is Mode.FULL


@pytest.mark.parametrize("mode", [Mode.FULL_AND_PIECEWISE, Mode.FULL_DECODE_ONLY, Mode.NONE])
def test_other_modes_are_left_to_vllm(mode: Mode):
    planted, plain = Planted(mode), Manager(mode)
    assert (planted.candidates, planted.capture_descs) == (plain.candidates, plain.capture_descs)
