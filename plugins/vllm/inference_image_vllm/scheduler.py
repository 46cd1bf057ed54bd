"""No speculative step for a request its step in flight may already have finished.

With async scheduling, vLLM's scheduler plans step N+1 while step N runs, before it knows how many
of step N's draft tokens are accepted. It skips a request only when step N is *sure* to reach
the request's max_tokens, even if every draft is rejected; otherwise it schedules one more
speculative step (1 + k tokens). When step N did accept enough, that step runs for a request
that has ended: at concurrency 1 a GPU step of nothing, and the client's next request, sent on
the last token, waits behind it (the proof measured the first token of a request sent at once
after a 512-token answer; docs/benchmarks.md, run 15).

Without speculation the scheduler knows step N's output exactly and never plans that step, so
this is the one place where speculation cost a closed-loop client its time to first token.

The rule added: a request that step N *may* finish (all its drafts accepted would reach
max_tokens) waits for step N's output before it is scheduled again. It costs such a request's
next step the overlap of host and GPU work (one step's scheduling in the open), and only at
its end. A request that ends on a stop token is not helped: nothing knows beforehand.

How: for the length of one `schedule()` call, each such request's max_tokens is lowered to the
value at which vLLM's own skip ("the previous step has reached request.max_tokens") applies to
it, and restored after. The request stays in the running list, counts against max_num_seqs and
keeps its blocks, exactly as vLLM's own skip leaves it.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

logger = logging.getLogger("vllm.inference_image_vllm")

# vLLM's own skip, the condition this relies on (vllm/v1/core/sched/scheduler.py): if a vLLM
# version drops it, the patch must not install.
BUILTIN_SKIP = "request.num_computed_tokens + 2 - request.num_output_placeholders"


def may_end_in_flight(req: Any) -> bool:
    """Step N is in flight for req and, with every draft accepted, reaches max_tokens."""
    return (req.num_output_placeholders > 0
            and req.num_output_tokens + req.num_output_placeholders >= req.max_tokens)


def skip_value(req: Any) -> int:
    """The max_tokens at which vLLM's own skip holds for req (its condition with equality)."""
    return req.num_computed_tokens + 2 - req.num_output_placeholders - req.num_prompt_tokens


def hold(running: list[Any]) -> list[tuple[Any, int]]:
    held = []
    for req in running:
        if may_end_in_flight(req):
            held.append((req, req.max_tokens))
            req.max_tokens = skip_value(req)
    return held


def release(held: list[tuple[Any, int]]) -> None:
    for req, max_tokens in held:
        req.max_tokens = max_tokens


def patch(cls: type) -> bool:
    """Wrap cls.schedule; False (and nothing changed) where vLLM's skip is not there."""
    if getattr(cls.schedule, "_inference_image", False):
        return True
    if BUILTIN_SKIP not in inspect.getsource(cls.schedule):
        return False
    original = cls.schedule

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.num_spec_tokens:
            return original(self, *args, **kwargs)
        held = hold(self.running)
        try:
            return original(self, *args, **kwargs)
        finally:
            release(held)

    schedule._inference_image = True  # type: ignore[attr-defined]
    cls.schedule = schedule
    return True


def install() -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    if patch(AsyncScheduler):
        logger.info("inference-image: no speculative step for a request its step in flight may "
                    "have ended (max_tokens)")
    else:
        logger.warning("inference-image: this vLLM's scheduler has no max_tokens skip to extend; "
                       "speculative steps past max_tokens stay as vLLM plans them")
