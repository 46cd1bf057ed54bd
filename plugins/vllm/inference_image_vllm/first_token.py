"""A step that only prefills hands back its first tokens before the next step is launched.

With async scheduling vLLM's engine core keeps two steps in flight: it launches step N+1 before it
reads step N's output, so that the GPU never waits for the host. For the step that finishes a
prompt, that order puts the host's launch of the next step (scheduling, input preparation, the
target's graph, and with a draft the sampler and the proposer's passes) between the GPU finishing
the first token and the server sending it, wherever that launch is not over by the time the
prefill is (docs/decisions.md, "The first token before the next step's launch").

This rule changes that order for one kind of step only: one where every request is still reading
its prompt and at least one finishes it (at c=1, every request's first step, or the last chunk of a
prompt longer than a step). When such a step is the only one in flight, the engine core waits for
it, hands its first tokens to the API server, and launches the next step after. The price is a GPU
pause of one launch after such a step: once a request at c=1, and at higher concurrency only where
no request is decoding (the first step of a burst). A step that also carries decoding requests
keeps vLLM's order, so a running batch never pauses for a newcomer.

The rule reuses vLLM's own code for the wait: it runs vLLM's step again with the scheduler
reporting nothing to schedule, which makes vLLM block on the step in flight and process its
output exactly as it would have one call later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from . import LOG_EARLY_FIRST_TOKEN, once

logger = logging.getLogger("vllm.inference_image_vllm")

Step = Callable[[Any], tuple[Any, bool]]


class PromptState(Protocol):
    """What the rule reads of a vLLM Request, after the scheduler advanced it for the step."""

    num_output_tokens: int
    num_prompt_tokens: int
    num_computed_tokens: int


def first_tokens_only(scheduled: Iterable[str], requests: Mapping[str, PromptState]) -> bool:
    """True where every scheduled request has produced no token yet and at least one has its whole
    prompt computed once the step runs (vLLM advances num_computed_tokens when it schedules)."""
    finishes = False
    for req_id in scheduled:
        r = requests.get(req_id)
        if r is None or r.num_output_tokens:
            return False
        finishes = finishes or r.num_computed_tokens >= r.num_prompt_tokens
    return finishes


def wrap(step: Step) -> Step:
    """vLLM's EngineCore.step_with_batch_queue with the rule in front of it."""

    def step_with_batch_queue(self: Any) -> tuple[Any, bool]:
        queue = self.batch_queue
        scheduler = self.scheduler
        # One step in flight and nothing decoding in it: the pipeline had drained, so no running
        # request waits behind this one. (Two in flight: vLLM reads the older one itself.)
        if queue is None or len(queue) != 1 or not first_tokens_only(
                queue[0][1].num_scheduled_tokens, scheduler.requests):
            return step(self)
        # vLLM's own wait and output processing: nothing to schedule, so its step blocks on the
        # step in flight (an instance attribute shadows the method for this one call)
        scheduler.has_requests = lambda: False
        try:
            outputs, _ = step(self)
        finally:
            del scheduler.has_requests
        # a model step did run for these outputs; "nothing executed" would make vLLM's busy loop
        # sleep 1 ms before the next step while requests remain
        return outputs, True

    return step_with_batch_queue


@once
def install() -> None:
    from vllm.v1.engine.core import EngineCore

    # EngineCore.__init__ loads the plugins before it binds step_fn, so its instances take this
    EngineCore.step_with_batch_queue = wrap(EngineCore.step_with_batch_queue)
    logger.info(LOG_EARLY_FIRST_TOKEN)
