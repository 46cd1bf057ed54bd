"""The README's OpenAI snippet with the client a user installs today (`pip install openai`, fresh,
unpinned), against a stand-in of the image's public port: HTTPS with the machine's own
certificate, the API key required. The booted image runs it with vLLM's own client
(image_tests/test_readme.py)."""

from __future__ import annotations

import http.server
import json
import re
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT

URL = "https://127.0.0.1:8443"


@pytest.mark.slow
def test_the_readme_openai_snippet_runs_with_a_freshly_installed_client(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "openai.OpenAI(" in b]
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=x",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True)
    (tmp_path / "api-key").write_text("k3y\n")

    class Api(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_POST(self) -> None:
            ok = self.headers.get("Authorization") == "Bearer k3y"
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            doc = {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                   "choices": [{"index": 0, "finish_reason": "stop", "message": {
                       "role": "assistant", "content": "Hello from the stand-in"}}]} if ok else \
                {"error": {"message": "no key"}}
            b = json.dumps(doc).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    venv = tmp_path / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = subprocess.run([str(venv / "bin/pip"), "install", "-q", "openai"],
                             capture_output=True, text=True, check=False, timeout=300)
        assert pip.returncode == 0, pip.stderr[-800:]
        here = code.replace(URL, f"https://127.0.0.1:{srv.server_address[1]}")
        out = subprocess.run([str(venv / "bin/python"), "-c", here], cwd=tmp_path,
                             capture_output=True, text=True, check=False, timeout=60)
        assert out.returncode == 0, out.stderr[-800:]
        assert out.stdout == "Hello from the stand-in\n"
    finally:
        srv.shutdown()
