"""The render's data as the machine's programs read it: profile.json (what the profile decided)
and each unit's environment and arguments files, under INFERENCE_ROOT (a render directory or a
scratch root; unset on the image). Every read is bounded (inputs.read_json, read_text)."""

from __future__ import annotations

import functools
import os
import re
import stat
from pathlib import Path
from typing import Any

from .contract import ENV, PATHS
from .inputs import InputError, read_json, read_text

UNIT_FILE_MAX = 2**20
PROFILE_MAX = 16 * 2**20
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RenderedError(Exception):
    """A rendered file that is missing or not what the render writes: one line, naming it."""


def root() -> str:
    return os.environ.get(ENV.root, "")


def here(key: str) -> Path:
    """PATHS[key] on this machine (under INFERENCE_ROOT)."""
    return Path(root() + PATHS[key])


def profile() -> dict[str, Any]:
    """profile.json as the render wrote it (read once a process: a program's parts all ask)."""
    return _profile_at(here("profile_json"))


@functools.cache
def _profile_at(path: Path) -> dict[str, Any]:
    try:
        doc = read_json(path, "profile.json", PROFILE_MAX, fix="install a render (inference-image "
                        f"render) or point {ENV.root} at one")
    except InputError as exc:
        raise RenderedError(str(exc)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("profile"), dict):
        raise RenderedError(f"{path}: not a render's profile.json")
    return doc


def setting(doc: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """A profile field by its dotted name (serving.nodes), as the render resolved it."""
    node: Any = doc.get("profile", {})
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def nonempty(path: Path) -> bool:
    """A regular file with something in it (what bash's -s asked, and never a FIFO to hang on)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def env_lines(path: Path, what: str | None = None) -> list[tuple[str, str]]:
    """A unit's environment file: KEY=VALUE lines (# comments and blank lines skipped), in order."""
    try:
        text = read_text(path, what or path.name, UNIT_FILE_MAX)
    except InputError as exc:
        raise RenderedError(str(exc)) from None
    out = []
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if eq and ENV_KEY.fullmatch(key):
            out.append((key, value))
    return out


def arg_lines(path: Path) -> list[str]:
    """A unit's arguments file: one argument a line, as written (# comments, blank lines skipped)."""
    try:
        text = read_text(path, path.name, UNIT_FILE_MAX)
    except InputError as exc:
        raise RenderedError(str(exc)) from None
    return [line for line in text.split("\n") if line and not line.startswith("#")]


ENDPOINT_MAX = 2**20


def read_endpoint(doc: dict[str, Any]) -> dict[str, Any]:
    """endpoint.json (first boot's: the URL, TLS mode and certificate, the instances' ready
    reports), {} when first boot has not written it."""
    path = Path(root() + doc["paths"]["endpoint"])
    try:
        ep = read_json(path, "endpoint.json", ENDPOINT_MAX, fix="run inference-firstboot")
    except InputError:
        return {}
    return ep if isinstance(ep, dict) else {}
