"""`inference-lab spy`: the engine core's main thread in py-spy's raw samples of one start
(src/inference_lab/spy.py), on lines of the form py-spy 0.4 writes with --subprocesses --threads
(the samples of docs/decisions.md#ready-time's evidence)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from inference_lab import spy
from inference_lab.cli import main

API = 'process 10:"";process 11:"/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server"'
ENGINE = f'{API};process 12:"VLLM::EngineCore"'
RUN = ("BaseProcess.run (multiprocessing/process.py:108);EngineCoreProc.run_engine_core "
       "(vllm/v1/engine/core.py:1100)")
LINES = [
    # the engine core's main thread: Dynamo and Inductor, a Triton compile inside the warm-up
    f"{ENGINE};thread (12): MainThread;{RUN};aot_compile_fullgraph (torch/_dynamo/aot_compile.py:"
    "90);compile_fx (torch/_inductor/compile_fx.py:2400) 80\n",
    f"{ENGINE};thread (12): MainThread;{RUN};warmup_kernels (vllm/v1/worker/gpu/warmup.py:300);"
    "compile (triton/compiler/compiler.py:300);CUDABackend.make_cubin (triton/backends/nvidia/"
    "compiler.py:494) 40\n",
    f"{ENGINE};thread (12): MainThread;{RUN};warmup_kernels (vllm/v1/worker/gpu/warmup.py:300);"
    "CompiledKernel._init_handles (triton/compiler/compiler.py:452);CudaLauncher.__init__ "
    "(triton/backends/nvidia/driver.py:683) 20\n",
    # another thread of the engine, and the API server's main thread: not counted
    f"{ENGINE};thread (99): Thread-3;{RUN};Condition.wait (threading.py:355) 400\n",
    f"{API};thread (11): MainThread;run_server (vllm/entrypoints/openai/api_server.py:700) 400\n",
]


def test_the_engine_cores_main_thread_by_part() -> None:
    d = spy.engine_parts(LINES, rate=40)
    assert d["pid"] == 12 and d["sampled_s"] == 3.5
    parts = d["parts_s"]
    assert parts["dynamo_and_inductor"] == 2.0 and parts["inductor"] == 2.0
    assert parts["warmup"] == 1.5 and parts["triton_compile"] == 1.0 and parts["ptxas"] == 1.0
    assert parts["triton_launcher"] == 0.5 and parts["graph_capture"] == 0.0


def test_samples_of_no_single_start_are_refused(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"0 processes run EngineCoreProc\.run_engine_core"):
        spy.engine_parts(LINES[-1:], rate=40)
    two = [line.replace("process 12", "process 13").replace("thread (12)", "thread (13)")
           for line in LINES[:1]]
    with pytest.raises(ValueError, match="2 processes run"):
        spy.engine_parts([*LINES, *two], rate=40)
    f = tmp_path / "start.txt.gz"
    with gzip.open(f, "wt") as out:
        out.writelines(LINES)
    assert main(["spy", str(f), "--rate", "40"]) == 0
    assert json.loads(capsys.readouterr().out)["parts_s"]["warmup"] == 1.5
    # the command says what is wrong in one line, no traceback
    plain = tmp_path / "api-server-only.txt"
    plain.write_text(LINES[-1])
    assert main(["spy", str(plain)]) == 1
    assert "0 processes run EngineCoreProc.run_engine_core" in capsys.readouterr().err
    assert main(["spy", str(tmp_path / "none.txt")]) == 1
    assert "none.txt" in capsys.readouterr().err
