"""inference-acme: replace the public port's own certificate with one from an ACME CA (Let's
Encrypt unless told otherwise) for the domain user-data names in paths.acme_conf, and keep it
renewed. inference-acme.timer runs it a minute after boot and hourly; it asks the CA only when
there is no certificate for the domain yet or it expires within 30 days, so an hourly run is a
retry after a failure and costs nothing otherwise. Until a certificate comes, and whenever the CA
cannot be reached, the machine keeps serving with the certificate first boot made.

paths.acme_conf, one setting a line (user-data's write_files, README "Using a machine"):
  domain=llm.example.com   required: a DNS name that resolves to this machine; the CA connects
                           to it on port 80, which is open only while it does
  email=ops@example.com    required: the account at the CA (Let's Encrypt's expiry notices)
  directory=https://...    optional: another CA's ACME directory (default: Let's Encrypt)
  ca=/path/bundle.pem      optional: the CA of the ACME server's own HTTPS (a private CA)
INFERENCE_ROOT prefixes every path (tests run it in a scratch directory)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import boundary, firstboot, rendered
from .contract import FIREWALL_TABLE
from .inputs import Email, Hostname, InputError, Refused, printable, read_bytes, read_text

LETS_ENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"
CONF_MAX = 64 * 1024
# a CA bundle: a few certificates, PEM
CA_MAX = 1024 * 1024
# lego's certificate and key for the domain, read back before they are installed
CERT_MAX = 1024 * 1024
SETTING = re.compile(r"([a-z]+)=(.*)")
DIRECTORY = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?")
RULE_COMMENT = "inference-acme"


def say(msg: str) -> None:
    print(f"inference-acme: {printable(msg)}", flush=True)


def read_conf(conf: Path) -> dict[str, str]:
    """The settings, each checked against a closed alphabet: every value reaches lego's command
    line and file names."""
    try:
        text = read_text(conf, conf.name, CONF_MAX)
    except InputError as exc:
        raise Refused(str(exc)) from None
    got = {"domain": "", "email": "", "directory": LETS_ENCRYPT, "ca": ""}
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if re.fullmatch(r"\s*(#.*)?", line):
            continue
        m = SETTING.fullmatch(line)
        if not m:
            raise Refused(f"{conf}: '{line}' is not setting=value. Fix: one of domain=, email=, "
                          "directory=, ca= a line")
        name, value = m.groups()
        if name not in got:
            raise Refused(f"{conf}: unknown setting '{name}'. Fix: domain=, email=, directory= or ca=")
        got[name] = value.lower() if name == "domain" else value
    # domain: the name whose A/AAAA record is this machine's address; email: the CA's account,
    # where Let's Encrypt sends expiry notices
    for name, parse in (("domain", Hostname.parse), ("email", Email.parse)):
        try:
            got[name] = parse(got[name])
        except Refused as exc:
            raise Refused(f"{conf}: {name}=: {exc}") from None
    if not DIRECTORY.fullmatch(got["directory"]):
        raise Refused(f"{conf}: directory='{got['directory']}' is not an https URL. Fix: leave it "
                      "out for Let's Encrypt, or give the CA's ACME directory URL")
    if got["ca"]:
        got["ca"] = ca_bundle(conf, got["ca"])
    return got


def ca_bundle(conf: Path, path: str) -> str:
    """ca=: an absolute path to a regular file of at most CA_MAX holding PEM certificates that
    openssl reads (lego trusts the ACME server's HTTPS by it, so it must be a CA, not any file)."""
    fix = "Fix: ca= the absolute path of a PEM bundle of the CA that signs the ACME server's own certificate"
    if not path.startswith("/"):
        raise Refused(f"{conf}: ca={path} is not an absolute path. {fix}")
    try:
        data = read_bytes(Path(path), "CA bundle", CA_MAX)
    except InputError as exc:
        raise Refused(f"{conf}: ca=: {exc}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise Refused(f"{conf}: ca={path} holds no PEM certificate. {fix}")
    r = firstboot.openssl("x509", "-in", path, "-noout", "-subject")
    if r.returncode:
        raise Refused(f"{conf}: ca={path} is not a certificate openssl can read "
                      f"({r.stderr.strip()[-120:]}). {fix}")
    return path


class Port80:
    """Port 80 is closed by the firewall; the CA's check (HTTP-01) needs it, so it opens for as
    long as lego answers on it, and no longer. Rules a killed run left behind go first."""

    def __init__(self) -> None:
        self.firewall = shutil.which("nft") is not None and self._nft(
            "list", "chain", "inet", FIREWALL_TABLE, "input").returncode == 0

    @staticmethod
    def _nft(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nft", *args], capture_output=True, text=True, timeout=30,
                              check=False)

    def close(self) -> None:
        if not self.firewall:
            return
        listing = self._nft("-a", "list", "chain", "inet", FIREWALL_TABLE, "input").stdout
        for handle in re.findall(rf'comment "{RULE_COMMENT}".*# handle ([0-9]+)$', listing, re.M):
            self._nft("delete", "rule", "inet", FIREWALL_TABLE, "input", "handle", handle)

    def open(self) -> None:
        if self.firewall:
            self._nft("insert", "rule", "inet", FIREWALL_TABLE, "input", "tcp", "dport", "80",
                      "accept", "comment", f'"{RULE_COMMENT}"')


def obtain(conf: dict[str, str], state: Path) -> Path:
    """lego's certificate for the domain, new or renewed (30 days before it expires)."""
    domain = conf["domain"]
    crt = state / "certificates" / f"{domain}.crt"
    argv = ["lego", "--path", str(state), "--accept-tos", "--email", conf["email"],
            "--server", conf["directory"], "--domains", domain, "--http", "--http.port", ":80"]
    argv += ["renew", "--days", "30", "--no-random-sleep"] if rendered.nonempty(crt) else ["run"]
    env = {**os.environ, **({"LEGO_CA_CERTIFICATES": conf["ca"]} if conf["ca"] else {})}
    port80 = Port80()
    port80.close()
    try:
        port80.open()
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        r = subprocess.CompletedProcess(argv, 1, "", str(exc))
    finally:
        port80.close()
    if r.returncode:
        sys.stderr.write("\n".join((r.stdout + r.stderr).strip().splitlines()[-4:]) + "\n")
        raise Refused(f"no certificate for {domain} from {conf['directory']} (the CA's answer "
                      "above). The public port keeps its current certificate; inference-acme.timer "
                      f"tries again within the hour. Check that {domain} resolves to this machine "
                      "and that nothing in front of it blocks port 80.")
    return crt


def checked_pair(domain: str, crt: Path, key: Path) -> tuple[bytes, bytes]:
    """lego's certificate and key, read as regular files (never a FIFO or a device left in their
    place), the certificate naming `domain` among its DNS names and the key its own. Refused
    otherwise: a certificate for another name would be served as this machine's."""
    try:
        cert_pem = read_bytes(crt, "certificate", CERT_MAX)
        key_pem = read_bytes(key, "certificate's key", CERT_MAX)
    except InputError as exc:
        raise Refused(f"lego's certificate for {domain}: {exc}") from None
    names = firstboot.openssl("x509", "-in", str(crt), "-noout", "-ext", "subjectAltName").stdout
    dns = set(re.findall(r"DNS:([^,\s]+)", names))
    if domain not in {d.lower() for d in dns}:
        raise Refused(f"the certificate {crt} does not name {domain} (it names "
                      f"{printable(', '.join(sorted(dns)) or 'nothing', 200)}): not installed. "
                      "Fix: remove it, and inference-acme asks the CA again")
    pub = [firstboot.openssl(*args).stdout for args in (
        ("x509", "-in", str(crt), "-noout", "-pubkey"), ("pkey", "-in", str(key), "-pubout"))]
    if not pub[0] or pub[0] != pub[1]:
        raise Refused(f"the key beside {crt} is not its certificate's: not installed. Fix: "
                      "remove both, and inference-acme asks the CA again")
    return cert_pem, key_pem


def install(doc: dict[str, Any], conf: dict[str, str], state: Path, crt: Path) -> None:
    cert, key = firstboot.at(doc, "tls_cert"), firstboot.at(doc, "tls_key")
    domain = conf["domain"]
    cert_pem, key_pem = checked_pair(domain, crt, state / "certificates" / f"{domain}.key")
    current = read_bytes(cert, "certificate", CERT_MAX) if rendered.nonempty(cert) else b""
    if current == cert_pem:
        say(f"the certificate for {domain} is current (renewed 30 days before it expires)")
        return
    # both files in place before nginx reloads (the firstboot call below): never a key of one
    # certificate beside the other
    cert.parent.mkdir(parents=True, exist_ok=True)
    firstboot.put(Path(f"{key}.new"), key_pem.decode("ascii", errors="replace"), 0o600)
    firstboot.put(Path(f"{cert}.new"), cert_pem.decode("ascii", errors="replace"), 0o644)
    os.replace(f"{key}.new", key)
    os.replace(f"{cert}.new", cert)
    end = firstboot.openssl("x509", "-in", str(cert), "-noout", "-enddate").stdout.strip()
    say(f"new certificate for {domain} from {conf['directory']}, valid until {end.partition('=')[2]}")


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv):
        print("usage: inference-acme", file=sys.stderr)
        return 2
    try:
        doc = rendered.profile()
        conf_path = firstboot.at(doc, "acme_conf")
        if not rendered.nonempty(conf_path):
            say(f"no {conf_path}: the public port keeps this machine's own certificate")
            return 0
        if firstboot.tls_mode(doc) == "off":
            say(f"TLS is off on this machine ({firstboot.at(doc, 'tls_mode')} or the profile): no "
                "certificate to get")
            return 0
        conf = read_conf(conf_path)
        if shutil.which("lego") is None:
            raise Refused("lego (the ACME client) is not installed. Fix: apt-get install lego")
        os.umask(0o077)
        state = firstboot.at(doc, "acme_state")
        state.mkdir(parents=True, exist_ok=True)
        with boundary.locked(state / ".lock"):
            crt = obtain(conf, state)
            install(doc, conf, state, crt)
            # first boot's program writes the endpoint file (this URL, the fingerprint) and
            # reloads nginx
            firstboot.put(state / "domain", conf["domain"] + "\n")
        return firstboot.main([])
    except (Refused, rendered.RenderedError, boundary.BoundaryError) as exc:
        print(f"inference-acme: {printable(str(exc))}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"inference-acme: cannot keep the ACME state or install the certificate: "
              f"{printable(str(exc))}. Fix: the cause (a full or read-only disk, a folder or a "
              "pipe in a file's place), then systemctl start inference-acme", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
