"""The public port's TLS and rate limit, as rendered and as first boot makes
them: a certificate per machine, a listen file nginx cannot start without, the choice of plain
HTTP by profile or user-data, and a per-address limit that answers 429. The running nginx is
checked by image_tests/test_security.py in the molecule scenario."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import runtime

from inference_image.profiles import resolve
from inference_image.render import PATHS, render


def _render(tmp_path: Path, *overrides: str) -> Path:
    out = tmp_path / "r"
    render(resolve("h100", overrides=list(overrides)), out)
    return out


def _boot(render_dir: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*runtime("inference-firstboot", render_dir, root), *args],
                          env={**os.environ, "INFERENCE_ROOT": str(root)},
                          capture_output=True, text=True, check=False)


def _at(root: Path, key: str) -> Path:
    return root / PATHS[key].lstrip("/")


def _fingerprint(cert: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256"],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().split("=", 1)[1]


def test_first_boot_makes_a_certificate_and_serves_tls_by_default(tmp_path: Path) -> None:
    r, root = _render(tmp_path), tmp_path / "root"
    run = _boot(r, root)
    assert run.returncode == 0, run.stderr
    cert, key = _at(root, "tls_cert"), _at(root, "tls_key")
    assert cert.stat().st_mode & 0o777 == 0o644
    assert key.stat().st_mode & 0o777 == 0o600, "the TLS key must be root's alone"
    text = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    assert "IP Address:127.0.0.1" in text, "a client on the machine cannot verify the certificate"
    listen = _at(root, "public_listen").read_text()
    assert "listen 0.0.0.0:8000 ssl " in listen
    assert f"ssl_certificate {PATHS['tls_cert']};" in listen
    endpoint = json.loads(_at(root, "endpoint").read_text())
    assert endpoint["tls"] == "self-signed" and endpoint["url"].startswith("https://")
    assert endpoint["tls_sha256"] == _fingerprint(cert)
    assert endpoint["tls_sha256"] in run.stdout, "the fingerprint is not shown at first boot"


def test_certificate_kept_across_boots_and_replaced_per_instance(tmp_path: Path) -> None:
    r, root = _render(tmp_path), tmp_path / "root"
    assert _boot(r, root).returncode == 0
    first = _fingerprint(_at(root, "tls_cert"))
    assert _boot(r, root).returncode == 0
    assert _fingerprint(_at(root, "tls_cert")) == first, "a reboot changed the certificate"
    assert _boot(r, root, "--force").returncode == 0  # cloud-init, once per new instance
    assert _fingerprint(_at(root, "tls_cert")) != first, "a new machine kept the image's certificate"


@pytest.mark.parametrize("how", ["user-data", "profile"])
def test_plain_http_only_when_asked(tmp_path: Path, how: str) -> None:
    r = _render(tmp_path, *(["router.tls=off"] if how == "profile" else []))
    root = tmp_path / "root"
    if how == "user-data":
        _at(root, "tls_mode").parent.mkdir(parents=True, exist_ok=True)
        _at(root, "tls_mode").write_text("off\n")
    assert _boot(r, root).returncode == 0
    listen = _at(root, "public_listen").read_text()
    assert "listen 0.0.0.0:8000 backlog=4096;" in listen and " ssl" not in listen
    endpoint = json.loads(_at(root, "endpoint").read_text())
    assert endpoint["tls"] == "off" and endpoint["url"].startswith("http://")


def test_user_data_can_turn_tls_back_on(tmp_path: Path) -> None:
    r, root = _render(tmp_path, "router.tls=off"), tmp_path / "root"
    _at(root, "tls_mode").parent.mkdir(parents=True, exist_ok=True)
    _at(root, "tls_mode").write_text("self-signed")
    assert _boot(r, root).returncode == 0
    assert " ssl " in _at(root, "public_listen").read_text()


def test_a_mistyped_mode_keeps_tls(tmp_path: Path) -> None:
    r, root = _render(tmp_path), tmp_path / "root"
    _at(root, "tls_mode").parent.mkdir(parents=True, exist_ok=True)
    _at(root, "tls_mode").write_text("of\n")
    run = _boot(r, root)
    assert run.returncode == 0
    assert "not one of self-signed, off" in run.stderr and "serving with TLS" in run.stderr
    assert " ssl " in _at(root, "public_listen").read_text()


@pytest.mark.parametrize("word", [
    "o f f", "o\nff", "off\x1b[2J", "OFF", "o\x01f\x02f", "off" + " " * 61 + "# plain, for the LB",
    "off # comment", "off\x00", "\u202eoff", "off\u2028", "self-signed\noff"])
@pytest.mark.parametrize("profile", ["self-signed", "off"])
def test_only_the_exact_word_turns_tls_off(tmp_path: Path, word: str, profile: str) -> None:
    """A file that is not exactly a mode, whatever the profile says, leaves TLS on (fails closed)
    and says so once, in the journal and in the banner's endpoint.json."""
    r, root = _render(tmp_path, f"router.tls={profile}"), tmp_path / "root"
    _at(root, "tls_mode").parent.mkdir(parents=True, exist_ok=True)
    _at(root, "tls_mode").write_text(f"  {word}\n")
    run = _boot(r, root)
    assert run.returncode == 0 and "serving with TLS (self-signed)" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert " ssl " in _at(root, "public_listen").read_text()
    assert "\x1b" not in run.stderr and "\u202e" not in run.stderr  # said, not replayed
    endpoint = json.loads(_at(root, "endpoint").read_text())
    assert endpoint["tls"] == "self-signed" and len(endpoint["refused"]) == 1


def test_an_empty_mode_file_is_the_profiles_mode(tmp_path: Path) -> None:
    r, root = _render(tmp_path, "router.tls=off"), tmp_path / "root"
    _at(root, "tls_mode").parent.mkdir(parents=True, exist_ok=True)
    _at(root, "tls_mode").write_text("\n")
    run = _boot(r, root)
    assert run.returncode == 0 and not run.stderr
    assert " ssl" not in _at(root, "public_listen").read_text()


def _key_boot(tmp_path: Path, which: str, data: bytes) -> tuple[subprocess.CompletedProcess[str],
                                                                 Path]:
    r, root = _render(tmp_path), tmp_path / "root"
    _at(root, which).parent.mkdir(parents=True, exist_ok=True)
    _at(root, which).write_bytes(data)
    return _boot(r, root), root


HOSTILE_KEYS = [b'mykey" 1;\n~. 1;\n"x', b"abcdefghijklmnop}\nserver { listen 81; }", b" " * 40,
                b"abcdefghijklmnopq;", b"abcdefghijklmnop$http_host", b"abcdefghij\\klmnopq",
                b"abcdefghijklmnop\x00", "abcdefghijklmnop\u2028".encode(),
                "abcdefghijklmnop\u202e".encode(), b"\xe9t\xe9abcdefghijklmnop",
                b"short", b"a" * 600, b"abcdefghijklmnop\r\nq", b"abc==defghijklmnopq"]


@pytest.mark.parametrize("which", ["api_key", "scrape_token"])
@pytest.mark.parametrize("data", HOSTILE_KEYS)
def test_a_key_that_is_no_bearer_token_is_replaced_and_said(tmp_path: Path, which: str,
                                                            data: bytes) -> None:
    """A key or scrape token user-data wrote that is not RFC 6750's b64token (of 16 to 512
    characters) never reaches nginx's map: the machine makes its own, says so in one line (the
    secret not repeated), and the banner's endpoint.json carries the line."""
    run, root = _key_boot(tmp_path, which, data)
    assert run.returncode == 0, run.stderr
    made = _at(root, which).read_text()
    assert len(made) == 64 and made.encode() != data
    mapped = _at(root, f"{which}_map").read_text()
    assert mapped == f'"Bearer {made}" 1;\n', "the map holds more than the one key"
    said = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(said) == 1 and "a new" in said[0] and "Fix:" in said[0], run.stderr
    if len(data.strip()) >= 16:
        assert data.decode(errors="replace").strip() not in said[0], "the refused key was repeated"
    refused = json.loads(_at(root, "endpoint").read_text())["refused"]
    assert len(refused) == 1 and refused[0] in said[0]


@pytest.mark.parametrize("data", [b"0123456789abcdef0123456789abcdef", b"abc.DEF-ghi_jkl~mno+p/q==\n",
                                  b"A" * 512 + b"\r\n"])
def test_a_key_user_data_wrote_as_a_token_is_kept(tmp_path: Path, data: bytes) -> None:
    run, root = _key_boot(tmp_path, "api_key", data)
    assert run.returncode == 0 and not run.stderr, run.stderr
    key = data.decode().rstrip("\r\n")
    assert _at(root, "api_key_map").read_text() == f'"Bearer {key}" 1;\n'
    assert json.loads(_at(root, "endpoint").read_text())["refused"] == []


@pytest.mark.parametrize("where", ["api_key", "public_listen"])
def test_first_boot_that_cannot_write_says_why_in_one_line(tmp_path: Path, where: str) -> None:
    """A file first boot cannot write (here a folder in its place; a full or read-only /etc is
    the same OSError) is one line naming the cause and the fix, never a traceback."""
    r, root = _render(tmp_path), tmp_path / "root"
    _at(root, where).mkdir(parents=True)
    run = _boot(r, root)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    said = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(said) <= 2 and "cannot make this machine's" in said[-1] and "Fix:" in said[-1]
    if where == "api_key":
        assert not _at(root, "api_key_map").exists(), "a map was written beside no key"
