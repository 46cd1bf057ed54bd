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

import ipaddress
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import boundary, rendered, writers
from .contract import UNIT
from .inputs import (
    TLS_MODE_MAX,
    BearerToken,
    Hostname,
    InputError,
    IPAddress,
    Refused,
    TlsMode,
    printable,
    read_text,
)

# the size a key or token file may have: a bearer token's longest and its line end
SECRET_FILE_MAX = 4096
DOMAIN_FILE_MAX = 1024


def say(msg: str) -> None:
    print(f"inference-firstboot: {printable(msg)}", flush=True)


def warn(msg: str) -> None:
    print(f"inference-firstboot: {printable(msg)}", file=sys.stderr, flush=True)


def at(doc: dict[str, Any], key: str) -> Path:
    return Path(rendered.root() + doc["paths"][key])


def tls_mode(doc: dict[str, Any], refused: list[str] | None = None) -> str:
    """The machine's TLS mode, decided here and nowhere else (inference-acme asks with
    --tls-mode): the profile's, unless user-data wrote one of the words (inputs.TlsMode). A file
    that says anything else fails closed: TLS on with this machine's own certificate, whatever the
    profile says, and one line (also into `refused`, for the banner)."""
    mode = str(doc["router"]["tls"])
    path = at(doc, "tls_mode")
    if not path.exists() and not path.is_symlink():
        return mode
    try:
        text = read_text(path, "TLS mode file", TLS_MODE_MAX)
        # an empty file says nothing: the profile's mode
        return str(TlsMode.parse(text)) if text.strip(" \t\r\n") else mode
    except (InputError, Refused) as exc:
        why = f"{path} refused ({exc}); serving with TLS (self-signed)"
    warn(why)
    if refused is not None:
        refused.append(why)
    return "self-signed"


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


def secret(path: Path, what: str, force: bool, refused: list[str]) -> BearerToken:
    """The bearer token at `path`, made new (hex) when missing, forced, or not a token
    (inputs.BearerToken: user-data may write it). A refused one is replaced, said in one line
    that never repeats it, and added to `refused` for the banner."""
    # an empty file (0 bytes) is no key written: made, as a missing one is
    written = path.is_symlink() or (path.exists() and (
        not path.is_file() or path.stat().st_size > 0))
    if not force and written:
        try:
            return BearerToken.parse(read_text(path, what, SECRET_FILE_MAX), what)
        except (InputError, Refused) as exc:
            why = f"{path}: {exc}; a new {what} was made in its place"
            warn(why)
            refused.append(why)
    token = BearerToken(secrets.token_hex(32))
    put(path, token)
    say(f"new {what} in {path} (read it with: sudo cat {path})")
    return token


def addresses() -> list[IPAddress]:
    """This machine's addresses (`hostname -I`), each word that is an address (a word is data)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found: list[IPAddress] = []
    for word in out.split():
        try:
            a = ipaddress.ip_address(word)
        except ValueError:
            continue
        if not (isinstance(a, ipaddress.IPv6Address) and a.scope_id):
            found.append(a)
    return found


def openssl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def host_name() -> Hostname:
    try:
        text = subprocess.run(["hostname"], capture_output=True, text=True, timeout=10,
                              check=False).stdout
        return Hostname.parse(text, "host name", labels_min=1)
    except (OSError, subprocess.TimeoutExpired, Refused):
        return Hostname("localhost")


def certificate(cert: Path, key: Path, acme_domain: Path, addrs: list[IPAddress]) -> None:
    """A new self-signed certificate naming the machine's addresses at its first boot, so that a
    client can check it against the address it connects to (curl --cacert, or the fingerprint)."""
    acme_domain.unlink(missing_ok=True)  # a new certificate of our own; inference-acme puts its one back
    host = host_name()
    dns = [Hostname("localhost")] + ([host] if host != "localhost" else [])
    names = writers.subject_alt_names(
        dns, [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"), *addrs])
    tmp = Path(tempfile.mkdtemp(prefix=".new.", dir=cert.parent))
    try:
        r = openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "3650", "-subj", f"/CN={host}",
                    "-addext", f"subjectAltName={names}",
                    "-keyout", str(tmp / "key.pem"), "-out", str(tmp / "cert.pem"))
        if r.returncode:
            raise OSError(f"openssl could not make the certificate: {r.stderr.strip()[-300:]}")
        os.chmod(tmp / "key.pem", 0o600)
        os.chmod(tmp / "cert.pem", 0o644)
        os.replace(tmp / "key.pem", key)
        os.replace(tmp / "cert.pem", cert)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"new TLS certificate in {cert} for {names}")


def listen_file(doc: dict[str, Any], mode: str, source: str) -> str:
    address, port = writers.parse_listen(str(doc["router"]["listen"]))
    backlog = doc["limits"]["public_backlog"]
    if mode == "off":
        return (f"# plain HTTP: chosen by {source} or the profile (router.tls: off)\n"
                + writers.nginx_listen(address, port, backlog, None))
    return writers.nginx_listen(address, port, backlog,
                                (doc["paths"]["tls_cert"], doc["paths"]["tls_key"]))


def acme_certificate(cert: Path, domain_file: Path) -> str | None:
    """The domain whose ACME certificate inference-acme installed, if the certificate in place
    names it."""
    try:
        domain = Hostname.parse(read_text(domain_file, "ACME domain record", DOMAIN_FILE_MAX))
    except (InputError, Refused):
        return None
    r = openssl("x509", "-in", str(cert), "-noout", "-ext", "subjectAltName")
    return domain if re.search(rf"DNS:{re.escape(domain)}(?![\w.-])", r.stdout) else None


def endpoint(doc: dict[str, Any], mode: str, addrs: list[IPAddress],
             refused: list[str]) -> tuple[str, str]:
    """endpoint.json written (the instances' ready reports kept); the URL and fingerprint.
    `refused`: what user-data wrote that this boot did not take, one line each (the banner
    shows them)."""
    where = writers.host_port(addrs[0] if addrs else ipaddress.ip_address("127.0.0.1"),
                              doc["router"]["port"])
    cert = at(doc, "tls_cert")
    fingerprint = ""
    if mode == "off":
        url = f"http://{where}"
    else:
        url = f"https://{where}"
        r = openssl("x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256")
        fingerprint = r.stdout.strip().partition("=")[2]
        if domain := acme_certificate(cert, at(doc, "acme_state") / "domain"):
            mode, url = "acme", f"https://{writers.host_port(Hostname(domain), doc['router']['port'])}"
    doc_out: dict[str, Any] = {
        "url": url, "model": doc["served_model_name"], "health": f"{url}/health", "tls": mode,
        "tls_cert": doc["paths"]["tls_cert"], "tls_sha256": fingerprint,
        "api_key": doc["paths"]["api_key"], "refused": refused}
    # the instances' ready reports (inference-startup ready, at each start) are theirs: kept
    if ready := rendered.read_endpoint(doc).get("ready"):
        doc_out["ready"] = ready
    put(at(doc, "endpoint"), json.dumps(doc_out) + "\n", 0o644)
    return url, fingerprint


def reload_nginx() -> None:
    # --no-block: this unit is ordered before nginx, so a waiting reload would deadlock at boot.
    if rendered.root() or not Path("/run/systemd/system").is_dir():
        return
    nginx = UNIT["public"]
    if subprocess.run(["systemctl", "-q", "is-active", nginx], check=False).returncode == 0:
        subprocess.run(["systemctl", "reload", "--no-block", nginx], check=False)


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
    if args == ["--tls-mode"]:
        print(tls_mode(doc))
        return 0
    try:
        return make(doc, force=args == ["--force"])
    except (OSError, Refused) as exc:
        # a read-only or full disk, a folder where a file goes, a value the render holds that no
        # writer takes: nothing half-made is left in place (put() writes whole files or none)
        warn(f"cannot make this machine's API key, certificate or nginx files: {exc}. Fix: the "
             "cause above (a full or read-only /etc, a folder in a file's place), then "
             "systemctl restart inference-firstboot")
        return 1


def make(doc: dict[str, Any], force: bool) -> int:
    refused: list[str] = []
    mode = tls_mode(doc, refused)
    os.umask(0o077)
    key, cert = at(doc, "api_key"), at(doc, "tls_cert")
    key.parent.mkdir(parents=True, exist_ok=True)
    cert.parent.mkdir(parents=True, exist_ok=True)
    # One writer at a time: cloud-init's --force run and the boot unit must not interleave a key
    # of one run with a map of the other.
    with boundary.locked(Path(f"{key}.lock")):
        # nginx compares the whole Authorization header, written by the one writer of its maps
        put(at(doc, "api_key_map"),
            writers.nginx_bearer_map(secret(key, "API key", force, refused)))
        # The scrape token: metrics only, never the API (a monitoring system holds it, not a client).
        token = secret(at(doc, "scrape_token"), "scrape token", force, refused)
        put(at(doc, "scrape_token_map"), writers.nginx_bearer_map(token, "scrape token"))
        addrs = addresses()
        tls_key = at(doc, "tls_key")
        if force or not rendered.nonempty(cert) or not rendered.nonempty(tls_key):
            certificate(cert, tls_key, at(doc, "acme_state") / "domain", addrs)
        cert.parent.chmod(0o755)
        put(at(doc, "public_listen"), listen_file(doc, mode, str(at(doc, "tls_mode"))), 0o644)
        url, fingerprint = endpoint(doc, mode, addrs, refused)
    say(f"the API is {url}" + (f" (TLS certificate SHA-256 {fingerprint})" if fingerprint else ""))
    reload_nginx()
    return 0


if __name__ == "__main__":
    sys.exit(main())
