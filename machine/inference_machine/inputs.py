"""What the machine and its CLIs read from outside, made data before anything uses it.

Files a user points the CLI at or user-data writes (profiles, fleet files, records, plans, key
files): a regular file of bounded size in UTF-8, or one clear error. A FIFO, a device (/dev/zero
through a symlink) or a huge file would otherwise hang the command or exhaust its memory.

Values from user-data, the service user or the network (an API key, a TLS mode, a domain, an
email, a port, an address or a network): parsed into a typed value (the classes below) or
refused with a `Refused` that says what is wrong and the fix in one line. The writers of
configuration (`inference_machine.writers`) take these types and nothing else."""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import stat
import unicodedata
from pathlib import Path


class InputError(Exception):
    """What is wrong with an input file, and the fix, in one line."""

    def __init__(self, what: str, path: Path, why: str, fix: str) -> None:
        self.what, self.path, self.why, self.fix = what, path, why, fix
        super().__init__(f"{what} {path}: {why}. Fix: {fix}")


def read_bytes(path: Path, what: str, max_bytes: int) -> bytes:
    """The file's bytes. InputError: missing, not a regular file, over max_bytes. The file is
    opened without blocking and checked on the descriptor it is read from, so a FIFO or a device
    put in its place (or swapped in between a check and the read) is refused, never waited on."""
    try:
        # follows symlinks: the file read is the one they point at
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(what, path, "not found", "check the path") from None
    except IsADirectoryError:
        raise InputError(what, path, "is a directory", "name a file") from None
    except OSError as exc:
        raise InputError(what, path, exc.strerror or "cannot be read", "check the path") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(what, path, "is a directory", "name a file")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(what, path, "not a regular file (a pipe or a device)", "name a file")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(what, path, exc.strerror or "cannot be read",
                         "check its permissions") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        size = f"{max_bytes // 1024} KiB" if max_bytes >= 1024 else f"{max_bytes} bytes"
        raise InputError(what, path, f"larger than {size}",
                         f"name the {what} itself, not another file")
    return data


def read_text(path: Path, what: str, max_bytes: int) -> str:
    """The file's text. InputError: missing, not a regular file, over max_bytes, not UTF-8."""
    data = read_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(what, path, f"not UTF-8 text (byte {exc.start})",
                         "save it as UTF-8") from None


def _shown(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat[0] not in "CZ" or cat == "Zs"


def printable(value: object, limit: int = 2000) -> str:
    """`value` as text a terminal or a table shows as text and nothing more: every control
    (newlines and tabs, ESC, C1), format character (bidi overrides, zero-width joiners), line or
    paragraph separator and unassigned code point written as a visible escape, and at most
    `limit` characters. The one filter for whatever is printed from files and the network (the
    login banner, `inference-startup show`/`status`/`check`, the ledger's cells)."""
    s = str(value)
    out = "".join(ch if _shown(ch) else (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else
                                         f"\\u{ord(ch):04x}") for ch in s[:limit])
    return out + ("..." if len(s) > limit else "")


MAX_DEPTH = 64
MAX_DIGITS = 100


def _too_deep(doc: object, limit: int) -> bool:
    """Whether `doc`'s arrays and objects nest past `limit`, walked without recursion and
    stopping at the first that does."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            stack += [(v, depth + 1) for v in (node.values() if isinstance(node, dict) else node)]
    return False


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON has")


def _finite_float(s: str) -> float:
    v = float(s)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{s[:40]} is too large for a number")
    return v


def _bounded_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"a number of {len(s)} digits")
    return int(s)


def parse_json(text: str, where: str = "JSON", max_depth: int = MAX_DEPTH) -> object:
    """JSON text as data, or ValueError in one line: nested past `max_depth`, NaN or Infinity
    (not JSON, though Python writes them), or a number of more than MAX_DIGITS digits."""
    try:
        doc = json.loads(text, parse_constant=_no_constant, parse_int=_bounded_int,
                         parse_float=_finite_float)
    except RecursionError:
        raise ValueError(f"{where}: nested more than {max_depth} levels deep") from None
    except ValueError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if _too_deep(doc, max_depth):
        raise ValueError(f"{where}: nested more than {max_depth} levels deep")
    return doc


def read_json(path: Path, what: str, max_bytes: int, fix: str = "name the file the tool wrote",
              max_depth: int = MAX_DEPTH) -> object:
    """The one reader of a JSON file a command is pointed at: a regular file (never a FIFO or a
    device), at most `max_bytes`, UTF-8, JSON with finite numbers of bounded size, nested at most
    `max_depth` deep. InputError naming the file, the problem and `fix` otherwise."""
    text = read_text(path, what, max_bytes)
    try:
        return parse_json(text, "it", max_depth)
    except ValueError as exc:
        raise InputError(what, path, str(exc).removeprefix("it: "), fix) from None


# ---- typed values -----------------------------------------------------------------------------

class Refused(ValueError):
    """A value that is not what its field takes: what it is and the fix, in one line (the value
    itself shown only through printable(), or not at all where it is a secret)."""


# RFC 6750 2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
TOKEN_MIN, TOKEN_MAX = 16, 512


class BearerToken(str):
    """A secret a client sends as `Authorization: Bearer <token>`: RFC 6750's b64token alphabet,
    TOKEN_MIN to TOKEN_MAX characters. Nothing of nginx's syntax (quotes, `;`, braces, `$`,
    backslashes, spaces, newlines) can be in one, so a map of it is data."""

    __slots__ = ()

    @classmethod
    def parse(cls, text: str, what: str = "API key") -> BearerToken:
        """One trailing newline (an editor's, user-data's write_files) is not part of it; any
        other character outside the alphabet refuses the whole value. The refusal never repeats
        the secret."""
        value = text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")
        if not TOKEN_MIN <= len(value) <= TOKEN_MAX:
            raise Refused(f"the {what} is {len(value)} characters long, not {TOKEN_MIN} to "
                          f"{TOKEN_MAX}. Fix: write {TOKEN_MIN}-{TOKEN_MAX} characters of A-Z a-z "
                          "0-9 - . _ ~ + / (e.g. openssl rand -hex 32), or write none and let the "
                          "machine make one")
        if not B64TOKEN.fullmatch(value):
            bad = next((ch for ch in value if not re.fullmatch(r"[A-Za-z0-9\-._~+/=]", ch)), "=")
            raise Refused(f"the {what} holds {printable(bad)!r} (or '=' before its end), which a "
                          "bearer token has not (RFC 6750). Fix: write only A-Z a-z 0-9 - . _ ~ + "
                          "/ and trailing '=' (e.g. openssl rand -hex 32), or write none and let "
                          "the machine make one")
        return cls(value)


TLS_MODES = ("self-signed", "off")
TLS_MODE_MAX = 64


class TlsMode(str):
    """The public port's TLS mode: exactly one of TLS_MODES. Spaces, tabs and line ends around
    the word are not part of it; anything else, inside it or beside it, refuses it."""

    __slots__ = ()

    @classmethod
    def parse(cls, text: str) -> TlsMode:
        word = text.strip(" \t\r\n")
        if word not in TLS_MODES:
            raise Refused(f"the TLS mode is {printable(word, 40)!r}, not one of "
                          f"{', '.join(TLS_MODES)}. Fix: write the word alone")
        return cls(word)


HOSTNAME_MAX = 253
LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class Hostname(str):
    """A DNS name by RFC 1123 (letters, digits and hyphens, labels of 1-63 characters, at most
    253 in all, a top-level label that is not all digits), lower case; an internationalised
    name as its A-labels (xn--...)."""

    __slots__ = ()

    @classmethod
    def parse(cls, text: str, what: str = "domain", labels_min: int = 2) -> Hostname:
        """`labels_min` 1 takes a machine's own host name (one label)."""
        name = text.strip(" \t\r\n").lower()
        fix = ("Fix: write a DNS name such as llm.example.com (an internationalised name as its "
               "A-labels, xn--...)")
        if not name.isascii():
            raise Refused(f"the {what} {printable(name, 80)!r} is not ASCII. {fix}")
        labels = name.split(".")
        if len(name) > HOSTNAME_MAX or len(labels) < labels_min or not all(
                LABEL.fullmatch(x) for x in labels) or labels[-1].isdigit():
            raise Refused(f"the {what} {printable(name, 80)!r} is not a DNS name. {fix}")
        return cls(name)


EMAIL_MAX = 254
# RFC 5322's dot-atom local part (no quoted strings, no comments)
ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
LOCAL = re.compile(rf"{ATEXT}(\.{ATEXT})*")


class Email(str):
    """An email address: a dot-atom local part of at most 64 characters, @, a Hostname."""

    __slots__ = ()

    @classmethod
    def parse(cls, text: str) -> Email:
        value = text.strip(" \t\r\n")
        local, at, domain = value.rpartition("@")
        fix = "Fix: write an address such as ops@example.com"
        if not at or len(value) > EMAIL_MAX or len(local) > 64 or not LOCAL.fullmatch(local):
            raise Refused(f"the email {printable(value, 80)!r} is not an email address. {fix}")
        try:
            host = Hostname.parse(domain, "email's domain")
        except Refused:
            raise Refused(f"the email {printable(value, 80)!r} is not an email address (its "
                          f"domain is no DNS name). {fix}") from None
        return cls(f"{local}@{host}")


class Port(int):
    """A TCP port, 1 to 65535, from an int or from decimal ASCII digits (never a float, a sign,
    another script's digits or a number that wraps)."""

    __slots__ = ()

    @classmethod
    def parse(cls, value: object, what: str = "port") -> Port:
        if isinstance(value, bool):
            n = None
        elif isinstance(value, int):
            n = value
        elif isinstance(value, str) and re.fullmatch(r"[0-9]{1,5}", value):
            n = int(value)
        else:
            n = None
        if n is None or not 0 < n < 65536:
            raise Refused(f"the {what} {printable(str(value), 40)!r} is not a port. Fix: a whole "
                          "number from 1 to 65535")
        return cls(n)


def finite(value: object, what: str, lo: float = 0.0, hi: float = math.inf) -> float:
    """A number from text or JSON that is finite and within [lo, hi] (a time, a count); Refused
    for nan, inf and anything that is not a number."""
    try:
        v = float(value) if isinstance(value, str | int | float) and not isinstance(value, bool) \
            else math.nan
    except (ValueError, OverflowError):
        v = math.nan
    if not math.isfinite(v) or not lo <= v <= hi:
        bound = f"from {lo:g}" + (f" to {hi:g}" if math.isfinite(hi) else "")
        raise Refused(f"the {what} {printable(str(value), 40)!r} is not a finite number {bound}. "
                      "Fix: give a number in that range")
    return v


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# the private networks a fleet may open its firewall to: RFC 1918 (a DigitalOcean VPC is one of
# these) and RFC 4193's unique local IPv6 addresses, and nothing larger than a VPC can be
# (DigitalOcean's largest is a /16): never a public network, never the whole internet
FLEET_SPACES: tuple[IPNetwork, ...] = (
    ipaddress.IPv4Network("10.0.0.0/8"), ipaddress.IPv4Network("172.16.0.0/12"),
    ipaddress.IPv4Network("192.168.0.0/16"), ipaddress.IPv6Network("fc00::/7"))
FLEET_PREFIX_MIN = {4: 16, 6: 48}


def fleet_network(value: object, what: str = "network") -> IPNetwork:
    """A network the fleet's machines share, which a firewall may open every port to: inside
    FLEET_SPACES, at most a /16 (IPv4) or /48 (IPv6); host bits set are refused (a typo)."""
    fix = "Fix: the private network the fleet's machines share, e.g. 10.110.0.0/20 (a VPC)"
    net: IPNetwork | None = None
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        net = value
    elif isinstance(value, str):
        try:
            net = ipaddress.ip_network(value, strict=True)
        except ValueError:
            try:
                whole = ipaddress.ip_network(value, strict=False)
            except ValueError:
                whole = None
            if whole is not None:
                raise Refused(f"the {what} {printable(value, 60)!r} has host bits set (its network "
                              f"is {whole}). {fix}") from None
    if net is None:
        raise Refused(f"the {what} {printable(str(value), 60)!r} is not a network. {fix}")
    if not any(net.version == s.version and net.subnet_of(s) for s in FLEET_SPACES):  # type: ignore[arg-type]
        raise Refused(f"the {what} {net} is not a private network (RFC 1918 or RFC 4193): "
                      f"opening it would open this machine to the internet. {fix}")
    if net.prefixlen < FLEET_PREFIX_MIN[net.version]:
        raise Refused(f"the {what} {net} is larger than a fleet's network (/"
                      f"{FLEET_PREFIX_MIN[net.version]} at most). {fix}")
    return net


def listen_address(value: object, what: str = "address") -> IPAddress:
    """An address a server may listen on: any of this machine's (0.0.0.0, ::), loopback or a
    unicast address; never multicast, the broadcast address, the reserved block or one with an
    IPv6 scope (whose text nginx cannot take)."""
    try:
        a = ipaddress.ip_address(value) if isinstance(value, str) else None
    except ValueError:
        a = None
    if a is None or (isinstance(a, ipaddress.IPv6Address) and a.scope_id):
        raise Refused(f"the {what} {printable(str(value), 60)!r} is not an IP address. Fix: "
                      "e.g. 0.0.0.0, :: or one of this machine's addresses")
    if a.is_multicast or (a.version == 4 and (a.is_reserved or
                                              a == ipaddress.IPv4Address("255.255.255.255"))):
        raise Refused(f"the {what} {a} is a multicast, broadcast or reserved address, which no "
                      "server listens on. Fix: e.g. 0.0.0.0, :: or one of this machine's addresses")
    return a
