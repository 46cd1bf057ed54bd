"""Root's boundary with the service user: every open, write, chown and remove that a root helper
(seal, install, check, inspect, precompile, the checkpoint helper) makes where another user could
plant a link, a hard link or a FIFO goes through here.

Two rules, after systemd-tmpfiles' refusal of unsafe path transitions and the common practice of
privileged daemons:
- Work inside a folder another user owns (the instance cache, /var/cache/inference-image) is done
  *as that user*: in a child process that has given root up (no supplementary groups, the
  folder's group, then its user) before it touches a path there. A link it follows, a hard link
  it writes through, a file it chowns can then reach only what that user could reach anyway.
- Root's own state (checkpoints, their take records, the word to a start, its gate's flag) lives
  in root-owned folders and is opened without following a link, never blocking on a FIFO, and
  checked to be a regular file; it is written beside its name (O_EXCL) and renamed into place.

Stdlib only (the image runs it with the system's Python)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .inputs import parse_json

T = TypeVar("T")
# what a child's answer may hold (a bundle's manifest: up to its own bound, with room for JSON)
MAX_ANSWER = 256 * 2**20


class BoundaryError(OSError):
    """A path root was asked to act on is not what it must be (a link, a FIFO, not a folder...),
    or the work done as its owner failed in a way its caller does not name."""


def folder_owner(folder: Path) -> tuple[int, int]:
    """(uid, gid) of `folder`, which must be a folder itself, not a link to one."""
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise BoundaryError(f"{folder}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BoundaryError(f"{folder}: not a folder (a link or a file stands there): refused")
    return st.st_uid, st.st_gid


def user_ids(name: str) -> tuple[int, int]:
    """(uid, gid) of the user called `name`; BoundaryError if there is none."""
    import pwd
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise BoundaryError(f"--owner {name}: no such user") from None
    return pw.pw_uid, pw.pw_gid


def as_user(uid: int, gid: int, fn: Callable[..., T], *args: Any,
            errors: tuple[type[Exception], ...] = (), **kwargs: Any) -> T:
    """fn(*args, **kwargs) run as `uid`:`gid` (no other groups) in a child process, when this one
    is root and `uid` is not; here otherwise. Its result must be JSON (a tuple comes back as a
    list). An exception of a class in `errors` is raised again here with its message; any other
    as BoundaryError naming its class."""
    if os.geteuid() != 0 or uid == 0:
        return fn(*args, **kwargs)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: root given up for good before anything else is touched
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            answer: dict[str, Any] = {"ok": fn(*args, **kwargs)}
        except BaseException as exc:
            answer = {"error": type(exc).__name__, "message": str(exc)}
        try:
            data = json.dumps(answer).encode()
            while data:
                data = data[os.write(w, data):]
        except BaseException:
            code = 1
        os._exit(code)
    os.close(w)
    chunks, size = [], 0
    with os.fdopen(r, "rb") as fh:
        while block := fh.read(1 << 20):
            size += len(block)
            if size > MAX_ANSWER:
                break
            chunks.append(block)
    _, status = os.waitpid(pid, 0)
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        raise BoundaryError(f"the work done as uid {uid} gave no answer (exit status "
                            f"{status})") from None
    if "error" in answer:
        for cls in errors:
            if cls.__name__ == answer["error"]:
                raise cls(answer["message"])
        raise BoundaryError(f"{answer['error']}: {answer['message']} (as uid {uid})")
    return answer["ok"]  # type: ignore[no-any-return]


def as_owner_of(folder: Path, fn: Callable[..., T], *args: Any,
                errors: tuple[type[Exception], ...] = (), **kwargs: Any) -> T:
    """fn run as the user who owns `folder` (module doc): what root does inside another user's
    folder, it does as that user."""
    uid, gid = folder_owner(folder)
    return as_user(uid, gid, fn, *args, errors=errors, **kwargs)


def make_owned_folder(folder: Path, ids: tuple[int, int] | None, mode: int = 0o750) -> None:
    """`folder` made if missing (its parent is root's) and, with `ids`, given to that user: the
    folder itself, never a link standing in its place."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(parents=True, mode=mode)
    folder_owner(folder)  # a folder, not a link
    if ids is not None:
        os.chown(folder, *ids, follow_symlinks=False)


# ---- root's own state, in root's folders ------------------------------------------------------

def open_regular(path: Path, flags: int = os.O_RDONLY, follow: bool = False,
                 mode: int = 0o600) -> int:
    """A descriptor of `path` opened without blocking on a FIFO and, unless `follow` (a path root
    itself was given), without following a link; BoundaryError where it is anything but a
    regular file."""
    try:
        fd = os.open(path, flags | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | os.O_CLOEXEC,
                     mode)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last part is a link
            raise BoundaryError(f"{path}: a link stands there: refused") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BoundaryError(f"{path}: not a regular file (a FIFO, a device or a folder): "
                            "refused")
    return fd


@contextlib.contextmanager
def locked(path: Path) -> Any:
    """An exclusive flock on `path` (a regular file made if missing, never a link followed or a
    FIFO opened, which would block the program before it asks for the lock), for the block's
    length."""
    import fcntl
    fd = open_regular(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """A regular file's bytes (open_regular), BoundaryError past `max_bytes`."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BoundaryError(f"{path}: larger than {max_bytes} bytes: refused")
    return data


def read_json(path: Path, max_bytes: int) -> Any:
    """A JSON file read as read_bytes reads it, through the one JSON reader (inputs.parse_json:
    depth, finite numbers); ValueError for what is not JSON."""
    return parse_json(read_bytes(path, max_bytes).decode(), str(path))


def write_file(path: Path, data: bytes, mode: int = 0o644,
               ids: tuple[int, int] | None = None) -> None:
    """`data` written whole at `path`: into a new file beside it (created, never opened through
    a link), given `ids` and `mode` through its descriptor, then renamed over `path`."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if ids is not None:
                os.fchown(fh.fileno(), *ids)
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove(path: Path) -> None:
    """`path` removed: a file or link unlinked (never followed), a folder removed with what it
    holds (shutil's descriptor-based walk, which follows no link)."""
    import shutil
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
