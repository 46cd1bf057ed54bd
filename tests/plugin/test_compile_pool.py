"""The plugin's compile pool (plugins/vllm/inference_image_vllm/compile_pool.py): when it starts
and stops Inductor's pool around vLLM's compile, on stand-ins with the calls torch 2.11 offers
(torch._inductor.config, AsyncCompile, shutdown_compile_workers). What it saves on a GPU is
measured by `inference-lab proof step ready` (docs/benchmarks.md)."""

from __future__ import annotations

import os
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "plugins/vllm"))
from inference_image_vllm import compile_pool


class AsyncCompile:
    """torch's AsyncCompile as the pool calls it: warm_pool starts the sidecar, use_process_pool
    submits the first job."""

    def __init__(self, calls: list[str], config: Any) -> None:
        self.calls, self.config = calls, config

    def warm_pool(self) -> None:
        self.calls.append(f"warm_pool threads={self.config.compile_threads}")

    def use_process_pool(self) -> bool:
        self.calls.append("use_process_pool")
        return False


def pool(n: int) -> tuple[compile_pool.Pool, list[str], Any]:
    calls: list[str] = []
    config = SimpleNamespace(compile_threads=1)  # as vLLM's env_override leaves it
    return (compile_pool.Pool(config, AsyncCompile(calls, config),
                              lambda: calls.append("shutdown"), n), calls, config)


def test_workers_are_one_a_cpu_up_to_inductors_ceiling() -> None:
    assert compile_pool.workers(16) == 16
    assert compile_pool.workers(192) == compile_pool.MAX_WORKERS
    assert compile_pool.workers(0) == 1
    # with no count given: this process's CPUs
    assert compile_pool.workers() == compile_pool.workers(len(os.sched_getaffinity(0)))


def test_the_pool_starts_where_vllm_compiles_and_stops_after_the_warm_up() -> None:
    p, calls, config = pool(16)
    events: list[str] = []
    compile_model = compile_pool.wrap_start(lambda: events.append("aot_compile") or "graph", p)
    warm_up = compile_pool.wrap_stop(lambda: events.append("warm_up") or "times", p)
    # the backbone and then the EAGLE-3 head compile: one pool, started before the first trace
    assert compile_model() == "graph" and compile_model() == "graph"
    assert calls == ["warm_pool threads=16", "use_process_pool"]
    assert config.compile_threads == 16
    assert warm_up() == "times"
    assert config.compile_threads == 1 and p.stopping is not None
    p.stopping.join(5)
    assert calls[-1] == "shutdown"
    assert events == ["aot_compile", "aot_compile", "warm_up"]
    # a later compile in the same process (none in vLLM 0.26's serving) starts it again
    compile_model()
    assert calls[-2:] == ["warm_pool threads=16", "use_process_pool"]


def test_a_start_that_loads_its_compiled_model_starts_no_pool() -> None:
    p, calls, _ = pool(16)
    compile_pool.wrap_stop(lambda: None, p)()
    assert calls == []


def test_one_cpu_compiles_in_the_engine_process_as_vllm_does() -> None:
    p, calls, config = pool(1)
    compile_pool.wrap_start(lambda: None, p)()
    compile_pool.wrap_stop(lambda: None, p)()
    assert calls == [] and config.compile_threads == 1


def test_the_pool_stops_when_the_warm_up_fails_and_the_failure_stands() -> None:
    p, calls, _ = pool(8)
    compile_pool.wrap_start(lambda: None, p)()

    def warm_up() -> None:
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        compile_pool.wrap_stop(warm_up, p)()
    assert p.stopping is not None
    p.stopping.join(5)
    assert calls[-1] == "shutdown"


def test_the_pool_stops_beside_the_engine_and_a_failed_stop_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """The workers' exit is waited for on a thread of its own: the warm-up returns while it
    runs; a shutdown that raises is logged, never raised into the engine."""
    release = threading.Event()
    calls: list[str] = []
    config = SimpleNamespace(compile_threads=1)

    def slow_shutdown() -> None:
        release.wait(5)
        raise OSError("sidecar gone")

    p = compile_pool.Pool(config, AsyncCompile(calls, config), slow_shutdown, 4)
    compile_pool.wrap_start(lambda: None, p)()
    assert compile_pool.wrap_stop(lambda: "times", p)() == "times"
    assert p.stopping is not None and p.stopping.is_alive()
    release.set()
    p.stopping.join(5)
    assert "compile pool not stopped" in caplog.text


def test_a_pool_that_cannot_start_leaves_the_compile_to_the_engine_process(
        caplog: pytest.LogCaptureFixture) -> None:
    p, calls, config = pool(8)

    def broken() -> None:
        raise OSError("fork: Resource temporarily unavailable")

    p.async_compile.warm_pool = broken
    assert compile_pool.wrap_start(lambda: "graph", p)() == "graph"
    assert "compile pool not started" in caplog.text and config.compile_threads == 1
    compile_pool.wrap_stop(lambda: None, p)()
    assert "shutdown" not in calls
