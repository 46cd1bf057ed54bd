"""Which NVIDIA device files a forked CUDA process keeps through CUDA's checkpoint, by what its
parent did before the fork: the question behind `serving.engine_process: fork` and
`serving.checkpoint` excluding each other
(docs/decisions.md#checkpoint-and-restore-criu-with-cudas-checkpoint-api).

CUDA's checkpoint releases every GPU reference a process's CUDA context holds; a device file the
process got otherwise (inherited from a parent that opened it, through NVML) stays open, and CRIU
cannot write it. vLLM's API server asks the GPU's name and capability through NVML and then forks
its engine core where the render says fork. For each scenario a fresh parent process does what
the scenario names, forks, and the child makes a CUDA context holding memory; from outside, this
process locks and checkpoints the child through the driver (the runtime's own calls), lists the
child's NVIDIA device files then, restores and unlocks it, and the child checks its memory came
back. Scenarios:

- `plain`: the parent did nothing of the GPU's (the baseline);
- `nvml-kept`: the parent initialised NVML and kept it;
- `nvml-shutdown`: the parent initialised NVML and shut it down again;
- `vllm-platform`: the parent asked vLLM's platform for the GPU's capability and name (what the
  plugin's FP8 table does in the API server);
- `vllm-api`: the parent imported vLLM's API server and asked the GPU as the image's plugin does
  there (its FP8 table's capability and name);
- `nvml-kept-closed` and `vllm-api-closed`: as those, the child closing the NVIDIA device files
  it inherited before it makes its CUDA context (whether such a child still works, and is then
  checkpointed clean);
- `vllm-api-released`: as `vllm-api`, the parent shutting NVML down before the fork until NVML
  says it is not initialised (`release_nvml`, from `os.register_at_fork`: where a plugin would
  do it in the API server, so the child inherits nothing and closes nothing of a library that
  still thinks it owns the files), then asking vLLM's platform the GPU's name again after the fork
  (whether the parent still gets its answers).

Runs on the GPU machine: `python3 -m inference_lab.fork_fds --out fds.json` with the checkout's
`lab`, `machine` and `plugins/vllm` and the carried vLLM (/tmp/site, with pynvml) on PYTHONPATH."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from inference_machine.checkpoint import nvidia_fds

SCENARIOS = ("plain", "nvml-kept", "nvml-shutdown", "vllm-platform", "vllm-api", "nvml-kept-closed",
             "vllm-api-closed", "vllm-api-released")
WAIT_S = 240.0
RELEASE_MAX = 64  # NVML's initialisations a process may hold; more would be a loop


def release_nvml(library: str = "libnvidia-ml.so.1") -> int:
    """Shut NVML down in this process until it says it is not initialised, so that it closes its
    NVIDIA device files (each nvmlInit counts; torch's device count, for one, never shuts down
    what it started). Returns how many shutdowns succeeded: 0 where NVML was not initialised or is
    not on this machine."""
    import ctypes

    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return 0
    done = 0
    while done < RELEASE_MAX and nvml.nvmlShutdown() == 0:  # 0 is NVML_SUCCESS
        done += 1
    return done


def nvidia_files(pid: int | str = "self", proc: Path = Path("/proc")) -> list[str]:
    """The NVIDIA device files `pid` holds open, as `fd:path`, in fd order (the runtime's reader,
    which the take's check of a tree uses)."""
    return [f"{fd}:{target}" for fd, target in nvidia_fds(pid, proc)]


# the scenario's parent: do what it names, fork, and in the child make a CUDA context with
# memory, say so, wait for the word, and check the memory
PARENT = r'''
import json, os, sys, time
from pathlib import Path
sys.path[:0] = [p for p in os.environ.get("FORK_FDS_PATH", "").split(":") if p]
from inference_lab.fork_fds import nvidia_files
scenario, work = sys.argv[1], Path(sys.argv[2])
base = scenario.removesuffix("-closed").removesuffix("-released")
if base.startswith("nvml"):
    try:
        import pynvml
    except ImportError:  # vLLM's own copy of NVIDIA's wrapper, without importing vLLM
        import importlib.util
        f = next(Path(p, "vllm/third_party/pynvml.py") for p in sys.path
                 if Path(p, "vllm/third_party/pynvml.py").is_file())
        spec = importlib.util.spec_from_file_location("pynvml", f)
        pynvml = sys.modules["pynvml"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(pynvml)
    pynvml.nvmlInit()
    pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    if base == "nvml-shutdown":
        pynvml.nvmlShutdown()
elif base == "vllm-platform":
    from vllm.platforms import current_platform
    current_platform.get_device_capability(); current_platform.get_device_name()
elif base == "vllm-api":
    import vllm.entrypoints.openai.api_server  # noqa: F401
    from inference_image_vllm import dispatch
    dispatch.capability(); dispatch.device_name()
if scenario.endswith("-released"):
    from inference_lab.fork_fds import release_nvml
    released = []
    os.register_at_fork(before=lambda: released.append(release_nvml()))
parent = nvidia_files()
pid = os.fork()
if pid:
    if scenario.endswith("-released"):
        after = {"released": released, "parent_at_fork": nvidia_files()}
        try:
            from vllm.platforms import current_platform
            after["parent_asks_again"] = current_platform.get_device_name()
        except Exception as exc:  # what the parent's NVML says after its release
            after["parent_asks_again"] = f"{type(exc).__name__}: {exc}"
        (work / "parent.json").write_text(json.dumps(after))
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
inherited = nvidia_files()
closed = []
if scenario.endswith("-closed"):
    for item in inherited:
        os.close(int(item.split(":")[0])); closed.append(item)
import torch
x = torch.ones(256 * 2**20, device="cuda")  # 1 GiB of float32
torch.cuda.synchronize()
(work / "ready.json").write_text(json.dumps({
    "pid": os.getpid(), "parent": parent, "inherited": inherited, "closed": closed,
    "with_cuda": nvidia_files()}))
while not (work / "go").exists():
    time.sleep(0.05)
ok = bool(x.sum().item() == x.numel())
(work / "done.json").write_text(json.dumps({"memory_back": ok}))
'''


def run_scenario(scenario: str, python: str, wait_s: float = WAIT_S) -> dict[str, Any]:
    """One scenario's parent and child, the child checkpointed and restored from here."""
    from inference_machine.cuda_checkpoint import Driver

    row: dict[str, Any] = {"scenario": scenario}
    with tempfile.TemporaryDirectory(prefix="fork-fds-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "FORK_FDS_PATH": os.pathsep.join(sys.path)}
        proc = subprocess.Popen([python, "-c", PARENT, scenario, str(work)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + wait_s
        while not (work / "ready.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out = proc.communicate()[0] or ""
                row["error"] = f"no CUDA child (exit {proc.returncode}): {out.strip()[-600:]}"
                return row
            time.sleep(0.05)
        time.sleep(0.2)  # the file written whole
        row.update(json.loads((work / "ready.json").read_text()))
        child = int(row["pid"])
        driver = Driver()
        try:
            driver.lock(child, 10_000)
            driver.checkpoint(child)
            row["after_checkpoint"] = nvidia_files(child)
            driver.restore(child)
            driver.unlock(child)
        except Exception as exc:  # the row says what the driver refused; the next one runs
            row["error"] = f"{type(exc).__name__}: {exc}"
        (work / "go").touch()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        done = work / "done.json"
        row["memory_back"] = json.loads(done.read_text())["memory_back"] if done.exists() else None
        if (parent := work / "parent.json").exists():
            row.update(json.loads(parent.read_text()))
        row["exit"] = proc.returncode
    return row


def released(row: dict[str, Any]) -> str:
    """What a `-released` scenario's parent did and kept: NVML's shutdowns before the fork, its
    NVIDIA device files after it, and its answer when it asked the GPU's name again."""
    if "released" not in row:
        return ""
    return (f"{'+'.join(map(str, row['released'])) or 0} shutdowns, "
            f"{len(row.get('parent_at_fork') or [])} files, asks again: "
            f"{str(row.get('parent_asks_again', '-'))[:80]}")


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| scenario | parent's | child inherited | after CUDA's checkpoint | memory back | error |"
             " parent after a release |", "|---|---|---|---|---|---|---|"]
    def n(r: dict[str, Any], k: str) -> str:
        v = r.get(k)
        return "-" if v is None else str(len(v)) if isinstance(v, list) else str(v)
    for r in rows:
        lines.append(f"| {r['scenario']} | {n(r, 'parent')} | {n(r, 'inherited')} | "
                     f"{', '.join(r.get('after_checkpoint') or []) or n(r, 'after_checkpoint')} | "
                     f"{n(r, 'memory_back')} | {str(r.get('error', ''))[:160]} |"
                     f" {released(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m inference_lab.fork_fds",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the rows as JSON")
    ap.add_argument("--scenario", action="append", choices=SCENARIOS,
                    help="one scenario (repeatable; default: all)")
    ap.add_argument("--python", default=sys.executable, help="the parent's interpreter (torch's)")
    a = ap.parse_args(argv)
    if not Path("/dev/nvidiactl").exists():
        print("fork_fds: no NVIDIA GPU here (/dev/nvidiactl); it runs on the GPU machine",
              file=sys.stderr)
        return 2
    rows = []
    for s in a.scenario or SCENARIOS:
        rows.append(run_scenario(s, a.python))
        a.out.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
