"""serving.checkpoint's units under real systemd (the Debian 12 systemd container molecule runs;
`make checkpoint-units`, which names it in INFERENCE_SYSTEMD_IMAGE): a start of vllm@ starts its
root helper unit from its ExecStartPre, the helper finds the start's main process, says its word
to the sandboxed, unprivileged instance, which starts behind its gate; the unit becomes active
only once the gate is open; a restart runs the helper again, which removes a stale checkpoint and
says so; stopping the instance leaves no helper behind. No GPU: vLLM is a stand-in behind the
plugin's real gate, so the take fails, saying why, and the instance serves without one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pip
import pytest
from conftest import ROOT
from test_unit_checkpoint import CHECKPOINTS, STANDIN, _resolved

from inference_image.render import PATHS, RUNTIME_PROGRAM_PATHS, SERVICE_USER, render
from inference_machine import unit_checkpoint

IMAGE = os.environ.get("INFERENCE_SYSTEMD_IMAGE", "")
pytestmark = pytest.mark.skipif(not IMAGE or not shutil.which("podman"),
                                reason="needs the molecule image (make checkpoint-units)")
NAME = "inference-image-checkpoint-units"


def sh(*cmd: str, check: bool = True, timeout: float = 120) -> str:
    proc = subprocess.run(["podman", "exec", NAME, *cmd], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode:
        raise AssertionError(f"{cmd}: exit {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc.stdout


def _runtime_wheel(tmp_path: Path) -> Path:
    """The machine's runtime as the project_wheel role builds it: a wheel of a copy of machine/."""
    src = tmp_path / "machine"
    shutil.copytree(ROOT / "machine", src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check",
                    "-w", str(tmp_path / "wheel"), str(src)], check=True, timeout=120)
    return next((tmp_path / "wheel").glob("inference_machine-*.whl"))


def _install_runtime(wheel: Path) -> None:
    """The wheel into a virtualenv of the container's python3, its programs linked where the units
    name them, as the inference_service role does; the container has no python3-venv (the base
    role installs it), so the venv has no pip and this host's pip runs from a copy."""
    venv = PATHS["runtime_venv"]
    subprocess.run(["podman", "cp", str(Path(pip.__file__).parent), f"{NAME}:/tmp/pip-src"],
                   check=True)
    subprocess.run(["podman", "cp", str(wheel), f"{NAME}:/tmp/{wheel.name}"], check=True)
    sh("install", "-d", "/tmp/pip-path")
    sh("mv", "/tmp/pip-src", "/tmp/pip-path/pip")
    sh("python3", "-m", "venv", "--without-pip", venv)
    sh("env", "PYTHONPATH=/tmp/pip-path", f"{venv}/bin/python", "-m", "pip", "install", "-q",
       "--no-deps", "--no-index", "--disable-pip-version-check", f"/tmp/{wheel.name}")
    for program in RUNTIME_PROGRAM_PATHS:
        sh("ln", "-sfn", f"{venv}/bin/{Path(program).name}", program)


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Path]:
    """The container, booted, with the h100 render (serving.checkpoint on) and the machine's
    runtime installed as the roles install them, vLLM's Python a stand-in behind the plugin's
    gate."""
    rdir = tmp_path / "render"
    render(_resolved(**CHECKPOINTS), rdir)
    wheel = _runtime_wheel(tmp_path)
    venv_python = Path(PATHS["vllm_venv"].lstrip("/")) / "bin" / "python"
    stage = tmp_path / "stage"
    (stage / venv_python.parent).mkdir(parents=True)
    (stage / venv_python).write_text(
        '#!/bin/bash\nif [[ $1 == -m && $2 == vllm.* ]]; then shift 2; exec /usr/bin/python3 '
        '/opt/standin/standin.py /opt/standin "$@"; fi\nexec /usr/bin/python3 "$@"\n')
    (stage / venv_python).chmod(0o755)
    (stage / "opt/standin").mkdir(parents=True)
    (stage / "opt/standin/standin.py").write_text(STANDIN)
    shutil.copytree(ROOT / "plugins/vllm/inference_image_vllm",
                    stage / "opt/standin/inference_image_vllm")
    (stage / PATHS["criu"].lstrip("/")).parent.mkdir(parents=True)
    shutil.copy("/bin/true", stage / PATHS["criu"].lstrip("/"))  # there is no GPU to take one on
    archive = tmp_path / "files.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(rdir / "etc", arcname="etc")
        for top in ("opt", "usr"):
            tar.add(stage / top, arcname=top)
    subprocess.run(["podman", "rm", "-f", NAME], capture_output=True, check=False)
    subprocess.run(["podman", "run", "-d", "--name", NAME, "--systemd=always", IMAGE,
                    "/sbin/init"], check=True, capture_output=True, timeout=120)
    try:
        deadline = time.monotonic() + 60
        while sh("systemctl", "is-system-running", check=False).strip() not in (
                "running", "degraded") and time.monotonic() < deadline:
            time.sleep(0.5)
        subprocess.run(["podman", "cp", str(archive), f"{NAME}:/tmp/files.tar"], check=True)
        sh("tar", "-xf", "/tmp/files.tar", "-C", "/", "--no-same-owner")
        _install_runtime(wheel)
        sh("useradd", "--system", "--home-dir", "/var/lib/inference-image/models",
           "--shell", "/usr/sbin/nologin", SERVICE_USER)
        sh("install", "-d", "-o", SERVICE_USER, "-g", SERVICE_USER, PATHS["cache"],
           f"{PATHS['cache']}/tmp")
        sh("install", "-d", "/var/lib/inference-image/models")
        sh("systemd-tmpfiles", "--create", "/etc/tmpfiles.d/inference-checkpoint.conf")
        sh("systemctl", "daemon-reload")
        yield rdir
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", NAME], capture_output=True, check=False)


def journal(unit: str) -> str:
    return sh("journalctl", "--no-pager", "-o", "cat", "-u", unit, check=False)


def test_a_start_asks_its_root_helper_and_serves_behind_its_gate_until_it_opens(
        machine: Path) -> None:
    store = PATHS["checkpoints"]
    assert sh("stat", "-c", "%a %U", store).split() == ["700", "root"]
    sh("systemctl", "start", "vllm@vllm-0.service", timeout=180)  # returns once READY: gate open
    helper = journal("inference-checkpoint@vllm-0.service")
    assert f"starts without its checkpoint: no checkpoint at {store}/vllm-0" in helper, helper
    # the take comes at the first idle moment after the gate opened, not before it
    assert "taking one failed" not in helper, helper
    deadline = time.monotonic() + unit_checkpoint.IDLE_S + 30
    while "taking one failed" not in helper and time.monotonic() < deadline:
        time.sleep(1)
        helper = journal("inference-checkpoint@vllm-0.service")
    assert "serves without a checkpoint: taking one failed: no CUDA driver" in helper, helper
    main = sh("systemctl", "show", "-p", "MainPID", "--value", "vllm@vllm-0.service").strip()
    word = f"{PATHS['checkpoint_run']}/vllm-0.word"
    assert sh("stat", "-c", "%a %U", word).split() == ["400", SERVICE_USER]
    assert sh("cat", word).split()[:2] == [main, "cold"]
    # the instance ran as its user, in its sandbox, and no request but the helper's was answered
    # before the gate opened
    log = [json.loads(x) for x in sh("sh", "-c", f"cat {PATHS['cache']}/standin.jsonl"
                                     ).splitlines()]
    assert any(token and status == 200 and not opened for _, status, token, opened in log)
    assert all(status == 503 for _, status, token, opened in log if not token and not opened)

    # a restart runs the helper again: a stale checkpoint is said, and removed
    sh("mkdir", "-p", f"{store}/vllm-0/images")
    sh("sh", "-c", f"echo '{{\"schema\": 1, \"key\": {{\"driver\": \"1.0\"}}, \"files\": "
       f"{{\"a\": 1}}, \"reference\": \"x\", \"pid\": 4242}}' > {store}/vllm-0/checkpoint.json")
    sh("systemctl", "restart", "vllm@vllm-0.service", timeout=180)
    helper = journal("inference-checkpoint@vllm-0.service")
    assert "starts without its checkpoint: stale: " in helper and "; removed" in helper, helper
    assert sh("sh", "-c", f"ls {store}").strip() == ""
    with contextlib.suppress(AssertionError):
        sh("systemctl", "stop", "vllm@vllm-0.service", timeout=60)
    assert sh("systemctl", "is-active", "inference-checkpoint@vllm-0.service",
              check=False).strip() in ("inactive", "failed")
