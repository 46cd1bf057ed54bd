"""Before a start: its files read into the page cache, the models inspected by vLLM once."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from ..inputs import InputError, read_text
from .bundle import BundleError, _chown_tree, _owner_ids, vllm_site

# ---- the page cache ------------------------------------------------------------------------

# what a start reads from the vLLM venv (Python's compiled modules, extension and CUDA libraries)
# and from the models (weights, configs, tokenizers)
PREFETCH_SUFFIXES = (".pyc", ".so", ".safetensors", ".json")
PREFETCH_THREADS = 16
# the packages every start imports, asked for first (the rest of a venv may never be read)
PREFETCH_FIRST = ("torch", "nvidia", "vllm", "triton", "transformers", "tokenizers",
                  "inference_image_vllm", "numpy", "pydantic", "pydantic_core", "fastapi",
                  "uvicorn", "starlette", "safetensors", "cuda", "xgrammar", "llguidance",
                  "outlines_core", "msgspec", "zmq", "pyzmq.libs", "compressed_tensors")


def _prefetch_files(roots: Iterable[Path]) -> list[Path]:
    first: list[Path] = []
    rest: list[Path] = []
    for root in roots:
        for dirpath, _, filenames in os.walk(root, followlinks=True):
            top = Path(dirpath).relative_to(root).parts[:1]
            bucket = first if not top or top[0] in PREFETCH_FIRST else rest
            for name in filenames:
                if name.endswith(PREFETCH_SUFFIXES) or ".so." in name:
                    bucket.append(Path(dirpath) / name)
    return first + rest


def _read(p: Path, whole: bool) -> int:
    """Bring one file into the page cache: read it (`whole`), or ask the kernel to read it ahead
    (POSIX_FADV_WILLNEED) and go on. Its size; 0 if it cannot be opened."""
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if whole:
            while os.read(fd, 1 << 20):
                pass
        else:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        return size
    except OSError:
        return 0
    finally:
        os.close(fd)


def prefetch(venv: Iterable[Path], models: Iterable[Path] = ()) -> tuple[int, int]:
    """Read what a start will read into the page cache, many files at once: on a new machine
    nothing is cached, and Python's imports read one file after the other. The venv's files are
    read (the imports need them first); the models' are then asked for, to be read while the
    engine starts (a model's weights are tens of GiB: read beside the venv, they would slow the
    imports). (files, bytes)."""
    from concurrent.futures import ThreadPoolExecutor

    n = total = 0
    with ThreadPoolExecutor(PREFETCH_THREADS) as pool:
        for roots, whole in ((venv, True), (models, False)):
            files = _prefetch_files(roots)
            n += len(files)
            total += sum(pool.map(lambda p, w=whole: _read(p, w), files))
    return n, total


def prefetch_roots() -> tuple[list[Path], list[Path]]:
    """The vLLM venv's packages (the folder this Python imports vLLM from, where torch and the
    CUDA libraries are too), and the instance's models (MODEL_PATH, DRAFT_PATH)."""
    venv = [p for p in (vllm_site(),) if p is not None]
    models = [Path(m) for m in (os.environ.get("MODEL_PATH"), os.environ.get("DRAFT_PATH"))
              if m and Path(m).is_dir()]
    return venv, models


# ---- the models' inspection ------------------------------------------------------------------

# vLLM 0.26 inspects each architecture a start serves in a Python subprocess of its own (it imports
# vLLM and the model's module: seconds each) and keeps what it learnt under VLLM_CACHE_ROOT/
# modelinfos, keyed by the module's source alone: the build can do it once, with no GPU.
INSPECT = """
import sys, time
from vllm.model_executor.models.registry import ModelRegistry
for arch in sys.argv[1:]:
    t0 = time.monotonic()
    info = ModelRegistry._try_inspect_model_cls(arch)
    print(arch, "inspected" if info else "unknown", round(time.monotonic() - t0, 1), flush=True)
"""
INSPECT_TIMEOUT_S = 900


UNIT_FILE_MAX = 2**20


def read_small(path: Path, what: str, max_bytes: int = UNIT_FILE_MAX) -> str:
    """A small text file the machine's own files name (a unit's environment or arguments, a
    model's config.json), read by the project's one bounded reader (inputs.read_text: a FIFO or a
    device would hang the read, a huge file fill the memory); its refusal as BundleError."""
    try:
        return read_text(path, what, max_bytes)
    except InputError as exc:
        raise BundleError(str(exc)) from None


def unit_environ(env_file: Path) -> dict[str, str]:
    """A unit's environment file (KEY=VALUE lines, as the render writes them) under this process's
    environment: a variable already set here wins, as in inference-run."""
    env: dict[str, str] = {}
    for line in read_small(env_file, "--env").split("\n"):
        key, eq, value = line.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            env[key] = value
    return {**env, **os.environ}


def architectures(env: dict[str, str], args_file: Path | None) -> list[str]:
    """The architectures a start serves: the target's (MODEL_PATH/config.json) and the draft's
    (DRAFT_PATH), named as vLLM 0.26 names an EAGLE head's (EAGLEConfig)."""
    method = ""
    if args_file is not None:
        argv = read_small(args_file, "--args").split("\n")
        for i, a in enumerate(argv[:-1]):
            if a == "--speculative-config":
                with contextlib.suppress(ValueError, AttributeError):
                    method = str(json.loads(argv[i + 1]).get("method", ""))
    archs: list[str] = []
    for var in ("MODEL_PATH", "DRAFT_PATH"):
        folder = env.get(var)
        if not folder:
            continue
        try:
            names = json.loads(read_small(Path(folder) / "config.json", f"{var}'s")
                               ).get("architectures")
        except (ValueError, AttributeError, RecursionError) as exc:
            raise BundleError(f"{var}={folder}: no readable config.json ({exc})") from None
        for a in names if isinstance(names, list) else []:
            a = str(a)
            if var == "DRAFT_PATH" and method == "eagle3" and "Eagle3" not in a:
                a = f"Eagle3{a}"
            elif var == "DRAFT_PATH" and method == "eagle" and not a.startswith("Eagle"):
                a = f"Eagle{a}"
            if a not in archs:
                archs.append(a)
    return archs


def inspect_models(env_file: Path, args_file: Path | None = None,
                   owner: str | None = None) -> str:
    """Inspect the architectures the unit serves with its vLLM, as its start would, so that the
    start reads vLLM's answers from its cache. One line saying what was done."""
    env = unit_environ(env_file)
    python, root = env.get("INFERENCE_PYTHON"), env.get("VLLM_CACHE_ROOT")
    if not python or not root:
        raise BundleError(f"{env_file}: names no INFERENCE_PYTHON or VLLM_CACHE_ROOT")
    archs = architectures(env, args_file)
    if not archs:
        return "no architecture to inspect"
    infos = Path(root) / "modelinfos"

    def written() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in infos.glob("*.json")} \
            if infos.is_dir() else {}

    before = written()
    t0 = time.monotonic()
    try:
        proc = subprocess.run([python, "-c", INSPECT, *archs], env=env, capture_output=True,
                              text=True, timeout=INSPECT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BundleError(f"inspecting {', '.join(archs)}: {exc}") from None
    done = [line.split()[0] for line in proc.stdout.splitlines() if " inspected " in line]
    if proc.returncode or not done:
        raise BundleError(f"vLLM did not inspect {', '.join(archs)} (exit {proc.returncode}): "
                          f"{(proc.stderr or proc.stdout).strip()[-400:]}")
    if written() == before:
        return f"already inspected: {', '.join(done)} ({infos})"
    if (ids := _owner_ids(owner)) is not None:
        _chown_tree(Path(root), ids)
    return f"inspected {', '.join(done)} in {time.monotonic() - t0:.0f} s ({infos})"
