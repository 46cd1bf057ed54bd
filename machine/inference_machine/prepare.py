"""Before a start: its files read into the page cache, the models inspected by vLLM once."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from . import boundary, rendered
from .bundle import BundleError, _owner_ids, _write_json
from .contract import ENV, cache_env
from .inputs import InputError, read_text

# ---- the page cache ------------------------------------------------------------------------

# What a start reads, recorded by the build's inspection (the same vLLM, imported as a start
# imports it): the shared libraries its processes map (torch's CUDA libraries are most of the
# bytes) and its modules' files in the order Python imported them. A walk of the whole venv
# reads gigabytes no start opens and slowed the imports it was to speed up (the evidence:
# docs/decisions.md, Ready time).
READS = "start-reads.json"  # under the instance cache root (INFERENCE_CACHE)
READS_MAX_BYTES = 16 * 2**20
READS_MAX_FILES = 200_000
# each lane reads its files in its order, this many at a time: the libraries are few and large,
# the modules many and small, and the imports need both from their first second
PREFETCH_THREADS = 8



def reads_from(stdout: str) -> dict[str, list[str]] | None:
    """The READS line a recording script printed, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("READS "):
            with contextlib.suppress(ValueError):
                data = json.loads(line[6:])
                if isinstance(data, dict):
                    return data
    return None


def load_reads(path: Path) -> tuple[list[str], list[str]]:
    """The recorded reads (libraries, modules): absolute paths only, at most READS_MAX_FILES.
    BundleError when the file is missing, not ours or not what `inspect` writes."""
    text = read_small(path, "start reads", READS_MAX_BYTES)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"{path}: not JSON ({exc}); `inference-startup inspect` writes it") \
            from None
    lanes: list[list[str]] = []
    for lane in ("libs", "modules"):
        items = data.get(lane) if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise BundleError(f"{path}: no list '{lane}'; `inference-startup inspect` writes it")
        lanes.append([p for p in items if isinstance(p, str) and p.startswith("/")
                      and "\x00" not in p][:READS_MAX_FILES])
    return lanes[0], lanes[1]


def _read(p: str | Path, whole: bool) -> int:
    """Bring one regular file into the page cache: read it (`whole`), or ask the kernel to read
    it ahead (POSIX_FADV_WILLNEED) and go on. Its size; 0 if it is not a regular file or cannot
    be opened (a FIFO or a device is never read: it could block forever)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return 0
        if whole:
            while os.read(fd, 1 << 20):
                pass
        else:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        return st.st_size
    except OSError:
        return 0
    finally:
        os.close(fd)


def prefetch(reads: Path | None, models: Iterable[Path] = ()) -> tuple[int, int]:
    """Read what a start will read into the page cache while its Python imports: on a new
    machine nothing is cached, and the imports read one file after the other. The recorded
    libraries and modules are read, two lanes at once, each in its order; the models' files are
    then asked for, to be read while the engine starts (tens of GiB: read beside the imports,
    they would slow them). (files, bytes)."""
    from concurrent.futures import ThreadPoolExecutor

    libs, modules = load_reads(reads) if reads is not None else ([], [])
    with ThreadPoolExecutor(PREFETCH_THREADS) as a, ThreadPoolExecutor(PREFETCH_THREADS) as b:
        got = [a.map(lambda p: _read(p, True), libs), b.map(lambda p: _read(p, True), modules)]
        total = sum(sum(g) for g in got)
    files = [f for root in models for f in model_files(root)]
    total += sum(_read(f, False) for f in files)
    return len(libs) + len(modules) + len(files), total


MODEL_FILES_MAX = 100_000


def model_files(root: Path) -> list[Path]:
    """The files under a model's folder, its links to folders followed (a hub cache's snapshot
    links to its blobs) but each folder walked once: a link back to a folder already walked (a
    folder linked to itself, two links to each other) ends there instead of looping for good; at
    most MODEL_FILES_MAX files."""
    seen: set[tuple[int, int]] = set()
    out: list[Path] = []
    for dirpath, dirnames, names in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        out += [Path(dirpath) / name for name in names]
        if len(out) >= MODEL_FILES_MAX:
            return out[:MODEL_FILES_MAX]
    return out


def prefetch_roots() -> tuple[Path | None, list[Path]]:
    """The recorded reads of this machine's starts (INFERENCE_CACHE/start-reads.json, where
    the build's inspection wrote it), and the instance's models (MODEL_PATH, DRAFT_PATH)."""
    cache = os.environ.get(ENV.cache)
    reads = Path(cache) / READS if cache and (Path(cache) / READS).is_file() else None
    models = [Path(m) for m in (os.environ.get("MODEL_PATH"), os.environ.get("DRAFT_PATH"))
              if m and Path(m).is_dir()]
    return reads, models


# ---- the models' inspection ------------------------------------------------------------------

# vLLM 0.26 inspects each architecture a start serves in a Python subprocess of its own (it imports
# vLLM and the model's module: seconds each) and keeps what it learnt under VLLM_CACHE_ROOT/
# modelinfos, keyed by the module's source alone: the build can do it once, with no GPU.
# run by the unit's vLLM Python as a file (-P: its folder, this package's, not on its path): one line an
# architecture, then the READS line (inspect_in_vllm.py)
INSPECT_SCRIPT = Path(__file__).with_name("inspect_in_vllm.py")
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
    try:
        env = dict(rendered.env_lines(env_file, "--env"))
    except rendered.RenderedError as exc:
        raise BundleError(str(exc)) from None
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


def _run_unit_python(argv: list[str], env: dict[str, str], timeout_s: int, doing: str,
                     ids: tuple[int, int] | None = None) -> subprocess.CompletedProcess[str]:
    """The unit's vLLM Python run to its end with the unit's environment, as the instances' user
    when root is given one (`ids`: what it writes in their cache is theirs, and it reaches only
    what they can: boundary's rule); one that cannot start or outlives `timeout_s` as
    BundleError, saying what it was doing."""
    as_user: dict[str, object] = {}
    if ids is not None and os.geteuid() == 0 and ids[0] != 0:
        import pwd
        with contextlib.suppress(KeyError):
            env = {**env, "HOME": pwd.getpwuid(ids[0]).pw_dir}
        if cache := env.get(ENV.cache):  # where vllm@'s Environment= puts them
            env = {**{k: v for k, v in cache_env(cache).items() if k.startswith("XDG_")}, **env}
        as_user = {"user": ids[0], "group": ids[1], "extra_groups": []}
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s,
                              check=False, **as_user)  # type: ignore[call-overload]
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BundleError(f"{doing}: {exc}") from None


def inspect_models(env_file: Path, args_file: Path | None = None,
                   owner: str | None = None) -> str:
    """Inspect the architectures the unit serves with its vLLM, as its start would, so that the
    start reads vLLM's answers from its cache. One line saying what was done."""
    env = unit_environ(env_file)
    python, root = env.get(ENV.python), env.get("VLLM_CACHE_ROOT")
    if not python or not root:
        raise BundleError(f"{env_file}: names no {ENV.python} or VLLM_CACHE_ROOT")
    archs = architectures(env, args_file)
    if not archs:
        return "no architecture to inspect"
    infos = Path(root) / "modelinfos"

    def written() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in infos.glob("*.json")} \
            if infos.is_dir() else {}

    before = written()
    t0 = time.monotonic()
    ids = _owner_ids(owner)
    proc = _run_unit_python([python, "-P", str(INSPECT_SCRIPT), *archs], env, INSPECT_TIMEOUT_S,
                            f"inspecting {', '.join(archs)}", ids)
    done = [line.split()[0] for line in proc.stdout.splitlines() if " inspected " in line]
    if proc.returncode or not done:
        raise BundleError(f"vLLM did not inspect {', '.join(archs)} (exit {proc.returncode}): "
                          f"{(proc.stderr or proc.stdout).strip()[-400:]}")
    recorded = _write_reads(env.get(ENV.cache), reads_from(proc.stdout), ids)
    if written() == before:
        return f"already inspected: {', '.join(done)} ({infos}){recorded}"
    return f"inspected {', '.join(done)} in {time.monotonic() - t0:.0f} s ({infos}){recorded}"


# ---- the Triton kernels a start compiles ------------------------------------------------------

# The plugin compiles the kernels recorded for the unit's tier (serving.triton_precompile) with the
# unit's vLLM, Triton and TRITON_CACHE_DIR; Triton needs no GPU for it (the plugin's
# triton_kernels.py says why that holds).
PRECOMPILE = ("-m", "inference_image_vllm.triton_kernels", "precompile")
PRECOMPILE_TIMEOUT_S = 1800


def precompile_kernels(env_file: Path, owner: str | None = None) -> str:
    """Compile, as the build does once, the Triton kernels a start of the unit's tier compiles
    into its Triton cache, owned by the instances' user. The plugin's one line."""
    env = unit_environ(env_file)
    python, cache = env.get(ENV.python), env.get("TRITON_CACHE_DIR")
    if not python or not cache:
        raise BundleError(f"{env_file}: names no {ENV.python} or TRITON_CACHE_DIR")
    ids = _owner_ids(owner)
    proc = _run_unit_python([python, *PRECOMPILE], env, PRECOMPILE_TIMEOUT_S,
                            "precompiling the Triton kernels", ids)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise BundleError(f"the plugin did not precompile the Triton kernels (exit "
                          f"{proc.returncode}): {(proc.stdout or proc.stderr).strip()[-400:]}")
    return lines[-1]


def _write_reads(cache: str | None, reads: dict[str, list[str]] | None,
                 ids: tuple[int, int] | None) -> str:
    """The inspection's record of what a start reads, under the cache root (replaced whole);
    what the line says of it."""
    if not cache or not reads:
        return "; no record of what a start reads"
    dest = Path(cache) / READS
    try:
        # written as the cache's owner (or `ids`), never by root in their folder
        uid, gid = ids or boundary.folder_owner(Path(cache))
        boundary.as_user(uid, gid, _write_json, dest, reads, errors=(OSError,))
    except OSError as exc:
        return f"; what a start reads was not recorded ({dest}: {exc.strerror or exc})"
    return (f"; recorded what a start reads ({len(reads.get('libs', []))} libraries, "
            f"{len(reads.get('modules', []))} modules: {dest})")
