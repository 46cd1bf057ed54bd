"""The one line that says why an instance did not start (cause.failure_cause): what the smoke
suite reports from a unit's journal and the proof's `cannot_start` step from a GPU machine's log.
The logs below are shaped as vLLM 0.26/0.32 writes them (the cpu line as the faults suite found it
in make test; the GPU one with the message vLLM raises for an empty KV cache)."""

from __future__ import annotations

from inference_image.ops.cause import failure_cause


def log(*lines: str) -> str:
    return "\n".join(lines) + "\n"

P = "(EngineCore pid=812) "
CPU = log(
    P + "INFO 11-23 22:47:01 [core.py:98] Initializing a V1 LLM engine (v0.32.0)",
    P + "WARNING 11-23 22:47:02 [cpu.py:120] Memory error-prone setting",
    P + "ERROR 11-23 22:47:09 [core.py:1510] EngineCore failed to start.",
    P + "ERROR 11-23 22:47:09 [core.py:1510] Traceback (most recent call last):",
    P + "ERROR 11-23 22:47:09 [core.py:1510]   File \"/opt/vllm/lib/python3.11/site-packages/vllm/"
        "v1/engine/core.py\", line 1500, in run",
    P + "ERROR 11-23 22:47:09 [core.py:1510] RuntimeError: Worker failed with error 'Available "
        "memory on node 0 (11.03/15.34 GiB) on kv cache allocation is less than requested memory "
        "for kv (1000000.0 GiB).'",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
)

G = "(EngineCore pid=77) "
GPU = log(
    G + "INFO 11-24 10:00:01 [gpu_model_runner.py:3000] Model loading took 8.49 GiB",
    G + "ERROR 11-24 10:00:30 [core.py:1510] ValueError: No available memory for the cache blocks. "
        "Try increasing `gpu_memory_utilization` when initializing the engine.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
)


def test_the_root_cause_beats_the_summary_after_it() -> None:
    assert failure_cause(CPU).startswith("RuntimeError: Worker failed with error 'Available memory")
    assert failure_cause(GPU).startswith("ValueError: No available memory for the cache blocks")


# vLLM 0.26.0 on an H100 with an EAGLE-3 head and a per-batch-size draft schedule
# (docs/decisions.md#no-per-batch-size-draft-length): the
# error names no resource, and multiprocessing prints it again without vLLM's level after the
# engine's own line; then the API server's summary, whose frames are indented.
A = "(APIServer pid=672) "
SCHEDULE = log(
    G + "ERROR 11-24 09:34:58 [core.py:1330]   File \"/tmp/site/vllm/utils/math_utils.py\", line 22",
    G + "ERROR 11-24 09:34:58 [core.py:1330] ZeroDivisionError: integer division or modulo by zero",
    G + "ZeroDivisionError: integer division or modulo by zero",
    A + "    raise RuntimeError(",
    A + "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
)


def test_an_error_that_names_no_resource_still_beats_the_summary() -> None:
    assert failure_cause(SCHEDULE) == "ZeroDivisionError: integer division or modulo by zero"
    summary_only = SCHEDULE.splitlines()[-1]
    assert failure_cause(summary_only).startswith("RuntimeError: Engine core initialization failed")


def test_warnings_frames_and_a_clean_log_say_nothing() -> None:
    assert failure_cause(CPU.splitlines()[1]) is None  # a WARNING that says "error"
    assert failure_cause("INFO ok\n  File \"x.py\", line 1, in f\n") is None
    assert failure_cause("") is None


def test_a_full_disk_from_inference_run_itself() -> None:
    line = ("inference-run: vllm-1: No space left for vLLM's compile cache and temporary files: "
            "64 MiB free in /x/tmp, 256 MiB needed. Free some space or grow the disk")
    assert failure_cause(f"starting\n{line}\n") == line[:300]
