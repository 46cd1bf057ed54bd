"""The inference_service role's install of the rendered files: one archive packed on the
controller, compared with what the machine holds and extracted only where something differs.
The role's own tasks run by Ansible on this machine, into a scratch root instead of /."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "inference_service"
LISTED = "List the rendered files"
FIRST, LAST = "Make a scratch directory on the controller", "Install the rendered files"


def packer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pack_render", ROLE / "files" / "pack_render.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def a_render(at: Path) -> Path:
    (at / "etc" / "inference-image").mkdir(parents=True)
    (at / "etc" / "update-motd.d").mkdir(parents=True)
    (at / "etc" / "inference-image" / "b.env").write_text("B=1\n")
    (at / "etc" / "inference-image" / "a.env").write_text("A=1\n")
    run = at / "etc" / "update-motd.d" / "90-inference-image"
    run.write_text("#!/bin/sh\n")
    run.chmod(0o755)
    (at / "packer").mkdir()
    (at / "packer" / "tier.pkrvars.hcl").write_text("tier = \"cpu\"\n")
    return at


def test_the_archive_holds_the_listed_files_sorted_as_root_and_is_the_same_bytes_for_the_same_files(
        tmp_path: Path) -> None:
    render = a_render(tmp_path / "render")
    pack = packer()
    # as the role's find lists them, in no particular order
    listed = [render / "etc" / "update-motd.d" / "90-inference-image",
              render / "etc" / "inference-image" / "b.env", render / "etc" / "inference-image" / "a.env"]
    pack.pack(render, tmp_path / "one.tar", listed)
    os.utime(render / "etc" / "inference-image" / "a.env", (time.time() + 60, time.time() + 60))
    pack.pack(render, tmp_path / "two.tar", listed[::-1])
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    with tarfile.open(tmp_path / "one.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["etc/inference-image/a.env", "etc/inference-image/b.env",
                                         "etc/update-motd.d/90-inference-image"]
    assert {(m.uid, m.gid, m.uname, m.mtime) for m in members} == {(0, 0, "root", 0)}
    assert members[2].mode == 0o755
    (render / "etc" / "inference-image" / "a.env").write_text("A=2\n")
    pack.pack(render, tmp_path / "three.tar", listed)
    assert (tmp_path / "three.tar").read_bytes() != (tmp_path / "one.tar").read_bytes()


def role_tasks() -> list[dict[str, Any]]:
    """The role's tasks in the order they run: main.yml with the files it imports in place."""
    out: list[dict[str, Any]] = []
    for task in yaml.safe_load((ROLE / "tasks" / "main.yml").read_text()):
        part = task.get("ansible.builtin.import_tasks")
        out += yaml.safe_load((ROLE / "tasks" / part).read_text()) if part else [task]
    return out


def the_install_tasks(root: Path) -> list[dict[str, Any]]:
    """The role's find of the rendered files and its tasks from packing to installing, with
    tar's --directory pointed at `root` (its directory task would make them under /)."""
    tasks = role_tasks()
    names = [t["name"] for t in tasks]
    picked = [tasks[names.index(LISTED)], *tasks[names.index(FIRST):names.index(LAST) + 1]]
    for task in picked:
        for args in task.values():
            if isinstance(args, dict) and "argv" in args and args["argv"][0] == "tar":
                args["argv"] = [str(root) if a == "/" else a for a in args["argv"]]
            if isinstance(args, dict):
                # the test runs as whoever runs it; root's ownership is the archive's, not checked here
                args.pop("owner", None)
                args.pop("group", None)
        task.pop("notify", None)
    return picked


def install(tmp_path: Path, render: Path, root: Path) -> dict[str, Any]:
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"role_path": str(ROLE), "inference_render_dir": str(render),
                      "inference_paths": {"build_stage": str(tmp_path / "stage")}},
             "tasks": the_install_tasks(root)}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "0",
           "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0", "ANSIBLE_STDOUT_CALLBACK": "json"}
    playbook = Path(sys.executable).parent / "ansible-playbook"
    proc = subprocess.run([str(playbook), "-i", "localhost,", "-e",
                           f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tasks = json.loads(proc.stdout[proc.stdout.index("{"):])["plays"][0]["tasks"]
    return {t["task"]["name"]: t["hosts"]["localhost"] for t in tasks}


@pytest.mark.slow
def test_the_role_installs_the_render_then_changes_nothing_then_puts_back_what_drifted(
        tmp_path: Path) -> None:
    render, root = a_render(tmp_path / "render"), tmp_path / "root"
    (root / "etc" / "inference-image").mkdir(parents=True)
    (root / "etc" / "update-motd.d").mkdir(parents=True)
    run = root / "etc" / "update-motd.d" / "90-inference-image"

    first = install(tmp_path, render, root)
    assert first[LAST]["changed"] is True
    assert (root / "etc" / "inference-image" / "a.env").read_text() == "A=1\n"
    assert run.stat().st_mode & 0o777 == 0o755
    assert not (root / "packer").exists()

    again = install(tmp_path, render, root)
    assert again[LAST].get("skipped") is True
    assert not any(r.get("changed") for r in again.values())

    # a file changed on the machine, and one whose mode did: both are put back
    (root / "etc" / "inference-image" / "b.env").write_text("B=edited\n")
    run.chmod(0o700)
    drifted = install(tmp_path, render, root)
    assert drifted[LAST]["changed"] is True
    assert (root / "etc" / "inference-image" / "b.env").read_text() == "B=1\n"
    assert run.stat().st_mode & 0o777 == 0o755

    # a new render reaches the machine
    (render / "etc" / "inference-image" / "a.env").write_text("A=2\n")
    assert install(tmp_path, render, root)[LAST]["changed"] is True
    assert (root / "etc" / "inference-image" / "a.env").read_text() == "A=2\n"
