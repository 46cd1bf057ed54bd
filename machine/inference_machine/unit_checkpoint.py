"""An instance's unit and its checkpoint (serving.checkpoint): the root helper beside each start,
and the follower that stands for a restored instance as its unit's main process.

At each start of vllm@X, its ExecStartPre starts inference-checkpoint@X (root), which finds the
start's main process (inference-run, sandboxed, unprivileged, waiting) and says one word to it,
in a file only that process's user reads:

- `PID restored HEAD`: the checkpoint was this machine's, CRIU restored its processes inside the
  start's mount namespace and cgroup, CUDA their GPU state, vLLM woke, and the instance gave its
  reference answer again; inference-run becomes `inference-startup follow HEAD`.
- `PID cold TOKEN`: there was none, or it was refused (one line saying why; a refused one is
  removed). inference-run starts vLLM with its gate closed to everything but TOKEN; once it
  answers, the helper opens the gate, so the first answer comes as soon as it would without
  checkpoints. At the instance's first idle moment (no client's request inside it for IDLE_S) the
  helper shuts the gate again (requests meanwhile get 503 with Retry-After, which the router
  holds), drains what is inside, takes the checkpoint and opens the gate: nothing of a client's
  request is in it. A request still inside after DRAIN_S abandons that try, the gate open at
  once, for the next idle moment. A take that leaves the instance unable to serve as before (its
  weights not read back from its files) stops it, and is not tried again under the same key: the
  unit's restart serves cold.

Without systemd (a container, the GPU machine) inference-run, as root, starts the helper itself
with --pid. Stdlib only."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import boundary, checkpoint
from .bounded_http import fetch
from .bundle import BundleError
from .checkpoint import CheckpointRefused, Criu, Timings
from .contract import ENV
from .inputs import printable

# how long the helper waits for the start's main process to exist, and for a cold start to answer
MAIN_PID_WAIT_S = 60.0
# an idle moment: no client's request inside the instance for this long (the take waits for one)
IDLE_S = 3.0
# once the gate shuts, how long requests already inside may take to end before the take is
# abandoned for the next idle moment (a long generation is not cut short for a checkpoint)
DRAIN_S = 5.0
POLL_S = 0.25
# the gate's count unanswered this many times in a row: it has none, so no take
UNANSWERED_MAX = 3
WORD = "{instance}.word"
GATE_OPEN = "{instance}.open"
# beside the checkpoints: a take that stopped its instance, with the key it was taken under
TAKE_FAILED = "{instance}.take-failed.json"
PIDFD_GETFD = 438  # the system call's number, the same on every architecture Linux has
# an instance's name as the render writes one (vllm-0, router): no path, nothing to expand
INSTANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_UNIT_FILE = 1 << 20


class NotHere(CheckpointRefused):
    """This start cannot use a checkpoint (no CRIU, no key): the checkpoint is kept as it is."""


def instances(units: Path) -> set[str]:
    """The render's closed set of instances: each name with both of its unit files."""
    return {p.stem for p in units.glob("*.args")
            if INSTANCE.fullmatch(p.stem) and p.with_suffix(".env").is_file()}


def checked_instance(units: Path, instance: str) -> str:
    """`instance` if the render made it; ValueError (one line) otherwise."""
    if not INSTANCE.fullmatch(instance) or instance not in instances(units):
        raise ValueError(f"instance {instance[:80]!r} is not one of the render's "
                         f"({', '.join(sorted(instances(units))) or 'none'} in {units})")
    return instance


def usable_criu(criu_bin: str) -> str:
    """The CRIU binary as a path root may run: a regular, executable file that root owns and no
    one else can write. NotHere otherwise (nothing is removed for it)."""
    path = shutil.which(criu_bin)
    if path is None:
        raise NotHere(f"no CRIU at {criu_bin}")
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022 or \
            not os.access(path, os.X_OK):
        raise NotHere(f"CRIU at {path} is not an executable file of root's alone")
    return path


def say(instance: str, text: str) -> None:
    print(printable(f"inference-checkpoint: {instance}: {text}"), file=sys.stderr, flush=True)


def unit_env(units: Path, instance: str) -> dict[str, str]:
    """The unit's environment file as inference-run reads it (KEY=VALUE lines, # comments)."""
    env = {}
    for line in boundary.read_bytes(units / f"{instance}.env", MAX_UNIT_FILE).decode() \
            .splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key] = value
    return env


def port_and_model(units: Path, instance: str) -> tuple[int, str]:
    """The instance's --port and --served-model-name, from its arguments file."""
    args = [a for a in boundary.read_bytes(units / f"{instance}.args", MAX_UNIT_FILE).decode()
            .splitlines() if a and not a.startswith("#")]
    found = {flag: args[i + 1] for i, flag in enumerate(args[:-1])
             if flag in ("--port", "--served-model-name")}
    if "--port" not in found or "--served-model-name" not in found:
        raise ValueError(f"{instance}.args names no --port or --served-model-name")
    return int(found["--port"]), found["--served-model-name"]


def main_pid(instance: str, wait_s: float = MAIN_PID_WAIT_S) -> int:
    """vllm@INSTANCE's main process, once systemd has started it (0 if it did not in time)."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value",
                              f"vllm@{instance}.service"], capture_output=True, text=True,
                             check=False).stdout.strip()
        if out.isdigit() and int(out) > 0:
            return int(out)
        if time.monotonic() >= deadline:
            return 0
        time.sleep(0.2)


def root_folder(run: Path) -> Path:
    """`run`, made if missing, as a folder of root's that no one else can write (root's own
    state lives there: boundary's rule); BoundaryError otherwise."""
    try:
        run.mkdir(parents=True, exist_ok=True, mode=0o755)
        st = os.lstat(run)
    except OSError as exc:
        raise boundary.BoundaryError(f"{run}: {exc.strerror or exc}: refused") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise boundary.BoundaryError(f"{run}: not a folder of this user's alone: refused")
    return run


def write_word(run: Path, instance: str, pid: int, word: str) -> None:
    """The word for main process `pid`, readable by that process's user alone (a cold word
    holds the gate's token), written whole. Its reader is asked of the process itself, not of a
    file the unit names: whatever the unit's files say (or lack), the start can read its word."""
    boundary.write_file(root_folder(run) / WORD.format(instance=instance),
                        f"{pid} {word}\n".encode(), 0o400, checkpoint.process_ids(pid))


def open_gate(run: Path, instance: str) -> None:
    boundary.write_file(root_folder(run) / GATE_OPEN.format(instance=instance), b"")


def answers(port: int, token: str) -> bool:
    with contextlib.suppress(OSError):
        return fetch(f"http://127.0.0.1:{port}/health", deadline_s=5,
                     headers={checkpoint.GATE_HEADER: token}).status == 200
    return False


def shut_gate(run: Path, instance: str) -> None:
    boundary.remove(root_folder(run) / GATE_OPEN.format(instance=instance))


def inflight(port: int, token: str) -> int | None:
    """The clients' requests inside the instance, as its gate counts them (None: no answer)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        a = fetch(f"http://127.0.0.1:{port}{checkpoint.GATE_STATE}", deadline_s=5,
                  headers={checkpoint.GATE_HEADER: token})
        if a.status == 200:
            return int(json.loads(a.body)["inflight"])
    return None


def quiet_for(port: int, token: str, pid: int, quiet_s: float) -> bool:
    """Until no client's request has been inside the instance for `quiet_s` seconds; False if its
    process went first."""
    since: float | None = None
    unanswered = 0
    while checkpoint.alive(pid):
        now = time.monotonic()
        n = inflight(port, token)
        # an instance whose gate does not say what is inside cannot be drained: no take
        unanswered = unanswered + 1 if n is None else 0
        if unanswered >= UNANSWERED_MAX:
            return False
        if n == 0:
            since = now if since is None else since
            if now - since >= quiet_s:
                return True
        else:
            since = None
        time.sleep(POLL_S)
    return False


def drained(port: int, token: str, wait_s: float) -> bool:
    """Until no client's request is inside the instance, within `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if inflight(port, token) == 0:
            return True
        time.sleep(POLL_S)
    return inflight(port, token) == 0


def take_when_idle(instance: str, run: Path, port: int, token: str, pid: int,
                   take: Callable[[], None], idle_s: float = IDLE_S,
                   drain_s: float = DRAIN_S) -> int:
    """The take at the instance's first idle moment, behind its shut gate (module doc): the
    tries a request abandoned before the one that ran; -1 if the instance went first."""
    abandoned = 0
    while quiet_for(port, token, pid, idle_s):
        shut_gate(run, instance)
        try:
            if not drained(port, token, drain_s):
                abandoned += 1
                say(instance, "a request was still inside as the gate shut: the take waits for "
                    "the next idle moment")
                continue
            take()
            return abandoned
        finally:
            open_gate(run, instance)
    return -1


def wait_answering(port: int, token: str, pid: int, wait_s: float) -> bool:
    """Until the cold start answers /health through its gate; False if its process went first or
    it did not in time."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and checkpoint.alive(pid):
        if answers(port, token):
            return True
        time.sleep(1)
    return False


def main_stream(pid: int) -> int:
    """A descriptor of the main process's standard error (its journal stream under systemd), for
    the restored tree to write to, as the instance did (pidfd_getfd); this process's own where
    the kernel refuses."""
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.syscall(PIDFD_GETFD, pidfd, 2, 0)
            if fd >= 0:
                return int(fd)
        finally:
            os.close(pidfd)
    return sys.stderr.fileno()


def take_failed(store: Path, instance: str, key: dict[str, str]) -> str:
    """Why a take of the instance stopped it before under this key ("" if none did)."""
    try:
        said = boundary.read_json(store / TAKE_FAILED.format(instance=instance), 1 << 20)
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as exc:
        return f"its record cannot be read ({exc})"
    return str(said.get("why", "?")) if isinstance(said, dict) and said.get("key") == key else ""


def note_take_failed(store: Path, instance: str, key: dict[str, str], why: str) -> None:
    boundary.write_file(root_folder(store) / TAKE_FAILED.format(instance=instance),
                        json.dumps({"key": key, "why": why}).encode(), 0o600)


def phases_line(phases: list[tuple[str, float]]) -> str:
    return ", ".join(f"{name} {s:.1f} s" for name, s in phases)


def helper(instance: str, units: Path, store: Path, run: Path, criu_bin: str,
           pid: int = 0, start_timeout_s: float = 1800.0) -> int:
    """The root helper beside one start of the instance (module doc). Always says a word to a
    main process it found; exit 0 unless it found none."""
    try:
        instance = checked_instance(units, instance)
    except ValueError as exc:
        say(instance[:80], f"refused: {exc}")
        # a name of the render's shape whose unit files are missing: its start is still told to
        # start without a checkpoint, rather than left to wait for a word
        if INSTANCE.fullmatch(instance) and (pid or (pid := main_pid(instance))):
            with contextlib.suppress(OSError):
                write_word(run, instance, pid, "cold -")
        return 2
    systemd = not pid
    pid = pid or main_pid(instance)
    if not pid:
        say(instance, f"no main process of vllm@{instance} after {MAIN_PID_WAIT_S:.0f} s: "
            "nothing to restore or take")
        return 1
    try:
        for stale in (WORD, GATE_OPEN):
            boundary.remove(root_folder(run) / stale.format(instance=instance))
        return _helper(instance, units, store, run, criu_bin, pid, systemd, start_timeout_s)
    except OSError as exc:
        # the word's folder or the main process itself is not what it must be: said once; the
        # start waits its word's time, then starts without a checkpoint
        say(instance, f"says nothing to the start ({exc}); it starts without a checkpoint once "
            "its wait for a word ends")
        return 1


def _helper(instance: str, units: Path, store: Path, run: Path, criu_bin: str, pid: int,
            systemd: bool, start_timeout_s: float) -> int:
    try:
        env = unit_env(units, instance)
        if not systemd:  # started by inference-run: its environment, overrides and all
            env.update({k: os.environ[k] for k in env if k in os.environ})
        port, model = port_and_model(units, instance)
        cache = Path(env[ENV.cache])
    except (OSError, ValueError, KeyError) as exc:
        say(instance, f"starts without a checkpoint: its unit files do not say where it serves "
            f"({exc})")
        write_word(run, instance, pid, "cold -")
        return 0
    # the key reads the instance's environment as inference-run exports it (its GPUs, its vLLM,
    # its models)
    os.environ.update(env)
    # CRIU works inside the start's namespaces (its sandbox) and, under systemd, puts what it
    # restores into the start's cgroup (the unit's)
    criu = Criu.in_start(criu_bin, pid, cgroups=systemd)
    profile_json = units.parent / "profile.json"
    dest = store / instance
    try:
        key = checkpoint.checkpoint_key(cache, profile_json if profile_json.is_file() else None,
                                        units, instance, criu_bin)
    except (OSError, ValueError, BundleError) as exc:
        key = {}
        say(instance, f"no checkpoint key ({exc})")
    t = Timings()
    criu_ok = False
    try:
        # what this start lacks is checked before the checkpoint is read: it is kept for a
        # start that has them
        if not key:
            raise NotHere("no key")
        usable_criu(criu_bin)
        criu_ok = True
        head = checkpoint.restore(dest, key, criu, t, stdout=main_stream(pid))
    except Exception as exc:  # whatever went wrong, the start goes on cold, saying why
        why = str(exc) if isinstance(exc, CheckpointRefused) else \
            f"restore failed: {type(exc).__name__}: {exc}"
        if os.path.lexists(dest) and not isinstance(exc, NotHere) and \
                not why.startswith("no checkpoint at"):
            # a link in the checkpoint's place is unlinked, what it points to left alone (root
            # removes nothing through a link): said as what was done
            why += "; the link in its place unlinked, what it points to left as it is" if \
                os.path.islink(dest) else "; removed"
            boundary.remove(dest)
        say(instance, f"starts without its checkpoint: {why}")
    else:
        open_gate(run, instance)
        write_word(run, instance, pid, f"restored {head}")
        say(instance, f"restored in {sum(s for _, s in t.phases):.1f} s, its reference answer "
            f"as before ({phases_line(t.phases)}); head pid {head}")
        return 0
    token = secrets.token_hex(16)
    write_word(run, instance, pid, f"cold {token}")
    try:
        if not key or not criu_ok:
            return 0  # nothing to take one with: the gate opens at once
        if not wait_answering(port, token, pid, start_timeout_s):
            say(instance, "the start did not answer: no checkpoint taken")
            return 0
        if failed := take_failed(store, instance, key):
            say(instance, f"serves without a checkpoint: a take under this key stopped the "
                f"instance before ({failed[:300]})")
            return 0
    finally:
        open_gate(run, instance)  # clients first: the take waits for an idle moment

    def take() -> None:
        t = Timings()
        try:
            m = checkpoint.take(pid, port, model, dest, key, criu, t, token=token,
                                weights=env.get(ENV.checkpoint_weights, "host"))
        except checkpoint.InstanceLost as exc:
            # it must not serve: stopped, its unit's restart serves cold, with no take
            note_take_failed(store, instance, key, str(exc))
            checkpoint.kill_tree(pid)
            say(instance, f"stopped: the checkpoint's take left it unable to serve as before "
                f"({str(exc)[:600]}); its next start serves without a checkpoint")
        except Exception as exc:  # the instance serves on whatever happened
            say(instance, f"serves without a checkpoint: taking one failed: {str(exc)[:600]}")
        else:
            left = m.get("released") or {}
            say(instance, f"checkpoint taken at an idle moment, behind the shut gate: "
                f"{m['bytes'] / 2**20:,.0f} MiB in {len(m['files'])} files "
                f"({phases_line(t.phases)})" + (
                    f"; {left.get('bytes', 0) / 2**20:,.0f} MiB of weights left to the model's "
                    f"files, read again at each wake" if m.get("weights") == "files" else ""))

    say(instance, "serves; its checkpoint is taken at its first idle moment")
    if take_when_idle(instance, run, port, token, pid, take) < 0:
        say(instance, "serves without a checkpoint: its process ended, or its gate did not say "
            "what is inside, before an idle moment")
    return 0


def follow(pid: int) -> int:
    """Stand for the restored instance whose tree `pid` heads (not this process's child): its
    stop signals go to it, and this returns once it has exited (1 unless it was asked to stop)."""
    try:
        fd = os.pidfd_open(pid)
        os.kill(pid, 0)  # may this process signal it (its stop must reach the instance)
    except PermissionError:
        print(f"inference-startup: follow: process {pid} is another user's: this process cannot "
              "signal it, so its unit could not stop it. Fix: the restored instance runs as the "
              "unit's user", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"inference-startup: follow: no process {pid} ({exc})", file=sys.stderr)
        return 1
    stopped = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopped
        stopped = stopped or signum in (signal.SIGTERM, signal.SIGINT)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    while not select.select([fd], [], [], None)[0]:
        pass
    print(f"inference-startup: the restored instance (pid {pid}) exited", file=sys.stderr,
          flush=True)
    return 0 if stopped else 1


# what the lab reads of a start's helper (its lines to the journal or the server's log)
SAID = re.compile(r"inference-checkpoint: \S+: (?P<what>restored in|starts without|checkpoint "
                  r"taken|serves without|the start did not|stopped: )")


def said(lines: list[str]) -> list[str]:
    return [line[line.index("inference-checkpoint:"):] for line in lines if SAID.search(line)]

