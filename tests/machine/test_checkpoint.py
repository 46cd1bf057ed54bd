"""An instance's CRIU checkpoint (inference_machine.checkpoint): which checkpoints a start
refuses and why, that a refused or failed restore leaves nothing running and the caller starts
as if there were none, and the pieces a checkpoint is made of that need no GPU."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import answering

from inference_machine import checkpoint
from inference_machine.checkpoint import CheckpointRefused
from inference_machine.cuda_checkpoint import CudaCheckpointError, Driver, tree

KEY = {"vllm": "0.26.0", "gpu": "NVIDIA H200", "driver": "580.159.04",
       "gpu_uuids": "GPU-b9c65e0b", "kernel": "6.18.44", "criu": "4.2.1", "unit_sha256": "ab12"}


def _checkpoint(dest: Path, key: dict[str, str] = KEY, **over: object) -> Path:
    """A checkpoint folder as take() leaves it: images and a manifest listing their sizes."""
    images = dest / checkpoint.IMAGES
    images.mkdir(parents=True)
    (images / "pages-1.img").write_bytes(b"\0" * 4096)
    (images / "core-4242.img").write_bytes(b"core")
    manifest = {"schema": checkpoint.SCHEMA, "key": key, "pid": 4242, "gpu_pids": [4300],
                "port": 8100, "model": "m", "reference": " the same sixteen tokens",
                "stdio": {"1": "pipe:[77]", "2": "pipe:[77]"},
                "files": {"pages-1.img": 4096, "core-4242.img": 4}, "bytes": 4100}
    manifest.update(over)
    (dest / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    return dest


def test_a_checkpoint_of_this_machine_is_usable(tmp_path: Path) -> None:
    m = checkpoint.validate(_checkpoint(tmp_path / "vllm-0"), dict(KEY))
    assert m["pid"] == 4242 and m["reference"] == " the same sixteen tokens"


@pytest.mark.parametrize(("change", "why"), [
    ("missing", "no checkpoint at"),
    ("not json", "corrupt: "),
    ("old schema", "corrupt: "),
    ("driver", "stale: driver is '580.160.01' here, '580.159.04' in the checkpoint"),
    ("another GPU", "stale: gpu_uuids is 'GPU-0000' here"),
    ("new field", "stale: plugin_sha256 is 'ff' here, 'missing' in the checkpoint"),
    ("truncated image", "corrupt: 1 image file(s) missing or of another size, e.g. pages-1.img "
                        "(100 bytes, 4096 written)"),
    ("lost image", "corrupt: 1 image file(s) missing or of another size, e.g. core-4242.img "
                   "(missing bytes, 4 written)"),
    ("stray image", "corrupt: image file(s) the manifest does not list, e.g. x.img"),
    ("no reference", "corrupt: no reference answer"),
])
def test_a_start_refuses_a_checkpoint_saying_why(tmp_path: Path, change: str, why: str) -> None:
    dest, key = tmp_path / "vllm-0", dict(KEY)
    if change != "missing":
        _checkpoint(dest, reference="" if change == "no reference" else " ok")
    mf, images = dest / checkpoint.MANIFEST, dest / checkpoint.IMAGES
    if change == "not json":
        mf.write_text("{half")
    elif change == "old schema":
        mf.write_text(json.dumps({**json.loads(mf.read_text()), "schema": 0}))
    elif change == "driver":
        key["driver"] = "580.160.01"
    elif change == "another GPU":
        key["gpu_uuids"] = "GPU-0000"
    elif change == "new field":
        key["plugin_sha256"] = "ff"
    elif change == "truncated image":
        (images / "pages-1.img").write_bytes(b"\0" * 100)
    elif change == "lost image":
        (images / "core-4242.img").unlink()
    elif change == "stray image":
        (images / "x.img").write_bytes(b"x")
    with pytest.raises(CheckpointRefused) as exc:
        checkpoint.validate(dest, key)
    assert str(exc.value).startswith(why) or why in str(exc.value), str(exc.value)


def test_a_refused_checkpoint_never_reaches_criu(tmp_path: Path) -> None:
    """A stale checkpoint is refused by its key alone: CRIU (here a path that does not exist,
    which would raise another error) is never run, and the caller starts normally."""
    dest = _checkpoint(tmp_path / "vllm-0")
    with pytest.raises(CheckpointRefused, match=r"^stale: kernel"):
        checkpoint.restore(dest, {**KEY, "kernel": "6.19.0"}, str(tmp_path / "no-criu"))
    assert not (dest / "restore.log").exists()


def test_a_restore_that_fails_is_refused_with_criu_s_reason(tmp_path: Path) -> None:
    """A checkpoint that passes its checks but that CRIU cannot restore (Debian's CRIU, `make
    deps`, given images that are no process): refused with CRIU's error lines, nothing
    restored, no pid handed back."""
    criu = shutil.which("criu")
    assert criu, "no criu: `make deps` installs Debian's"
    dest = _checkpoint(tmp_path / "vllm-0")
    t = checkpoint.Timings()
    with pytest.raises(CheckpointRefused, match=r"^criu restore exited [0-9]+: .+"):
        checkpoint.restore(dest, dict(KEY), criu, t)
    assert [n for n, _ in t.phases] == ["validate"]
    assert not (dest / "restored.pid").exists()


def test_a_restored_tree_that_fails_its_check_is_killed(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """After CRIU, a failure (here: no CUDA driver on this machine) kills the restored tree,
    whose pid CRIU's pidfile names, before the refusal reaches the caller. CRIU is stood in for
    by a script that writes a running process's pid as a restore would: a real restore needs a
    real checkpoint, which needs the GPU machine."""
    dest = _checkpoint(tmp_path / "vllm-0")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    criu = tmp_path / "criu"
    criu.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --pidfile ] && pf=$2; shift; "
                    f"done\necho {child.pid} > \"$pf\"\n")
    criu.chmod(0o755)
    monkeypatch.setattr(checkpoint, "Driver", lambda: Driver("libcuda-absent.so.1"))
    with pytest.raises(CheckpointRefused, match="restore failed: no CUDA driver library"):
        checkpoint.restore(dest, dict(KEY), str(criu))
    assert child.wait(timeout=10) == -9


def test_no_cuda_driver_is_one_clear_error() -> None:
    with pytest.raises(CudaCheckpointError, match="no CUDA driver library"):
        Driver("libcuda-absent.so.1")


def test_the_tree_lists_a_process_and_its_children_parents_first() -> None:
    child = subprocess.Popen([sys.executable, "-c",
                              "import subprocess, sys, time; subprocess.Popen([sys.executable, "
                              "'-c', 'import time; time.sleep(30)']); time.sleep(30)"])
    try:
        for _ in range(100):
            pids = tree(child.pid)
            if len(pids) == 2:
                break
            time.sleep(0.05)
        assert pids[0] == child.pid and len(pids) == 2
        assert tree(os.getpid())[0] == os.getpid() and child.pid in tree(os.getpid())
    finally:
        for p in reversed(tree(child.pid)):
            os.kill(p, 9)
        child.wait()


def test_standard_streams_are_handed_over_once_each() -> None:
    assert checkpoint.inherit_args({"1": "pipe:[77]", "2": "pipe:[77]"}) == [
        "--inherit-fd", "fd[1]:pipe:[77]"]
    assert checkpoint.inherit_args({"1": "socket:[9]", "2": "/var/log/x.log"}) == [
        "--inherit-fd", "fd[1]:socket:[9]"]
    assert checkpoint.inherit_args({"1": "/dev/null", "2": "/dev/null"}) == []


def test_the_key_changes_with_the_unit(tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    (units / "vllm-0.env").write_text("A=1\n")
    (units / "vllm-0.args").write_text("--port\n8100\n")
    before = checkpoint.unit_digest(units, "vllm-0")
    (units / "vllm-0.args").write_text("--port\n8101\n")
    assert checkpoint.unit_digest(units, "vllm-0") != before
    key = checkpoint.checkpoint_key(tmp_path, None, units, "vllm-0", str(tmp_path / "no-criu"))
    assert set(checkpoint.EXTRA_KEY) <= set(key) and key["criu"] == "none"


def test_this_process_holds_no_device_file_or_io_uring() -> None:
    assert checkpoint.device_files([os.getpid()]) == []
    assert checkpoint.io_uring_holders([os.getpid()]) == []


@pytest.mark.parametrize("body", [b'{"choices": [', b'{"choices": []}', b"[1" + b"9" * 5000 + b"]",
                                  b"<html>\x1b[2J"])
def test_an_instance_answer_that_is_no_completion_is_an_os_error(body: bytes) -> None:
    """The reference answer a checkpoint keeps and a restore compares: an instance that answers
    something else (cut short, empty, a number past Python's limit, a page) is an OSError the
    take and the restore turn into their refusal, not a traceback."""
    with answering(body) as port, pytest.raises(OSError, match="no completion in the answer"):
        checkpoint.reference_answer(port, "m", deadline_s=5)


def test_a_take_that_fails_wakes_the_instance_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that fails after the instance went to sleep (here: no process of its tree has
    a CUDA context): the instance is woken again and serves on, and no half-written checkpoint is
    left. The instance is a stand-in HTTP server, and so is the driver (this machine has no GPU)."""
    calls: list[str] = []
    monkeypatch.setattr(checkpoint, "Driver", lambda: object())
    monkeypatch.setattr(checkpoint, "gpu_processes", lambda pid, drv: [])
    dest = tmp_path / "checkpoints" / "vllm-0"
    with answering(json.dumps({"choices": [{"text": " ok"}]}).encode(), calls) as port, \
            pytest.raises(CheckpointRefused, match="has a CUDA context"):
        checkpoint.take(os.getpid(), port, "m", dest, dict(KEY), "criu")
    assert calls == ["/v1/completions", "/sleep?level=1", "/wake_up"]
    assert not dest.exists() and list((tmp_path / "checkpoints").iterdir()) == []


def test_a_named_semaphore_a_process_maps_is_found_by_its_name(tmp_path: Path) -> None:
    """The start method spawn keeps a semaphore's name under /dev/shm while glibc maps the file
    through a temporary name it removed: take() removes such names (CRIU then writes the file
    into the images) and nothing else of /dev/shm. A child that holds one, its name found; the
    name of a file nobody maps through a deleted name, not."""
    code = ("import multiprocessing as mp, sys, time\n"
            "lock = mp.get_context('spawn').Lock()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    other = Path("/dev/shm") / f"inference-image-test-{os.getpid()}"
    other.write_bytes(b"x")
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        names = checkpoint.shm_names([child.pid])
        assert len(names) == 1 and names[0].name.startswith("sem.") and names[0].exists()
        assert other not in names
        assert checkpoint.shm_names([os.getpid()]) == []
    finally:
        child.kill()
        child.wait()
        other.unlink()


def test_memory_counts_what_a_process_holds_anonymously() -> None:
    """The manifest's memory: a process that takes 64 MiB more anonymous memory is counted with
    them; a pid that is gone is left out."""
    def anon() -> float:
        return float(checkpoint.memory([os.getpid()])[str(os.getpid())]["rssanon_mib"])

    before = anon()
    held = bytearray(64 * 2**20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    assert anon() - before >= 60
    proc = subprocess.Popen(["true"])
    proc.wait()
    got = checkpoint.memory([os.getpid(), proc.pid])
    assert list(got) == [str(os.getpid())]
    # its command line as ps shows it (an xdist worker's holds a script with newlines)
    shown = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert got[str(os.getpid())]["cmd"] == shown[:120]
    del held


def test_a_restore_whose_pid_is_taken_says_so_and_leaves_the_checkpoint_usable(
        tmp_path: Path) -> None:
    """CRIU restores a process under the pid it had: one taken by another process (a start after
    a reboot) is refused naming the pid. The statistics CRIU writes go to its work directory
    (-W, the checkpoint's folder), not among the images: the next restore still finds the
    images the manifest lists. CRIU stood in for by a script doing what the real one does there
    (a real restore needs a real checkpoint, which needs the GPU machine)."""
    dest = _checkpoint(tmp_path / "vllm-0")
    criu = tmp_path / "criu"
    criu.write_text(
        "#!/bin/sh\nwhile [ $# -gt 0 ]; do case $1 in -o) log=$2;; -W) work=$2;; -D) img=$2;; "
        "esac; shift; done\n: > \"${work:-$img}/stats-restore\"\n"
        "echo \"(00.1) Error (criu/cr-restore.c:1237): Can't fork for 4242: File exists\" > $log\n"
        "exit 1\n")
    criu.chmod(0o755)
    for _ in range(2):
        with pytest.raises(CheckpointRefused, match=r"pid 4242, which the checkpoint's process "
                           r"had, is another process's now"):
            checkpoint.restore(dest, dict(KEY), str(criu))
    assert (dest / "stats-restore").exists()
    checkpoint.validate(dest, dict(KEY))


def test_kill_tree_waits_until_the_tree_has_exited() -> None:
    """A restore needs the pids its checkpoint's processes had: killing a restored tree returns
    once every process of it has exited (a zombie is its parent's to reap), its children too."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(tree(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    family = tree(proc.pid)
    assert len(family) == 3
    assert checkpoint.kill_tree(proc.pid, wait_s=10) == []
    # killed, or exited 0 from its `wait` when its children died just before its own SIGKILL came
    assert proc.wait(timeout=5) in (-9, 0)
    assert not any(Path(f"/proc/{p}").exists() and Path(f"/proc/{p}/stat").read_text()
                   .rpartition(")")[2].split()[0] != "Z" for p in family)


def test_a_restore_marks_the_phases_the_ledger_shows_in_their_order() -> None:
    """The ledger's columns for a restored start are RESTORE_PHASES (ready_chart): restore() must
    mark exactly those, in that order, or a phase would vanish from the table."""
    import inspect
    import re

    marked = re.findall(r't\.mark\("(\w+)"\)', inspect.getsource(checkpoint.restore))
    assert tuple(marked) == checkpoint.RESTORE_PHASES


# A process tree shaped like an instance's (an API process and its worker talking over loopback
# TCP, its output a connected stream socket as systemd's journal is), answering GET / with both
# pids and a count the worker keeps in memory, one line of output each answer.
TREE = r"""
import http.server, os, socket, subprocess, sys
port = int(sys.argv[1])
if sys.argv[2:] == ["worker"]:
    s, n = socket.create_connection(("127.0.0.1", port + 1)), 0
    while s.recv(1):
        n += 1
        s.sendall(f"{os.getpid()}:{n}".encode().ljust(32))
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port + 1))
ls.listen(1)
worker = subprocess.Popen([sys.executable, __file__, str(port), "worker"])
conn = ls.accept()[0]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        conn.sendall(b"x")
        body = f"api={os.getpid()} worker={conn.recv(32).decode().strip()}".encode()
        print(body.decode(), flush=True)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
print("serving", flush=True)
srv.serve_forever()
"""


PR_SET_CHILD_SUBREAPER = 36


def _working_criu() -> str:
    """A CRIU that can run here ($PROOF_CRIU, else on PATH): `criu check` says so (Debian 12's
    3.17 cannot initialise on Linux 6.16 and later; CRIU 4.2 built from Debian's source can)."""
    criu = os.environ.get("PROOF_CRIU") or shutil.which("criu")
    if not criu or os.geteuid() != 0:
        pytest.skip("needs root and CRIU ($PROOF_CRIU or on PATH)")
    out = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=60, check=False)
    if "Looks good" not in out.stdout + out.stderr:
        pytest.skip(f"{criu} cannot run on this kernel: "
                    f"{(out.stdout + out.stderr).strip().splitlines()[-1:]}")
    return criu


def _get(port: int) -> str:
    from inference_machine.bounded_http import fetch
    return fetch(f"http://127.0.0.1:{port}/", deadline_s=10).body.decode()


@pytest.mark.criu
@pytest.mark.parametrize("uid", [0, 65534], ids=["root", "another-user"])
def test_criu_writes_and_restores_a_tree_whose_output_is_the_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uid: int) -> None:
    """With a CRIU that runs here: a tree whose output is a connected stream socket (systemd's
    journal, where a unit's instance writes) is dumped while it runs, killed, and restored with
    its memory, its loopback connection and its pids; its output then goes to the restorer's
    socket. A checkpoint whose image CRIU cannot finish (a truncated page image, which keeps its
    restore spinning) is refused once its time is up, and nothing it restored is left running.
    The tree of another user too (an instance's, under systemd), also where root lacks
    CAP_SYS_RESOURCE, as here (scripts/build-criu's patch: its limits from /proc)."""
    import socket

    criu = _working_criu()
    if uid:  # its script where that user may read it
        tmp_path = Path(tempfile.mkdtemp(dir="/tmp"))
        tmp_path.chmod(0o755)
    # the worker, orphaned when its API process is killed, is this process's to reap (as an
    # instance's tree is its unit's): its pid is free for the restore only once reaped
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    script, port = tmp_path / "tree.py", 18931
    script.write_text(TREE)
    journal, ours = socket.socketpair()  # the journal's end and the tree's
    # another user's tree runs the system's Python: this one may sit in root's home
    python = "/usr/bin/python3" if uid else sys.executable
    proc = subprocess.Popen([python, str(script), str(port)], stdout=ours, stderr=ours,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            **({"user": uid, "group": uid, "extra_groups": []} if uid else {}))
    ours.close()
    dest = tmp_path / "vllm-0"
    (dest / checkpoint.IMAGES).mkdir(parents=True)
    pids: list[int] = []
    try:
        journal.settimeout(30)
        assert journal.recv(64).startswith(b"serving")
        first = _get(port)
        pids = tree(proc.pid)
        assert len(pids) == 2 and first == f"api={pids[0]} worker={pids[1]}:1"
        checkpoint.dump(proc.pid, dest / checkpoint.IMAGES, criu, mib=64)
        assert _get(port).endswith(":2")  # left running, serving on
        files = {p.name: p.stat().st_size for p in (dest / checkpoint.IMAGES).iterdir()}
        manifest = {"stdio": checkpoint.stdio(proc.pid), "bytes": sum(files.values())}
        assert checkpoint.kill_tree(proc.pid, wait_s=10) == []
        proc.wait(timeout=10)
        _reap(pids)

        journal2, theirs = socket.socketpair()
        with theirs:
            pid = checkpoint.restore_tree(dest, manifest, criu, stdout=theirs.fileno())
        assert pid == pids[0] and tree(pid) == pids
        assert os.stat(f"/proc/{pid}").st_uid == uid
        assert _get(port) == f"api={pids[0]} worker={pids[1]}:2"  # its count, from before the kill
        journal2.settimeout(10)
        assert journal2.recv(64).startswith(f"api={pids[0]}".encode())
        assert checkpoint.kill_tree(pid, wait_s=10) == []
        _reap(pids)

        pages = max((dest / checkpoint.IMAGES).glob("pages-*.img"), key=lambda p: p.stat().st_size)
        os.truncate(pages, 100)
        monkeypatch.setattr(checkpoint, "CRIU_MIN_TIMEOUT_S", 5.0)
        t0 = time.monotonic()
        with pytest.raises(CheckpointRefused, match=r"^criu restore did not finish in 5 s"):
            checkpoint.restore_tree(dest, manifest, criu)
        assert time.monotonic() - t0 < 30
        assert not [p for p in pids if checkpoint.alive(p)]
    finally:
        for p in pids:
            with contextlib.suppress(OSError):
                os.kill(p, 9)
        proc.kill()
        _reap(pids)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        if uid:
            shutil.rmtree(tmp_path, ignore_errors=True)


# a unit's start as systemd sandboxes it, for what CRIU meets there: its own UTS and IPC
# namespaces (ProtectHostname, PrivateIPC) and a mount namespace whose /proc/sys is read-only
# (ProtectKernelTunables); its stdin opened in there, as systemd opens a unit's
SANDBOXED = ("unshare", "--uts", "--ipc", "--mount", "--propagation", "private", "sh", "-c",
             'mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && '
             'exec "$@" < /dev/null',
             "start")


def _ns(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


@pytest.mark.criu
def test_a_sandboxed_start_is_restored_into_the_namespaces_of_the_next_start(
        tmp_path: Path) -> None:
    """With a CRIU that runs here: a tree in a start's namespaces, as a unit's sandbox makes
    them, written from inside them (`Criu.in_start`) and restored from inside the next start's,
    joins that start's namespaces. Written from its mount namespace alone (the helper's first
    way), the restore has to make the UTS namespace again through the read-only /proc/sys and
    fails, as it did on the GPU machine under systemd."""
    import socket

    criu = _working_criu()

    def mount_only(pid: int) -> checkpoint.Criu:  # the helper's first way
        return checkpoint.Criu(criu, ("nsenter", "-t", str(pid), "-m", "--"))

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    script, port = tmp_path / "tree.py", 18932
    script.write_text(TREE)
    journal, ours = socket.socketpair()
    proc = subprocess.Popen([*SANDBOXED, sys.executable, str(script), str(port)], stdout=ours,
                            stderr=ours, stdin=subprocess.DEVNULL, start_new_session=True)
    ours.close()
    starts: list[subprocess.Popen[bytes]] = []
    pids: list[int] = []
    restored = 0
    try:
        journal.settimeout(30)
        assert journal.recv(64).startswith(b"serving")
        pids = tree(proc.pid)
        assert _ns(proc.pid, "uts") != _ns(os.getpid(), "uts")
        images: dict[str, Path] = {}
        for way, criu_run in (("mount", mount_only(proc.pid)),
                              ("start", checkpoint.Criu.in_start(criu, proc.pid))):
            images[way] = tmp_path / way
            (images[way] / checkpoint.IMAGES).mkdir(parents=True)
            checkpoint.dump(proc.pid, images[way] / checkpoint.IMAGES, criu_run, mib=64)
        manifest = {"stdio": checkpoint.stdio(proc.pid), "bytes": 0}
        assert checkpoint.kill_tree(proc.pid, wait_s=10) == []
        proc.wait(timeout=10)
        _reap(pids)

        # the next start of the unit: its main process waits in namespaces of its own
        nxt = subprocess.Popen([*SANDBOXED, "sleep", "300"], start_new_session=True)
        starts.append(nxt)
        deadline = time.monotonic() + 10
        while _ns(nxt.pid, "uts") == _ns(os.getpid(), "uts") and time.monotonic() < deadline:
            time.sleep(0.05)
        # the next start's journal stream, which the restored tree writes to
        journal2, theirs = socket.socketpair()
        with theirs:
            with pytest.raises(CheckpointRefused, match="kernel/hostname"):
                checkpoint.restore_tree(images["mount"], manifest, mount_only(nxt.pid),
                                        stdout=theirs.fileno())
            _reap(pids)  # what CRIU had restored, killed: this process's to reap
            assert not [p for p in pids if checkpoint.alive(p)]
            restored = checkpoint.restore_tree(images["start"], manifest,
                                               checkpoint.Criu.in_start(criu, nxt.pid),
                                               stdout=theirs.fileno())
        assert restored == pids[0] and tree(restored) == pids
        for kind in ("mnt", "uts", "ipc", "net"):
            assert _ns(restored, kind) == _ns(nxt.pid, kind), kind
        assert _get(port) == f"api={pids[0]} worker={pids[1]}:1"
        journal2.settimeout(10)
        assert journal2.recv(64).startswith(f"api={pids[0]}".encode())
        assert checkpoint.kill_tree(restored, wait_s=10) == []
        _reap(pids)
    finally:
        for p in pids:
            with contextlib.suppress(OSError):
                os.kill(p, 9)
        for x in (proc, *starts):
            x.kill()
            x.wait(timeout=10)
        _reap(pids)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _reap(pids: list[int]) -> None:
    """Reap those of `pids` that were handed to this process and have exited."""
    for p in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p, 0)


def test_a_journal_stream_is_named_external_once_and_criu_gets_time_for_its_images() -> None:
    assert checkpoint.external_args({"1": "socket:[9]", "2": "socket:[9]"}) == [
        "--external", "unix[9]"]
    assert checkpoint.external_args({"1": "pipe:[7]", "2": "/var/log/x.log"}) == []
    assert checkpoint.criu_timeout(10) == checkpoint.CRIU_MIN_TIMEOUT_S
    big = 100 * checkpoint.CRIU_MIN_MIB_S * checkpoint.CRIU_MIN_TIMEOUT_S
    assert checkpoint.criu_timeout(big) == 100 * checkpoint.CRIU_MIN_TIMEOUT_S


def _completion(text: str) -> bytes:
    return json.dumps({"choices": [{"text": text}]}).encode()


RPC = {"/collective_rpc": [json.dumps({"results": [{"segments": 3, "bytes": 2**30}]}).encode()]}


def test_a_take_that_leaves_weights_in_the_files_reads_them_back_before_it_serves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """weights=files: the plugin releases the target's weights before the sleep, and after the
    wake they are read again and the reference answer must come back; a take that fails on the
    way (no CUDA context here) still does both, and leaves nothing."""
    calls: list[str] = []
    monkeypatch.setattr(checkpoint, "Driver", lambda: object())
    monkeypatch.setattr(checkpoint, "gpu_processes", lambda pid, drv: [])
    dest = tmp_path / "checkpoints" / "vllm-0"
    with answering({"/v1/completions": [_completion(" ok")], **RPC}, calls) as port, \
            pytest.raises(CheckpointRefused, match="has a CUDA context") as exc:
        checkpoint.take(os.getpid(), port, "m", dest, dict(KEY), "criu", weights="files")
    assert not isinstance(exc.value, checkpoint.InstanceLost)
    assert calls == ["/v1/completions", f"/collective_rpc {checkpoint.RELEASE_RPC}", "/sleep?level=1",
                     "/wake_up?tags=weights", f"/collective_rpc {checkpoint.RELOAD_RPC}",
                     "/wake_up?tags=kv_cache", "/v1/completions"]
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_a_take_whose_weights_do_not_come_back_says_the_instance_is_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read back from the files, the instance answers otherwise than before: it must not serve
    (InstanceLost, whatever else failed), and no checkpoint is left."""
    calls: list[str] = []
    monkeypatch.setattr(checkpoint, "Driver", lambda: object())
    monkeypatch.setattr(checkpoint, "gpu_processes", lambda pid, drv: [])
    dest = tmp_path / "checkpoints" / "vllm-0"
    answers = {"/v1/completions": [_completion(" ok"), _completion(" other")], **RPC}
    with answering(answers, calls) as port, \
            pytest.raises(checkpoint.InstanceLost, match="answered ' other', ' ok' before"):
        checkpoint.take(os.getpid(), port, "m", dest, dict(KEY), "criu", weights="files")
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_a_restore_of_a_checkpoint_without_weights_reads_them_after_the_wake(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restored tree whose checkpoint left its weights in the model's files reads them again
    between its wake and its reference answer, each a phase of its own. CRIU and the driver are
    stood in for (a real restore needs the GPU machine)."""
    dest = _checkpoint(tmp_path / "vllm-0", weights="files")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)

    class Drv:
        def restore(self, pid: int) -> None:
            pass

        unlock = restore

    monkeypatch.setattr(checkpoint, "Driver", Drv)
    monkeypatch.setattr(checkpoint, "restore_tree", lambda *a, **k: child.pid)
    calls: list[str] = []
    t = checkpoint.Timings()
    try:
        with answering({"/v1/completions": [_completion(" the same sixteen tokens")], **RPC},
                      calls) as port:
            manifest = json.loads((dest / checkpoint.MANIFEST).read_text())
            (dest / checkpoint.MANIFEST).write_text(json.dumps({**manifest, "port": port}))
            assert checkpoint.restore(dest, dict(KEY), "criu", t) == child.pid
    finally:
        child.kill()
    assert calls == ["/wake_up?tags=weights", f"/collective_rpc {checkpoint.RELOAD_RPC}",
                     "/wake_up?tags=kv_cache", "/v1/completions"]
    assert [n for n, _ in t.phases] == list(checkpoint.RESTORE_PHASES)
