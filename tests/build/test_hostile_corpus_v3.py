"""The hostile-input corpus v3 (tests/hostile3, from ../shared/hostile-corpus-v3, written against
the project of 2026-12-04 and ported to its layout on 2026-12-07): 250 inputs to the warm-cache
bundles, the root checkpoint helper, the login banner and a start's status, notify, the
profiles' new fields and Triton kernel lists, the lab, the ledger and the fleet file, and what the
unprivileged service user (played by `nobody`) can make a root helper do. Every case must end in
a clear error (non-zero, a line that says what is wrong) or harmlessly: no escalation, injection,
bad value accepted, hang or traceback. Classified as the corpus's own runner classifies
(run_corpus.py). A case whose check or old judgement is wrong for the project as it is now is
corrected in tests/hostile3/corrections.json, with its reason.

`make hostile` runs it beside v2 (part of `make test`), spread over workers by area: the
checkpoint cases share one stand-in port and run one after another. Scratch: /tmp/hostile3-work,
the code under test reached through /tmp/hostile3 (links to this checkout); stand-in servers on
127.0.0.1:18871-18879."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.hostile
REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "tests" / "hostile3"
W, H = Path("/tmp/hostile3-work"), Path("/tmp/hostile3")
# what the cases reach of the project through H (lib.sh: PATH, PYTHONPATH, home())
LINKED = (".venv", "machine", "src", "lab", "plugins", "profiles", "scripts")
SEVERITY = ["escalation", "injection", "accepted-bad-value", "hang", "traceback"]
GOOD = ("clear-error", "harmless")
# run_corpus.py's test of a message that says what is wrong
MESSAGE = re.compile(r"error|fix|refus|not |usage|cannot|must|no such|invalid|unknown|is a |empty|"
                     r"missing|corrupt|stale|outside|larger|more than|no cache|no key|no process|"
                     r"no recorded|no \S+ (list|manifest)|does not|too |a second|letters, digits|"
                     r"nothing to", re.I)
CORRECTIONS = {k: v for k, v in json.loads((SRC / "corrections.json").read_text()).items()
               if k != "_"}
CASES = [json.loads(line) for line in (SRC / "corpus-v3.jsonl").read_text().splitlines()]
# one worker a group: the checkpoint helper's, notify's and the banner's cases listen on fixed
# stand-in ports; CK30 waits out its helper's minute for a main process and reaches no port, so it
# waits beside them, on a worker of its own
GROUP = {"checkpoint": "v3-ports", "checkpoint-follow": "v3-ports", "notify": "v3-ports",
         "motd": "v3-ports", "CK30": "v3-wait"}


def _corrected(c: dict) -> dict:  # type: ignore[type-arg]
    fix = CORRECTIONS.get(c["id"], {})
    assert not fix or fix.get("why"), f"{c['id']}: a correction without its reason"
    return {**c, **{k: v for k, v in fix.items() if k != "why"}}


def _sh(script: str, env: dict[str, str], limit: float) -> tuple[int, str, bool]:
    p = subprocess.Popen(["bash", "-c", script], cwd=H, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=limit)
        rc, timed_out = p.returncode, False
    except subprocess.TimeoutExpired:
        rc, timed_out = 124, True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
    # whatever the case left running in its group (stand-ins, sleeps, a helper)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    return rc, out.decode(errors="replace"), timed_out


@pytest.fixture(scope="session")
def corpus() -> dict[str, str]:
    """H's links and the corpus's fixtures, made once for all workers (a lock between them)."""
    W.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "INFERENCE_IMAGE_HOME")}
    env.update(W=str(W), H=str(H))
    with open("/tmp/hostile3.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        H.mkdir(exist_ok=True)
        for name in LINKED:
            link = H / name
            if not (link.is_symlink() and link.resolve() == (REPO / name).resolve()):
                link.unlink(missing_ok=True)
                link.symlink_to(REPO / name)
        rc, out, _ = _sh(f"bash {SRC}/fixtures.sh", env, 300)
        assert rc == 0, out
    return env


@pytest.mark.parametrize("case", [
    pytest.param(_corrected(c), marks=pytest.mark.xdist_group(
        GROUP.get(c["id"], GROUP.get(c["area"], "v3"))),
                 id=c["id"]) for c in CASES])
def test_a_hostile_input_ends_in_a_clear_error_or_harmlessly(
        case: dict, corpus: dict[str, str]) -> None:  # type: ignore[type-arg]
    i = case["id"]
    pre = f"source {SRC}/lib.sh; ulimit -v 2500000; I={i}; o=$W/o/{i}; "
    t0 = time.monotonic()
    rc, out, timed_out = _sh(pre + case["command"], corpus, case.get("limit") or 15)
    wall = time.monotonic() - t0
    (W / "o").mkdir(exist_ok=True)
    (W / "o" / f"{i}.out").write_text(out)
    hits = []
    for check, cls in case.get("checks") or []:
        crc, cout, _ = _sh(pre + check, corpus, 30)
        if crc == 0:
            hits.append((cls, " | ".join(ln for ln in cout.splitlines() if ln.strip())[-300:]))
    hits.sort(key=lambda h: SEVERITY.index(h[0]))
    if hits:
        cls = hits[0][0]
    elif timed_out:
        cls = "hang"
    elif "Traceback (most recent call last)" in out:
        cls = "traceback"
    elif rc != 0:
        cls = "clear-error" if MESSAGE.search(out) else "unclear-error"
    else:
        cls = "harmless"
    if case.get("manual") and cls in GOOD:
        cls = case["manual"]
    said = " | ".join(line for line in out.splitlines() if line.strip())[-600:]
    assert cls in GOOD, (f"{i} ({case['area']}): {cls} after {wall:.1f} s, rc {rc}; expected "
                         f"{case.get('expected')!r}; output: {said}; checks: {hits}")
    if want := case.get("message"):
        assert re.search(want, out), f"{i}: the output does not say {want!r}: {said}"
