"""CUDA's checkpoint API (the driver's cuCheckpointProcess* calls, what NVIDIA's
`cuda-checkpoint` tool makes), called through ctypes from another process: a running CUDA
process is locked, its GPU memory brought into its host memory and every GPU reference released
(so CRIU can write it like any other process), and later restored onto the GPU and unlocked.

Stdlib only: the image runs it with the system's Python, which has no CUDA package."""

from __future__ import annotations

import ctypes
import enum
import os
from pathlib import Path


class CudaCheckpointError(RuntimeError):
    """A checkpoint call failed: the call, the process and CUDA's error name."""


class State(enum.IntEnum):
    """CUprocessState."""
    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3


# every argument struct of the API is 64 bytes, zeroed but for the fields set
_ARGS = ctypes.c_char * 64


class Driver:
    """libcuda's checkpoint calls. Raises CudaCheckpointError when the driver lacks them."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            self._cuda = ctypes.CDLL(library)
        except OSError as exc:
            raise CudaCheckpointError(f"no CUDA driver library ({library}): {exc}") from None
        for name in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                     "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock",
                     "cuCheckpointProcessGetState"):
            if not hasattr(self._cuda, name):
                raise CudaCheckpointError(
                    f"the CUDA driver ({library}) has no {name}: CUDA's checkpoint API needs "
                    "driver 550 or newer")
        rc = self._cuda.cuInit(0)
        if rc:
            raise CudaCheckpointError(f"cuInit: {self._name(rc)}")

    def _name(self, rc: int) -> str:
        s = ctypes.c_char_p()
        self._cuda.cuGetErrorName(rc, ctypes.byref(s))
        return s.value.decode() if s.value else f"CUresult {rc}"

    def _call(self, name: str, pid: int, *args: object) -> None:
        rc = getattr(self._cuda, name)(ctypes.c_int(pid), *args)
        if rc:
            raise CudaCheckpointError(f"{name}(pid {pid}): {self._name(rc)}")

    def state(self, pid: int) -> State:
        st = ctypes.c_int(-1)
        self._call("cuCheckpointProcessGetState", pid, ctypes.byref(st))
        return State(st.value)

    def lock(self, pid: int, timeout_ms: int) -> None:
        """Wait (up to timeout_ms) for the process's CUDA work to finish, and block new work."""
        args = _ARGS()
        ctypes.c_uint.from_buffer(args, 0).value = timeout_ms
        self._call("cuCheckpointProcessLock", pid, ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", pid, None)

    def restore(self, pid: int) -> None:
        self._call("cuCheckpointProcessRestore", pid, None)

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", pid, None)

    def is_cuda(self, pid: int) -> bool:
        """Whether the process has a CUDA context the driver can checkpoint."""
        try:
            self.state(pid)
        except CudaCheckpointError:
            return False
        return True


def stat_fields(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """The fields of the process's stat after its command (which may hold anything): its state,
    its parent's pid, ... OSError where there is no such process."""
    return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def tree(root: int, proc: Path = Path("/proc")) -> list[int]:
    """`root` and every process below it, parents first."""
    children: dict[int, list[int]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int(stat_fields(int(d.name), proc)[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return out


def gpu_processes(root: int, driver: Driver) -> list[int]:
    """The processes of `root`'s tree that hold a CUDA context."""
    return [p for p in tree(root) if p != os.getpid() and driver.is_cuda(p)]
