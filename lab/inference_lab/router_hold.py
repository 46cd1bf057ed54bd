"""What vllm-router does with requests while its only instance restarts: a stand-in instance
(answers /health and /v1/completions) goes away for DOWN_S seconds, as a restart (connection
refused) or a closed gate (503 with Retry-After), under a steady load through the router; the
requests that failed and the longest a request took are counted for each set of router flags.

    python -m inference_lab.router_hold ROUTER_BIN [--down-s 20] [--mode refused|gate] [FLAGS...]

The answer decides serving's router flags for a one-instance tier (docs/decisions.md)."""

from __future__ import annotations

import argparse
import http.server
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Instance:
    """A stand-in vLLM instance on `port` that can go down and come back."""

    def __init__(self, port: int) -> None:
        self.port, self.gate_closed, self.server = port, False, None
        self.served = 0

    def up(self) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if code == 503:
                    self.send_header("Retry-After", "5")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(503 if outer.gate_closed else 200, b"{}")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if outer.gate_closed:
                    self._send(503, b'{"error": "starting"}')
                    return
                time.sleep(0.05)
                outer.served += 1
                self._send(200, b'{"choices": [{"text": "ok"}]}')

            def log_message(self, *_: Any) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        srv.daemon_threads = True
        self.server = srv
        threading.Thread(target=srv.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def one(url: str, timeout_s: float) -> tuple[str, float]:
    t = time.monotonic()
    req = urllib.request.Request(url, data=json.dumps({"model": "m", "prompt": "x",
                                                       "max_tokens": 1}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read()
            code = str(r.status)
    except urllib.error.HTTPError as exc:
        code = str(exc.code)
    except OSError as exc:
        code = type(exc).__name__
    return code, time.monotonic() - t


def run(router_bin: str, flags: list[str], down_s: float, mode: str, conc: int = 8,
        total_s: float = 0.0) -> dict[str, Any]:
    inst_port, port, metrics = free_port(), free_port(), free_port()
    inst = Instance(inst_port)
    inst.up()
    cmd = [router_bin, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
           "--worker-urls", f"http://127.0.0.1:{inst_port}", "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(metrics), "--health-check-endpoint", "/health",
           "--health-check-interval-secs", "5", "--worker-startup-timeout-secs", "60",
           "--worker-startup-check-interval", "1", "--log-level", "warning", *flags]
    router = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        deadline = time.monotonic() + 60
        while one(url, 5)[0] != "200":
            if time.monotonic() > deadline or router.poll() is not None:
                said = router.stderr.read()[-500:] if router.poll() is not None else ""
                raise RuntimeError(f"the router never served: {said}")
            time.sleep(0.5)
        results: list[tuple[str, float, float]] = []
        lock = threading.Lock()
        stop = threading.Event()
        t0 = time.monotonic()

        def load() -> None:
            while not stop.is_set():
                sent = time.monotonic() - t0
                code, took = one(url, 300)
                with lock:
                    results.append((code, took, sent))

        total_s = total_s or down_s + 40
        with ThreadPoolExecutor(conc) as pool:
            for _ in range(conc):
                pool.submit(load)
            time.sleep(5)
            if mode == "gate":
                inst.gate_closed = True
            else:
                inst.down()
            time.sleep(down_s)
            if mode == "gate":
                inst.gate_closed = False
            else:
                inst.up()
            back = time.monotonic() - t0
            time.sleep(max(0.0, total_s - down_s - 5))
            stop.set()
        failed = Counter(c for c, _, _ in results if c != "200")
        during = [r for r in results if 5 <= r[2] <= back]
        return {"flags": " ".join(flags) or "(the render's)", "mode": mode, "down_s": down_s,
                "requests": len(results), "failed": dict(failed),
                "sent_while_down": len(during),
                "failed_while_down": sum(1 for c, _, _ in during if c != "200"),
                "longest_s": round(max((t for _, t, _ in results), default=0.0), 1)}
    finally:
        router.terminate()
        router.wait(10)
        inst.down()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="router_hold")
    ap.add_argument("router_bin")
    ap.add_argument("--down-s", type=float, default=20.0)
    ap.add_argument("--mode", choices=("refused", "gate"), default="refused")
    a, flags = ap.parse_known_args(argv)  # the rest: the router's own flags
    print(json.dumps(run(a.router_bin, flags, a.down_s, a.mode)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
