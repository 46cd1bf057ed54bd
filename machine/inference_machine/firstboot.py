"""inference-firstboot: make what is per machine for the public port: the API key (root only) and
nginx's map of it; the scrape token a remote Prometheus reads /metrics/<target> with (root only)
and its map; the TLS certificate and its key; how nginx listens; and what a client needs to know
(endpoint.json, readable by all: URL, certificate fingerprint). Every path is the render's
(profile.json's `paths`).

    inference-firstboot             make what is missing; rewrite the maps, the listen file, the endpoint
    inference-firstboot --force     replace the key and the certificate (cloud-init: once per new instance)
    inference-firstboot --tls-mode  print this machine's TLS mode (self-signed or off) and change nothing

TLS is router.tls by the profile; user-data can choose for this machine by writing "self-signed"
or "off" (plain HTTP, e.g. behind a TLS-terminating load balancer) to paths.tls_mode, or name a
domain in paths.acme_conf for a certificate from Let's Encrypt (inference-acme). INFERENCE_ROOT
prefixes every path (tests run it in a scratch directory)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import rendered
from .inputs import printable

MODES = ("self-signed", "off")
ADDRESS = re.compile(r"[0-9A-Fa-f:.]{2,45}")
HOSTNAME = re.compile(r"[A-Za-z0-9.-]+")


def say(msg: str) -> None:
    print(f"inference-firstboot: {printable(msg)}", flush=True)


def warn(msg: str) -> None:
    print(f"inference-firstboot: {printable(msg)}", file=sys.stderr, flush=True)


def at(doc: dict[str, Any], key: str) -> Path:
    return Path(rendered.root() + doc["paths"][key])


def tls_mode(doc: dict[str, Any]) -> str:
    """The machine's TLS mode, decided here and nowhere else (inference-acme asks with
    --tls-mode): the profile's, unless user-data wrote the exact word of another."""
    mode = str(doc["router"]["tls"])
    path = at(doc, "tls_mode")
    if not rendered.nonempty(path):
        return mode
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(64) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return mode
    # the word alone, spaces around it allowed: "o f f" is no mode
    want = re.sub(r"[\x00-\x09\x0b-\x1f\x7f]", "", raw.decode(errors="replace")).strip()
    if want in MODES:
        return want
    # fail closed: a typo must not turn TLS off
    warn(f"{path} says '{want}'; it takes self-signed or off. Keeping {mode}")
    return mode


def put(path: Path, text: str, mode: int = 0o600) -> None:
    """`text` to `path` through a temporary file beside it: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def secret(path: Path, what: str, force: bool) -> str:
    """The secret at `path` (hex), made new when missing or forced."""
    if force or not rendered.nonempty(path):
        put(path, secrets.token_hex(32))
        say(f"new {what} in {path} (read it with: sudo cat {path})")
    return path.read_text().strip()


def addresses() -> list[str]:
    """This machine's addresses (`hostname -I`), each word that is an address (a word is data)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [a for a in out.split() if ADDRESS.fullmatch(a)]


def openssl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def certificate(cert: Path, key: Path, acme_domain: Path, addrs: list[str]) -> None:
    """A new self-signed certificate naming the machine's addresses at its first boot, so that a
    client can check it against the address it connects to (curl --cacert, or the fingerprint)."""
    acme_domain.unlink(missing_ok=True)  # a new certificate of our own; inference-acme puts its one back
    names = "DNS:localhost,IP:127.0.0.1,IP:::1"
    try:
        host = subprocess.run(["hostname"], capture_output=True, text=True, timeout=10,
                              check=False).stdout.strip() or "localhost"
    except (OSError, subprocess.TimeoutExpired):
        host = "localhost"
    if HOSTNAME.fullmatch(host):
        names += f",DNS:{host}"
    else:
        host = "localhost"
    names += "".join(f",IP:{a}" for a in addrs)
    tmp = Path(tempfile.mkdtemp(prefix=".new.", dir=cert.parent))
    try:
        r = openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "3650", "-subj", f"/CN={host}",
                    "-addext", f"subjectAltName={names}",
                    "-keyout", str(tmp / "key.pem"), "-out", str(tmp / "cert.pem"))
        if r.returncode:
            sys.stderr.write(r.stderr)
            raise SystemExit(1)
        os.chmod(tmp / "key.pem", 0o600)
        os.chmod(tmp / "cert.pem", 0o644)
        os.replace(tmp / "key.pem", key)
        os.replace(tmp / "cert.pem", cert)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"new TLS certificate in {cert} for {names}")


def listen_file(doc: dict[str, Any], mode: str, source: str) -> str:
    listen, backlog = doc["router"]["listen"], doc["limits"]["public_backlog"]
    if mode == "off":
        return (f"# plain HTTP: chosen by {source} or the profile (router.tls: off)\n"
                f"listen {listen} backlog={backlog};\n")
    # TLS session cache kept small: its shared memory is counted in nginx's resident size as it
    # fills, and a larger one kept nginx growing through a soak (docs/benchmarks.md#2026-11-23-soak-cpu).
    return (f"listen {listen} ssl backlog={backlog};\n"
            f"ssl_certificate {doc['paths']['tls_cert']};\n"
            f"ssl_certificate_key {doc['paths']['tls_key']};\n"
            "ssl_protocols TLSv1.2 TLSv1.3;\n"
            "ssl_session_cache shared:inference_tls:1m;\n"
            "ssl_session_timeout 1h;\n")


def acme_certificate(cert: Path, domain_file: Path) -> str | None:
    """The domain whose ACME certificate inference-acme installed, if the certificate in place
    names it."""
    try:
        domain = domain_file.read_text().strip()
    except OSError:
        return None
    if not domain:
        return None
    r = openssl("x509", "-in", str(cert), "-noout", "-ext", "subjectAltName")
    return domain if re.search(rf"DNS:{re.escape(domain)}(?![\w.-])", r.stdout) else None


def endpoint(doc: dict[str, Any], mode: str, addrs: list[str]) -> tuple[str, str]:
    """endpoint.json written (the instances' ready reports kept); the URL and fingerprint."""
    first = addrs[0] if addrs else "127.0.0.1"
    if ":" in first:
        first = f"[{first}]"
    port, cert = doc["router"]["port"], at(doc, "tls_cert")
    fingerprint = ""
    if mode == "off":
        url = f"http://{first}:{port}"
    else:
        url = f"https://{first}:{port}"
        r = openssl("x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256")
        fingerprint = r.stdout.strip().partition("=")[2]
        if domain := acme_certificate(cert, at(doc, "acme_state") / "domain"):
            mode, url = "acme", f"https://{domain}:{port}"
    doc_out: dict[str, Any] = {
        "url": url, "model": doc["served_model_name"], "health": f"{url}/health", "tls": mode,
        "tls_cert": doc["paths"]["tls_cert"], "tls_sha256": fingerprint,
        "api_key": doc["paths"]["api_key"]}
    # the instances' ready reports (inference-startup ready, at each start) are theirs: kept
    if ready := rendered.read_endpoint(doc).get("ready"):
        doc_out["ready"] = ready
    put(at(doc, "endpoint"), json.dumps(doc_out) + "\n", 0o644)
    return url, fingerprint


def reload_nginx() -> None:
    # --no-block: this unit is ordered before nginx, so a waiting reload would deadlock at boot.
    if rendered.root() or not Path("/run/systemd/system").is_dir():
        return
    if subprocess.run(["systemctl", "-q", "is-active", "nginx.service"], check=False).returncode == 0:
        subprocess.run(["systemctl", "reload", "--no-block", "nginx.service"], check=False)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--force"], ["--tls-mode"]):
        print("usage: inference-firstboot [--force | --tls-mode]", file=sys.stderr)
        return 2
    try:
        doc = rendered.profile()
    except rendered.RenderedError as exc:
        warn(str(exc))
        return 1
    mode = tls_mode(doc)
    if args == ["--tls-mode"]:
        print(mode)
        return 0
    force = args == ["--force"]
    os.umask(0o077)
    key, cert = at(doc, "api_key"), at(doc, "tls_cert")
    key.parent.mkdir(parents=True, exist_ok=True)
    cert.parent.mkdir(parents=True, exist_ok=True)
    # One writer at a time: cloud-init's --force run and the boot unit must not interleave a key
    # of one run with a map of the other.
    with open(f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # nginx compares the whole Authorization header; the key is hex, so it needs no quoting.
        put(at(doc, "api_key_map"), f'"Bearer {secret(key, "API key", force)}" 1;\n')
        # The scrape token: metrics only, never the API (a monitoring system holds it, not a client).
        token = secret(at(doc, "scrape_token"), "scrape token", force)
        put(at(doc, "scrape_token_map"), f'"Bearer {token}" 1;\n')
        addrs = addresses()
        tls_key = at(doc, "tls_key")
        if force or not rendered.nonempty(cert) or not rendered.nonempty(tls_key):
            certificate(cert, tls_key, at(doc, "acme_state") / "domain", addrs)
        cert.parent.chmod(0o755)
        put(at(doc, "public_listen"), listen_file(doc, mode, str(at(doc, "tls_mode"))), 0o644)
        url, fingerprint = endpoint(doc, mode, addrs)
    say(f"the API is {url}" + (f" (TLS certificate SHA-256 {fingerprint})" if fingerprint else ""))
    reload_nginx()
    return 0


if __name__ == "__main__":
    sys.exit(main())
