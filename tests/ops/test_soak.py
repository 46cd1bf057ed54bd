"""inference-image soak: the load script as it runs on a machine (against a TLS server on the
machine's first-boot certificate, standing in for nginx), the targets, and its bad input."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import machine

from inference_image.cli import main
from inference_image.ops import soak


class Completions(http.server.BaseHTTPRequestHandler):
    """Every 5th request 503 (a restarting stack); the rest 200. Records the requests."""

    seen: ClassVar[list[dict]] = []
    lock = threading.Lock()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.seen.append({"auth": self.headers["Authorization"], "path": self.path, **body})
            n = len(self.seen)
        self.send_response(503 if n % 5 == 0 else 200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"choices": []}')

    def log_message(self, *_):
        pass


def test_load_script_counts_per_minute_through_tls(tmp_path: Path) -> None:
    m = machine(tmp_path, Completions)
    out = tmp_path / "minutes.jsonl"
    cfg = {"profile_json": str(m.profile_json), "out": str(out), "minutes": 2,
           "concurrency": 3, "max_tokens": 5, "interval_s": 1}
    with m.serving():
        # the soak's copy of the load, run as the machine's runtime runs it: no image carries it
        assert soak.LOAD.split()[1] == f"{soak.WORK}/load.py"
        assert not (Path(__file__).parents[2] / "machine/inference_machine/soak_load.py").exists()
        run = subprocess.run([sys.executable, str(soak.LOAD_SOURCE), json.dumps(cfg)],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert lines[-1] == {"done": True}
    minutes = lines[:-1]
    assert [x["minute"] for x in minutes] == [1, 2]
    assert all(x["ok"] > 0 and x["failed"].get("503", 0) > 0 for x in minutes), minutes
    assert set(minutes[0]["rss_mib"]) == {"nginx.service", "vllm-router.service",
                                          "vllm@vllm-0.service", "vllm@vllm-1.service"}
    key = (m.etc / "api-key").read_text().strip()
    seen = Completions.seen
    assert seen and all(s["auth"] == f"Bearer {key}" and s["max_tokens"] == 5 for s in seen)
    assert soak.assess(minutes) == [f"failed requests: {{'503': {sum(x['failed']['503'] for x in minutes)}}}"]


def _minute(n: int, ok: int, rss: float, failed: dict[str, int] | None = None) -> dict:
    return {"minute": n, "ok": ok, "failed": failed or {}, "p50_ms": 1.0, "p90_ms": 2.0,
            "p99_ms": 3.0, "rss_mib": {"nginx.service": 10.0, "vllm@vllm-0.service": rss}}


def test_targets() -> None:
    assert soak.assess([_minute(1, 5, 100), _minute(2, 5, 110)]) == []
    grew = soak.assess([_minute(1, 5, 100), _minute(2, 5, 111)])
    assert grew == ["vllm@vllm-0.service: resident memory 100 -> 111 MiB (+11.0 %, limit 10 %)"]
    assert soak.assess([_minute(1, 0, 100)]) == ["no request succeeded"]
    assert "failed requests: {'000': 2}" in soak.assess([_minute(1, 3, 100, {"000": 2})])
    assert "vllm-0 MiB" in soak.table([_minute(1, 5, 100)])


@pytest.mark.parametrize(("argv", "says"), [
    (["soak", "--host", "podman://no-such-container"], "no running container named no-such-container"),
    (["soak", "--host", "h", "--minutes", "0"], "give an integer >= 1"),
])
def test_bad_input_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own usage error
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert rc != 0 and says in err and "Traceback" not in err
