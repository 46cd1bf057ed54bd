"""A corpus of hostile inputs, as a user would give them to the CLI: each ends in a clear
error (exit 1, or argparse's 2) within seconds, says what is wrong, and prints no traceback; none
is accepted with the bad value in the output, and none hangs."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, answering

from inference_image.ops import bench, soak

TIMEOUT_S = 60


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    module = "inference_lab.cli" if args[:1] == ("proof",) else "inference_image.cli"
    r = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                       text=True, timeout=TIMEOUT_S, check=False, cwd=cwd)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-2000:]
    return r


def refused(r: subprocess.CompletedProcess[str], *said: str) -> None:
    assert r.returncode in (1, 2), (r.returncode, r.stdout[-500:], r.stderr[-500:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and all(ln.startswith(("error:", "usage:", "inference-image", " ")) for ln in lines), \
        r.stderr
    for s in said:
        assert s in r.stderr, (s, r.stderr)


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    shutil.copytree(ROOT / "profiles", d)
    return d


# ---- hangs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["validate", "--all"], ["profiles", "--names"]])
def test_a_profile_that_is_a_fifo(pdir: Path, command: list[str]) -> None:
    os.mkfifo(pdir / "stuck.yaml")
    refused(cli("--profiles-dir", str(pdir), *command), "stuck.yaml: not a regular file")


def test_metrics_dripped_a_byte_at_a_time_end_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    class Drip(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"#")
                self.wfile.flush()
                time.sleep(1)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setattr(bench, "METRICS_DEADLINE_S", 3.0)
    try:
        t0 = time.monotonic()
        assert bench.engine_counters(f"http://127.0.0.1:{srv.server_address[1]}") is None
        assert time.monotonic() - t0 < 8
    finally:
        srv.shutdown()


def test_a_fleet_file_that_is_dev_zero(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").symlink_to("/dev/zero")
    refused(cli("fleet", "plan", str(tmp_path / "fleet.yaml")), "not a regular file")


# ---- tracebacks -----------------------------------------------------------------------------

def test_a_sibling_profile_that_is_dev_zero(pdir: Path) -> None:
    (pdir / "_gpu.yaml").unlink()
    (pdir / "_gpu.yaml").symlink_to("/dev/zero")
    refused(cli("--profiles-dir", str(pdir), "validate", "h100"), "_gpu.yaml: not a regular file")


def test_a_huge_set_value() -> None:
    refused(cli("validate", "cpu", "--set", "description=" + "&a [*a, *a] " * 10000),
            "--set: description: a value of")


@pytest.mark.parametrize(("text", "said"), [
    ("[]\n", "not a mapping"), ("name: [1]\nworkers: x\n", "name"),
    (b"name: \xff\xfe\n", "not UTF-8"),
])
def test_fleet_files_of_the_wrong_shape(tmp_path: Path, text: str | bytes, said: str) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    refused(cli("fleet", "plan", str(f)), said)


@pytest.mark.parametrize("vllm_cmd", ["", '"vllm'])
def test_a_vllm_command_that_is_no_command(vllm_cmd: str) -> None:
    refused(cli("bench", "run", "--model", "m", "--vllm-cmd", vllm_cmd), "--vllm-cmd")


def test_a_missing_api_key_file(tmp_path: Path) -> None:
    refused(cli("bench", "run", "--model", "m", "--vllm-cmd", "true", "--out", str(tmp_path / "o"),
                "--api-key-file", str(tmp_path / "nope")), "--api-key-file", "not found")


@pytest.mark.parametrize(("content", "said"), [
    (b"[1, 2]", "not a result of `bench run`"),
    (b'{"runs": [{"scenario": "chat"}]}', "not a result of `bench run`"),
    (b"\xff\xfe", "not UTF-8"), (b"{", "not JSON"),
])
def test_bench_compare_on_what_is_no_result(tmp_path: Path, content: bytes, said: str) -> None:
    (tmp_path / "a.json").write_bytes(content)
    refused(cli("bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "a.json")), said)


@pytest.mark.parametrize("answer", ["not json", "{}", "[1]"])
def test_soak_against_a_host_whose_profile_is_no_profile(monkeypatch: pytest.MonkeyPatch,
                                                         answer: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # the host is stood in for (soak reaches it over SSH or podman); what it answers is real input
    monkeypatch.setattr(soak, "preflight", lambda target, identity: "cpu")
    monkeypatch.setattr(soak, "remote", lambda *a, **k: (0, answer))
    from inference_image.cli import main
    rc = main(["soak", "--host", "local://", "--out", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    assert rc == 1 and "is not an inference-image profile document" in err, err


@pytest.mark.parametrize("plan", ["[1]", '{"steps": "x"}', '{"steps": [1]}'])
def test_proof_run_on_what_is_no_plan(tmp_path: Path, plan: str) -> None:
    (tmp_path / "plan.json").write_text(plan)
    refused(cli("proof", "run", "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o")),
            "not a plan")


# ---- accepted with the bad value --------------------------------------------------------------

def test_a_missing_profiles_dir_validates_nothing_and_fails(tmp_path: Path) -> None:
    refused(cli("--profiles-dir", str(tmp_path / "missing"), "validate", "--all"),
            "not a directory of profiles")


@pytest.mark.parametrize("out", ["", "LINK"])
def test_bench_out_empty_or_a_symlink(tmp_path: Path, out: str) -> None:
    if out == "LINK":
        (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
        out = str(tmp_path / "link")
    refused(cli("bench", "run", "--model", "m", "--vllm-cmd", "true", "--out", out), "--out")
    assert not (tmp_path / "elsewhere").exists()


def test_labels_that_climb_out_of_out(tmp_path: Path) -> None:
    refused(cli("bench", "run", "--model", "m", "--vllm-cmd", "true", "--out", str(tmp_path),
                "--label", "../../x"), "--label")
    refused(cli("proof", "step", "vanilla", "--label", "../../x", "--out", str(tmp_path)),
            "label")
    assert not (tmp_path.parent.parent / "x.json").exists()


def test_a_url_that_is_no_http(tmp_path: Path) -> None:
    refused(cli("bench", "run", "--model", "m", "--vllm-cmd", "true", "--out", str(tmp_path),
                "--url", "file:///etc/passwd"), "--url")


@pytest.mark.parametrize(("override", "said"), [
    ("router.port=9100", "node exporter"),
    ("router.health_check_interval_secs=1000000000000000000000000000000", "health_check_interval"),
    ("serving.cpu_kv_cache_gib=100000000000000000000", "cpu_kv_cache_gib"),
    ("versions.driver_branch=\"\u0665\u0668\u0660\"", "driver_branch"),
    ("router.metrics_port=9400 (h100)", "DCGM exporter"),
    ("versions.dcgm=\"4; reboot\"", "versions.dcgm"),
    ("description=\"a\\u001b[2Jb\"", "description"),
])
def test_values_out_of_any_real_range(override: str, said: str) -> None:
    gpu = "driver" in override or "(h100)" in override or "dcgm" in override
    refused(cli("validate", "h100" if gpu else "cpu", "--set",
                override.removesuffix(" (h100)")), said)


def test_a_key_given_twice(pdir: Path) -> None:
    text = (pdir / "cpu.yaml").read_text()
    (pdir / "cpu.yaml").write_text(text + "\ntier: cpu\n")
    refused(cli("--profiles-dir", str(pdir), "validate", "cpu"), "tier: given twice")


def test_the_corpus_leaves_nothing_half_built(tmp_path: Path) -> None:
    """A refused render writes no output directory."""
    out = tmp_path / "out"
    refused(cli("render", "--profile", "cpu", "--out", str(out), "--set", "router.bind=::%x"))
    assert not out.exists()



# ---- the lab's command line -----------------------------------------------------------------

def test_a_lab_plan_for_a_tier_that_does_not_exist_is_one_line() -> None:
    # a one-line error type no command caught itself ends the command in one line (cli.run)
    refused(cli("proof", "plan", "--tier", "nosuch"), "unknown tier 'nosuch'", "use one of: cpu")


def test_a_client_cpu_range_too_large_to_be_a_machines_is_refused_at_once() -> None:
    r = cli("proof", "step", "profile", "--client-cpus", "0-100000000")
    assert r.returncode == 2 and "give CPU numbers 0-4095" in r.stderr


@pytest.mark.parametrize("date", ["../../x", "2026-13-01", "2026-11-29\n", "29.11.2026"])
def test_a_record_date_that_is_no_date_is_refused_before_anything_is_written(
        tmp_path: Path, date: str) -> None:
    r = cli("proof", "record", "--run", "1", "--title", "t", "--note", "n", "--date", date,
            "--machine", f"a={tmp_path / 'proof.json'}", cwd=tmp_path)
    assert r.returncode == 2 and "give a date as YYYY-MM-DD" in r.stderr
    assert not any(tmp_path.rglob("*.json"))


@pytest.mark.parametrize("label", ["x\n", "x\ny", "../x"])
def test_a_label_is_one_line_of_a_closed_set(label: str) -> None:
    assert bench.LABEL.match(label) is None
    r = cli("proof", "step", "profile", "--label", label)
    assert r.returncode == 2 and "--label" in r.stderr


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000 x", "http://127.0.0.1:8000\r\nX: y",
                                 "http://127.0.0.1:99999", "ftp://h", "http://", "http://h:0",
                                 "http://h/?q=1"])
def test_a_bench_url_that_is_no_base_url_is_refused_before_a_request(url: str) -> None:
    r = cli("bench", "run", "--url", url, "--model", "m", "--label", "x")
    assert r.returncode == 2 and "give a base URL" in r.stderr


@pytest.mark.parametrize("host", ["127.0.0.1:99999", "h:0", "a b", "h;reboot", "podman://a b",
                                  "-oProxyCommand=x"])
def test_a_verify_host_that_is_no_host_is_refused(host: str) -> None:
    from inference_image.ops.verify import VerifyError, parse_target
    with pytest.raises(VerifyError, match="--host"):
        parse_target(host, "root")


def _misbehaving(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_headers_dripped_a_byte_at_a_time_end_the_read_at_the_deadline() -> None:
    """urllib's timeout bounds each read: headers a byte every half second never trip it. The one
    HTTP client of the project bounds the whole exchange."""
    from inference_machine import bounded_http

    class Drip(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            for ch in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
                self.wfile.write(bytes([ch]))
                self.wfile.flush()
                time.sleep(0.5)

        def log_message(self, *args: object) -> None:
            pass

    srv = _misbehaving(Drip)
    url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"/metrics: no whole answer within 2 s"):
            bounded_http.fetch(url, deadline_s=2.0)
        assert time.monotonic() - t0 < 4
        with pytest.raises(OSError, match="not a port number"):
            bounded_http.fetch("http://127.0.0.1:99999/x", deadline_s=1.0)
        with pytest.raises(OSError, match="a space or control character"):
            bounded_http.fetch("http://127.0.0.1:1/a b\r\nX: y", deadline_s=1.0)
    finally:
        srv.shutdown()


def test_a_server_silent_until_its_work_is_done_is_waited_for_only_when_asked() -> None:
    """vLLM answers /collective_rpc only once its work is done (a 70B model's weights read again:
    seconds of silence). A read waits at most `idle_s` between bytes (10 s by default), or the whole
    deadline where the caller expects such silence."""
    from inference_machine import bounded_http

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(1.5)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    srv = _misbehaving(Slow)
    url = f"http://127.0.0.1:{srv.server_address[1]}/collective_rpc"
    try:
        with pytest.raises(OSError):
            bounded_http.fetch(url, deadline_s=5.0, idle_s=0.5)
        assert bounded_http.fetch(url, deadline_s=5.0, idle_s=5.0).body == b"ok"
    finally:
        srv.shutdown()


def test_an_endless_answer_is_cut_at_its_cap() -> None:
    from inference_machine import bounded_http

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            with contextlib.suppress(OSError):
                while True:
                    self.wfile.write(b"x" * 65536)

        def log_message(self, *args: object) -> None:
            pass

    srv = _misbehaving(Endless)
    try:
        with pytest.raises(OSError, match="an answer of more than 1 MiB"):
            bounded_http.fetch(f"http://127.0.0.1:{srv.server_address[1]}/", deadline_s=10.0,
                               max_bytes=2**20)
    finally:
        srv.shutdown()


@pytest.mark.parametrize("body", [b'{"choices": [', b"[1" + b"9" * 5000 + b"]", b"<html>\x1b[2J",
                                  b'"a string"'])
def test_a_completion_that_is_no_json_object_is_one_os_error(body: bytes) -> None:
    """The lab's probes read a server's completion: an answer JSON cannot read, or no object,
    is an OSError naming the route and the answer's start (escapes shown as escapes)."""
    from inference_lab.proof_probes import completion_json

    with answering(body) as port, pytest.raises(OSError, match="/v1/completions: not a "
                                                "completion") as exc:
        completion_json(f"http://127.0.0.1:{port}", {"prompt": "x"}, 5)
    assert "\x1b" not in str(exc.value)
