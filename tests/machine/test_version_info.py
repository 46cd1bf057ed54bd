"""`inference-startup version-info` (sysprep's image.json): what a snapshot holds, read from the
render's profile.json and vLLM's environment as it lies on disk (a stand-in site with vLLM's and
torch's metadata, asked through the environment's own Python as the image's /opt/vllm is)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference_machine import version_info


def machine(tmp: Path, cuda: str | None = "12.8") -> Path:
    """A render's profile.json whose vLLM environment is a Python wrapper over a site holding
    vLLM 0.26.0, torch 2.9.0 (its version file), and a vllm-router venv."""
    site = tmp / "vllm-site"
    for pkg, version in (("vllm", "0.26.0"), ("torch", "2.9.0")):
        (site / pkg).mkdir(parents=True)
        (site / pkg / "__init__.py").write_text("")
        (site / f"{pkg}-{version}.dist-info").mkdir()
    (site / "torch" / "version.py").write_text(
        f"__version__ = '2.9.0'\ncuda: Optional[str] = {cuda!r}\n")
    venv = tmp / "opt/vllm"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin/python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    router_site = tmp / "opt/vllm-router/lib/python3.12/site-packages"
    (router_site / "vllm_router-0.1.17.dist-info").mkdir(parents=True)
    model = tmp / "models/target"
    model.mkdir(parents=True)
    (model / ".inference-image-revision").write_text("RedHatAI/x@abc123\n")
    stand_in = tmp / "models/draft"
    stand_in.mkdir(parents=True)
    (stand_in / ".make-test-model").write_text("")
    profile = {"tier": "h100", "profile_sha256": "f" * 64,
               "profile": {"versions": {"vllm_package": "vllm"}},
               "paths": {"vllm_venv": str(venv), "router_venv": str(tmp / "opt/vllm-router")},
               "models": [{"name": "target", "path": str(model)},
                          {"name": "draft", "path": str(stand_in)}]}
    pj = tmp / "profile.json"
    pj.write_text(json.dumps(profile))
    return pj


def test_it_names_what_the_environment_holds_and_where_each_model_came_from(tmp_path: Path) -> None:
    info = version_info.version_info(machine(tmp_path))
    assert (info["tier"], info["vllm"], info["torch"], info["cuda"], info["vllm_router"]) == \
        ("h100", "0.26.0", "2.9.0", "12.8", "0.1.17")
    assert [(m["name"], m["source"]) for m in info["models"]] == \
        [("target", "RedHatAI/x@abc123"), ("draft", "weightless stand-in")]
    assert info["kernel"] == os.uname().release and info["os"] != "unknown"


def test_a_cpu_build_of_torch_has_no_cuda(tmp_path: Path) -> None:
    assert version_info.version_info(machine(tmp_path, cuda=None))["cuda"] is None


def test_the_command_writes_the_file_whole_and_readable_by_all(tmp_path: Path) -> None:
    pj, dest = machine(tmp_path), tmp_path / "image.json"
    r = subprocess.run([sys.executable, "-m", "inference_machine", "version-info", str(pj), str(dest)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert json.loads(dest.read_text())["vllm"] == "0.26.0"
    assert dest.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.glob("image.json*")] == ["image.json"]


@pytest.mark.parametrize("text", ["[]", '{"tier": "h100"}'])
def test_a_file_that_is_not_a_render_s_profile_gets_one_line(tmp_path: Path, text: str) -> None:
    pj = tmp_path / "profile.json"
    pj.write_text(text)
    r = subprocess.run([sys.executable, "-m", "inference_machine", "version-info", str(pj)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "profile.json" in r.stderr, r.stderr
