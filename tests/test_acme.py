"""A certificate from an ACME CA for a domain user-data names (issue 19, item 8), as rendered:
the settings file is checked before anything reaches lego (one line each, naming the setting and
the fix), nothing runs without it or with TLS off, and first boot's endpoint file names the
domain once inference-acme has installed its certificate. The issuance itself (lego against a
real ACME server, pebble, with the HTTP-01 check over port 80) runs in the molecule scenario:
image_tests/test_acme.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import runtime

from inference_image.profiles import resolve
from inference_image.render import PATHS, render


def _at(root: Path, key: str) -> Path:
    return root / PATHS[key].lstrip("/")


@pytest.fixture
def rendered(tmp_path: Path) -> tuple[Path, Path]:
    out, root = tmp_path / "r", tmp_path / "root"
    render(resolve("h100"), out)
    return out, root


def _acme(r: Path, root: Path, conf: str | None, path: str = "/usr/bin:/bin") -> \
        subprocess.CompletedProcess[str]:
    if conf is not None:
        _at(root, "acme_conf").parent.mkdir(parents=True, exist_ok=True)
        _at(root, "acme_conf").write_text(conf)
    # no lego on PATH: a run that got past the checks says so, and nothing else can run
    return subprocess.run(runtime("inference-acme", r, root),
                          env={"INFERENCE_ROOT": str(root), "PATH": path},
                          capture_output=True, text=True, check=False)


def test_nothing_to_do_without_a_domain_or_with_tls_off(rendered: tuple[Path, Path]) -> None:
    r, root = rendered
    run = _acme(r, root, None)
    assert run.returncode == 0 and "keeps this machine's own certificate" in run.stdout
    _at(root, "tls_mode").parent.mkdir(parents=True, exist_ok=True)
    _at(root, "tls_mode").write_text("off\n")
    run = _acme(r, root, "domain=llm.example.com\nemail=ops@example.com\n")
    assert run.returncode == 0 and "TLS is off" in run.stdout
    assert not _at(root, "acme_state").exists()


GOOD = "domain=llm.example.com\nemail=ops@example.com\n"


@pytest.mark.parametrize(("profile_tls", "mode_file", "off"), [
    ("off", "self-signd\n", False),     # a typo is TLS on, whatever the profile says ...
    ("self-signed", "of\n", False),     # ... fail closed in both
    ("self-signed", "off\n", True),
    ("off", "self-signed\n", False),
])
def test_acme_takes_the_mode_first_boot_decided(tmp_path: Path, profile_tls: str, mode_file: str,
                                                off: bool) -> None:
    r, root = tmp_path / "r", tmp_path / "root"
    render(resolve("h100", overrides=[f"router.tls={profile_tls}"]), r)
    _at(root, "tls_mode").parent.mkdir(parents=True, exist_ok=True)
    _at(root, "tls_mode").write_text(mode_file)
    decided = subprocess.run([*runtime("inference-firstboot", r, root), "--tls-mode"],
                             env={"INFERENCE_ROOT": str(root), "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, check=True).stdout.strip()
    assert decided == ("off" if off else "self-signed")
    assert not _at(root, "api_key").exists(), "--tls-mode makes nothing"
    run = _acme(r, root, GOOD)
    assert ("TLS is off" in run.stdout) is off, run.stdout + run.stderr


@pytest.mark.parametrize(("conf", "names"), [
    ("domain=llm.example.com;touch /tmp/x\nemail=ops@example.com\n", "domain="),
    ("domain=$(reboot).example.com\nemail=ops@example.com\n", "domain="),
    ("domain=-llm.example.com\nemail=ops@example.com\n", "domain="),
    ("domain=localhost\nemail=ops@example.com\n", "domain="),
    ("email=ops@example.com\n", "domain="),
    ("domain=llm.example.com\n", "email="),
    ("domain=llm.example.com\nemail=ops@example.com --server=http://evil\n", "email="),
    (GOOD + "directory=http://acme.example.com/dir\n", "directory="),
    (GOOD + "directory=https://acme.example.com/dir --x\n", "directory="),
    (GOOD + "ca=/nonexistent.pem\n", "ca="),
    (GOOD + "server=https://x\n", "unknown setting 'server'"),
    (GOOD + "just words\n", "not setting=value"),
])
def test_bad_settings_are_one_line_naming_the_setting(rendered: tuple[Path, Path], conf: str,
                                                      names: str) -> None:
    r, root = rendered
    run = _acme(r, root, conf)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Fix:" in lines[0], run.stderr
    assert not _at(root, "acme_state").exists(), "a refused file must leave nothing behind"


def test_good_settings_reach_the_acme_client(rendered: tuple[Path, Path]) -> None:
    r, root = rendered
    conf = ("# user-data\r\n" + GOOD.replace("llm", "LLM") + "\n"
            "directory=https://acme-staging-v02.api.letsencrypt.org/directory\n")
    run = _acme(r, root, conf)
    assert run.returncode == 1 and "lego (the ACME client) is not installed" in run.stderr


def test_endpoint_names_the_domain_of_an_installed_acme_certificate(
        rendered: tuple[Path, Path], tmp_path: Path) -> None:
    r, root = rendered
    env = {**os.environ, "INFERENCE_ROOT": str(root)}
    boot = runtime("inference-firstboot", r, root)
    subprocess.run(boot, env=env, check=True, capture_output=True)
    assert json.loads(_at(root, "endpoint").read_text())["tls"] == "self-signed"
    # what inference-acme leaves: the CA's certificate for the domain in place, the domain noted
    cert, key = _at(root, "tls_cert"), _at(root, "tls_key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    "/CN=llm.example.com", "-addext", "subjectAltName=DNS:llm.example.com",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    marker = _at(root, "acme_state") / "domain"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("llm.example.com\n")
    subprocess.run(boot, env=env, check=True, capture_output=True)
    endpoint = json.loads(_at(root, "endpoint").read_text())
    assert endpoint["tls"] == "acme" and endpoint["url"] == "https://llm.example.com:8000"
    # a certificate that does not name the domain (first boot made a new one) is not the CA's
    subprocess.run([*boot, "--force"], env=env, check=True, capture_output=True)
    endpoint = json.loads(_at(root, "endpoint").read_text())
    assert endpoint["tls"] == "self-signed" and not marker.exists()
