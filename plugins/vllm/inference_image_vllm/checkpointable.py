"""INFERENCE_IMAGE_CHECKPOINT=1 (the instance is checkpointed with CRIU: inference_image.startup.
checkpoint): once vLLM's worker sleeps, torch's cached but unused GPU blocks go back to the
driver, so CUDA's checkpoint copies into host memory, and CRIU into the images, only what the
engine still holds (graphs, buffers) besides the weights sleep mode keeps."""

import functools
import gc
import logging
from typing import Any

logger = logging.getLogger("vllm.inference_image_vllm")

LOG_CHECKPOINTABLE = ("inference-image: the worker empties torch's GPU cache when it sleeps, so "
                      "a checkpoint holds only what it uses")


def release_cached() -> int:
    """Return torch's cached, unused GPU blocks to the driver: the bytes released (0 without a
    GPU)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    gc.collect()
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return max(0, before - torch.cuda.memory_reserved())


def install() -> None:
    from vllm.v1.worker import gpu_worker

    original = gpu_worker.Worker.sleep

    @functools.wraps(original)
    def sleep(self: Any, level: int = 1) -> None:
        original(self, level)
        logger.info("inference-image: %.2f GiB of torch's GPU cache released after sleep",
                    release_cached() / 2**30)

    gpu_worker.Worker.sleep = sleep
    logger.info(LOG_CHECKPOINTABLE)
