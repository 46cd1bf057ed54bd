"""inference-run UNIT: run one rendered unit (its PATHS["units"]/UNIT.env and UNIT.args) in the
foreground, as vllm@'s and vllm-router's ExecStart.

Without systemd (a container, the GPU machine) run it from a render directory, overriding what
differs there, e.g.:
    INFERENCE_ROOT=build/h100 INFERENCE_PYTHON=python3 MODEL_PATH=/tmp/model \\
      INFERENCE_EXTRA_ARGS="--load-format dummy" inference-run vllm-0
Variables already set win over UNIT.env; INFERENCE_EXTRA_ARGS is appended to the command line;
INFERENCE_DRY_RUN=1 prints the command instead of running it.

`inference-run --leave UNIT` (vllm@'s ExecStop): on a fleet worker, the router stops sending to the
instance and it finishes what it serves (inference-join --leave); elsewhere nothing.
`inference-run --seal UNIT [--owner USER]` (a build that served on the tier's own GPU): the cache
as its starts left it becomes a warm-cache bundle, keyed as this unit's start computes its key."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import boundary, join, rendered
from .contract import ENV, FLEET_ROUTER_UNIT, NODE_UNIT_SUFFIX
from .inputs import printable

USAGE = "usage: inference-run [--leave|--seal] UNIT"
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
CHECK_TIMEOUT_S = 120


class Refused(Exception):
    """The start cannot go on: one line, and the exit status."""

    def __init__(self, msg: str, code: int = 2) -> None:
        super().__init__(msg)
        self.code = code


def startup(*args: str) -> list[str]:
    """inference-startup's command line, run by this package's own Python."""
    return [sys.executable, "-m", "inference_machine", *args]


def detach(argv: list[str]) -> None:
    """Start `argv` beside this start and let go of it: a helper that outlives this process's exec
    of vLLM is handed to systemd (or init) to reap, as vLLM would not (the double fork)."""
    pid = os.fork()
    if pid == 0:
        try:
            subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr,
                             start_new_session=False)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def expand(line: str, unit: str) -> str:
    """Each ${VAR} of an arguments line; an unset VAR stops the start rather than passing ""."""
    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in os.environ:
            raise Refused(f"{unit}.args uses ${{{name}}}, which is not set")
        return os.environ[name]
    return VAR.sub(value, line)


def load_env(units: Path, unit: str) -> None:
    """UNIT.env into this process's environment; a variable already set wins."""
    for key, value in rendered.env_lines(units / f"{unit}.env"):
        os.environ.setdefault(key, value)


def argv_of(units: Path, unit: str) -> list[str]:
    argv = [expand(line, unit) for line in rendered.arg_lines(units / f"{unit}.args")]
    return argv + os.environ.get(ENV.extra_args, "").split()


def flag(argv: list[str], name: str) -> str:
    """The value after `name` on the command line ('' without one)."""
    return next((b for a, b in itertools.pairwise(argv) if a == name), "")


def multi_node(unit: str, role: str, doc: dict[str, Any]) -> str:
    """A head's or a node's start of an instance over several machines (serving.nodes): the
    group's addresses exported for vLLM (it would guess them from the default route, the public
    one); the unit a node runs (its stage, headless)."""
    nodes = rendered.setting(doc, "serving.nodes", 1)
    if role not in ("head", "node"):
        raise Refused(f"{unit} spans {nodes} machines (serving.nodes) and this machine's fleet "
                      f"file ({rendered.here('fleet')}, from user-data) does not say head or node: "
                      "make the machines with `inference-image fleet up`")
    group = join.group()
    if group is None:
        raise Refused(f"{unit}: this machine's place in its group is unknown (above)")
    rank, head, addr, ifname = group
    os.environ.update({ENV.node_rank: rank, ENV.head: head,
                       ENV.node_addr: addr, "VLLM_HOST_IP": addr,
                       "GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": ifname})
    return unit + NODE_UNIT_SUFFIX if role == "node" else unit


def cpu_slice() -> None:
    """Instance i of k (INFERENCE_CPU_SLICE=i/k) takes the i-th k-th of this machine's cores."""
    spec = os.environ.get(ENV.cpu_slice, "")
    if not spec or os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return
    i, _, k = spec.partition("/")
    if not (i.isdigit() and k.isdigit() and int(k) > 0):
        raise Refused(f"{ENV.cpu_slice}={spec!r} is not i/k")
    n = os.cpu_count() or 1
    lo, hi = int(i) * n // int(k), (int(i) + 1) * n // int(k) - 1
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"{lo}-{max(hi, lo)}"


def room_for_caches(unit: str, doc: dict[str, Any]) -> None:
    """A full disk under the caches fails here, with its cause, not minutes later mid-compile."""
    tmp = os.environ.get("TMPDIR")
    if not tmp:
        return
    Path(tmp).mkdir(parents=True, exist_ok=True)
    need = int(doc["limits"]["min_cache_free_mib"])
    free = shutil.disk_usage(tmp).free // 2**20
    if free < need:
        raise Refused(f"{unit}: No space left for vLLM's compile cache and temporary files: "
                      f"{free} MiB free in {tmp}, {need} MiB needed. Free some space or grow the "
                      "disk", 1)


def checkpoint_word(unit: str, units: Path, doc: dict[str, Any]) -> str:
    """serving.checkpoint: the root helper beside this start (vllm@'s ExecStartPre starts it;
    without systemd, as root, this does) restores the instance's checkpoint into it or lets it
    start cold, and says which in one word for this process: "PID restored HEAD" or "PID cold
    TOKEN". The restored head's pid to follow, or ''."""
    run = rendered.here("checkpoint_run")
    pid = os.getpid()
    if not os.environ.get("INVOCATION_ID") and os.geteuid() == 0:
        # a word left by another start (a container restarted gives a process the same pid) is
        # gone before the helper starts: only the helper's word for this start is read (under
        # systemd the unit's ExecStartPre removes it before this process exists)
        for left in (f"{unit}.word", f"{unit}.open"):
            boundary.remove(run / left)
        detach(startup("checkpoint", unit, "--pid", str(pid), "--units", str(units),
                       "--store", str(rendered.here("checkpoints")), "--run", str(run),
                       "--criu", os.environ.get(ENV.criu, doc["paths"]["criu"])))
    wait_s = float(doc["limits"]["checkpoint_word_s"])
    word: list[str] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            word = (run / f"{unit}.word").read_text().split()
        except (OSError, UnicodeDecodeError):
            word = []
        if word[:1] == [str(pid)]:
            break
        word = []
        time.sleep(0.1)
    if word[1:2] == ["restored"] and len(word) > 2:
        return word[2]
    if word[1:2] == ["cold"] and len(word) > 2 and word[2] != "-":
        # the plugin's gate answers 503 to all but the helper until it has taken the checkpoint
        os.environ[ENV.checkpoint_token] = word[2]
        os.environ[ENV.checkpoint_gate] = str(run / f"{unit}.open")
    elif not word:
        warn(f"{unit}: no word from its checkpoint helper in {wait_s:.0f} s: it starts without a "
             "checkpoint")
    return ""


def warm_cache_check() -> None:
    """An instance's start: a warm-cache bundle under the cache root is kept only if it is this
    machine's (one line to the journal either way; it never stops the start); with
    serving.page_cache_prefetch, what the build recorded that a start reads is read now, in the
    background, while Python imports (its one line goes to the journal too)."""
    if os.environ.get(ENV.prefetch) == "1":
        detach(startup("prefetch"))
    try:
        subprocess.run(startup("check", "--cache", os.environ[ENV.cache],
                               "--profile-json", str(rendered.here("profile_json"))),
                       stdin=subprocess.DEVNULL, stdout=sys.stderr, timeout=CHECK_TIMEOUT_S,
                       check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        warn(f"the warm-cache check did not end ({exc}); starting")


def notify_argv(port: str, served: str, role: str, doc: dict[str, Any]) -> list[str]:
    """The helper beside a Type=notify unit (vllm@): systemd hears that the instance started once
    its /health answers; a head or node also watches the other stages. It waits a few seconds
    after READY=1 because systemd attributes the message by the sender's cgroup, which a process
    that has exited has not."""
    limits = doc["limits"]
    watch = {"head": "head",
             "node": f"node:{os.environ.get(ENV.head, '')}:"
                     f"{rendered.setting(doc, 'serving.node_port', '')}"}.get(role, "")
    return startup("notify", port, f"--watch={watch}", "--pid", str(os.getpid()),
                   f"--model={served}", "--stall-s", str(limits["stall_s"]),
                   "--probe-every-s", str(limits["stall_probe_every_s"]),
                   "--poll-s", str(limits["stall_poll_s"]),
                   "--stop-timeout-s", str(limits["stop_timeout_s"]))


def warn(msg: str) -> None:
    print(f"inference-run: {printable(msg)}", file=sys.stderr, flush=True)


def start(mode: str, unit: str, rest: list[str]) -> int:
    doc = rendered.profile()
    units = rendered.here("units")
    role = join.role() if join.has_file(rendered.here("fleet")) else "none"
    if mode == "leave" and role != "worker":
        return 0
    if role == "worker" and not os.environ.get(ENV.host):
        # a worker's instances serve the fleet's router on another machine (the firewall lets that
        # router in and no one else)
        os.environ[ENV.host] = "0.0.0.0"
    elif role == "router" and unit == "router":
        unit = FLEET_ROUTER_UNIT
    if (mode == "run" and rendered.setting(doc, "serving.nodes", 1) > 1
            and unit.startswith("vllm-") and not unit.endswith(NODE_UNIT_SUFFIX)):
        unit = multi_node(unit, role, doc)
    if not (units / f"{unit}.env").is_file() or not (units / f"{unit}.args").is_file():
        have = sorted(p.stem for p in units.glob("*.args")) if units.is_dir() else []
        raise Refused(f"no unit {unit!r} in {units} (have: {' '.join(have)})")
    load_env(units, unit)
    if mode == "seal":
        from .cli import main as startup_main
        cache = os.environ.get(ENV.cache)
        if not cache:
            raise Refused(f"{unit}.env sets no {ENV.cache}")
        return startup_main(["seal", "--cache", cache, "--profile-json",
                             str(rendered.here("profile_json")), *rest])
    cpu_slice()
    if mode == "run":
        room_for_caches(unit, doc)
    argv = argv_of(units, unit)
    port, served = flag(argv, "--port"), flag(argv, "--served-model-name")
    if mode == "leave":
        # no --port: nothing a router could know it by
        return join.main(["--leave", port]) if port else 0
    if os.environ.get(ENV.dry_run) == "1":
        print(shlex.join(argv))
        return 0
    follow = ""
    if rendered.setting(doc, "serving.checkpoint", False) and os.environ.get(
            ENV.checkpoint) == "1":
        follow = checkpoint_word(unit, units, doc)
    if not follow and os.environ.get(ENV.cache):
        warm_cache_check()
    # a fleet worker's instance (it serves a model) starting again: the join may add it back once
    # it answers. The router's user cannot reach the instances' caches, and has nothing there.
    if port and served:
        with_leaving = rendered.here("leaving") / port
        with contextlib.suppress(OSError):
            with_leaving.unlink(missing_ok=True)
    if os.environ.get("NOTIFY_SOCKET"):
        detach(notify_argv(port, served, role, doc))
    sys.stdout.flush()
    sys.stderr.flush()
    if follow:
        # the restored instance is not this process's child: this stands for it as the unit's main
        # process, handing it the stop signals, until it exits
        os.execv(sys.executable, startup("follow", follow))
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        raise Refused(f"{unit}: cannot run {argv[0]}: {exc}", 1) from None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    mode = "run"
    if args[:1] in (["--leave"], ["--seal"]):
        mode, args = args[0][2:], args[1:]
    if not args or not args[0]:
        print(USAGE, file=sys.stderr)
        return 2
    unit, rest = args[0], args[1:]
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9@._-]{0,99}", unit):
        warn(f"{unit!r} is no unit name (letters, digits, @ . _ -)")
        return 2
    try:
        return start(mode, unit, rest)
    except Refused as exc:
        warn(str(exc))
        return exc.code
    except rendered.RenderedError as exc:
        warn(str(exc))
        return 2
    except OSError as exc:
        # a full or read-only disk under the caches, a folder where a file goes: one line
        where = f" ({exc.filename})" if exc.filename else ""
        warn(f"{unit}: cannot start: {exc.strerror or exc}{where}. Fix: the cause named; "
             "systemd starts the unit again")
        return 1


if __name__ == "__main__":
    sys.exit(main())
