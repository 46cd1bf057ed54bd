"""Reading what a user points the CLI at (profiles, fleet files, records, plans, key files): a
regular file of bounded size in UTF-8, or one clear error. A FIFO, a device (/dev/zero through a
symlink) or a huge file would otherwise hang the command or exhaust its memory."""

from __future__ import annotations

import json
import os
import stat
import unicodedata
from pathlib import Path


class InputError(Exception):
    """What is wrong with an input file, and the fix, in one line."""

    def __init__(self, what: str, path: Path, why: str, fix: str) -> None:
        self.what, self.path, self.why, self.fix = what, path, why, fix
        super().__init__(f"{what} {path}: {why}. Fix: {fix}")


def read_text(path: Path, what: str, max_bytes: int) -> str:
    """The file's text. InputError: missing, not a regular file, over max_bytes, not UTF-8."""
    try:
        st = os.stat(path)  # follows symlinks: the file read is the one they point at
    except FileNotFoundError:
        raise InputError(what, path, "not found", "check the path") from None
    except OSError as exc:
        raise InputError(what, path, exc.strerror or "cannot be read", "check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(what, path, "is a directory", "name a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(what, path, "not a regular file (a pipe or a device)", "name a file")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(what, path, exc.strerror or "cannot be read",
                         "check its permissions") from None
    if len(data) > max_bytes:
        raise InputError(what, path, f"larger than {max_bytes // 1024} KiB",
                         f"name the {what} itself, not another file")
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
