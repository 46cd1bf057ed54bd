"""serving.checkpoint on the image (inference_machine.unit_checkpoint, the plugin's gate,
the render): what the profile refuses, what the render writes, the gate that keeps clients out
until the helper opens it, the follower, and a real inference-run beside its real helper falling
back to a cold start, saying why, where there is no usable checkpoint or no GPU to take one on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, free_port, runtime

from inference_image.profiles import ProfileErrors, resolve
from inference_image.render import CHECKPOINT_ENV, CHECKPOINT_GATE, CHECKPOINT_RELOAD, PATHS, render
from inference_machine import checkpoint, unit_checkpoint
from inference_machine.bounded_http import fetch

sys.path.insert(0, str(ROOT / "plugins" / "vllm"))
from inference_image_vllm.gate import Gate
from inference_image_vllm.reload import OWN_SEGMENT_BYTES, own_segments

CHECKPOINTS = {"serving.checkpoint": "true", "serving.engine_process": "spawn"}


def _resolved(tier: str = "h100", **sets: str) -> Any:
    return resolve(tier, overrides=[f"{k}={v}" for k, v in sets.items()])


@pytest.mark.parametrize(("tier", "sets", "names"), [
    ("cpu", {"serving.checkpoint": "true"}, "the cpu tier has none"),
    ("h100", {"serving.checkpoint": "true", "serving.engine_process": "fork"},
     "serving.engine_process: spawn"),
    ("h200x8", CHECKPOINTS, "one GPU on one machine"),
])
def test_a_profile_that_cannot_checkpoint_is_refused_naming_the_field(
        tier: str, sets: dict[str, str], names: str) -> None:
    with pytest.raises(ProfileErrors) as exc:
        _resolved(tier, **sets)
    assert "serving.checkpoint" in str(exc.value) and names in str(exc.value)


@pytest.mark.parametrize(("tier", "sets", "names"), [
    ("h200", {"serving.checkpoint_weights": "files"}, "serving.checkpoint is off"),
])
def test_where_weights_go_is_refused_without_a_checkpoint(tier: str, sets: dict[str, str],
                                                          names: str) -> None:
    with pytest.raises(ProfileErrors) as exc:
        _resolved(tier, **sets)
    assert "serving.checkpoint_weights" in str(exc.value) and names in str(exc.value)


def test_a_checkpoint_without_its_weights_gets_the_plugin_s_reload(tmp_path: Path) -> None:
    """serving.checkpoint_weights: files gives vLLM the plugin's worker methods and tells the
    helper; host (the default) renders as before."""
    render(_resolved("h200", **CHECKPOINTS, **{"serving.checkpoint_weights": "files"}),
           tmp_path / "files")
    render(_resolved("h200", **CHECKPOINTS), tmp_path / "host")
    for mode in ("files", "host"):
        units = tmp_path / mode / "etc/inference-image/units"
        args = (units / "vllm-0.args").read_text().splitlines()
        assert (args[args.index("--worker-extension-cls") + 1] == CHECKPOINT_RELOAD) if \
            mode == "files" else "--worker-extension-cls" not in args
        assert f"INFERENCE_CHECKPOINT_WEIGHTS={mode}" in (units / "vllm-0.env").read_text()


def test_only_segments_of_one_large_parameter_each_are_left_to_the_files() -> None:
    """The plugin discards at the sleep only a segment that one large parameter begins and fills
    but for torch's 2 MiB rounding: a segment shared with anything else is copied as before."""
    big = OWN_SEGMENT_BYTES
    storages = {0x1000: big, 0x9000_0000: 3 * big, 0x7000_0000: big // 2, 0x5000_0000: big}
    segments = {0x1000: big, 0x9000_0000: 3 * big + 2 * 2**20 - 512,  # rounded up
                0x7000_0000: 20 * 2**20,  # a small parameter's shared segment
                0x5000_0000: big + 4 * 2**20,  # room for other tensors after it
                0x3000_0000: big}  # no parameter begins it
    assert sorted(own_segments(storages, segments)) == [0x1000, 0x9000_0000]


def test_a_take_that_stops_its_instance_is_not_tried_again_under_the_same_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A take that leaves the instance unable to serve (its weights not read back): the helper
    stops it and notes the key, so the unit's next start serves cold, saying why, without a
    take; another key tries again. The instance is a sleeping process, the take stood in for."""
    units, store, run = tmp_path / "units", tmp_path / "store", tmp_path / "run"
    units.mkdir()
    (units / "vllm-0.env").write_text(f"INFERENCE_CACHE={tmp_path}\n"
                                      "INFERENCE_CHECKPOINT_WEIGHTS=files\n")
    (units / "vllm-0.args").write_text("--port\n8100\n--served-model-name\nm\n")
    key = {"driver": "580"}
    monkeypatch.setattr(checkpoint, "checkpoint_key", lambda *a: dict(key))
    monkeypatch.setattr(unit_checkpoint, "wait_answering", lambda *a: True)
    # the stand-in serves no gate: idle at once, nothing inside
    monkeypatch.setattr(unit_checkpoint, "quiet_for", lambda *a: True)
    monkeypatch.setattr(unit_checkpoint, "drained", lambda *a: True)
    taken: list[str] = []

    def take(*_: object, weights: str, **__: object) -> dict[str, Any]:
        taken.append(weights)
        raise checkpoint.InstanceLost("after its weights were read back it answered 'x'")

    monkeypatch.setattr(checkpoint, "take", take)
    said: list[str] = []
    monkeypatch.setattr(unit_checkpoint, "say", lambda inst, text: said.append(text))

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    first = start()
    assert unit_checkpoint.helper("vllm-0", units, store, run, "/bin/true", pid=first.pid) == 0
    assert first.wait(timeout=10) == -9 and taken == ["files"]
    assert said[-1].startswith("stopped: the checkpoint's take left it unable to serve")
    second = start()
    try:
        unit_checkpoint.helper("vllm-0", units, store, run, "/bin/true", pid=second.pid)
        assert taken == ["files"] and second.poll() is None
        assert "a take under this key stopped the instance before" in said[-1]
        assert (run / "vllm-0.open").exists()
        key["driver"] = "590"  # a new driver: tried again
        unit_checkpoint.helper("vllm-0", units, store, run, "/bin/true", pid=second.pid)
        assert taken == ["files", "files"]
    finally:
        second.kill()


def test_the_render_of_a_tier_that_checkpoints_has_its_helper_gate_and_kernel_setting(
        tmp_path: Path) -> None:
    r = _resolved(**CHECKPOINTS)
    render(r, tmp_path / "on")
    render(_resolved(), tmp_path / "off")
    on, off = tmp_path / "on", tmp_path / "off"
    args = (on / "etc/inference-image/units/vllm-0.args").read_text().splitlines()
    assert "--enable-sleep-mode" in args and args[args.index("--middleware") + 1] == CHECKPOINT_GATE
    env = (on / "etc/inference-image/units/vllm-0.env").read_text().splitlines()
    assert {f"{k}={v}" for k, v in CHECKPOINT_ENV.items()} <= set(env)
    helper = (on / "etc/systemd/system/inference-checkpoint@.service").read_text()
    assert f"--store {PATHS['checkpoints']} --run {PATHS['checkpoint_run']} " \
           f"--criu {PATHS['criu']}" in helper and "BindsTo=vllm@%i.service" in helper
    unit = (on / "etc/systemd/system/vllm@.service").read_text()
    assert "ExecStartPre=+/bin/systemctl start --no-block inference-checkpoint@%i.service" in unit
    assert f"-{PATHS['checkpoints']}" in unit
    tmpfiles = (on / "etc/tmpfiles.d/inference-checkpoint.conf").read_text()
    assert f"d {PATHS['checkpoints']} 0700 root root -" in tmpfiles
    extra = json.loads((on / "ansible/extra-vars.json").read_text())
    assert extra["checkpoint_enabled"] is True and extra["checkpoint_store"] == PATHS["checkpoints"]
    assert extra["base_sysctl_extra"] == {"kernel.io_uring_disabled": 2}
    assert json.loads((off / "ansible/extra-vars.json").read_text())["base_sysctl_extra"] == {}
    # a tier that does not checkpoint is rendered as before
    assert not (off / "etc/systemd/system/inference-checkpoint@.service").exists()
    assert "--middleware" not in (off / "etc/inference-image/units/vllm-0.args").read_text()
    assert "checkpoint" not in (off / "etc/systemd/system/vllm@.service").read_text()
    assert _resolved().digest == resolve("h100").digest
    assert r.digest != _resolved().digest


def _call(gate: Gate, path: str = "/health", token: str = "") -> tuple[int, dict[bytes, bytes]]:
    """One HTTP request through the gate (ASGI); its status and headers."""
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    gate.app = app
    headers = [(b"x-inference-checkpoint", token.encode())] if token else []
    asyncio.run(gate({"type": "http", "path": path, "headers": headers}, receive, send))
    return sent[0]["status"], dict(sent[0].get("headers", []))


def test_the_gate_answers_503_to_all_but_the_token_until_its_flag_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flag = tmp_path / "vllm-0.open"
    monkeypatch.setenv("INFERENCE_CHECKPOINT_TOKEN", "s3cret")
    monkeypatch.setenv("INFERENCE_CHECKPOINT_GATE", str(flag))
    gate = Gate(None)  # type: ignore[arg-type]
    status, headers = _call(gate)
    assert status == 503 and headers[b"retry-after"] == b"5"
    assert _call(gate, "/v1/chat/completions", token="s3cre")[0] == 503
    assert _call(gate, "/v1/completions", token="s3cret")[0] == 200
    assert _call(gate, "/sleep", token="s3cret")[0] == 200
    flag.touch()
    assert _call(gate, "/v1/chat/completions")[0] == 200
    flag.unlink()  # shut again for a take at an idle moment
    assert _call(gate, "/v1/chat/completions")[0] == 503
    assert _call(gate, "/v1/completions", token="s3cret")[0] == 200
    flag.touch()
    assert _call(gate)[0] == 200
    # how many clients' requests are inside: to the token alone
    assert _call(gate, "/inference-gate")[0] == 403
    assert _call(gate, "/inference-gate", token="s3cret")[0] == 200
    # vLLM's dev routes need the token, open or not
    assert [_call(gate, path)[0] for path in ("/sleep", "/collective_rpc", "/wake_up/")] == \
        [403, 403, 403]
    assert _call(gate, "/collective_rpc", token="s3cret")[0] == 200
    monkeypatch.delenv("INFERENCE_CHECKPOINT_TOKEN")
    no_gate = Gate(None)  # type: ignore[arg-type]
    assert _call(no_gate)[0] == 200 and _call(no_gate, "/sleep")[0] == 403


class _Served:
    """The plugin's real gate before an app that answers after X-Sleep seconds, served over HTTP
    on loopback in this process, as vLLM's API server serves it."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        import http.server
        import threading
        self.run, self.token = tmp_path / "run", "t0ken"
        self.run.mkdir(mode=0o755)
        monkeypatch.setenv("INFERENCE_CHECKPOINT_TOKEN", self.token)
        monkeypatch.setenv("INFERENCE_CHECKPOINT_GATE", str(self.run / "vllm-0.open"))

        async def app(scope: Any, receive: Any, send: Any) -> None:
            wait = dict(scope["headers"]).get(b"x-sleep", b"0")
            await asyncio.sleep(float(wait))
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
        gate = self.gate = Gate(app)
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()

        class H(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                got: list[dict[str, Any]] = []

                async def receive() -> dict[str, Any]:
                    return {"type": "http.request", "body": b""}

                async def send(m: dict[str, Any]) -> None:
                    got.append(m)
                scope = {"type": "http", "path": self.path, "headers": [
                    (k.lower().encode(), v.encode()) for k, v in self.headers.items()]}
                asyncio.run_coroutine_threadsafe(gate(scope, receive, send), loop).result(30)
                self.send_response(got[0]["status"])
                self.end_headers()
                self.wfile.write(b"".join(m.get("body", b"") for m in got[1:]))
            do_GET = do_POST = _serve

            def log_message(self, *a: Any) -> None:
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        unit_checkpoint.open_gate(self.run, "vllm-0")

    def client(self, sleep_s: float = 0.0) -> int:
        return fetch(f"http://127.0.0.1:{self.port}/v1/completions", deadline_s=30,
                     method="POST", body=b"{}", headers={"X-Sleep": str(sleep_s)}).status


def test_the_take_waits_for_an_idle_moment_behind_the_shut_gate_then_serves_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold start answers clients at once; its take waits until no client's request has been
    inside for the idle time, runs behind the shut gate (a client meanwhile gets 503 with
    Retry-After, never a hang), and the gate opens after it."""
    import threading
    s = _Served(tmp_path, monkeypatch)
    assert s.client() == 200  # served before any take
    busy = threading.Thread(target=s.client, args=(1.5,))
    busy.start()
    time.sleep(0.2)
    seen: dict[str, Any] = {}

    def take() -> None:
        seen["inside"] = unit_checkpoint.inflight(s.port, s.token)
        seen["client"] = s.client()
        seen["at"] = time.monotonic()
    t0 = time.monotonic()
    assert unit_checkpoint.take_when_idle("vllm-0", s.run, s.port, s.token, os.getpid(), take,
                                          idle_s=0.5, drain_s=1.0) == 0
    busy.join()
    # after the busy request's end and a quiet half second; nothing inside; a client refused
    assert seen["at"] - t0 >= 1.3 + 0.5 and seen["inside"] == 0 and seen["client"] == 503
    assert (s.run / "vllm-0.open").exists() and s.client() == 200
    s.server.shutdown()


def test_a_request_inside_as_the_gate_shuts_abandons_the_take_until_the_next_idle_moment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's request that came in as the idle moment was seen (the race the drain is for)
    is still inside past the drain: that try is abandoned and the gate opens at once, with no
    take; the next idle moment's take runs, and the request was answered whole."""
    import threading
    s = _Served(tmp_path, monkeypatch)
    answered: list[int] = []
    slow = threading.Thread(target=lambda: answered.append(s.client(2.0)))
    slow.start()
    time.sleep(0.2)
    quiet = unit_checkpoint.quiet_for
    calls: list[float] = []

    def seen_idle_once(port: int, token: str, pid: int, quiet_s: float) -> bool:
        calls.append(time.monotonic())  # the first: an idle moment seen just before it came
        return True if len(calls) == 1 else quiet(port, token, pid, quiet_s)
    monkeypatch.setattr(unit_checkpoint, "quiet_for", seen_idle_once)
    opened_between: list[bool] = []
    takes: list[int | None] = []

    def take() -> None:
        takes.append(unit_checkpoint.inflight(s.port, s.token))
    said: list[str] = []
    monkeypatch.setattr(unit_checkpoint, "say", lambda _i, text: said.append(text))
    abandoned = unit_checkpoint.take_when_idle("vllm-0", s.run, s.port, s.token, os.getpid(),
                                               take, idle_s=0.3, drain_s=0.5)
    opened_between.append((s.run / "vllm-0.open").exists())
    slow.join()
    assert abandoned == 1 and takes == [0] and answered == [200], (abandoned, takes, answered)
    assert len(calls) == 2 and any("next idle moment" in t for t in said), said
    assert opened_between == [True]


def test_the_follower_hands_a_stop_to_the_restored_tree_and_ends_with_it() -> None:
    tree = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    follower = subprocess.Popen([sys.executable, "-c", "import sys; from inference_machine"
                                 " import unit_checkpoint as u; sys.exit(u.follow(int(sys.argv[1"
                                 "])))", str(tree.pid)], stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    assert follower.poll() is None
    follower.send_signal(signal.SIGTERM)
    assert tree.wait(10) == -signal.SIGTERM
    _, err = follower.communicate(timeout=10)
    assert follower.returncode == 0 and f"(pid {tree.pid}) exited" in err


def test_a_follower_of_no_process_says_so() -> None:
    assert unit_checkpoint.follow(2**22 + 7) == 1


# A stand-in for vLLM's API server behind the plugin's real gate: /health and /v1/completions
# answer 200, every answer noted (its status and whether the gate's flag existed then).
STANDIN = r'''
import asyncio, http.server, json, os, sys
sys.path.insert(0, sys.argv[1])
from inference_image_vllm.gate import Gate
from inference_image_vllm.reload import OWN_SEGMENT_BYTES, own_segments
port = int(sys.argv[sys.argv.index("--port") + 1])
log = open(os.environ.get("STANDIN_LOG", os.environ["INFERENCE_CACHE"] + "/standin.jsonl"), "a")

async def app(scope, receive, send):
    body = b'{"choices": [{"text": " same"}]}'
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})

gate = Gate(app)

class H(http.server.BaseHTTPRequestHandler):
    def _serve(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        got = []
        async def receive():
            return {"type": "http.request", "body": b""}
        async def send(m):
            got.append(m)
        scope = {"type": "http", "path": self.path, "headers": [
            (k.lower().encode(), v.encode()) for k, v in self.headers.items()]}
        asyncio.run(gate(scope, receive, send))
        status = got[0]["status"]
        log.write(json.dumps([self.path, status, "X-Inference-Checkpoint" in self.headers,
                              os.path.exists(os.environ.get("INFERENCE_CHECKPOINT_GATE", "/-"))])
                  + "\n")
        log.flush()
        self.send_response(status)
        self.end_headers()
        self.wfile.write(b"".join(m.get("body", b"") for m in got[1:]))
    do_GET = do_POST = _serve
    def log_message(self, *a):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="inference-run starts the helper only as root")
@pytest.mark.parametrize("state", ["none", "stale"])
def test_inference_run_starts_cold_behind_its_gate_saying_why_when_it_cannot_restore(
        tmp_path: Path, state: str) -> None:
    """The render's own inference-run, as root without systemd, starts its own helper; with no
    checkpoint (or a stale one, which goes) and no GPU to take one on, the helper says so, the
    instance starts behind its gate, and the gate opens: no client was answered before."""
    port = free_port()
    rdir = tmp_path / "render"
    render(_resolved(**CHECKPOINTS), rdir)
    units = rdir / PATHS["units"].lstrip("/")
    args = units / "vllm-0.args"
    lines = args.read_text().splitlines()
    lines[lines.index("--port") + 1] = str(port)
    args.write_text("\n".join(lines) + "\n")
    (tmp_path / "standin.py").write_text(STANDIN)
    py = tmp_path / "python"
    py.write_text(f'#!/bin/bash\nif [[ $1 == -m && $2 == vllm.* ]]; then shift 2; exec '
                  f'{sys.executable} {tmp_path}/standin.py {ROOT}/plugins/vllm "$@"; fi\n'
                  f'exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir()
    store = rdir / PATHS["checkpoints"].lstrip("/")
    if state == "stale":
        (store / "vllm-0" / checkpoint.IMAGES).mkdir(parents=True)
        (store / "vllm-0" / checkpoint.MANIFEST).write_text(json.dumps({
            "schema": checkpoint.SCHEMA, "key": {"driver": "1.0"}, "files": {"a": 1},
            "reference": "x", "pid": 4242}))
    log = tmp_path / "standin.jsonl"
    env = {**os.environ, "INFERENCE_ROOT": str(rdir), "INFERENCE_PYTHON": str(py),
           "INFERENCE_CRIU": "/bin/true", "INFERENCE_CACHE": str(cache),
           "TMPDIR": str(tmp_path / "tmp"), "MODEL_PATH": str(tmp_path), "DRAFT_PATH": "d",
           "INFERENCE_HOST": "127.0.0.1", "STANDIN_LOG": str(log)}
    env.pop("INVOCATION_ID", None)
    proc = subprocess.Popen([*runtime("inference-run"), "vllm-0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    run = rdir / PATHS["checkpoint_run"].lstrip("/")
    try:
        deadline = time.monotonic() + 60
        while not (run / "vllm-0.open").exists() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):  # a client knocking while the gate is closed
                fetch(f"http://127.0.0.1:{port}/health", deadline_s=2)
            time.sleep(0.1)
        assert (run / "vllm-0.open").exists(), "the helper never opened the gate"
        assert fetch(f"http://127.0.0.1:{port}/v1/completions", deadline_s=5, method="POST",
                     body=b"{}").status == 200
        word = (run / "vllm-0.word").read_text().split()
        assert word[:2] == [str(proc.pid), "cold"] and len(word[2]) == 32
        assert oct((run / "vllm-0.word").stat().st_mode & 0o777) == "0o400"
        # a client was answered before any take: the take waits for an idle moment
        time.sleep(unit_checkpoint.IDLE_S + 2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
    said = unit_checkpoint.said(out.splitlines())
    why = "no checkpoint at" if state == "none" else "stale: "
    assert any("starts without its checkpoint: " + why in x and (state == "none" or (
        "driver is 'none' here, '1.0' in the checkpoint" in x and x.endswith("; removed")))
        for x in said), out
    assert any("serves without a checkpoint: taking one failed: no CUDA driver" in x
               for x in said), out
    assert not store.joinpath("vllm-0").exists()  # the stale one is gone, none half-written
    answers = [json.loads(x) for x in log.read_text().splitlines()]
    # the helper's own requests passed the closed gate; no other was answered before it opened
    assert any(token and status == 200 and not opened for _, status, token, opened in answers)
    assert all(status == 503 for _, status, token, opened in answers if not token and not opened)


def test_the_lab_reads_a_restored_start_s_phases_from_its_helper_s_line() -> None:
    from inference_lab.proof_ready import restored_phases
    timings = checkpoint.Timings()
    timings.phases = [("validate", 0.02), ("criu_restore", 9.4), ("cuda_restore", 2.1),
                      ("wake_up", 0.5), ("first_answer", 0.1)]
    line = (f"inference-checkpoint: vllm-0: restored in 12.1 s, its reference answer as before "
            f"({unit_checkpoint.phases_line(timings.phases)}); head pid 1319")
    assert unit_checkpoint.said(["x " + line]) == [line]
    assert restored_phases(line, 12.6, 12.67) == [
        ["unit_start", 0.5], ["validate", 0.0], ["criu_restore", 9.4], ["cuda_restore", 2.1],
        ["wake_up", 0.5], ["reference_answer", 0.1], ["first_answer", 0.07]]
