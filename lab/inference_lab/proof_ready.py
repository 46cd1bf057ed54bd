"""The `ready` step: how long a server takes from its process start to its first answer, and
where that time goes, cold, warm and from a warm-cache bundle; the Runner takes it from this
mixin.

A start's moments are the first log lines that mark them (inference_machine.MOMENTS, the
same reading the image's first boot logs), timed by this process's clock as the lines arrive.
Every start gets a home of its own, so no cache outside the instance cache (~/.cache, ~/.triton,
CUDA's JIT cache) carries over unless it is listed; what a cold start wrote outside the cache
root is recorded. `cold` and `bundle` starts drop the page cache first where the kernel lets
them (a new machine has read nothing yet) and say whether it did.

With `image_paths` the server runs from the image's own paths: vLLM's packages linked into a
virtualenv at the image's vLLM venv, the stand-in models at the image's model paths, the caches
at the image's cache root. vLLM's compile hash reads the source paths it traced and the model
path, so only a bundle made this way loads on an image.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import inference_machine as startup
from inference_image.render import NATIVE_SAMPLER, PATHS, model_path
from inference_machine import checkpoint, contract, unit_checkpoint
from inference_machine.contract import ENV

from .proof_machine import runtime, start, with_runtime
from .proof_plan import (
    DEFAULT_STARTS,
    RESTORED,
    STANDIN,
    TRITON_RECORD_ENV,
    ProofError,
    Step,
    vanilla_step,
)
from .proof_probes import completion_json

BUNDLE_NAME = "warm-cache.tar.gz"
# the starts from the warm-cache bundle: as it is, and after a read-ahead (proof_plan.READY_STARTS)
BUNDLED = ("bundle", "readahead")
FIRST_ANSWER_TOKENS = 16
IMPORT_MODULE = "vllm.entrypoints.openai.api_server"


# the server's command-line flag and variables a checkpoint needs: vLLM's sleep mode and its
# /sleep and /wake_up endpoints; the engine core spawned, since one forked from the API server
# keeps NVIDIA device files CUDA's checkpoint cannot release
# (docs/decisions.md#checkpoint-and-restore-criu-with-cudas-checkpoint-api)
CHECKPOINT_ARGS = "--enable-sleep-mode"
CHECKPOINT_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_HOST_IP": "127.0.0.1",
                  "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def criu_bin() -> str:
    """CRIU: $PROOF_CRIU, else on PATH."""
    found = os.environ.get("PROOF_CRIU") or shutil.which("criu")
    if not found:
        raise ProofError("checkpoint: no criu (set PROOF_CRIU or put criu on PATH)")
    return found


class Restored:
    """A server restored from a checkpoint: its tree's pid and what it writes (the restored tree
    writes to the pipe CRIU's restore handed it)."""

    def __init__(self, log: Path, lines: list[tuple[float, str]]) -> None:
        self.pid = 0
        self.read_fd, self.write_fd = os.pipe()
        t0 = time.monotonic()

        def copy() -> None:
            with log.open("ab") as fh, os.fdopen(self.read_fd, "rb") as src:
                for raw in src:
                    fh.write(raw)
                    fh.flush()
                    lines.append((time.monotonic() - t0, raw.decode(errors="replace").rstrip()))

        threading.Thread(target=copy, daemon=True).start()
        # the restored tree's head is CRIU's child, and this process's once CRIU exits
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.write_fd)
        if not self.pid:
            return
        family = checkpoint.tree(self.pid)
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{self.pid}").exists():
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    break
            time.sleep(0.5)
        # the tree's pids free again: the next restore of the same checkpoint needs them
        left = checkpoint.kill_tree(self.pid, pids=family)
        for p in family:  # this process is their subreaper: reaped, their pids are free
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p, 0 if p not in left else os.WNOHANG)
        if taken := [p for p in family if Path(f"/proc/{p}").exists()]:
            print(f"[restored] pids {taken} still taken after the restored tree was killed",
                  flush=True)
        time.sleep(2)  # the engine process lets go of GPU memory after its parent


def reap_orphans() -> list[int]:
    """Wait for this process's exited children: as a subreaper it inherits what a restore left
    (the restored tree's processes, the helper), and a restore needs their pids free again."""
    reaped = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if not pid:
            return reaped
        reaped.append(pid)


def restored_phases(said: str, ready_s: float, answered_s: float) -> list[list[Any]]:
    """A restored start's phases from its helper's line: the unit's start up to the restore
    (inference-run, the helper's own start, the key), the restore's phases, its reference answer,
    then the lab's first answer."""
    got = [(n, float(x)) for n, x in re.findall(r"(\w+) ([\d.]+) s", said.split("(", 1)[-1])
           if n in checkpoint.RESTORE_PHASES]
    helper = [("reference_answer" if n == "first_answer" else n, x) for n, x in got]
    return [["unit_start", round(max(0.0, ready_s - sum(x for _, x in helper)), 2)],
            *([n, x] for n, x in helper), ["first_answer", round(answered_s - ready_s, 2)]]


def drop_page_cache() -> bool:
    """Forget the files read so far, as a new machine has read none (root only)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def image_environ() -> dict[str, str]:
    """This process's environment less vLLM's variables: vLLM's compile hash reads every one of
    them, and an image's instance has only those of its unit (e.g. the GPU machine's guide sets
    VLLM_USE_DEEP_GEMM=0, which the image does not)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}


def first_answer(port: int, model: str) -> float:
    """Seconds one short greedy completion takes: what the first client after a start waits."""
    t0 = time.monotonic()
    completion_json(f"http://127.0.0.1:{port}", {
        "model": model, "prompt": "The first request after a start", "temperature": 0,
        "max_tokens": FIRST_ANSWER_TOKENS, "ignore_eos": True}, 600)
    return time.monotonic() - t0


def _size_mib(root: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                total += (Path(dirpath) / f).lstat().st_size
    return round(total / 2**20, 1)


def written_under(root: Path, since: float) -> dict[str, float]:
    """MiB written under each top folder of `root` after `since` (epoch seconds)."""
    out: dict[str, float] = {}
    if not root.is_dir():
        return out
    for top in root.iterdir():
        total = 0
        for dirpath, _, files in os.walk(top) if top.is_dir() else [(str(root), [], [top.name])]:
            for f in files:
                with contextlib.suppress(OSError):
                    st = (Path(dirpath) / f).lstat()
                    if st.st_mtime >= since:
                        total += st.st_size
        if total:
            out[top.name] = round(total / 2**20, 1)
    return out


def image_layout(python: str, site_dirs: list[Path], venv: Path) -> str:
    """A virtualenv at `venv` (the image's vLLM venv path) whose site-packages links every entry
    of `site_dirs` (the first wins): the packages this machine has, imported from the paths the
    image imports them from. Its Python."""
    py = venv / "bin" / "python"
    if not py.exists():
        proc = subprocess.run([python, "-m", "venv", "--without-pip", str(venv)],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            raise ProofError(f"image_paths: no virtualenv at {venv}: "
                             f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    ver = subprocess.run([str(py), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    site = venv / "lib" / f"python{ver}" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    for src in site_dirs:
        if not src.is_dir():
            continue
        for entry in sorted(src.iterdir()):
            if entry.name in ("__pycache__", "bin") or (site / entry.name).exists() or \
                    (site / entry.name).is_symlink():
                continue
            (site / entry.name).symlink_to(entry)
    return str(py)


# what compile_bytecode runs with the machine's Python: every folder on its sys.path (PROOF_SITE's
# packages and the machine's own) compiled to bytecode, as pip does at an image's install; the
# folders it compiled
COMPILE_ALL = """
import compileall, os, sys
dirs = [p for p in dict.fromkeys(sys.path[1:]) if os.path.isdir(p)]
for d in dirs:
    compileall.compile_dir(d, quiet=2, workers=0)
print("\\n".join(dirs))
"""


def compile_bytecode(python: str, site: str) -> dict[str, Any]:
    """Compile every package the servers import to bytecode, as an image's pip install does: a
    machine whose packages have none and that writes none (PYTHONDONTWRITEBYTECODE) compiles
    each module from source at every start (docs/decisions.md#ready-time). Its seconds and
    folders."""
    t0 = time.monotonic()
    proc = subprocess.run([python, "-c", COMPILE_ALL], capture_output=True, text=True,
                          check=False, timeout=900,
                          env={**os.environ, "PYTHONPATH": site})
    if proc.returncode:
        raise ProofError(f"compiling the packages to bytecode: {proc.stderr.strip()[-300:]}")
    return {"s": round(time.monotonic() - t0, 1), "dirs": proc.stdout.split()}


def link_model(stand_in: Path, name: str) -> str:
    """The stand-in at the image's path of model `name` (a link), that path."""
    dest = Path(model_path(name))
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.is_dir():
        raise ProofError(f"image_paths: {dest} is a folder (a real model?); move it away")
    dest.symlink_to(stand_in.resolve())
    return str(dest)


def import_profile(python: str, env: dict[str, str], top: int = 12) -> dict[str, Any]:
    """`python -X importtime` of vLLM's API server module: its wall time and the modules whose
    imports (with what they import) took longest."""
    t0 = time.monotonic()
    proc = subprocess.run([python, "-X", "importtime", "-c", f"import {IMPORT_MODULE}"],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          check=False, timeout=300)
    wall = time.monotonic() - t0
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(2)), len(m.group(3)), m.group(4)))
    # the outermost modules below the top level, by their cumulative time
    heavy = sorted((r for r in rows if r[1] <= 3), reverse=True)[:top]
    return {"module": IMPORT_MODULE, "wall_s": round(wall, 2), "exit": proc.returncode,
            "top_cumulative_s": [[name, round(us / 1e6, 2)] for us, _, name in heavy]}


class ReadySteps:
    """The `ready` step of the Runner (proof.py)."""

    def step_ready(self, step: Step) -> None:
        """Start the server (the render as it ships, or vanilla `vllm serve`) once per state of
        `step.starts` and time each start's phases up to its first answer: `cold` (an empty
        cache), `warm` (the cache the start before left), `bundle` (the cache packed into a
        warm-cache bundle, or `step.bundle`'s, installed into an emptied cache root, as the
        image's build installs one; the render's inference-run checks it, as on an image),
        `checkpoint` and `restart` (the start before them checkpointed once it answered, then
        restored after a dropped page cache, or with its images still cached)."""
        label = step.name()
        starts = step.starts or DEFAULT_STARTS
        if step.vanilla and step.image_paths:
            raise ProofError(f"{label}: image_paths serves the render; vanilla runs as a user "
                             "would, from this machine's own paths")
        if step.bundle and not Path(step.bundle).is_file():
            raise ProofError(f"{label}: bundle {step.bundle}: not a file")
        argv, env, port, model, python, root, profile_json = self._ready_server(step)
        if not self.results.get("bytecode"):
            self._phase("compiling the packages to bytecode, as an image's install does")
            self.results["bytecode"] = compile_bytecode(
                self.python, os.environ.get("PROOF_SITE", "/tmp/site"))
        restores, by_unit, env = self._restore_env(step, label, starts, env)
        record = self.results.setdefault("ready", {}).setdefault(label, {})
        # sleep_mode: the server ran with what a checkpoint needs (CHECKPOINT_ARGS and _ENV), not
        # quite as it ships; the ledger shows such starts only beside a restored one
        record.update({"cache": str(root), "python": python, "image_paths": step.image_paths,
                       "vanilla": step.vanilla, "argv": " ".join(argv),
                       "sleep_mode": restores, "checkpoint_by_unit": by_unit})
        # the starts in the order they ran, over calls (proof.json sorts its keys)
        record["order"] = [*[s for s in record.get("order", []) if s not in starts], *starts]
        runs = record.setdefault("starts", {})
        bundle = Path(step.bundle) if step.bundle else None
        taken: tuple[Path, dict[str, str]] | None = None
        for i, state in enumerate(starts):
            if state in RESTORED and not by_unit:
                if taken is None:
                    raise ProofError(f"{label}: no checkpoint was taken before its restore")
                runs[state] = {}  # nothing of an earlier call's restore kept
                self._restored(label, state, *taken, port, step, i == len(starts) - 1,
                               runs[state])
                self.save()
                continue
            if state == "cold":
                self._wipe(root)
            elif state in BUNDLED:
                if bundle is None:
                    bundle = self._pack(label, root, python, profile_json, record, env)
                self._wipe(root)
                try:
                    startup.install(bundle, root)
                except startup.BundleError as exc:
                    raise ProofError(f"{label}: {exc}") from None
            home = self.work / "ready-home" / f"{label}-{state}"
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True)
            senv = {**env, "HOME": str(home)}
            recording = self.work / f"triton-{label}.jsonl"
            if step.record_triton and i == 0:  # the first start compiles what the list is of
                recording.unlink(missing_ok=True)
                senv[TRITON_RECORD_ENV] = str(recording)
            entry: dict[str, Any] = {}
            if state in ("cold", *BUNDLED) and profile_json is not None:
                # what the image's build leaves under the cache root (the role's inspect task):
                # vLLM's inspections (a bundle carries them too) and the record of what a start
                # reads (the page-cache prefetch's list)
                entry["inspected"] = self._inspect(profile_json.parent / "units", argv[-1],
                                                   {**(image_environ() if step.image_paths
                                                       else os.environ), **env})
            if state in ("cold", "checkpoint", *BUNDLED):
                entry["page_cache_dropped"] = drop_page_cache()
            if state == "readahead":
                entry["readahead"] = self._read_ahead(env)
            runs[state] = entry
            since = time.time()
            self._phase(f"the {state} start")
            lines: list[tuple[float, str]] = []
            (self.work / "logs").mkdir(parents=True, exist_ok=True)
            srv = start(argv, senv, self.work / "logs" / f"{label}-{state}.log", port,
                        lines=lines, base=image_environ() if step.image_paths else None)
            try:
                ready = srv.wait_ready()
                answered = ready + first_answer(port, model)
                entry.update(startup.anatomy(list(lines), ready, answered))
                entry.update({"ready_s": ready, "answered_s": round(answered, 2)})
                self.results.setdefault("ready_s", {})[f"{label}-{state}"] = {
                    "s": ready, "compile_cache": state}
                print(f"[{label}] {state}: ready {ready} s, answered {answered:.1f} s; phases "
                      f"{entry['phases']}; {entry['said'].get('warm_cache', '')}", flush=True)
                if state in BUNDLED and not step.vanilla and "matches" not in \
                        entry["said"].get("warm_cache", ""):
                    raise ProofError(f"{label}: the bundle start did not use the bundle: "
                                     f"{entry['said'].get('warm_cache', 'no check line')}")
                if TRITON_RECORD_ENV in senv:
                    self._record_triton(label, recording, python, env, record)
                checkpointed = bool(set(RESTORED) & set(starts[i + 1:i + 2]))
                if by_unit:
                    self._unit_said(label, state, lines, Path(env[ENV.root]),
                                    argv[-1], entry)
                elif checkpointed:
                    taken = self._take(label, argv[-1], srv.proc.pid, port, model, root,
                                       profile_json, entry)
                # the server a checkpoint was taken from benches too (after its dump and wake):
                # its restore's rows compare with its own, from the same call
                if step.concurrency and (i == len(starts) - 1 or checkpointed):
                    self._phase("the bench rows")
                    self._bench(f"{label}-{state}", port, model, step.concurrency,
                                None if step.vanilla else self.step_resolved(step), (),
                                step.sampling)
            finally:
                self._stopped(srv, label, state, lines, by_unit, root, home, since, entry)
        if not step.vanilla and not set(BUNDLED) & set(starts) and not step.bundle:
            # what a build on this GPU would ship: the cache the starts left
            self._pack(label, root, python, profile_json, record, env)
            self.save()
        if step.import_profile:
            self._phase("the import profile")
            record["imports"] = import_profile(python, {k: v for k, v in env.items()
                                                        if k in ("PYTHONPATH",)})
            print(f"[{label}] import {IMPORT_MODULE}: {record['imports']['wall_s']} s; "
                  f"{record['imports']['top_cumulative_s'][:5]}", flush=True)

    def _restore_env(self, step: Step, label: str, starts: list[str] | tuple[str, ...],
                     env: dict[str, str]) -> tuple[bool, bool, dict[str, str]]:
        """Whether the starts restore a checkpoint, whether the render's own units take and
        restore it (serving.checkpoint: its inference-run starts the root helper where there is
        no systemd, and its restored starts are timed like the others, from the process start),
        and the servers' environment for that."""
        restores = bool(set(RESTORED) & set(starts))
        # a render with serving.checkpoint takes and restores its checkpoints itself (its
        # inference-run starts the root helper where there is no systemd): its restored starts
        # are starts like the others, timed from the process start
        by_unit = restores and not step.vanilla and self.step_resolved(step).profile.serving \
            .checkpoint
        if by_unit:
            if self.step_resolved(step).profile.serving.checkpoint_weights == "files" and \
                    not step.weight_files:
                raise ProofError(f"{label}: its checkpoint reads the weights again from the "
                                 "model's files, and dummy weights have none: give "
                                 "--weight-files DIR (a tmpfs)")
            if step.acceptance_length or step.acceptance_rates or step.published_acceptance:
                raise ProofError(f"{label}: a render that checkpoints compares its reference "
                                 "answer after a restore, which synthetic acceptance draws: run "
                                 "its ready starts without an acceptance")
            env = {**env, ENV.criu: criu_bin()}
            # the restored trees' processes become this process's once CRIU exits
            ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        elif restores:
            env = {**env, **CHECKPOINT_ENV, ENV.extra_args: " ".join(
                (env.get(ENV.extra_args, ""), CHECKPOINT_ARGS)).strip()}
        return restores, by_unit, env

    def _stopped(self, srv: Any, label: str, state: str, lines: list[tuple[float, str]],
                 by_unit: bool, root: Path, home: Path, since: float,
                 entry: dict[str, Any]) -> None:
        """A start's server stopped, and what it left recorded: its timed log lines, its cache's
        size, and (cold) what it wrote outside its folders."""
        self._phase("stopping the server")
        srv.stop()
        if by_unit:
            # the restored tree is not the server's process group: gone for sure, and
            # its pids free for the next restore
            for _, line in lines:
                if m := re.search(r"inference-checkpoint: .*: restored in .*; head pid "
                                  r"(\d+)", line):
                    checkpoint.kill_tree(int(m[1]))
            reap_orphans()
        # each log line with the second it arrived after the process start: where a
        # phase's time goes, finer than vLLM's own one-second stamps
        (self.work / "logs" / f"{label}-{state}.times.json").write_text(
            json.dumps([[round(t, 3), line] for t, line in lines]))
        entry["cache_mib"] = {p: _size_mib(root / p) for p in startup.CACHE_PARTS
                              if (root / p).exists()}
        if state == "cold":
            entry["written_outside"] = {
                "home": written_under(home, since),
                "tmp": {k: v for k, v in written_under(Path("/tmp"), since).items()
                        if not (self.work.is_relative_to("/tmp") and
                                k == self.work.relative_to("/tmp").parts[0])}}
        self.save()

    def _unit_said(self, label: str, state: str, lines: list[tuple[float, str]], rdir: Path,
                   instance: str, entry: dict[str, Any]) -> None:
        """What the render's checkpoint helper said of a start (taken, restored, or why not),
        with the checkpoint's size and phases; a restored start that was not restored fails."""
        said = unit_checkpoint.said([line for _, line in lines])
        entry["checkpoint_said"] = said
        mf = rdir / PATHS["checkpoints"].lstrip("/") / instance / checkpoint.MANIFEST
        m = json.loads(mf.read_text()) if mf.is_file() else {}
        if m:
            entry["checkpoint"] = {"phases": m["phases"], "files": len(m["files"]),
                                   "mib": round(m["bytes"] / 2**20, 1),
                                   "memory": m["memory"], "weights": m.get("weights", "host"),
                                   **({"released": m["released"]} if m.get("released") else {})}
        print(f"[{label}] {state}: " + " | ".join(said or ["the helper said nothing"]),
              flush=True)
        restored = next((x for x in said if ": restored in " in x), "")
        if state in RESTORED and not restored:
            raise ProofError(f"{label}: the {state} start was not restored: "
                             f"{' | '.join(said) or 'the helper said nothing'}")
        if restored and "ready_s" in entry:
            # vLLM's log marks no phase of a restored start: the helper's own
            entry["phases"] = restored_phases(restored, entry["ready_s"], entry["answered_s"])

    def _take(self, label: str, instance: str, pid: int, port: int, model: str, root: Path,
              profile_json: Path | None, entry: dict[str, Any]) -> tuple[Path, dict[str, str]]:
        """Checkpoint the server that just answered (before any other request), as the image
        does after an instance's first start."""
        self._phase("taking a checkpoint")
        dest = self.work / "checkpoints" / label
        units = profile_json.parent / "units" if profile_json else self.work
        key = checkpoint.checkpoint_key(root, profile_json, units, instance, criu_bin())
        t = checkpoint.Timings()
        try:
            manifest = checkpoint.take(pid, port, model, dest, key, criu_bin(), t)
        except (checkpoint.CheckpointRefused, OSError, RuntimeError) as exc:
            entry["checkpoint"] = {"failed": str(exc)[:600], "phases": t.phases}
            raise ProofError(f"{label}: the checkpoint failed: {exc}") from None
        entry["checkpoint"] = {"phases": manifest["phases"], "files": len(manifest["files"]),
                               "mib": round(manifest["bytes"] / 2**20, 1),
                               "reference": manifest["reference"],
                               "gpu_pids": len(manifest["gpu_pids"]),
                               "memory": manifest["memory"]}
        print(f"[{label}] checkpoint: {entry['checkpoint']['mib']} MiB in "
              f"{entry['checkpoint']['files']} files; phases {manifest['phases']}", flush=True)
        return dest, key

    def _restored(self, label: str, state: str, dest: Path, key: dict[str, str], port: int,
                  step: Step, last: bool, entry: dict[str, Any]) -> None:
        """Restore the checkpoint at `dest` (state checkpoint: the page cache dropped first, as
        after a reboot; restart: its images left there) and time it to its reference answer, into
        `entry` (a refusal too); the bench rows from the restored server if asked."""
        entry["page_cache_dropped"] = drop_page_cache() if state == "checkpoint" else False
        # synthetic acceptance draws which draft tokens stand: the same prompt's answer differs
        entry["reference_compared"] = not (step.acceptance_length or step.acceptance_rates
                                           or step.published_acceptance)
        self._phase("the checkpoint's restore")
        lines: list[tuple[float, str]] = []
        srv = Restored(self.work / "logs" / f"{label}-{state}.log", lines)
        t = checkpoint.Timings()
        try:
            try:
                srv.pid = checkpoint.restore(dest, key, criu_bin(), t, stdout=srv.write_fd,
                                             compare=entry["reference_compared"])
            except checkpoint.CheckpointRefused as exc:
                entry.update({"refused": str(exc)[:600], "phases": t.phases})
                raise ProofError(f"{label}: the checkpoint was not restored: {exc}") from None
            phases = dict(t.phases)
            ready = round(sum(s for n, s in t.phases if n != "first_answer"), 2)
            answered = round(sum(phases.values()), 2)
            entry.update({"phases": t.phases, "ready_s": ready, "answered_s": answered,
                          "said": {}})
            self.results.setdefault("ready_s", {})[f"{label}-{state}"] = {
                "s": ready, "compile_cache": state}
            print(f"[{label}] {state}: ready {ready} s, answered {answered} s ("
                  f"{'the reference answer as before' if entry['reference_compared'] else 'an answer'}"
                  f"); phases {t.phases}", flush=True)
            if step.concurrency and last:
                self._phase("the bench rows")
                self._bench(f"{label}-{state}", port, self.step_resolved(step).profile.model
                            .target, step.concurrency, self.step_resolved(step), (),
                            step.sampling)
        finally:
            self._phase("stopping the server")
            srv.stop()

    def _ready_server(self, step: Step) -> tuple[list[str], dict[str, str], int, str, str, Path,
                                                 Path | None]:
        """The command, environment, port, model name, Python, cache root and profile.json of
        the server the step starts."""
        label = step.name()
        root = Path(PATHS["cache"]) if step.image_paths else self.work / f"ready-cache-{label}"
        cache_env = {**self._cache_env(root),
                     **{k: v for k, v in contract.cache_env(str(root)).items()
                        if k.startswith("XDG_")}}
        if step.vanilla:
            r = self.resolved()
            port, name = r.instances[0].port, r.profile.model.target
            args = step.args or vanilla_step(r).args
            argv = [self.python, "-m", "vllm.entrypoints.cli.main", "serve",
                    str(self.made(self.model_for(r, checkpoint=False))), "--load-format",
                    "dummy", "--served-model-name", name, "--port", str(port), *args]
            return argv, {**cache_env, **NATIVE_SAMPLER}, port, name, self.python, root, None
        r, _, env, _ = self._rendered(step)
        inst = r.instances[0]
        env = {**env, **cache_env}
        python = self.python
        rdir = Path(env[ENV.root])
        if step.image_paths:
            site = os.environ.get("PROOF_SITE", "/tmp/site")
            system = subprocess.run([self.python, "-c", "import sysconfig; "
                                     "print(sysconfig.get_paths()['purelib'])"],
                                    capture_output=True, text=True, check=True).stdout.strip()
            python = image_layout(self.python, [Path(site), Path(system)],
                                  Path(PATHS["vllm_venv"]))
            env[ENV.python] = python
            env["MODEL_PATH"] = link_model(Path(env["MODEL_PATH"]), r.profile.model.target)
            if r.profile.model.speculative.draft:
                env["DRAFT_PATH"] = link_model(Path(env["DRAFT_PATH"]),
                                               r.profile.model.speculative.draft)
            # the stand-ins' correction only: vLLM and its packages come from the venv's paths
            env["PYTHONPATH"] = str(STANDIN)
        return (runtime("run", inst.name), with_runtime(env), inst.port,
                r.profile.model.target, python, root, rdir / "etc/inference-image/profile.json")

    def _read_ahead(self, env: dict[str, str]) -> dict[str, Any]:
        """`inference-startup prefetch` with the server's environment, run to its end before
        the start, as a read-ahead begun at boot has run by the time an instance starts: its
        seconds and its line."""
        self._phase("reading ahead what a start reads")
        t0 = time.monotonic()
        proc = subprocess.run(runtime("", "prefetch"),
                              env={**os.environ, **with_runtime(env)}, capture_output=True, text=True,
                              check=False, timeout=600)
        line = ((proc.stdout or proc.stderr).strip().splitlines() or ["no output"])[-1]
        print(f"[readahead] {line}", flush=True)
        if proc.returncode:
            raise ProofError(f"the read-ahead failed: {line}")
        return {"s": round(time.monotonic() - t0, 2), "said": line}

    def _inspect(self, units: Path, instance: str, env: dict[str, str]) -> str:
        """`inference-startup inspect` and `precompile` of the instance, as the image's build runs
        them: their lines."""
        self._phase("inspecting the models and precompiling Triton kernels, as the build does")
        said = []
        for cmd in (["inspect", "--env", str(units / f"{instance}.env"),
                     "--args", str(units / f"{instance}.args")],
                    ["precompile", "--env", str(units / f"{instance}.env")]):
            proc = subprocess.run(runtime("", *cmd), env=with_runtime(env, env),
                                  capture_output=True, text=True, check=False)
            line = (proc.stdout or proc.stderr).strip().splitlines()[-1:] or ["no output"]
            print(f"[{cmd[0]}] {line[0]}", flush=True)
            said.append(line[0])
        return "; ".join(said)

    def _record_triton(self, label: str, recording: Path, python: str, env: dict[str, str],
                       record: dict[str, Any]) -> None:
        """The Triton kernels the start compiled (the plugin's recording) as the tier's list:
        kernels-<tier>.json under --out's ready folder and $OUT, to be committed as the plugin's
        kernels/<tier>.json."""
        r = self.resolved()
        cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader",
                              "-i", "0"], capture_output=True, text=True, check=False)
        capability = cap.stdout.strip() or str(r.profile.hardware.compute_capability)
        out = self.work / "ready" / f"kernels-{r.profile.tier}.json"
        proc = subprocess.run([python, "-m", "inference_image_vllm.triton_kernels", "collect",
                               str(recording), "--tier", r.profile.tier, "--capability",
                               capability, "--device", (self.results.get("info") or {}).get(
                                   "gpu", "?"), "--profile-sha256", r.digest],
                              env={**os.environ, **env}, capture_output=True, text=True,
                              check=False)
        if proc.returncode:
            raise ProofError(f"{label}: the recorded Triton kernels were not collected: "
                             f"{(proc.stderr or proc.stdout).strip()[-400:]}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(proc.stdout)
        n = len(json.loads(proc.stdout)["kernels"])
        record["triton_kernels"] = {"path": str(out), "kernels": n, "capability": capability}
        if mirror := self._mirror():
            shutil.copy(out, mirror / out.name)
        print(f"[{label}] Triton kernels the start compiled: {n} -> {out}", flush=True)

    def _wipe(self, root: Path) -> None:
        for p in (*(c.name for c in contract.CACHE_PARTS), startup.MANIFEST, startup.REJECTED,
                  startup.READS):
            target = root / p
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()

    def _key(self, python: str, root: Path, profile_json: Path | None,
             env: dict[str, str]) -> dict[str, str]:
        """The machine key as the server sees it: where its Python imports vLLM from, its
        models (MODEL_PATH, DRAFT_PATH)."""
        argv = runtime("", "key", "--cache", str(root))
        if profile_json:
            argv += ["--profile-json", str(profile_json)]
        see = {k: env[k] for k in ("PYTHONPATH", "MODEL_PATH", "DRAFT_PATH") if k in env}
        proc = subprocess.run(argv, capture_output=True, text=True, check=False,
                              env={**os.environ, "MODEL_PATH": "", "DRAFT_PATH": "",
                                   **with_runtime(see), ENV.python: python})
        if proc.returncode:
            raise ProofError(f"the machine key: {proc.stderr.strip()[-300:]}")
        return dict(json.loads(proc.stdout))

    def _pack(self, label: str, root: Path, python: str, profile_json: Path | None,
              record: dict[str, Any], env: dict[str, str]) -> Path:
        out = self.work / "ready" / f"{label}-{BUNDLE_NAME}"
        self._phase("packing the warm cache")
        t0 = time.monotonic()
        try:
            manifest = startup.make(root, out, self._key(python, root, profile_json, env))
        except startup.BundleError as exc:
            raise ProofError(f"{label}: {exc}") from None
        record["bundle"] = {"path": str(out), "files": len(manifest["files"]),
                            "cache_mib": round(manifest["bytes"] / 2**20, 1),
                            "mib": round(out.stat().st_size / 2**20, 1),
                            "make_s": round(time.monotonic() - t0, 1), "key": manifest["key"]}
        # small enough to come back from a GPU machine: restored on another, fresh one
        if (mirror := self._mirror()) and out.stat().st_size <= 15 * 2**20:
            shutil.copy(out, mirror / f"{label}-{BUNDLE_NAME}")
        print(f"[{label}] bundle: {record['bundle']['files']} files, "
              f"{record['bundle']['cache_mib']} MiB of cache, {record['bundle']['mib']} MiB "
              f"packed in {record['bundle']['make_s']} s", flush=True)
        return out
