"""The one writer of each kind of configuration text the machine and the build host make from
values that came from outside (user-data, the service user, the network, a record): nginx's maps
and listen file, nftables elements, a certificate's names, a host:port for a URL or a
Prometheus target, and Markdown for the evidence ledger.

Each takes the typed values of `inputs` (a plain string is parsed first, so a value that is not
what its field takes is refused with `inputs.Refused`, never pasted) and escapes what the syntax
it lands in would read as structure. tests/build/test_writers.py feeds each the characters of its
syntax."""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Sequence

from .inputs import BearerToken, Hostname, IPAddress, IPNetwork, Port, Refused, listen_address, printable

# a path nginx reads a file from: written as a bare word, so no space, quote, `;`, `{`, `}`, `$`
NGINX_PATH = re.compile(r"/[A-Za-z0-9._/-]+")


def _token(value: BearerToken | str, what: str) -> BearerToken:
    return value if isinstance(value, BearerToken) else BearerToken.parse(value, what)


def nginx_bearer_map(token: BearerToken | str, what: str = "API key") -> str:
    """One entry of an nginx `map $http_authorization`: the whole header a holder of `token`
    sends, as a quoted string (never a regular expression: it starts with `Bearer`)."""
    t = _token(token, what)
    return f'"Bearer {t}" 1;\n'


def _nginx_path(path: str) -> str:
    if not NGINX_PATH.fullmatch(path) or "/../" in f"{path}/":
        raise Refused(f"the file {printable(path, 80)!r} cannot be named in nginx's "
                      "configuration. Fix: an absolute path of letters, digits, '.', '_', '-'")
    return path


def parse_listen(text: str) -> tuple[IPAddress, Port]:
    """ADDRESS:PORT or [IPV6]:PORT, as the render writes router.listen."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise Refused(f"the listen address {printable(text, 60)!r} has no port. Fix: "
                      "ADDRESS:PORT, e.g. 0.0.0.0:8000 or [::]:8000")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return listen_address(host, "listen address"), Port.parse(port, "listen port")


def host_port(address: IPAddress | Hostname, port: Port | int) -> str:
    """ADDRESS:PORT for a URL, nginx's listen or a Prometheus target: an IPv6 address in
    brackets."""
    p = Port.parse(port)
    if isinstance(address, ipaddress.IPv6Address):
        return f"[{address}]:{p}"
    if isinstance(address, ipaddress.IPv4Address | Hostname):
        return f"{address}:{p}"
    raise Refused(f"{printable(str(address), 60)!r} is not a typed address. Fix: parse it first")


def nginx_listen(address: IPAddress, port: Port | int, backlog: int,
                 tls: tuple[str, str] | None) -> str:
    """nginx's listen file for the public port: plain HTTP, or TLS with the certificate and key
    at `tls` (paths)."""
    addr = listen_address(str(address), "listen address")
    if not isinstance(backlog, int) or isinstance(backlog, bool) or not 0 < backlog < 2**31:
        raise Refused(f"the backlog {printable(str(backlog), 20)!r} is not a positive integer")
    where = host_port(addr, port)
    if tls is None:
        return f"listen {where} backlog={backlog};\n"
    cert, key = (_nginx_path(p) for p in tls)
    # TLS session cache kept small: its shared memory is counted in nginx's resident size as it
    # fills, and a larger one kept nginx growing through a soak (docs/benchmarks.md#2026-11-23-soak-cpu).
    return (f"listen {where} ssl backlog={backlog};\n"
            f"ssl_certificate {cert};\n"
            f"ssl_certificate_key {key};\n"
            "ssl_protocols TLSv1.2 TLSv1.3;\n"
            "ssl_session_cache shared:inference_tls:1m;\n"
            "ssl_session_timeout 1h;\n")


def nft_element(value: IPAddress | IPNetwork) -> str:
    """An element of an nftables set (`{ ELEMENT }`): an address or a network, as ipaddress
    writes it, and nothing else."""
    if not isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address |
                      ipaddress.IPv4Network | ipaddress.IPv6Network):
        raise Refused(f"{printable(str(value), 60)!r} is not a typed address or network. Fix: "
                      "parse it first")
    if isinstance(value, ipaddress.IPv6Address) and value.scope_id:
        raise Refused(f"{value}: an address with a scope cannot be a set's element")
    return str(value)


def subject_alt_names(dns: Sequence[Hostname], ips: Sequence[IPAddress]) -> str:
    """openssl's subjectAltName value for `-addext`: DNS:... and IP:..., comma-separated (a
    name holding a comma would add a name of its own: only typed values are taken)."""
    parts = []
    for d in dns:
        if not isinstance(d, Hostname):
            raise Refused(f"{printable(str(d), 60)!r} is not a typed host name")
        parts.append(f"DNS:{d}")
    for a in ips:
        if not isinstance(a, ipaddress.IPv4Address | ipaddress.IPv6Address) or (
                isinstance(a, ipaddress.IPv6Address) and a.scope_id):
            raise Refused(f"{printable(str(a), 60)!r} is not a typed address")
        parts.append(f"IP:{a}")
    return ",".join(parts)


# ---- Markdown (the evidence ledger) -----------------------------------------------------------

# what CommonMark and GitHub read as structure inside a line: emphasis, links and images (their
# brackets: a parenthesis or `!` alone makes none), raw HTML and entities, table cells, a
# heading's closing #s, strikethrough; each is backslash-escaped (any ASCII punctuation may be),
# so `&` and `<` never start an entity or a tag
MD_SPECIAL = re.compile(r"([\\*_\[\]<>|#~&])")
# an inline code span: Markdown shows what is inside as it is (no link, tag or emphasis), so a
# record's `command` stays code; only a cell's `|` is escaped there (GFM splits cells first)
CODE_SPAN = re.compile(r"(`+)([^`]+?)\1(?!`)")


def markdown_text(value: object, limit: int = 2000) -> str:
    """Text from a record as Markdown that shows exactly that text, on one line: control,
    format and separator characters made visible escapes (inputs.printable), every character
    Markdown or HTML reads as structure backslash-escaped, code spans kept as code."""
    text, out, at = printable(value, limit), [], 0
    for m in CODE_SPAN.finditer(text):
        out.append(MD_SPECIAL.sub(r"\\\1", text[at:m.start()]).replace("`", "\\`"))
        out.append(m.group(0).replace("|", "\\|"))
        at = m.end()
    out.append(MD_SPECIAL.sub(r"\\\1", text[at:]).replace("`", "\\`"))
    return "".join(out)


def markdown_link(text: object, target: str) -> str:
    """[text](target): the text escaped as markdown_text, the target percent-encoded but for its
    slashes (a space, a parenthesis, a quote or a colon in a file name cannot end the link, add a
    title or make it a URL of another scheme)."""
    return f"[{markdown_text(text)}]({urllib.parse.quote(target, safe='/')})"
