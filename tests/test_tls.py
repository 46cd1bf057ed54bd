"""The public port's TLS and rate limit (issue 19, item 8), as rendered and as first boot makes
them: a certificate per machine, a listen file nginx cannot start without, the choice of plain
HTTP by profile or user-data, and a per-address limit that answers 429. The running nginx is
checked by image_tests/test_security.py in the molecule scenario."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, runtime

from inference_image.profiles import resolve
from inference_image.render import MACHINE_FILES, MACHINE_STATE, PATHS, render


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
    assert "takes self-signed or off. Keeping self-signed" in run.stderr
    assert " ssl " in _at(root, "public_listen").read_text()


@pytest.mark.parametrize("word", ["o f f", "o\nff", "off\x1b[2J", "OFF"])
def test_only_the_exact_word_turns_tls_off(tmp_path: Path, word: str) -> None:
    r, root = _render(tmp_path), tmp_path / "root"
    _at(root, "tls_mode").parent.mkdir(parents=True, exist_ok=True)
    _at(root, "tls_mode").write_text(f"  {word}\n")
    run = _boot(r, root)
    assert run.returncode == 0 and "Keeping self-signed" in run.stderr
    assert " ssl " in _at(root, "public_listen").read_text()
    assert "\x1b" not in run.stderr  # said, not replayed to the terminal


def test_the_certificate_names_the_addresses_and_globs_nothing(tmp_path: Path) -> None:
    """`hostname -I` words that are no address (a `*` would glob the working directory's files
    into the certificate) are left out."""
    r, root = _render(tmp_path), tmp_path / "root"
    bin_dir, cwd = tmp_path / "bin", tmp_path / "cwd"
    bin_dir.mkdir()
    cwd.mkdir()
    (cwd / "evil.example").write_text("")
    (bin_dir / "hostname").write_text('#!/bin/sh\n[ "$1" = -I ] && echo "10.0.0.7 * 2001:db8::7"'
                                      ' || echo worker-1\n')
    (bin_dir / "hostname").chmod(0o755)
    run = subprocess.run(runtime("inference-firstboot", r, root), cwd=cwd,
                         env={**os.environ, "INFERENCE_ROOT": str(root),
                              "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    text = subprocess.run(["openssl", "x509", "-in", str(_at(root, "tls_cert")), "-noout", "-ext",
                           "subjectAltName"], capture_output=True, text=True, check=True).stdout
    assert "IP Address:10.0.0.7" in text and "IP Address:2001:DB8:0:0:0:0:0:7" in text
    assert "evil" not in text and "*" not in text
    assert json.loads(_at(root, "endpoint").read_text())["url"] == "https://10.0.0.7:8000"


def test_nginx_cannot_listen_without_first_boot(tmp_path: Path) -> None:
    conf = (_render(tmp_path) / "etc/nginx/conf.d/inference-image.conf").read_text()
    # a glob include would let nginx start with no listen line (port 80, plain) before first boot
    assert f"include {PATHS['public_listen']};" in conf
    assert not [ln for ln in conf.splitlines() if ln.strip().startswith("listen ")]


def test_rate_limit_per_client_address(tmp_path: Path) -> None:
    conf = (_render(tmp_path, "router.rate_limit_rps=7", "router.rate_limit_burst=9")
            / "etc/nginx/conf.d/inference-image.conf").read_text()
    assert "rate=7r/s" in conf and "burst=9 nodelay" in conf
    assert "limit_req_status 429;" in conf and "return 429 " in conf
    assert "~^127\\.  \"\";" in conf, "loopback clients (the machine's own checks) are limited"
    off = (_render(tmp_path, "router.rate_limit_rps=0")
           / "etc/nginx/conf.d/inference-image.conf").read_text()
    assert "limit_req" not in off


def test_sysprep_removes_every_per_machine_file(tmp_path: Path) -> None:
    r, root = _render(tmp_path), tmp_path / "root"
    assert _boot(r, root).returncode == 0
    # and what a machine with a domain has: user-data's ACME settings, inference-acme's account
    _at(root, "acme_conf").write_text("domain=llm.example.com\nemail=ops@example.com\n")
    (_at(root, "acme_state") / "accounts").mkdir(parents=True, exist_ok=True)
    # and a fleet droplet's role, from its user-data
    _at(root, "fleet").write_text('{"fleet": "f", "role": "router", "worker_tag": "f-worker"}')
    # and an instance's checkpoint, written once it served
    (_at(root, "checkpoints") / "vllm-0" / "images").mkdir(parents=True, exist_ok=True)
    extra = json.loads((r / "ansible/extra-vars.json").read_text())
    every = [PATHS[k] for k in (*MACHINE_FILES, *MACHINE_STATE)]
    assert extra["sysprep_machine_files"] == every
    made = [p for p in every if (root / p.lstrip("/")).exists()]
    assert made == every, "a per-machine file is missing"
    check = subprocess.run(
        ["bash", str(ROOT / "roles/sysprep/files/inference-sysprep-check")],
        env={**os.environ, "SYSPREP_FORBIDDEN_FILE": "",
             "SYSPREP_MACHINE_FILES": " ".join(str(root) + p for p in made)},
        capture_output=True, text=True, check=False)
    assert check.returncode == 1
    for p in made:
        assert f"per-machine file left: {root}{p}" in check.stdout


def test_first_boot_makes_a_scrape_token_apart_from_the_api_key(tmp_path: Path) -> None:
    """The scrape token (router.scrape): root's alone, not the API key, kept across boots and
    replaced per instance with the key; nginx's map of it names it whole. With router.scrape off
    the public port has no /metrics/<target> route and nginx reads no scrape map."""
    r, root = _render(tmp_path), tmp_path / "root"
    assert _boot(r, root).returncode == 0
    token, key = _at(root, "scrape_token"), _at(root, "api_key")
    assert token.stat().st_mode & 0o777 == 0o600
    first = token.read_text()
    assert len(first) == 64 and first != key.read_text()
    assert _at(root, "scrape_token_map").read_text() == f'"Bearer {first}" 1;\n'
    assert _boot(r, root).returncode == 0 and token.read_text() == first
    assert _boot(r, root, "--force").returncode == 0 and token.read_text() != first
    conf = (r / "etc/nginx/conf.d/inference-image.conf").read_text()
    assert "location = /metrics/vllm-0 {" in conf and "proxy_pass http://127.0.0.1:29000/metrics;" \
        in conf
    off = _render(tmp_path / "off", "router.scrape=false")
    conf = (off / "etc/nginx/conf.d/inference-image.conf").read_text()
    assert "/metrics/" not in conf.replace("/metrics;", "") and "scrape-token" not in conf
