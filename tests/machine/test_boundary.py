"""Root's helpers and what their service user can plant: a link, a hard link or a FIFO at every
path seal, install, check, the build's inspection record and the checkpoint helper touch. Root
acts on none of them: the file a plant points at keeps its owner, mode and bytes, nothing is made
where a link points, and no helper waits on a FIFO. Runs as root (as CI does): the service user
is `nobody`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference_machine import boundary, bundle, checkpoint, prepare, unit_checkpoint
from inference_machine.bundle import LOCK, MANIFEST, REJECTED, BundleError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root's helpers are tried as root")
NOBODY = (65534, 65534)
KEY = {k: "x" for k in bundle.KEY_FIELDS}
PLANTS = ("symlink", "hardlink", "fifo")
PY = "/usr/bin/python3"  # one the service user can run (the venv's lies under root's home)


@pytest.fixture
def world() -> Iterator[Path]:
    """A folder every user can pass through (pytest's own are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="boundary-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=False)


def _victim(world: Path) -> Path:
    """A file of root's in a folder of root's: what a plant aims root at."""
    (world / "root").mkdir(mode=0o755)
    v = world / "root" / "victim"
    v.write_text("root's own\n")
    os.chmod(v, 0o644)
    return v


def _intact(v: Path) -> None:
    st = os.lstat(v)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o644)
    assert v.read_text() == "root's own\n"


def _cache(world: Path) -> Path:
    cache = world / "cache"
    for part in ("", "vllm", "inductor", "triton"):
        (cache / part).mkdir(mode=0o750, exist_ok=True)
        os.chown(cache / part, *NOBODY)
    f = cache / "triton" / "kernel.bin"
    f.write_bytes(b"compiled")
    os.chown(f, *NOBODY)
    return cache


def _plant(kind: str, at: Path, victim: Path) -> None:
    if kind == "hardlink":  # what protected_hardlinks=0 would let the user make: root's inode
        os.link(victim, at)
        return
    if kind == "symlink":
        os.symlink(victim, at)
    else:
        os.mkfifo(at)
    os.chown(at, *NOBODY, follow_symlinks=False)


def _timed(fn: object, *args: object, **kw: object) -> object:
    """fn's result, or its exception, within 20 s (a FIFO must not stall root's helper)."""
    t0 = time.monotonic()
    try:
        out: object = fn(*args, **kw)  # type: ignore[operator]
    except (BundleError, OSError) as exc:
        out = exc
    assert time.monotonic() - t0 < 20
    return out


@pytest.mark.parametrize("kind", PLANTS)
@pytest.mark.parametrize("name", [LOCK, MANIFEST, REJECTED])
def test_seal_as_root_acts_on_nothing_planted_in_the_cache(world: Path, kind: str,
                                                           name: str) -> None:
    victim = _victim(world)
    cache = _cache(world)
    _plant(kind, cache / name, victim)
    _timed(bundle.seal, cache, dict(KEY), "nobody")
    _intact(victim)


@pytest.mark.parametrize("kind", PLANTS)
@pytest.mark.parametrize("name", [LOCK, MANIFEST, REJECTED])
def test_check_as_root_acts_on_nothing_planted_in_the_cache(world: Path, kind: str,
                                                            name: str) -> None:
    victim = _victim(world)
    cache = _cache(world)
    bundle.seal(cache, dict(KEY), "nobody")
    if os.path.lexists(cache / name):
        os.unlink(cache / name)
    _plant(kind, cache / name, victim)
    _timed(bundle.check, cache, dict(KEY))
    _intact(victim)
    # a link to a name that does not exist yet: nothing is made there
    if os.path.lexists(cache / name):  # the check may have removed the plant itself
        os.unlink(cache / name)
    ghost = world / "root" / "made-by-root"
    os.symlink(ghost, cache / name)
    _timed(bundle.check, cache, dict(KEY))
    assert not ghost.exists()


def _bundle(world: Path) -> Path:
    src = world / "src"
    (src / "vllm" / "modelinfos").mkdir(parents=True)
    (src / "triton").mkdir()
    (src / "triton" / "k.bin").write_bytes(b"kernel")
    out = world / "b.tar.gz"
    bundle.make(src, out, dict(KEY))
    return out


@pytest.mark.parametrize("kind", PLANTS)
@pytest.mark.parametrize("name", [MANIFEST, REJECTED, "vllm/modelinfos/Llama.json",
                                  "vllm/modelinfos", "triton/k.bin"])
def test_install_as_root_acts_on_nothing_planted_in_the_cache(world: Path, kind: str,
                                                              name: str) -> None:
    victim = _victim(world)
    b = _bundle(world)
    cache = _cache(world)
    (cache / "vllm" / "modelinfos").mkdir()
    os.chown(cache / "vllm" / "modelinfos", *NOBODY)
    if name == "vllm/modelinfos":
        os.rmdir(cache / name)
    _plant(kind, cache / name, victim)
    _timed(bundle.install, b, cache, "nobody")
    _intact(victim)
    for p in [cache, *cache.rglob("*")]:  # what the install wrote is the user's, none root's
        if not p.is_symlink() and not os.path.samefile(p, victim):
            assert os.lstat(p).st_uid == NOBODY[0], p


def test_install_opens_the_bundle_as_root_and_refuses_a_fifo(world: Path) -> None:
    b = _bundle(world)
    os.chmod(b, 0o600)  # root's alone: the user never reads it, the install still does
    cache = _cache(world)
    assert bundle.install(b, cache, "nobody")["files"]
    assert (cache / "triton" / "k.bin").read_bytes() == b"kernel"
    os.mkfifo(world / "fifo.tar.gz")
    assert isinstance(_timed(bundle.install, world / "fifo.tar.gz", cache, "nobody"),
                      BundleError)


@pytest.mark.parametrize("kind", PLANTS)
def test_the_builds_record_of_what_a_start_reads_is_written_as_the_caches_user(
        world: Path, kind: str) -> None:
    victim = _victim(world)
    cache = _cache(world)
    _plant(kind, cache / prepare.READS, victim)
    line = _timed(prepare._write_reads, str(cache), {"libs": ["a"], "modules": ["b"]}, NOBODY)
    _intact(victim)
    assert "recorded" in str(line)
    assert os.lstat(cache / prepare.READS).st_uid == NOBODY[0]


def test_work_as_the_user_cannot_reach_what_root_can(world: Path) -> None:
    victim = _victim(world)
    os.chmod(victim, 0o600)
    with pytest.raises(boundary.BoundaryError, match="PermissionError"):
        boundary.as_user(*NOBODY, Path.read_text, victim)
    assert boundary.as_user(*NOBODY, os.getuid) == NOBODY[0]
    with pytest.raises(BundleError, match="said so"):
        boundary.as_user(*NOBODY, _raise, errors=(BundleError,))


def _raise() -> None:
    raise BundleError("said so")


# ---- the checkpoint helper ---------------------------------------------------------------

@pytest.mark.parametrize("kind", PLANTS)
def test_the_word_and_the_gates_flag_replace_a_plant_and_never_write_through_it(
        world: Path, kind: str) -> None:
    victim = _victim(world)
    run = world / "run"
    run.mkdir(mode=0o755)
    _plant(kind, run / "vllm-0.word", victim)
    _plant(kind if kind != "hardlink" else "symlink", run / "vllm-0.open", victim)
    # the word's reader is the start's main process: here one of the service user's
    start = subprocess.Popen(["setpriv", f"--reuid={NOBODY[0]}", f"--regid={NOBODY[1]}",
                              "--clear-groups", "sleep", "30"])
    try:
        time.sleep(0.2)
        unit_checkpoint.write_word(run, "vllm-0", start.pid, "cold tok")
    finally:
        start.kill()
        start.wait()
    unit_checkpoint.open_gate(run, "vllm-0")
    _intact(victim)
    st = os.lstat(run / "vllm-0.word")
    assert stat.S_ISREG(st.st_mode) and st.st_uid == NOBODY[0] and \
        stat.S_IMODE(st.st_mode) == 0o400
    assert stat.S_ISREG(os.lstat(run / "vllm-0.open").st_mode)


def test_the_helper_keeps_its_state_only_in_a_folder_of_roots(world: Path) -> None:
    run = world / "run"
    run.mkdir(mode=0o755)
    os.chown(run, *NOBODY)
    with pytest.raises(boundary.BoundaryError, match="not a folder of this user's alone"):
        unit_checkpoint.open_gate(run, "vllm-0")
    link = world / "run-link"
    os.symlink(world, link)
    with pytest.raises(boundary.BoundaryError):
        unit_checkpoint.open_gate(link, "vllm-0")
    # a word for a process that is gone is written for no one
    with pytest.raises(OSError):
        unit_checkpoint.write_word(world / "r2", "vllm-0", 2**22 + 1, "cold -")


def test_a_fifo_as_the_take_record_or_the_manifest_is_refused_at_once(world: Path) -> None:
    store = world / "store"
    (store / "vllm-0").mkdir(parents=True, mode=0o700)
    os.mkfifo(store / "vllm-0.take-failed.json")
    said = _timed(unit_checkpoint.take_failed, store, "vllm-0", {})
    assert "cannot be read" in str(said)
    os.mkfifo(store / "vllm-0" / checkpoint.MANIFEST)
    with pytest.raises(checkpoint.CheckpointRefused, match="corrupt"):
        _timed(checkpoint.validate, store / "vllm-0", {})


def _units(world: Path, cache: Path) -> Path:
    units = world / "units"
    units.mkdir()
    (units / "vllm-0.env").write_text(f"INFERENCE_CACHE={cache}\n")
    (units / "vllm-0.args").write_text("--port\n8100\n--served-model-name\nm\n")
    return units


def test_an_instance_name_outside_the_renders_set_is_refused_and_nothing_removed(
        world: Path) -> None:
    cache = _cache(world)
    units = _units(world, cache)
    outside = world / "escape"
    (outside / "keep").mkdir(parents=True)
    store = world / "store"
    store.mkdir()
    for name in ("../escape", "/tmp", "vllm-0/../../escape", "", "vllm-1"):
        assert unit_checkpoint.helper(name, units, store, world / "run", "/bin/true",
                                      pid=os.getpid()) == 2
    assert (outside / "keep").is_dir()
    assert unit_checkpoint.instances(units) == {"vllm-0"}


@pytest.mark.parametrize("criu", ["/nonexistent/criu", "WRITABLE"])
def test_a_missing_or_unsafe_criu_keeps_the_checkpoint(
        world: Path, criu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _cache(world)
    units = _units(world, cache)
    store, run = world / "store", world / "run"
    dest = store / "vllm-0"
    (dest / checkpoint.IMAGES).mkdir(parents=True)
    (dest / checkpoint.MANIFEST).write_text("{}")
    if criu == "WRITABLE":  # a CRIU another user could have replaced
        criu = str(world / "criu")
        Path(criu).write_text("#!/bin/sh\n")
        os.chmod(criu, 0o777)
    monkeypatch.setattr(checkpoint, "checkpoint_key", lambda *a: {"driver": "580"})
    monkeypatch.setenv("INFERENCE_CACHE", str(cache))  # the helper exports the unit's env
    said: list[str] = []
    monkeypatch.setattr(unit_checkpoint, "say", lambda inst, text: said.append(text))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert unit_checkpoint.helper("vllm-0", units, store, run, criu, pid=sleeper.pid) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
    assert (dest / checkpoint.MANIFEST).exists(), said
    assert any("CRIU" in s and "removed" not in s for s in said), said
    assert (run / "vllm-0.word").read_text().split()[1] == "cold"


@pytest.mark.parametrize("pid", [0, 1, -1, "self"])
def test_kill_tree_refuses_what_heads_no_tree_of_its_own(pid: int | str) -> None:
    p = os.getpid() if pid == "self" else int(pid)
    with pytest.raises(ValueError, match="no tree this helper may stop"):
        checkpoint.kill_tree(p)
    with pytest.raises(ValueError):
        checkpoint.kill_tree(os.getpid() + 10**6, pids=[p])


def _criu_writing(world: Path, body: str) -> checkpoint.Criu:
    """A stand-in CRIU whose restore writes its --pidfile as `body` says (the real one needs a
    checkpoint of a real tree)."""
    script = world / "criu"
    script.write_text("#!/bin/bash\nwhile (( $# )); do [[ $1 == --pidfile ]] && pf=$2; shift; "
                      f"done\n{body}\n")
    os.chmod(script, 0o755)
    return checkpoint.Criu(str(script))


@pytest.mark.parametrize("named", ["1", "0", "-1", "$PPID", "4194304"])
def test_a_restore_that_names_a_pid_outside_its_tree_is_refused(world: Path, named: str) -> None:
    dest = world / "ck"
    (dest / checkpoint.IMAGES).mkdir(parents=True)
    criu = _criu_writing(world, f'echo "{named}" > "$pf"')
    with pytest.raises(checkpoint.CheckpointRefused, match=r"not the tree it restored|no pid"):
        checkpoint.restore_tree(dest, {"stdio": {}, "bytes": 0}, criu)


def test_a_restored_head_is_this_processs_child_and_is_accepted(world: Path) -> None:
    dest = world / "ck"
    (dest / checkpoint.IMAGES).mkdir(parents=True)
    # CRIU forks the head and exits: the head is reparented to this process (a subreaper)
    criu = _criu_writing(world, 'setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $! > "$pf"')
    pid = checkpoint.restore_tree(dest, {"stdio": {}, "bytes": 0}, criu)
    try:
        assert checkpoint.own_child(pid)
        assert checkpoint.kill_tree(pid, wait_s=5) == []
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def test_manifest_numbers_outside_what_a_restore_can_act_on_are_corrupt(world: Path) -> None:
    dest = world / "ck"
    (dest / checkpoint.IMAGES).mkdir(parents=True)
    (dest / checkpoint.IMAGES / "pages-1.img").write_bytes(b"x")
    good = {"schema": checkpoint.SCHEMA, "key": {}, "files": {"pages-1.img": 1}, "pid": 1234,
            "gpu_pids": [1235], "port": 8100, "reference": "r", "bytes": 1}
    (dest / checkpoint.MANIFEST).write_text(json.dumps(good))
    assert checkpoint.validate(dest, {})["pid"] == 1234
    for bad in ({"bytes": 1e15}, {"bytes": 2**60}, {"pid": 1}, {"pid": -1}, {"pid": True},
                {"gpu_pids": [0]}, {"gpu_pids": []}, {"port": 0}, {"port": 70000},
                {"files": {"../../etc/passwd": 1}}):
        (dest / checkpoint.MANIFEST).write_text(json.dumps({**good, **bad}))
        with pytest.raises(checkpoint.CheckpointRefused, match="corrupt"):
            checkpoint.validate(dest, {})
    assert checkpoint.criu_timeout(1e15) == checkpoint.CRIU_MAX_TIMEOUT_S


def test_shared_memory_names_are_the_instances_users_alone_and_removed_as_that_user(
        world: Path) -> None:
    """A name in the sticky folder that shares its inode with a file the instance mapped and
    deleted, but is another user's (a hard link), is neither listed nor removed."""
    shm = world / "shm"
    shm.mkdir()
    os.chmod(shm, 0o1777)
    theirs = shm / "sem.root"
    theirs.write_bytes(b"\0" * 4096)
    mapped = shm / "sem.tmp"
    os.link(theirs, mapped)
    os.chown(mapped, 0, 0)
    code = ("import mmap, os, sys, time; f = open(sys.argv[1], 'rb'); "
            "m = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ); print('ok', flush=True); "
            "time.sleep(30)")
    child = subprocess.Popen([PY, "-c", code, str(mapped)], user=NOBODY[0],
                             group=NOBODY[1], extra_groups=[], stdout=subprocess.PIPE)
    try:
        assert child.stdout and child.stdout.readline().strip() == b"ok"
        mapped.unlink()
        assert checkpoint.shm_names([child.pid], shm) == [theirs]  # by inode alone
        assert checkpoint.shm_names([child.pid], shm, NOBODY[0]) == []
        checkpoint.unlink_shm_names([child.pid], child.pid, shm)
        assert theirs.exists()
        # the instance's own name is removed, as its user
        own = shm / "sem.own"
        own.write_bytes(b"\0" * 4096)
        os.chown(own, *NOBODY)
        child2 = subprocess.Popen([PY, "-c", code, str(own)], user=NOBODY[0],
                                  group=NOBODY[1], extra_groups=[], stdout=subprocess.PIPE)
        try:
            assert child2.stdout and child2.stdout.readline().strip() == b"ok"
            os.link(own, shm / "sem.tmp2")
            os.chown(shm / "sem.tmp2", *NOBODY)
            os.unlink(own)
            checkpoint.unlink_shm_names([child2.pid], child2.pid, shm)
            assert not (shm / "sem.tmp2").exists()
        finally:
            child2.send_signal(signal.SIGKILL)
            child2.wait()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
