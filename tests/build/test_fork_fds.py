"""The lab's fork probe (lab/inference_lab/fork_fds.py): how it reads a process's NVIDIA device
files, what its table says, and its refusal where there is no GPU. Its scenarios run on the GPU
machine (docs/gpu-machine.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inference_lab import fork_fds


def test_a_process_s_nvidia_device_files_are_read_from_its_fd_links(tmp_path: Path) -> None:
    fds = tmp_path / "42" / "fd"
    fds.mkdir(parents=True)
    for fd, target in ((0, "/dev/null"), (11, "/dev/nvidia0"), (3, "/dev/nvidiactl"),
                       (7, "/dev/nvidia-caps/nvidia-cap1"), (9, "socket:[123]")):
        os.symlink(target, fds / str(fd))
    assert fork_fds.nvidia_files(42, proc=tmp_path) == [
        "3:/dev/nvidiactl", "7:/dev/nvidia-caps/nvidia-cap1", "11:/dev/nvidia0"]


def test_this_process_holds_no_nvidia_file_on_a_machine_without_one() -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("a GPU machine")
    assert fork_fds.nvidia_files() == []


def test_the_table_counts_files_and_names_what_the_checkpoint_left() -> None:
    rows = [{"scenario": "nvml-kept", "parent": ["3:/dev/nvidiactl"], "inherited": ["3:/dev/nvidiactl"],
             "after_checkpoint": ["3:/dev/nvidiactl"], "memory_back": True},
            {"scenario": "nvml-shutdown", "parent": [], "inherited": [], "after_checkpoint": [],
             "memory_back": True},
            {"scenario": "vllm-api", "error": "no CUDA child (exit 1): ImportError"}]
    lines = fork_fds.table(rows).splitlines()
    assert lines[2] == "| nvml-kept | 1 | 1 | 3:/dev/nvidiactl | True |  |  |"
    assert lines[3] == "| nvml-shutdown | 0 | 0 | 0 | True |  |  |"
    assert lines[4] == "| vllm-api | - | - | - | - | no CUDA child (exit 1): ImportError |  |"


def test_without_a_gpu_it_says_where_it_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("a GPU machine")
    assert fork_fds.main(["--out", str(tmp_path / "f.json")]) == 2
    assert "runs on the GPU machine" in capsys.readouterr().err
    assert not (tmp_path / "f.json").exists()


def test_a_scenario_whose_parent_cannot_fork_a_cuda_child_says_why() -> None:
    """The parent's own program runs here as it does there (compiled, its imports found); with no
    NVIDIA driver it ends before any child, and the row carries its last words."""
    import sys

    compile(fork_fds.PARENT, "fork_fds.PARENT", "exec")
    if Path("/dev/nvidiactl").exists():
        pytest.skip("a GPU machine")
    row = fork_fds.run_scenario("nvml-shutdown", sys.executable, wait_s=60)
    assert row["scenario"] == "nvml-shutdown"
    assert row["error"].startswith("no CUDA child (exit 1): ")
    assert "Error" in row["error"] and "pid" not in row


def test_a_released_parent_s_row_says_its_shutdowns_files_and_second_answer() -> None:
    row = {"scenario": "vllm-api-released", "parent": ["3:/dev/nvidiactl"], "inherited": [],
           "after_checkpoint": [], "memory_back": True, "released": [2], "parent_at_fork": [],
           "parent_asks_again": "NVIDIA H200"}
    assert fork_fds.table([row]).splitlines()[2] == (
        "| vllm-api-released | 1 | 0 | 0 | True |  | 2 shutdowns, 0 files, asks again: NVIDIA H200 |")


def test_releasing_nvml_where_there_is_none_does_nothing() -> None:
    """No NVIDIA library (this build host): nothing to shut down, and no error for a fork that
    asks; with the library but nothing initialised, NVML refuses the first shutdown."""
    assert fork_fds.release_nvml("libnvidia-ml-not-here.so.1") == 0
    if not Path("/dev/nvidiactl").exists():
        assert fork_fds.release_nvml() == 0
