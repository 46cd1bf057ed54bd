from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the machine's runtime's console scripts, beside this Python (make setup installs machine/)
RUNTIME_BIN = Path(sys.executable).parent


def runtime(name: str, render_dir: Path | None = None, root: Path | None = None) -> list[str]:
    """The command line of one of the machine's programs (inference-run, -join, -firstboot,
    -acme, -startup). Run with INFERENCE_ROOT=root, it reads the render's profile.json there: a
    scratch root beside a render gets a copy of it."""
    if render_dir is not None and root is not None and render_dir != root:
        dst = root / "etc/inference-image/profile.json"
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(render_dir / "etc/inference-image/profile.json", dst)
    return [str(RUNTIME_BIN / name)]


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
        # the copy with the scratch root's paths, and the one the machine's programs read there
        for f in (self.profile_json, self.etc / "profile.json"):
            doc = json.loads(f.read_text())
            doc["router"]["port"] = srv.server_address[1]
            f.write_text(json.dumps(doc))
        try:
            yield srv.server_address[1]
        finally:
            srv.shutdown()


def first_boot(render_dir: Path, root: Path) -> None:
    env = {**os.environ, "INFERENCE_ROOT": str(root)}
    run = subprocess.run(runtime("inference-firstboot", render_dir, root),
                         env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr


def machine(tmp_path: Path, handler: type[http.server.BaseHTTPRequestHandler]) -> Machine:
    from inference_image.profiles import resolve
    from inference_image.render import render

    r, root = tmp_path / "render", tmp_path / "root"
    render(resolve("cpu"), r)
    first_boot(r, root)
    etc = root / "etc/inference-image"
    doc = json.loads((r / "etc/inference-image/profile.json").read_text())
    for k, v in doc["paths"].items():
        doc["paths"][k] = str(root) + v
    endpoint = json.loads((etc / "endpoint.json").read_text())
    endpoint["tls_cert"] = str(root) + endpoint["tls_cert"]
    (etc / "endpoint.json").write_text(json.dumps(endpoint))
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    return Machine(root, etc, tmp_path / "profile.json", handler)


def anchors(page: Path) -> set[str]:
    """A Markdown page's heading anchors as GitHub makes them (lower case, punctuation dropped,
    spaces as hyphens), fenced code left out."""
    out: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.*)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-"))
    return out


# Each test lives in the folder of its room (pyproject's markers): `pytest -m machine` or
# `pytest tests/machine` runs the machine's runtime's tests alone.
ROOMS = ("machine", "build", "ops", "lab", "plugin")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        room = item.path.relative_to(here).parts[0]
        if room in ROOMS:
            item.add_marker(room)
