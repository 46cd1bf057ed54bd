"""The hostile-input corpus v2 (tests/hostile, from ../shared/hostile-corpus-v2): 345 inputs a
careless or hostile user, profile author, fleet file, record or server gives the CLIs and the
machine's programs. Every case must end in a clear error (non-zero, one line that says what is
wrong) or harmlessly: no traceback, no hang, no bad value accepted, nothing injected. A case
whose check was wrong is corrected in tests/hostile/corrections.json with its reason.

`make hostile` runs it (part of `make test`). The cases write under /tmp/hostile-work and run
from /tmp/hostile (this checkout's .venv and profiles linked there), with a bounded stand-in
server on 127.0.0.1:18765, 18766 and 34463."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
pytestmark = pytest.mark.hostile
REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "tests" / "hostile"
W, H = Path("/tmp/hostile-work"), Path("/tmp/hostile")
LIMIT_S = 15
PORTS = (18765, 18766, 34463)
# the runner's classes (shared/hostile-corpus-v2/run_corpus.py)
MESSAGE = re.compile(r"error|fix|refus|not |usage|cannot|must|no such|invalid|unknown|keeping|"
                     r"is a |empty|no running", re.I)
GOOD = ("clear-error", "accepted-harmless")
CORRECTIONS = {k: v for k, v in json.loads((SRC / "corrections.json").read_text()).items()
               if k != "_"}
CASES = [json.loads(line) for line in (SRC / "corpus-v2.jsonl").read_text().splitlines()]


# The corpus ran the machine's programs as the render once held them, bash files under usr/local of
# a base render; they are now the machine's runtime's console scripts (machine/), which
# read the render's profile.json under INFERENCE_ROOT. `as-render TIER PROGRAM` (fixtures.sh)
# puts the base render's profile.json into the case's scratch root and runs the program there:
# the same input reaches the same program logic.
AS_RENDER = re.compile(r"bash (?:\$W/base/([a-z0-9-]+)|\$R)/usr/local/s?bin/(inference-[a-z]+)")


def _adapted(command: str) -> str:
    return AS_RENDER.sub(lambda m: f"{W}/bin/as-render {m.group(1) or 'cpu'} {m.group(2)}", command)


def _corrected(c: dict) -> dict:  # type: ignore[type-arg]
    fix = CORRECTIONS.get(c["id"], {})
    assert not fix or fix.get("why"), f"{c['id']}: a correction without its reason"
    c = {**c, **{k: v for k, v in fix.items() if k != "why"}}
    return {**c, "command": _adapted(c["command"])}


def _dies_with_pytest() -> None:
    # a pytest killed mid-run must not leave the stand-in server holding its ports for its hour
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _sh(script: str, env: dict[str, str], limit: float) -> tuple[int, str, bool]:
    p = subprocess.Popen(["bash", "-c", script], cwd=H, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=limit)
        return p.returncode, out.decode(errors="replace"), False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the case's own process group
        out, _ = p.communicate()
        return 124, out.decode(errors="replace"), True


@pytest.fixture(scope="module")
def corpus() -> Iterator[dict[str, str]]:
    for port in PORTS:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.fail(f"127.0.0.1:{port} is in use: the corpus's stand-in server needs it")
    shutil.rmtree(W, ignore_errors=True)
    shutil.rmtree(H, ignore_errors=True)
    shutil.copytree(SRC, W)
    H.mkdir()
    (H / ".venv").symlink_to(REPO / ".venv")
    (H / "profiles").symlink_to(REPO / "profiles")
    env = {**os.environ, "W": str(W), "H": str(H)}
    rc, out, _ = _sh(f"bash {W}/fixtures.sh", env, 300)
    assert rc == 0, out
    log = open(W / "server.log", "w")  # noqa: SIM115 - the server's, closed below
    srv = subprocess.Popen(
        ["python3", str(W / "fx" / "hostile_server.py"), *map(str, PORTS[:1]), str(PORTS[2]),
         str(PORTS[1]), str(W / "fx" / "api.pem"), str(W / "fx" / "api.key"),
         str(W / "server.log"), "3600"], stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=_dies_with_pytest)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", PORTS[0])) == 0:
                break
        time.sleep(0.1)
    try:
        yield env
    finally:
        srv.kill()
        srv.wait()
        log.close()


# one worker for all of v2 (`make hostile` runs v3 beside it): its stand-in server's ports are fixed
@pytest.mark.parametrize("case", [pytest.param(_corrected(c), marks=pytest.mark.xdist_group("v2"),
                                               id=c["id"]) for c in CASES])
def test_a_hostile_input_ends_in_a_clear_error_or_harmlessly(
        case: dict, corpus: dict[str, str]) -> None:  # type: ignore[type-arg]
    i = case["id"]
    (W / f"PWNED_{i}").unlink(missing_ok=True)
    out_file = W / "o" / f"{i}.out"
    env = {**corpus, "OUT": str(out_file)}
    pre = (f"source {W}/lib.sh; ulimit -v 2500000; o=$W/o/{i}; f=$W/fx/fleet-{i}.yaml; "
           f"R=$W/rt/{i}; L=$R/stub.log; P=$W/p/{i}; ")
    t0 = time.monotonic()
    rc, out, timed_out = _sh(pre + case["command"], env, case.get("limit_s", LIMIT_S))
    wall = time.monotonic() - t0
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(out)
    hit, check_out = False, ""
    if case.get("check") and not timed_out:
        crc, check_out, _ = _sh("set -o pipefail; " + pre + case["check"], env, LIMIT_S)
        hit = crc == 0
    if timed_out:
        cls = "hang"
    elif "Traceback (most recent call last)" in out:
        cls = "traceback"
    elif hit:
        cls = case["bad"]
    elif rc != 0:
        cls = "clear-error" if MESSAGE.search(out) else "unclear-error"
    else:
        cls = "accepted-harmless"
    if case.get("manual") and cls in GOOD:
        cls = case["manual"]
    said = " | ".join(line for line in out.splitlines() if line.strip())[-600:]
    assert cls in GOOD, (f"{i} ({case.get('area')}): {cls} after {wall:.1f} s, rc {rc}; "
                         f"expected {case.get('expected')!r}; output: {said}; check: "
                         f"{check_out.strip()[-300:]}")
    if want := case.get("message"):
        assert re.search(want, out), f"{i}: the output does not say {want!r}: {said}"
