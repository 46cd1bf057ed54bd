"""The GPU proof's servers on the machine: starting, waiting for, stopping and describing them."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tenacity

import inference_machine
from inference_image.ops.cause import failure_cause
from inference_machine.bounded_http import fetch
from inference_machine.contract import ENV

from .proof_plan import ProofError

# ---- the machine ------------------------------------------------------------------------------

def serving(port: int) -> bool:
    try:
        return fetch(f"http://127.0.0.1:{port}/health", deadline_s=2.0).status == 200
    except OSError:
        return False


class _NotYet(Exception):
    """The server runs and does not answer /health yet."""


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    started: float

    def wait_ready(self, timeout_s: float = 1800) -> float:
        """Seconds from the start until /health answers; ProofError at once if the server exits
        first, or once `timeout_s` have passed since its start."""
        def ready() -> float:
            if serving(self.port):
                return round(time.monotonic() - self.started, 1)
            if self.proc.poll() is not None:
                text = self.log.read_text(errors="replace")
                raise ProofError(f"server exited ({self.proc.returncode}) before it was ready: "
                                 f"{failure_cause(text) or 'no error line'}\n"
                                 + "\n".join(text.splitlines()[-25:]))
            raise _NotYet

        left = max(0.0, timeout_s - (time.monotonic() - self.started))
        try:
            return tenacity.Retrying(stop=tenacity.stop_after_delay(left),
                                     wait=tenacity.wait_fixed(0.5),
                                     retry=tenacity.retry_if_exception_type(_NotYet))(ready)
        except tenacity.RetryError:
            raise ProofError(f"not ready after {timeout_s:.0f} s (log: {self.log})") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 40), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        time.sleep(2)  # the engine process lets go of GPU memory after its parent


# bench's seed for the rows through the router when the same start was benched at the instance
# first: bench's seeds are seed + c per row, and 500 + c meets no row of seed 0 (c <= 64)
SERVED_SEED = 500
# the row a server answers first, before the measured ones (Runner._settle): 700 + c meets no
# measured row's seed (seed + c, c <= 64; 500 + c; scenarios from 1000). At c=8 a server that
# decodes one token a step meets vLLM's Triton top-p kernel (8 rows and more; torch's sort
# below) before its rows, so the build is not inside a measured row. Then c=16: Triton compiles
# an integer argument divisible by 16 (its BATCH_SIZE) apart, a second build the first measured
# c=16 row would otherwise wait out (docs/gpu-machine.md, the warm-up rows).
SETTLE_SEED, SETTLE_CONCURRENCY = 700, (8, 16)
# a concurrent trace's length: scores of decode steps of either model at any concurrency
DECODE_WINDOW_S = 1.0
# how often a finished trace is looked for: a file's size unchanged over one such wait
FILE_POLL_S = 3.0
# Tokens each decoding stream asks for while first tokens are timed beside it: more than it can
# make while the prompts are sent, so none ends early; the streams are closed once the prompts
# are done.
BESIDE_TOKENS = 3072
# a stack-sampling window (step stacks): ~500 decode steps of the 8B at c=64, at 1 ms a sample
STACKS_WINDOW_S = 3.0
# the end of a cut-off step's server log kept in proof.json
CUT_LOG_LINES = 40


def router_bin(python: str) -> str:
    """vllm-router for the `served` step: $PROOF_ROUTER_BIN, else beside `python`, else on PATH."""
    for cand in (os.environ.get("PROOF_ROUTER_BIN"), str(Path(python).parent / "vllm-router"),
                 str(Path(os.environ.get("PROOF_SITE", "/tmp/site")) / "bin" / "vllm-router"),
                 shutil.which("vllm-router")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise ProofError("no vllm-router to serve through: carry its wheels (docs/gpu-machine.md) "
                     "or set PROOF_ROUTER_BIN")


# The machine's runtime as the lab runs it: its programs by the lab's own Python, with its package
# first on the path of whatever runs under it (the image runs its console scripts instead).
RUNTIME_SITE = str(Path(inference_machine.__file__).resolve().parents[1])


def runtime(program: str, *args: str) -> list[str]:
    """One of the machine's programs (run, join, firstboot, acme; "" for inference-startup)."""
    return [sys.executable, "-m", "inference_machine" + (f".{program}" if program else ""), *args]


def with_runtime(env: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """`env` with the runtime's package on PYTHONPATH (before what `env`, else `base`, else this
    process gives it)."""
    rest = env.get("PYTHONPATH", (os.environ if base is None else base).get("PYTHONPATH", ""))
    return {**env, "PYTHONPATH": os.pathsep.join(x for x in (RUNTIME_SITE, rest) if x)}


def dry_run(runner: list[str], env: dict[str, str]) -> str:
    """The command line a render's `inference-run UNIT` would exec (INFERENCE_DRY_RUN)."""
    return subprocess.run(runner, env={**os.environ, **with_runtime(env), ENV.dry_run: "1"},
                          capture_output=True, text=True, check=False).stdout.strip()


def compiled_into(cache: Path) -> bool:
    """A compile cache is warm only where a start compiled into it: a start that failed early
    leaves the folder empty, and would be called warm by the folder alone."""
    compiled = cache / "vllm" / "torch_compile_cache"
    return compiled.is_dir() and any(f.is_file() for f in compiled.rglob("*"))


# Where a proof server looks for CUDA's compiler: nowhere that exists (without_cuda_compiler)
NO_CUDA_HOME = "/nonexistent/cuda"


def without_cuda_compiler(env: dict[str, str]) -> dict[str, str]:
    """`env` as the image's servers have it: no CUDA compiler. torch's wheels bring CUDA's
    libraries, not nvcc, and no role installs a toolkit; the GPU machines the proof runs on have
    one. vLLM 0.26 turns FlashInfer's kernels on where it finds nvcc (`has_flashinfer`: its
    all-reduce fusion at TP>1, among others), and FlashInfer builds its kernels with it at their
    first use: a proof server that found it would serve otherwise than the image."""
    path = [d for d in env.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "nvcc").exists()]
    return {**env, "PATH": os.pathsep.join(path), "CUDA_HOME": NO_CUDA_HOME,
            "CUDA_PATH": NO_CUDA_HOME}


def start(argv: list[str], env: dict[str, str], log: Path, port: int,
          cpus: frozenset[int] | None = None, lines: list[tuple[float, str]] | None = None,
          base: dict[str, str] | None = None) -> Server:
    """`cpus`: the server's processes run on these CPUs only (their children inherit them).
    `PROOF_SERVER_WRAP` in the environment: a command every server starts under (its words
    before the server's argv), e.g. `python3 -m inference_lab.sandbox exec --allow FILE --`.
    `lines`: each output line is also kept there with the seconds since the start at which it
    arrived (the ready step's phases). `base`: the environment before `env` (default this
    process's)."""
    if argv[:3] == runtime("run")[:3]:  # the image's own start: the runtime must be importable
        env = with_runtime(env, base)
    argv = shlex.split(os.environ.get("PROOF_SERVER_WRAP", "")) + argv
    if serving(port):
        raise ProofError(f"port {port} already serves: stop that server first (a run cut off by "
                         "a time limit leaves one behind)")
    t0 = time.monotonic()
    fh = log.open("wb")
    proc = subprocess.Popen(argv, env=without_cuda_compiler({**(base or os.environ), **env}),
                            stdin=subprocess.DEVNULL,
                            stdout=fh if lines is None else subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    if lines is not None:
        def copy() -> None:
            assert proc.stdout is not None
            with fh:
                for raw in proc.stdout:
                    fh.write(raw)
                    fh.flush()
                    lines.append((time.monotonic() - t0,
                                  raw.decode(errors="replace").rstrip()))

        threading.Thread(target=copy, daemon=True).start()
    return Server(proc, port, log, t0)


def backends(log: Path) -> list[str]:
    """What vLLM said it chose: attention, kernels, graphs, runner, the plugin."""
    pat = re.compile(r"Selected .*Kernel|FlashAttention version|AttentionBackendEnum|GPU KV cache "
                     r"size|Model Runner V2|model weights took|inference-image|cudagraph_mode|"
                     r"speculative|Speculative|synthetic")
    seen: dict[str, None] = {}
    for line in log.read_text(errors="replace").splitlines():
        if pat.search(line):
            seen.setdefault(re.sub(r"^.*?\] ", "", line)[:200], None)
    return list(seen)[:30]



def machine_info(python: str) -> dict[str, Any]:
    """The GPUs (model, serials, driver, memory) and the vLLM and torch that `python` imports."""
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,serial,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True,
                         check=False).stdout.strip().splitlines()
    code = ("import json, torch, vllm; "
            "print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__}))")
    probe = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    info: dict[str, Any] = {}
    if probe.returncode == 0 and probe.stdout.strip():
        info = json.loads(probe.stdout.strip().splitlines()[-1])
    rows = [[f.strip() for f in line.split(",")] for line in smi if line.count(",") == 3]
    if rows:
        name, _, drv, mem = rows[0]
        info.update(gpu=name, driver=drv, memory=mem, gpus=len(rows),
                    serials=[row[1] for row in rows])
    return info


