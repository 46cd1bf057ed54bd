"""The air-gapped install path (scripts/install-root, scripts/make-debrepo, ansible/packages.yml):
every distribution package a role installs is named by a list the package folder is made from, so
an offline build cannot miss one; nothing a role starts, reloads or applies to the kernel runs in a
root installed through chroot. The whole path runs in `make chroot-proof` (test-more)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from conftest import ROOT

from inference_image.profiles import resolve
from inference_image.render import render

ROLES = ROOT / "roles"
# the roles whose packages come from another vendor's repository or the host, not the
# distribution's folder (an air-gapped build keeps the host's driver and leaves DCGM out)
VENDOR = {"nvidia_driver_packages", "gnupg", "observability_dcgm_packages"}


def _apt_tasks() -> list[tuple[str, object]]:
    found = []
    for f in sorted(ROLES.glob("*/tasks/*.yml")):
        for task in _tasks(yaml.safe_load(f.read_text()) or []):
            if "ansible.builtin.apt" in task and isinstance(task["ansible.builtin.apt"], dict) \
                    and "name" in task["ansible.builtin.apt"]:
                found.append((f"{f.relative_to(ROOT)}: {task.get('name')}",
                              task["ansible.builtin.apt"]["name"]))
    return found


def _tasks(items: list) -> list[dict]:
    out = []
    for t in items:
        if isinstance(t, dict):
            out.append(t)
            for key in ("block", "rescue", "always"):
                out += _tasks(t.get(key) or [])
    return out


def test_every_package_a_role_installs_is_in_a_list_the_package_folder_reads() -> None:
    listed = set(re.findall(r"\b([a-z_]+_packages)\b", (ROOT / "ansible/packages.yml").read_text()))
    for where, name in _apt_tasks():
        names = re.findall(r"\b([a-z_]+_packages)\b", name) if isinstance(name, str) else []
        assert names or (isinstance(name, str) and name in VENDOR), \
            f"{where}: installs {name!r}, not a role's *_packages list (ansible/packages.yml reads those)"
        missing = [n for n in names if n not in listed and n not in VENDOR]
        assert not missing, f"{where}: {missing} are not read by ansible/packages.yml"


def test_packages_yml_names_the_renders_packages(tmp_path: Path) -> None:
    r = tmp_path / "r"
    render(resolve("cpu"), r)
    out = tmp_path / "packages.txt"
    run = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "packages.yml",
                          "-e", f"@{r}/ansible/extra-vars.yml", "-e", f"packages_out={out}"],
                         cwd=ROOT / "ansible", capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-2000:]
    got = out.read_text().split()
    assert got == sorted(set(got))
    for pkg in ("nginx", "nftables", "prometheus-node-exporter", "mtail", "python3-venv",
                "unattended-upgrades", "python3-apt", "cloud-init"):
        assert pkg in got


def test_nothing_is_started_reloaded_or_applied_to_the_kernel_in_a_chroot() -> None:
    """A task or handler that starts, restarts or reloads a service, or applies sysctl, says what
    it does in a root installed through chroot (host_facts_in_chroot): omits the state there, or
    does not run."""
    for f in sorted([*ROLES.glob("*/tasks/*.yml"), *ROLES.glob("*/handlers/*.yml")]):
        for task in _tasks(yaml.safe_load(f.read_text()) or []):
            svc = task.get("ansible.builtin.systemd_service") or {}
            state = str(svc.get("state", "")) if isinstance(svc, dict) else ""
            cmd = str(task.get("ansible.builtin.command", ""))
            if not (re.search(r"started|restarted|reloaded", state) or cmd.startswith("sysctl")):
                continue
            # (inference_service_start: install-root sets it false, as a build that serves later)
            guard = f"{state} {task.get('when', '')}"
            assert any(g in guard for g in ("host_facts_in_chroot", "base_in_container",
                                            "inference_service_start")), \
                f"{f.relative_to(ROOT)}: {task.get('name')} runs in a chroot"
