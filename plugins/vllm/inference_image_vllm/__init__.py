"""vLLM plugin of inference-image (entry point `vllm.general_plugins`).

vLLM loads it in every process it starts (API server, engine core, workers). It does nothing
unless INFERENCE_IMAGE_FP8_DISPATCH=1, which the rendered unit environment sets for profiles with
`serving.fp8_gemm_dispatch: true`; then FP8 linear layers with per-tensor scales run, per batch
size, whichever of Cutlass and cuBLASLt a measured table says is faster (dispatch.py).
"""

import logging
import os

logger = logging.getLogger("vllm.inference_image_vllm")  # under vLLM's configured logger


def enabled() -> bool:
    return os.environ.get("INFERENCE_IMAGE_FP8_DISPATCH", "0") == "1"


def register() -> None:
    if not enabled():
        return
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            return
        from . import vllm_kernel

        vllm_kernel.install()
    except Exception:  # the server must still start, on vLLM's own kernels
        logger.exception("inference-image FP8 dispatch not installed; vLLM's kernels serve")
