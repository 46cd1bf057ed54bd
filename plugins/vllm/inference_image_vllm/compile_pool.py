"""Inductor's Triton kernels compiled on a pool of worker processes while vLLM compiles a model.

vLLM 0.26 sets TORCHINDUCTOR_COMPILE_THREADS=1 on import (its env_override), so a start with no
matching compile cache builds every kernel Inductor generates one after another in the engine
process, with the machine's other cores idle. Handing Inductor more threads later is not enough:
Inductor uses its pool only once a first job has come back from it, and a pool started at the
first kernel is still importing torch when the last one is built.

So this starts the pool where vLLM begins a compile (its AOT compile of a model, which a start
that loads a compiled model from the cache never reaches): Dynamo's trace of the model takes
longer than the pool takes to come up, and Inductor's kernels then build in parallel. The pool
stops once the worker has compiled, captured and warmed up its model (its workers' exit waited
for on a thread of its own), so a serving engine keeps no compile processes. A start that loads
its compiled model starts no pool.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from . import LOG_COMPILE_POOL, once

logger = logging.getLogger("vllm.inference_image_vllm")

MAX_WORKERS = 32  # Inductor's own ceiling for its pool (torch._inductor.config)


def workers(available: int | None = None) -> int:
    """One worker a CPU this process may run on, at most MAX_WORKERS."""
    n = available if available is not None else len(os.sched_getaffinity(0))
    return max(1, min(MAX_WORKERS, n))


class Pool:
    """Start and stop of Inductor's compile pool, on torch's own calls (passed in: the tests run
    without torch)."""

    def __init__(self, config: Any, async_compile: Any, shutdown: Callable[[], None],
                 n: int) -> None:
        self.config, self.async_compile, self.shutdown, self.n = config, async_compile, shutdown, n
        self.started = False
        self.stopping: threading.Thread | None = None

    def start(self) -> None:
        if self.started or self.n <= 1:
            return
        self.config.compile_threads = self.n
        try:
            # the sidecar comes up now, and the first job makes it fork its workers; Inductor
            # uses the pool once that job is back (AsyncCompile.use_process_pool)
            self.async_compile.warm_pool()
            self.async_compile.use_process_pool()
        except BaseException:
            self.config.compile_threads = 1  # no half-started pool for Inductor to wait on
            raise
        self.started = True
        logger.info(LOG_COMPILE_POOL.format(workers=self.n))

    def stop(self) -> None:
        if not self.started:
            return
        self.config.compile_threads = 1  # vLLM's setting again, for anything compiled later
        self.started = False
        # the workers' exit is waited for beside the engine, not before it serves
        self.stopping = threading.Thread(target=self._shutdown, name="inference-image-compile-pool",
                                         daemon=True)
        self.stopping.start()

    def _shutdown(self) -> None:
        try:
            self.shutdown()
        except Exception:
            logger.exception("inference-image compile pool not stopped")


def wrap_start(fn: Callable[..., Any], pool: Pool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def compile_with_pool(*args: Any, **kwargs: Any) -> Any:
        try:
            pool.start()
        except Exception:
            logger.exception("inference-image compile pool not started; Inductor compiles in "
                             "the engine process")
        return fn(*args, **kwargs)

    return compile_with_pool


def wrap_stop(fn: Callable[..., Any], pool: Pool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def warm_up_then_stop_pool(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            pool.stop()

    return warm_up_then_stop_pool


@once
def install() -> None:
    import torch._inductor.config as inductor_config
    from torch._inductor.async_compile import AsyncCompile, shutdown_compile_workers
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper
    from vllm.v1.worker.gpu_worker import Worker

    pool = Pool(inductor_config, AsyncCompile, shutdown_compile_workers, workers())
    TorchCompileWithNoGuardsWrapper.aot_compile = wrap_start(  # type: ignore[method-assign]
        TorchCompileWithNoGuardsWrapper.aot_compile, pool)
    Worker.compile_or_warm_up_model = wrap_stop(  # type: ignore[method-assign]
        Worker.compile_or_warm_up_model, pool)
