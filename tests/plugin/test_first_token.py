"""The plugin's early-first-token rule (plugins/vllm/inference_image_vllm/first_token.py) around an
engine that steps as vLLM 0.26's EngineCore.step_with_batch_queue does: two steps in flight, the
next one launched before the last one's output is read. Its effect on a GPU is measured by
`inference-lab proof` (docs/benchmarks.md)."""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from conftest import ROOT

sys.path.insert(0, str(ROOT / "plugins/vllm"))
from inference_image_vllm import first_token


@dataclass
class Request:
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    num_output_tokens: int = 0


class Scheduler:
    """Schedules every request each step: a prefill chunk of at most `chunk` tokens, or one decode
    token; advances num_computed_tokens when it schedules, as vLLM's does."""

    def __init__(self, chunk: int = 2048) -> None:
        self.chunk = chunk
        self.requests: dict[str, Request] = {}

    def has_requests(self) -> bool:
        return bool(self.requests)

    def schedule(self) -> SimpleNamespace:
        scheduled = {}
        for rid, r in self.requests.items():
            left = r.num_prompt_tokens - r.num_computed_tokens
            scheduled[rid] = min(self.chunk, left) if left > 0 else 1
            r.num_computed_tokens += scheduled[rid]
        # the requests that get a token from this step: their prompt read once it runs
        finishes = {rid for rid, r in self.requests.items()
                    if r.num_computed_tokens >= r.num_prompt_tokens}
        return SimpleNamespace(num_scheduled_tokens=scheduled, finishes=finishes)

    def update_from_output(self, out: SimpleNamespace) -> dict[str, int]:
        """Each request whose prompt was read once the step ran gets a token: {request: its
        token count}."""
        tokens = {}
        for rid in out.num_scheduled_tokens:
            r = self.requests[rid]
            if rid in out.finishes:
                r.num_output_tokens += 1
                tokens[rid] = r.num_output_tokens
        return tokens


class Engine:
    """vLLM 0.26's step_with_batch_queue reduced to its order: schedule and launch a step while the
    queue has room and there is something to schedule (returning None), else block on the oldest
    step in flight and return its output."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.batch_queue: deque[tuple[Any, SimpleNamespace, Any]] = deque(maxlen=2)
        self.launched: list[dict[str, int]] = []

    def step_with_batch_queue(self) -> tuple[Any, bool]:
        executed = False
        if self.scheduler.has_requests():
            out = self.scheduler.schedule()
            executed = sum(out.num_scheduled_tokens.values()) > 0
            self.launched.append(dict(out.num_scheduled_tokens))
            self.batch_queue.appendleft((None, out, None))
            if len(self.batch_queue) < 2 and executed:
                return None, executed
        elif not self.batch_queue:
            return None, False
        _, out, _ = self.batch_queue.pop()
        return self.scheduler.update_from_output(out), executed


class Ruled(Engine):
    step_with_batch_queue = first_token.wrap(Engine.step_with_batch_queue)


def test_vllms_order_launches_the_next_step_before_the_first_token_is_read():
    """The fake keeps vLLM's order (what the rule exists for): a lone prompt's first token comes
    back only after the step after it was launched."""
    e = Engine(Scheduler())
    e.scheduler.requests["a"] = Request(512)
    assert e.step_with_batch_queue() == (None, True)
    assert e.step_with_batch_queue() == ({"a": 1}, True)
    assert e.launched == [{"a": 512}, {"a": 1}]


def test_a_lone_prompt_gets_its_first_token_before_the_next_step_is_launched():
    e = Ruled(Scheduler())
    e.scheduler.requests["a"] = Request(512)
    assert e.step_with_batch_queue() == (None, True)  # launched; the queue has room
    assert e.step_with_batch_queue() == ({"a": 1}, True)
    assert e.launched == [{"a": 512}] and not e.batch_queue
    assert "has_requests" not in vars(e.scheduler)  # vLLM's method again
    # the request decodes from here on in vLLM's order: two steps in flight
    assert e.step_with_batch_queue() == (None, True)
    assert e.step_with_batch_queue() == ({"a": 2}, True)
    assert len(e.batch_queue) == 1


def test_prompts_arriving_together_get_their_first_tokens_from_the_step_that_finishes_them():
    e = Ruled(Scheduler())
    e.scheduler.requests.update(a=Request(512), b=Request(300))
    e.step_with_batch_queue()
    assert e.step_with_batch_queue() == ({"a": 1, "b": 1}, True)
    assert len(e.launched) == 1


def test_a_step_with_a_decoding_request_keeps_vllms_order():
    """A newcomer beside a running request: the step carries decode work, so nothing waits."""
    e = Ruled(Scheduler())
    e.scheduler.requests.update(a=Request(512, num_computed_tokens=600, num_output_tokens=88),
                                b=Request(512))
    assert e.step_with_batch_queue() == (None, True)
    # vLLM's order: the next step launched before the newcomer's first token is read
    assert e.step_with_batch_queue() == ({"a": 89, "b": 1}, True)
    assert len(e.launched) == 2


def test_a_prefill_chunk_that_leaves_its_prompt_unfinished_is_not_waited_for():
    """A prompt longer than a step: its first chunk is not waited for, its last chunk is."""
    e = Ruled(Scheduler(chunk=2048))
    e.scheduler.requests["a"] = Request(4096)
    assert e.step_with_batch_queue() == (None, True)  # 2048 of 4096 launched
    # vLLM launches the second chunk while the first is in flight, then reads the first (no token)
    assert e.step_with_batch_queue() == ({}, True)
    assert e.step_with_batch_queue() == ({"a": 1}, True)  # the last chunk, read before a decode
    assert e.launched == [{"a": 2048}, {"a": 2048}] and not e.batch_queue


def test_a_request_the_scheduler_no_longer_holds_is_not_taken_for_a_prompt():
    assert not first_token.first_tokens_only(["gone"], {})
    assert not first_token.first_tokens_only([], {})  # nothing finishes a prompt
