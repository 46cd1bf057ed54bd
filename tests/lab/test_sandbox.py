"""The lab's stand-in for a GPU unit's SystemCallFilter: systemd's groups expand as systemd lists
them (nested, hyphenated), and a process under the filter and its children get EPERM for a call
outside the groups and run everything inside them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inference_lab import sandbox

LISTING = """@default
    # always
    exit_group
@basic-io
    read
    write
@system-service
    # a service
    @basic-io
    @default
    ioctl
@loop
    @loop
    brk
"""


def test_groups_expand_nested_and_a_wrong_group_is_one_error() -> None:
    assert sandbox.expand(["@system-service"], LISTING) == {"read", "write", "exit_group", "ioctl"}
    assert sandbox.expand(["@loop", "mmap"], LISTING) == {"brk", "mmap"}
    with pytest.raises(sandbox.SandboxError, match=r"^@nope: no such system-call group\. Fix: one of "
                       r"@basic-io, @default, @loop, @system-service$"):
        sandbox.expand(["@nope"], LISTING)
    header = "#define __NR_read 0\n#define __NR_write 1\n#define __NR_ioctl 16\n"
    got = sandbox.allowlist(["@system-service"], LISTING, header)
    assert got["syscalls"] == {"ioctl": 16, "read": 0, "write": 1}
    assert got["not_on_x86_64"] == ["exit_group"]


def test_the_program_allows_exactly_its_list() -> None:
    prog = sandbox.program([3, 1, 3])
    assert len(prog) == 8 * (4 + 2 * 2 + 1)  # arch check, load, two calls, the default


@pytest.mark.skipif(not shutil.which("systemd-analyze") or not sandbox.UNISTD.is_file(),
                    reason="needs systemd-analyze and the kernel's x86-64 headers")
def test_a_call_outside_system_service_is_denied_and_children_inherit_it(tmp_path: Path) -> None:
    allow = tmp_path / "allow.json"
    allow.write_text(json.dumps(sandbox.allowlist(["@system-service"])))
    # perf_event_open (@debug) with no attributes: EFAULT where it is allowed, EPERM where not;
    # sched_setaffinity (@resources, inside @system-service) must still work
    probe = ("import ctypes, os, subprocess, sys\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "print(libc.syscall(298, None, 0, -1, -1, 0), ctypes.get_errno())\n"
             "os.sched_setaffinity(0, os.sched_getaffinity(0))\n"
             "if sys.argv[1:] != ['child']:\n"
             "    subprocess.run([sys.executable, __file__, 'child'], check=True)\n")
    script = tmp_path / "probe.py"
    script.write_text(probe)
    run = subprocess.run([sys.executable, "-m", "inference_lab.sandbox", "exec", "--allow",
                          str(allow), "--", sys.executable, str(script)],
                         capture_output=True, text=True, check=True, timeout=60)
    assert run.stdout.splitlines() == ["-1 1", "-1 1"]  # EPERM, in the child too
    free = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          check=True, timeout=60)
    assert free.stdout.splitlines() == ["-1 14", "-1 14"]  # EFAULT: the call ran
