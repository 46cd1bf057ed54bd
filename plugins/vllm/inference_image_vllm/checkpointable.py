"""INFERENCE_IMAGE_CHECKPOINT=1 (the instance is checkpointed with CRIU: inference_image.startup.
checkpoint): once vLLM's worker sleeps, NVML is shut down in its process. NVML keeps the NVIDIA
control device open from its first init to its last shutdown; CUDA's checkpoint releases only
CUDA's own device files, and CRIU cannot write a device file."""

import ctypes
import functools
import logging
from typing import Any

logger = logging.getLogger("vllm.inference_image_vllm")

LOG_CHECKPOINTABLE = ("inference-image: the worker releases NVML when it sleeps, so CRIU can "
                      "checkpoint it")
NVML = "libnvidia-ml.so.1"
NVML_SUCCESS = 0


def release_nvml(library: str = NVML) -> int:
    """Shut NVML down in this process however many times it was initialised: how many."""
    try:
        lib = ctypes.CDLL(library)
    except OSError:
        return 0
    n = 0
    while n < 1024 and lib.nvmlShutdown() == NVML_SUCCESS:
        n += 1
    return n


def install() -> None:
    from vllm.v1.worker import gpu_worker

    original = gpu_worker.Worker.sleep

    @functools.wraps(original)
    def sleep(self: Any, level: int = 1) -> None:
        original(self, level)
        logger.info("inference-image: NVML released after sleep (%d init(s) undone)",
                    release_nvml())

    gpu_worker.Worker.sleep = sleep
    logger.info(LOG_CHECKPOINTABLE)
