"""A certificate from an ACME CA for a domain user-data names, as rendered:
the settings file is checked before anything reaches lego (one line each, naming the setting and
the fix), nothing runs without it or with TLS off, and first boot's endpoint file names the
domain once inference-acme has installed its certificate. The issuance itself (lego against a
real ACME server, pebble, with the HTTP-01 check over port 80) runs in the molecule scenario:
image_tests/machine/test_acme.py."""

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


def _pem(tmp_path: Path, name: str) -> tuple[Path, Path]:
    crt, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "90", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True)
    return crt, key


def _stand_in_lego(tmp_path: Path, crt: Path, key: Path) -> str:
    """A stand-in for lego (the CA is on the internet): `run` leaves the given certificate and
    key where lego leaves the domain's. Its folder, for PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "lego").write_text(
        "#!/bin/sh\nwhile [ $# -gt 0 ]; do case $1 in --path) p=$2;; --domains) d=$2;; esac; "
        f"shift; done\nmkdir -p $p/certificates && cp {crt} $p/certificates/$d.crt && "
        f"cp {key} $p/certificates/$d.key\n")
    (bin_dir / "lego").chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


@pytest.mark.parametrize("what", ["another name", "another key"])
def test_a_certificate_that_is_not_the_domains_is_never_installed(
        rendered: tuple[Path, Path], tmp_path: Path, what: str) -> None:
    """What the CA (or anything in lego's folder) hands back is installed only where it names the
    domain and its key is its own; else one line, and the machine keeps its own certificate."""
    r, root = rendered
    subprocess.run(runtime("inference-firstboot", r, root), env={**os.environ,
                   "INFERENCE_ROOT": str(root)}, check=True, capture_output=True)
    before = _at(root, "tls_cert").read_bytes()
    crt, key = _pem(tmp_path, "llm.example.com")
    if what == "another name":
        crt, key = _pem(tmp_path, "evil.example.net")
    else:
        key = _pem(tmp_path / ".." / tmp_path.name, "other.example.com")[1]
    run = _acme(r, root, GOOD, _stand_in_lego(tmp_path, crt, key))
    assert run.returncode == 1 and "not installed" in run.stderr and "Fix:" in run.stderr, \
        run.stdout + run.stderr
    assert _at(root, "tls_cert").read_bytes() == before
    assert json.loads(_at(root, "endpoint").read_text())["tls"] == "self-signed"


def test_the_domains_certificate_is_installed_and_named(rendered: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    r, root = rendered
    crt, key = _pem(tmp_path, "llm.example.com")
    run = _acme(r, root, GOOD, _stand_in_lego(tmp_path, crt, key))
    assert run.returncode == 0, run.stdout + run.stderr
    assert _at(root, "tls_cert").read_bytes() == crt.read_bytes()
    assert json.loads(_at(root, "endpoint").read_text())["url"] == "https://llm.example.com:8000"


@pytest.mark.parametrize("ca", ["notes", "dev-zero", "fifo", "folder", "relative"])
def test_ca_must_be_a_pem_certificate_file(rendered: tuple[Path, Path], tmp_path: Path,
                                           ca: str) -> None:
    r, root = rendered
    path = tmp_path / ca
    if ca == "notes":
        path.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    elif ca == "dev-zero":
        path.symlink_to("/dev/zero")
    elif ca == "fifo":
        os.mkfifo(path)
    elif ca == "folder":
        path.mkdir()
    run = _acme(r, root, GOOD + f"ca={'ca.pem' if ca == 'relative' else path}\n")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1 and "ca=" in lines[0] and "Traceback" not in \
        run.stderr, run.stderr


@pytest.mark.parametrize("where", [".lock", "domain"])
def test_a_fifo_in_the_acme_state_never_holds_it_up(rendered: tuple[Path, Path], tmp_path: Path,
                                                    where: str) -> None:
    r, root = rendered
    state = _at(root, "acme_state")
    state.mkdir(parents=True)
    os.mkfifo(state / where)
    _at(root, "acme_conf").parent.mkdir(parents=True, exist_ok=True)
    _at(root, "acme_conf").write_text(GOOD)
    crt, key = _pem(tmp_path, "llm.example.com")
    run = subprocess.run(runtime("inference-acme", r, root), capture_output=True, text=True,
                         env={"INFERENCE_ROOT": str(root),
                              "PATH": _stand_in_lego(tmp_path, crt, key)},
                         check=False, timeout=20)
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) <= 1, run.stderr
    if where == ".lock":
        assert run.returncode == 1 and "not a regular file" in run.stderr
    else:  # the domain's record is written whole over what stood there
        assert run.returncode == 0, run.stderr
        assert (state / "domain").is_file() and (state / "domain").read_text() == "llm.example.com\n"
