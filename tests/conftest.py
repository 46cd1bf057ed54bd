from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    """A writable copy of the real profiles, for tests that break one thing."""
    dst = tmp_path / "profiles"
    shutil.copytree(ROOT / "profiles", dst)
    return dst


def free_port() -> int:
    """A loopback TCP port no one listens on now, for a server a test starts."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n different loopback TCP ports no one listens on now: each held until all are chosen (one
    at a time, the kernel may hand the same free port out twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


@contextlib.contextmanager
def answering(body: bytes | dict[str, list[bytes]],
              calls: list[str] | None = None) -> Iterator[int]:
    """A stand-in HTTP server on loopback that answers every POST 200 with `body` (as it is:
    broken JSON, a page, escapes), or, given {path: [bodies]}, each path its next body (the last
    again once they run out), noting each request in `calls`: its path and query, and for
    /collective_rpc the method its body names. Its port."""

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            sent = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.split("?")[0]
            if calls is not None:
                calls.append(self.path + (" " + json.loads(sent)["method"]
                                          if path == "/collective_rpc" else ""))
            queue = body.get(path, [b""]) if isinstance(body, dict) else [body]
            out = queue.pop(0) if len(queue) > 1 else queue[0]
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@dataclass
class Machine:
    """A first-booted cpu render in a scratch root, with a TLS server on its certificate standing
    in for nginx: profile_json is a copy whose paths and port point into the scratch root."""

    root: Path
    etc: Path
    profile_json: Path
    handler: type[http.server.BaseHTTPRequestHandler]

    @contextlib.contextmanager
    def serving(self, cert_dir: Path | None = None) -> Iterator[int]:
        cert_dir = cert_dir or self.etc / "tls"
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_dir / "cert.pem", cert_dir / "key.pem")
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        doc = json.loads(self.profile_json.read_text())
        doc["router"]["port"] = srv.server_address[1]
        self.profile_json.write_text(json.dumps(doc))
        try:
            yield srv.server_address[1]
        finally:
            srv.shutdown()


def first_boot(render_dir: Path, root: Path) -> None:
    env = {**os.environ, "INFERENCE_ROOT": str(root)}
    run = subprocess.run(["bash", str(render_dir / "usr/local/sbin/inference-firstboot")],
                         env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr


def machine(tmp_path: Path, handler: type[http.server.BaseHTTPRequestHandler]) -> Machine:
    from inference_image.profiles import resolve
    from inference_image.render import PATHS, render

    r, root = tmp_path / "render", tmp_path / "root"
    render(resolve("cpu"), r)
    first_boot(r, root)
    etc = root / "etc/inference-image"
    doc = json.loads((r / "etc/inference-image/profile.json").read_text())
    for k, v in doc["paths"].items():
        doc["paths"][k] = str(root) + v
    # the image's modules beside inference-startup, as the render holds them
    doc["paths"]["startup_lib"] = str(r) + PATHS["startup_lib"]
    endpoint = json.loads((etc / "endpoint.json").read_text())
    endpoint["tls_cert"] = str(root) + endpoint["tls_cert"]
    (etc / "endpoint.json").write_text(json.dumps(endpoint))
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    return Machine(root, etc, tmp_path / "profile.json", handler)
