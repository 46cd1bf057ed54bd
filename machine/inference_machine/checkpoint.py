"""A served instance written to disk and brought back: CUDA's checkpoint API moves its GPU state
into its host memory, CRIU writes its processes, and a later start restores them instead of
importing, loading and compiling again.

Taking one (the instance ready, before any client's request; so nothing of a user's request is
in it): the instance answers a fixed greedy request (its reference answer), sleeps (vLLM's sleep
mode, level 1: the KV cache freed, the weights moved to host memory), is locked and checkpointed
by CUDA, written by CRIU while it keeps running, then given its GPU back and woken. The folder
is written beside its final name and renamed into place whole. With `weights="files"` the
target's large weights are discarded at the sleep instead of written (the plugin's reload.py),
and read again from the model's files at each wake; the instance must then give its reference
answer again, or it is stopped (its weights are not what it served with).

Restoring one: it is used only if its manifest's key is this machine's (the bundle's key, plus
the driver's full version, the GPUs' UUIDs, the kernel, CRIU's version and the instance's unit
files) and its files are the sizes the manifest says; CRIU restores the processes, CUDA their
GPU state, vLLM wakes, and the instance must give its reference answer again, token for token.
Anything else is refused with one line saying why (CheckpointRefused), the restored processes
killed, and the caller starts the instance as if there were no checkpoint.

Stdlib only; needs root (CRIU) and an NVIDIA driver with CUDA's checkpoint API."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import boundary
from .bounded_http import fetch
from .bundle import machine_key, smi_rows
from .cuda_checkpoint import Driver, gpu_processes, stat_fields, tree

SCHEMA = 1
MANIFEST = "checkpoint.json"
IMAGES = "images"
# the checkpoint's key beyond the warm-cache bundle's: a restored process resumes on exactly the
# driver, GPUs, kernel and CRIU it was written under, with the unit it was started from
EXTRA_KEY = ("driver", "gpu_uuids", "kernel", "criu", "unit_sha256")
REFERENCE_PROMPT = "A restored instance answers this exactly as before:"
REFERENCE_TOKENS = 16
LOCK_TIMEOUT_MS = 30_000
# CRIU's options both ways: the API server's and the engine's connections to each other (TCP on
# the loopback) are restored as they were; no other machine talks to an instance while it is
# written (it is taken before traffic), so the network is not locked
CRIU_COMMON = ("--tcp-established", "--file-locks", "--network-lock", "skip")
# CRIU's slowest acceptable pace through a checkpoint's images, and the least time it gets: a
# dump or restore slower than that is stuck (a damaged image keeps a restore's tasks spinning,
# and CRIU ignores SIGTERM meanwhile): killed with what it restored, and refused
# (docs/decisions.md#checkpoint-and-restore-criu-with-cudas-checkpoint-api)
CRIU_MIN_MIB_S = 50
CRIU_MIN_TIMEOUT_S = 60.0
CRIU_MAX_TIMEOUT_S = 7200.0
# a manifest's bounds: more than any machine's memory, a pid past the kernel's largest, a port
# outside TCP's are not a checkpoint this code wrote
MAX_BYTES = 2**42
MAX_MANIFEST = 64 * 2**20
PID_MAX = 2**22
PR_SET_CHILD_SUBREAPER = 36
# a restore's phases (Timings' marks), in order: what a ledger shows for a restored start
RESTORE_PHASES = ("validate", "criu_restore", "cuda_restore", "wake_up", "reload_weights",
                  "first_answer")
# where a checkpoint's weights are: in its images (host memory at the sleep), or left out and read
# again from the model's files at each wake (serving.checkpoint_weights)
WEIGHTS = ("host", "files")
# the plugin's worker methods (inference_image_vllm/reload.py), called through /collective_rpc
RELEASE_RPC = "inference_image_release_weights"
RELOAD_RPC = "inference_image_reload_weights"
# how long a reload from the model's files may take (a 70B model after a reboot reads its files
# from disk)
RELOAD_S = 900
# the wake after a checkpoint: all of it, or (weights in the files) the weights alone, the KV
# cache only once they are read back (reload)
WAKE = {"host": "/wake_up", "files": "/wake_up?tags=weights"}
# the header that takes the checkpoint's own requests through the instance's gate (the plugin's
# gate.py) while it answers every other request 503: a checkpoint is taken with no client's
# request inside, and a restored instance serves only once it has given its reference answer again
GATE_HEADER = "X-Inference-Checkpoint"
# the gate's count of the clients' requests inside the instance, to the token alone
GATE_STATE = "/inference-gate"


@dataclass(frozen=True)
class Criu:
    """How CRIU is run: its binary, what goes before it (`in_start`: the namespaces of the start
    it works for) and whether it puts the restored tree back into the cgroup it was written from
    (a unit's, under systemd)."""
    binary: str
    prefix: tuple[str, ...] = ()
    cgroups: bool = False

    def argv(self, *args: str) -> list[str]:
        return [*self.prefix, self.binary, *args,
                *(("--manage-cgroups=soft",) if self.cgroups else ())]

    @classmethod
    def in_start(cls, binary: str, pid: int, cgroups: bool = False) -> Criu:
        """CRIU inside every namespace a unit's sandbox gives the start `pid` heads (mount:
        PrivateTmp and ProtectSystem; UTS: ProtectHostname; IPC: PrivateIPC; network:
        PrivateNetwork). A namespace CRIU shares with the tree is neither written nor made
        again: the restored tree joins the new start's. One it does not share is made anew at the
        restore, through /proc/sys, which ProtectKernelTunables leaves read-only, so that restore
        fails (docs/decisions.md#checkpoints-under-systemd-on-a-gpu)."""
        return cls(binary, ("nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "--"), cgroups)


def as_criu(criu: str | Criu) -> Criu:
    return criu if isinstance(criu, Criu) else Criu(criu)


class CheckpointRefused(Exception):
    """Why a checkpoint was not used (missing, stale, corrupt, or its restore failed)."""


class InstanceLost(CheckpointRefused):
    """A take that left its instance unable to serve as before (it did not wake, or its weights
    were not read back from the model's files): its caller must stop it."""


@dataclass
class Timings:
    phases: list[tuple[str, float]] = field(default_factory=list)
    _t: float = field(default_factory=time.monotonic)

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.phases.append((name, round(now - self._t, 2)))
        self._t = now


# ---- the key ----------------------------------------------------------------------------------

def criu_version(criu: str) -> str:
    try:
        out = subprocess.run([criu, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except OSError:
        return "none"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines()
                 if line.startswith("Version:")), "unreadable")


def unit_digest(units: Path, instance: str) -> str:
    h = hashlib.sha256()
    for suffix in (".env", ".args"):
        p = units / f"{instance}{suffix}"
        h.update(p.read_bytes() if p.is_file() else b"none")
        h.update(b"\0")
    return h.hexdigest()[:16]


def checkpoint_key(cache: Path, profile_json: Path | None, units: Path, instance: str,
                   criu: str) -> dict[str, str]:
    """Everything a restored instance depends on (the instance's environment, as inference-run
    exports it, names its models and GPUs)."""
    rows = smi_rows("driver_version,uuid", os.environ.get("CUDA_VISIBLE_DEVICES"))
    return {**machine_key(cache, profile_json),
            "driver": rows if isinstance(rows, str) else ",".join(sorted({r[0] for r in rows})),
            "gpu_uuids": rows if isinstance(rows, str) else ",".join(r[1] for r in rows),
            "kernel": platform.release(),
            "criu": criu_version(criu),
            "unit_sha256": unit_digest(units, instance)}


def key_fields(key: dict[str, str]) -> tuple[str, ...]:
    return tuple(sorted(key))


# ---- checking one ----------------------------------------------------------------------------

def _whole(value: Any, lo: int, hi: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{what} {value!r} is not a whole number from {lo} to {hi}")
    return value


def _bounded(manifest: dict[str, Any], files: dict[str, Any]) -> None:
    """Every number a restore acts on within what this code writes: pids a process could have
    (never 0, 1 or negative), a TCP port, sizes no machine exceeds, image names without a path."""
    _whole(manifest["pid"], 2, PID_MAX, "pid")
    gpu_pids = manifest.get("gpu_pids", [])
    if not isinstance(gpu_pids, list) or not gpu_pids:
        raise ValueError("gpu_pids is not a list of pids")
    for p in gpu_pids:
        _whole(p, 2, PID_MAX, "a gpu pid")
    _whole(manifest["port"], 1, 65535, "port")
    _whole(manifest.get("bytes", 0), 0, MAX_BYTES, "bytes")
    for name, size in files.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"image file name {name[:80]!r} is not a plain name")
        _whole(size, 0, MAX_BYTES, f"{name}'s size")


def _files(images: Path) -> dict[str, int]:
    """The regular files of `images` by name and size (a link or FIFO there is no image)."""
    out = {}
    for p in sorted(images.iterdir()):
        st = p.lstat()
        if stat.S_ISREG(st.st_mode):
            out[p.name] = st.st_size
    return out


def validate(dest: Path, key: dict[str, str]) -> dict[str, Any]:
    """The manifest of the checkpoint at `dest` if this machine can restore it; CheckpointRefused
    saying why not otherwise (cheap: no image is read whole)."""
    mf = dest / MANIFEST
    if not os.path.lexists(mf):
        raise CheckpointRefused(f"no checkpoint at {dest}")
    try:
        manifest = boundary.read_json(mf, MAX_MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
            raise ValueError(f"schema {manifest.get('schema') if isinstance(manifest, dict) else '?'}"
                             f", this reads {SCHEMA}")
        want, files = manifest["key"], manifest["files"]
        reference = str(manifest["reference"])
        if not isinstance(want, dict) or not isinstance(files, dict) or not files:
            raise ValueError("key or files malformed")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointRefused(f"corrupt: {mf}: {exc}") from None
    if stale := [f"{k} is {key.get(k, 'missing')!r} here, {want.get(k, 'missing')!r} in the "
                 "checkpoint" for k in sorted(set(want) | set(key)) if want.get(k) != key.get(k)]:
        raise CheckpointRefused("stale: " + "; ".join(stale))
    try:
        _bounded(manifest, files)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointRefused(f"corrupt: {mf}: {exc}") from None
    images = dest / IMAGES
    have = _files(images) if images.is_dir() else {}
    if bad := [n for n, size in files.items() if have.get(n) != size]:
        raise CheckpointRefused(f"corrupt: {len(bad)} image file(s) missing or of another size, "
                                f"e.g. {bad[0]} ({have.get(bad[0], 'missing')} bytes, "
                                f"{files[bad[0]]} written)")
    if extra := sorted(set(have) - set(files)):
        raise CheckpointRefused(f"corrupt: image file(s) the manifest does not list, e.g. "
                                f"{extra[0]}")
    if not reference:
        raise CheckpointRefused("corrupt: no reference answer")
    return manifest


# ---- the instance's side --------------------------------------------------------------------

def _post(port: int, path: str, body: dict[str, Any] | None, deadline_s: float,
          token: str = "") -> bytes:
    # vLLM answers /sleep, /wake_up and /collective_rpc once their work is done: the whole
    # deadline may pass in silence
    got = fetch(f"http://127.0.0.1:{port}{path}", deadline_s=deadline_s, idle_s=deadline_s,
                method="POST",
                body=json.dumps(body).encode() if body is not None else b"",
                headers={"Content-Type": "application/json",
                         **({GATE_HEADER: token} if token else {})})
    if got.status != 200:
        raise OSError(f"{path}: HTTP {got.status}: {got.body.decode(errors='replace')[:200]}")
    return got.body


def rpc(port: int, method: str, deadline_s: float, token: str = "") -> Any:
    """What the instance's (one) worker answered to a call of `method` through vLLM's
    /collective_rpc."""
    body = _post(port, "/collective_rpc", {"method": method, "timeout": deadline_s}, deadline_s,
                 token)
    try:
        return json.loads(body)["results"][0]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise OSError(f"/collective_rpc {method}: no result in the answer ({type(exc).__name__})"
                      ) from None


def reference_answer(port: int, model: str, deadline_s: float = 120, token: str = "") -> str:
    """The instance's greedy answer to the fixed reference prompt (its tokens as text)."""
    body = _post(port, "/v1/completions", {
        "model": model, "prompt": REFERENCE_PROMPT, "max_tokens": REFERENCE_TOKENS,
        "temperature": 0, "ignore_eos": True}, deadline_s, token)
    try:
        return str(json.loads(body)["choices"][0]["text"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise OSError(f"/v1/completions: no completion in the answer ({type(exc).__name__})"
                      ) from None


def stdio(pid: int) -> dict[str, str]:
    """What the process's standard output and error are (pipe:[N], socket:[N], a path)."""
    out = {}
    for fd in ("1", "2"):
        with contextlib.suppress(OSError):
            out[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return out


def inherit_args(streams: dict[str, str]) -> list[str]:
    """CRIU's --inherit-fd for a restored tree's standard output and error when they were a pipe
    or a socket (a journal stream, a parent's pipe): the restorer's own fd takes their place."""
    args, seen = [], set()
    for fd, what in sorted(streams.items()):
        if what.startswith(("pipe:[", "socket:[")) and what not in seen:
            seen.add(what)
            args += ["--inherit-fd", f"fd[{fd}]:{what}"]
    return args


def external_args(streams: dict[str, str]) -> list[str]:
    """CRIU's --external for standard output and error that are a connected stream socket
    (systemd's journal): CRIU writes only the process's end, and inherit_args hands the restorer's
    own in at the restore; without it, CRIU refuses to write half of a connection."""
    args, seen = [], set()
    for _, what in sorted(streams.items()):
        if (m := re.fullmatch(r"socket:\[(\d+)\]", what)) and m[1] not in seen:
            seen.add(m[1])
            args += ["--external", f"unix[{m[1]}]"]
    return args


def criu_timeout(mib: float) -> float:
    """The seconds a dump or restore of `mib` MiB of images gets before it counts as stuck."""
    return min(CRIU_MAX_TIMEOUT_S, max(CRIU_MIN_TIMEOUT_S, mib / CRIU_MIN_MIB_S))


def nvidia_fds(pid: int | str, proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """The NVIDIA device files `pid` holds open, as (fd, path) in fd order; none where its fds
    cannot be read."""
    out = []
    with contextlib.suppress(OSError):
        for fd in (proc / str(pid) / "fd").iterdir():
            with contextlib.suppress(OSError):
                if (target := os.readlink(fd)).startswith("/dev/nvidia"):
                    out.append((int(fd.name), target))
    return sorted(out)


def device_files(pids: list[int]) -> list[str]:
    """The NVIDIA device files still open in these processes (pid, fd, path)."""
    return [f"pid {p} fd {fd} {target}" for p in pids for fd, target in nvidia_fds(p)]


def io_uring_holders(pids: list[int]) -> list[str]:
    """The processes holding an io_uring (CRIU cannot write one), by pid and command."""
    out = []
    for p in pids:
        try:
            fds = [os.readlink(f"/proc/{p}/fd/{f}") for f in os.listdir(f"/proc/{p}/fd")]
            if any("io_uring" in f for f in fds):
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                out.append(f"{p} ({cmd.strip()[:120]})")
        except OSError:
            continue
    return out


def shm_names(pids: list[int], shm: Path = Path("/dev/shm"), uid: int | None = None) -> list[Path]:
    """The names in `shm` of files these processes map through another, deleted name: glibc's
    sem_open maps a temporary name and links the file to the semaphore's, which the start method
    spawn keeps until the end (for its children to open by name). With `uid`, only regular files
    that user owns."""
    deleted: set[tuple[int, int, int]] = set()
    for p in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/maps").read_text().splitlines():
                f = line.split(maxsplit=5)
                if len(f) == 6 and f[5].endswith(" (deleted)") and f[4] != "0":
                    major, minor = (int(x, 16) for x in f[3].split(":"))
                    deleted.add((major, minor, int(f[4])))
    out = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(shm):
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in deleted and \
                        stat.S_ISREG(st.st_mode) and (uid is None or st.st_uid == uid):
                    out.append(Path(entry.path))
    return sorted(out)


def process_ids(pid: int) -> tuple[int, int]:
    """The real uid and gid of process `pid`."""
    uid = gid = -1
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
        elif line.startswith("Gid:"):
            gid = int(line.split()[1])
    if uid < 0 or gid < 0:
        raise OSError(f"/proc/{pid}/status names no Uid or Gid")
    return uid, gid


def unlink_shm_names(pids: list[int], head: int, shm: Path = Path("/dev/shm")) -> None:
    """shm_names of the instance's own user removed as that user: in a sticky folder the kernel
    then refuses a name that is another user's, whatever a hard link made it look like."""
    uid, gid = process_ids(head)

    def unlink(names: list[str]) -> None:
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(n)

    boundary.as_user(uid, gid, unlink, [str(n) for n in shm_names(pids, shm, uid)],
                     errors=(OSError,))


def memory(pids: list[int]) -> dict[str, dict[str, Any]]:
    """What each process holds that CRIU writes (its anonymous and shared-memory pages, MiB; after
    CUDA's checkpoint its GPU state is among them), by pid, with its command."""
    out: dict[str, dict[str, Any]] = {}
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text().splitlines()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        kib = {k: int(v.split()[0]) for k, _, v in (ln.partition(":") for ln in status)
               if k in ("RssAnon", "RssShmem")}
        out[str(p)] = {"cmd": cmd[:120], **{f"{k.lower()}_mib": round(v / 1024, 1)
                                            for k, v in kib.items()}}
    return out


def _criu(criu: str | Criu, argv: list[str], log: Path, stdout: int | None = None,
          timeout_s: float = CRIU_MIN_TIMEOUT_S) -> None:
    # -W: CRIU's statistics (stats-dump, stats-restore) go beside its log, out of the images a
    # manifest lists, so a restore leaves the checkpoint as it was for the next one
    proc = subprocess.Popen(as_criu(criu).argv(*argv, "-v2", "-o", str(log), "-W",
                                               str(log.parent)),
                            text=True, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE if stdout is None else stdout)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # the tasks a restore has forked outlive CRIU: they go first, then CRIU
        kill_tree(proc.pid, wait_s=10)
        proc.communicate()
        raise CheckpointRefused(f"criu {argv[0]} did not finish in {timeout_s:.0f} s (a "
                                "damaged image can keep it going): killed, with what it had "
                                "restored") from None
    if proc.returncode:
        tail = ""
        with contextlib.suppress(OSError):
            tail = " | ".join(x for x in log.read_text(errors="replace").splitlines()
                              if "Error" in x)[-600:]
        taken = re.search(r"Can't fork for (\d+): File exists", tail)
        why = (f"pid {taken[1]}, which the checkpoint's process had, is another process's now; "
               if taken else "")
        raise CheckpointRefused(f"criu {argv[0]} exited {proc.returncode}: {why}"
                                f"{tail or err.strip()[-600:]}")


def dump(pid: int, images: Path, criu: str | Criu, mib: float) -> None:
    """CRIU writes the tree `pid` heads into `images` and leaves it running (`mib`: what its
    processes hold, which sets how long CRIU gets)."""
    _criu(criu, ["dump", "-t", str(pid), "-D", str(images), "--leave-running", "--ext-unix-sk",
                 *external_args(stdio(pid)), *CRIU_COMMON], images.parent / "dump.log",
          timeout_s=criu_timeout(mib))


def restore_tree(dest: Path, manifest: dict[str, Any], criu: str | Criu,
                 stdout: int | None = None) -> int:
    """CRIU restores the processes of the checkpoint at `dest` (detached); the pid heading them.
    CheckpointRefused where CRIU fails or is stuck, nothing of it left running."""
    pidfile = dest / "restored.pid"
    boundary.remove(pidfile)
    # CRIU forks the restored tree's head and exits: as a subreaper this process inherits it, so
    # the pid CRIU names can be checked to be that head (a child of this process) before any
    # signal is sent to it
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _criu(criu, ["restore", "-D", str(dest / IMAGES), "-d", "--pidfile", str(pidfile),
                 *CRIU_COMMON, *inherit_args(manifest["stdio"])], dest / "restore.log", stdout,
          timeout_s=criu_timeout(int(manifest.get("bytes", 0)) / 2**20))
    try:
        pid = int(boundary.read_bytes(pidfile, 32))
    except (OSError, ValueError):
        raise CheckpointRefused(f"criu restore wrote no pid to {pidfile}") from None
    if not own_child(pid):
        raise CheckpointRefused(f"criu restore named pid {pid}, which is not the tree it "
                                "restored (no child of this process): nothing is signalled")
    return pid


def stoppable(pid: object) -> bool:
    """`pid` can head a tree this helper may stop: a whole number, never 0, 1 or a negative one
    (kill's process groups and everything), nor this process."""
    return isinstance(pid, int) and not isinstance(pid, bool) and pid >= 2 and pid != os.getpid()


def own_child(pid: int) -> bool:
    """`pid` is a process (stoppable) whose parent is this process."""
    if not stoppable(pid):
        return False
    try:
        return int(stat_fields(pid)[1]) == os.getpid()
    except (OSError, IndexError, ValueError):
        return False


def take(pid: int, port: int, model: str, dest: Path, key: dict[str, str], criu: str | Criu,
         timings: Timings | None = None, token: str = "", weights: str = "host") -> dict[str, Any]:
    """Checkpoint the running instance whose tree `pid` heads into `dest`; it goes on serving.
    Its manifest (with the phases' seconds). `token`: what the instance's gate lets through (the
    restored tree's gate asks for it again, so the manifest keeps it). `weights`: host (in the
    images) or files (read again from the model's files). InstanceLost where the instance is
    left unable to serve as before: its caller must stop it."""
    if weights not in WEIGHTS:
        raise CheckpointRefused(f"weights {weights!r}: want one of {', '.join(WEIGHTS)}")
    t = timings or Timings()
    drv = Driver()
    reference = reference_answer(port, model, token=token)
    t.mark("reference")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / IMAGES).mkdir(parents=True)
    os.chmod(tmp, 0o700)
    gpus: list[int] = []
    held_memory: dict[str, dict[str, Any]] = {}
    released: dict[str, Any] = {}
    try:
        if weights == "files":
            released = dict(rpc(port, RELEASE_RPC, 60, token))
            t.mark("release")
        _post(port, "/sleep?level=1", None, 300, token)
        t.mark("sleep")
        try:
            gpus = gpu_processes(pid, drv)
            if not gpus:
                raise CheckpointRefused(f"no process of pid {pid}'s tree has a CUDA context")
            for p in gpus:
                drv.lock(p, LOCK_TIMEOUT_MS)
            for p in gpus:
                drv.checkpoint(p)
            t.mark("cuda_checkpoint")
            pids = tree(pid)
            held_memory = memory(pids)
            if held := device_files(pids):
                raise CheckpointRefused("CRIU cannot write a device file, and CUDA's checkpoint "
                                        "left these open: " + "; ".join(held))
            if holders := io_uring_holders(pids):
                raise CheckpointRefused("CRIU cannot write an io_uring, and these processes hold "
                                        "one: " + "; ".join(holders))
            # such a file is written into the images only unlinked (a ghost): CRIU's other way, a
            # link it adds beside it, is gone with the tree it leaves running and with /dev/shm
            # at a reboot; every process of the tree has opened it already
            unlink_shm_names(pids, pid)
            dump(pid, tmp / IMAGES, criu, sum(m.get("rssanon_mib", 0) + m.get("rssshmem_mib", 0)
                                              for m in held_memory.values()))
            t.mark("criu_dump")
        finally:
            # the instance serves on whatever happened above: its GPU state back, awake
            for p in gpus:
                with contextlib.suppress(Exception):
                    drv.restore(p)
                with contextlib.suppress(Exception):
                    drv.unlock(p)
            t.mark("cuda_resume")
            try:
                _post(port, WAKE[weights], None, 300, token)
            except OSError as exc:
                raise InstanceLost(f"it did not wake after its checkpoint: {exc}") from None
            t.mark("wake_up")
            if weights == "files":
                reload_or_lose(port, model, reference, token)
                t.mark("reload_weights")
        files = _files(tmp / IMAGES)
        manifest = {"schema": SCHEMA, "key": key, "pid": pid, "gpu_pids": gpus, "port": port,
                    "model": model, "reference": reference, "stdio": stdio(pid), "files": files,
                    "token": token, "weights": weights, "released": released,
                    "memory": held_memory,
                    "bytes": sum(files.values()),
                    "taken": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "phases": t.phases}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # no half-written checkpoint left behind
        raise
    return manifest


def reload(port: int, token: str) -> None:
    """Between the wake of its weights and that of its KV cache: the instance's weights read
    again from its model's files."""
    rpc(port, RELOAD_RPC, RELOAD_S, token)
    _post(port, "/wake_up?tags=kv_cache", None, 300, token)


def reload_or_lose(port: int, model: str, reference: str, token: str) -> None:
    """The instance's weights read again from its model's files, and its reference answer as
    before; InstanceLost otherwise (it must not serve)."""
    try:
        reload(port, token)
        answer = reference_answer(port, model, token=token)
    except OSError as exc:
        raise InstanceLost(f"its weights were not read back from the model's files: {exc}"
                          ) from None
    if answer != reference:
        raise InstanceLost(f"after its weights were read back from the model's files it answered "
                          f"{answer!r}, {reference!r} before")


def alive(pid: int) -> bool:
    """The pid is a process that has not exited (a zombie is its parent's to reap)."""
    try:
        return stat_fields(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_tree(pid: int, wait_s: float = 60, pids: list[int] | None = None) -> list[int]:
    """SIGKILL the tree `pid` heads (or `pids`, the tree as it was) and wait, up to `wait_s`, until
    each has exited: a restore needs every pid its checkpoint's processes had, free once their
    parent (the caller, for a tree it restored) has reaped them. The pids still running.
    ValueError for a pid that heads no tree of ours: 0, 1, a negative one (kill's process groups
    and everything), or this process."""
    for p in [pid, *(pids or [])]:
        if not stoppable(p):
            raise ValueError(f"kill_tree: pid {p!r} is no tree this helper may stop")
    pids = tree(pid) if pids is None else pids
    for p in reversed(pids):
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def restore(dest: Path, key: dict[str, str], criu: str | Criu, timings: Timings | None = None,
            stdout: int | None = None, compare: bool = True) -> int:
    """Restore the instance checkpointed at `dest`: the pid heading its tree, serving and woken,
    once it has given its reference answer again. CheckpointRefused otherwise, nothing of it
    left running. `stdout`: the descriptor the restored tree writes its output and errors to
    where they were a pipe or a socket (the restorer's own otherwise). `compare` False: the
    answer must come, not match (a server whose answers are drawn, as the lab's synthetic
    acceptance draws which draft tokens stand)."""
    t = timings or Timings()
    manifest = validate(dest, key)
    t.mark("validate")
    pid = restore_tree(dest, manifest, criu, stdout)
    t.mark("criu_restore")
    try:
        drv = Driver()
        for p in manifest["gpu_pids"]:
            drv.restore(p)
        for p in manifest["gpu_pids"]:
            drv.unlock(p)
        t.mark("cuda_restore")
        port, model = int(manifest["port"]), str(manifest["model"])
        token = str(manifest.get("token", ""))
        weights = "files" if manifest.get("weights") == "files" else "host"
        _post(port, WAKE[weights], None, 300, token)
        t.mark("wake_up")
        if weights == "files":
            reload(port, token)
            t.mark("reload_weights")
        answer = reference_answer(port, model, token=token)
        t.mark("first_answer")
        if compare and answer != manifest["reference"]:
            raise CheckpointRefused(f"the restored instance answered {answer!r}, "
                                    f"{manifest['reference']!r} before its checkpoint")
    except BaseException as exc:
        kill_tree(pid)
        if isinstance(exc, CheckpointRefused):
            raise
        raise CheckpointRefused(f"restore failed: {exc}") from None
    return pid
