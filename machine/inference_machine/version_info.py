"""What a snapshot of this machine holds, as the image's image.json: kernel, driver, CUDA, vLLM,
torch, vllm-router, the models and where each came from, the profile's hash, when it was sealed.
sysprep writes it (`inference-startup version-info`); read, never imported, from vLLM's
environment (its packages' metadata, torch's version file), so it costs no import of torch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .bundle import BundleError, _dist_version, python_world
from .inputs import InputError, read_text
from .rendered import RenderedError, _profile_at

SMALL = 64 * 2**10


def _first_line(path: Path) -> str:
    try:
        return read_text(path, path.name, SMALL).strip()
    except InputError:
        return ""


def _command(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def nvidia_driver() -> str | None:
    """The loaded module's version, else the installed module's, else the package's; None
    without an NVIDIA driver."""
    return (_first_line(Path("/sys/module/nvidia/version"))
            or _command(["modinfo", "-F", "version", "nvidia"])
            or _command(["dpkg-query", "-W", "-f", "${Version}", "nvidia-smi"])) or None


def os_name(os_release: Path = Path("/etc/os-release")) -> str:
    try:
        text = read_text(os_release, "os-release", SMALL)
    except InputError:
        return "unknown"
    m = re.search(r'^PRETTY_NAME=("?)(.*)\1$', text, re.MULTILINE)
    return m.group(2) if m else "unknown"


def cuda_of(torch_site: Path | None) -> str | None:
    """torch.version.cuda, read from torch/version.py (None for a CPU build of torch)."""
    if torch_site is None:
        return None
    try:
        text = read_text(torch_site / "torch" / "version.py", "torch/version.py", SMALL)
    except InputError:
        return None
    m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return m.group(1) if m else None


def router_version(venv: Path) -> str:
    sites = sorted(venv.glob("lib/python3*/site-packages"))
    return _dist_version(sites[0] if sites else None, "vllm-router")


def model_source(path: Path) -> str:
    """Where a model folder came from: the hub revision the build wrote, a weightless stand-in
    (the tests' models: config and tokenizer), or local."""
    if (path / ".inference-image-revision").exists():
        return _first_line(path / ".inference-image-revision")
    if (path / ".make-test-model").exists():
        return "weightless stand-in"
    return "local"


def version_info(profile_json: Path) -> dict[str, Any]:
    doc = _profile_at(profile_json)
    paths, versions = doc.get("paths", {}), doc["profile"].get("versions", {})
    package = versions.get("vllm_package", "vllm")
    try:
        world = python_world(str(Path(paths["vllm_venv"]) / "bin" / "python"))
    except BundleError:
        world = {}

    def site(module: str) -> Path | None:
        return Path(world[module]) if isinstance(world.get(module), str) else None

    def found(version: str) -> str | None:
        return None if version == "none" else version

    return {
        "tier": doc.get("tier"),
        "profile_sha256": doc.get("profile_sha256"),
        "os": os_name(),
        "kernel": os.uname().release,
        "nvidia_driver": nvidia_driver(),
        "cuda": cuda_of(site("torch")),
        "vllm_package": package,
        "vllm": found(_dist_version(site("vllm"), package)),
        "torch": found(_dist_version(site("torch"), "torch")),
        "vllm_router": found(router_version(Path(paths["router_venv"]))),
        "models": [dict(m, source=model_source(Path(m["path"]))) for m in doc.get("models", [])],
        "sysprepped_at": int(time.time()),
    }


def write(profile_json: Path, dest: Path | None) -> str:
    """The JSON, printed (dest None) or written to dest atomically, mode 0644."""
    try:
        text = json.dumps(version_info(profile_json), indent=1) + "\n"
    except (KeyError, TypeError, AttributeError) as exc:
        raise RenderedError(f"{profile_json}: not a render's profile.json ({exc!r} missing)") from None
    if dest is None:
        return text
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
    return ""
