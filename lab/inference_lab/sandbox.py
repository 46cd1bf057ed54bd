"""What a GPU tier's vLLM unit could be denied, measured where there is a GPU but no systemd.

systemd is not on the GPU machine, so `SystemCallFilter=` and `DeviceAllow=` cannot be tried
there as units. This module does the parts that decide them: `allowlist` (here, where systemd
is) expands systemd's system-call groups into the x86-64 numbers of this host's kernel headers;
`exec` (there) installs a seccomp filter of that list, answering EPERM to every other call as
`SystemCallErrorNumber=EPERM` does, and execs the server, whose children inherit it; `devices`
(there) lists the device nodes the server's processes hold open or mapped while it serves."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
AUDIT_ARCH_X86_64 = 0xC000003E
# linux/filter.h and linux/seccomp.h
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, EPERM = 0x7FFF0000, 0x00050000, 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


class SandboxError(Exception):
    """A group, list or command this module cannot use, with the fix."""


def expand(groups: list[str], listing: str | None = None) -> set[str]:
    """The system calls of systemd's `groups` (@name or a call's name), nested groups expanded,
    as `systemd-analyze syscall-filter` lists them."""
    if listing is None:
        try:
            listing = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True,
                                     text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            raise SandboxError(f"systemd-analyze syscall-filter failed ({exc}). Fix: run "
                               "`allowlist` where systemd is installed") from None
    members: dict[str, list[str]] = {}
    group = ""
    for line in listing.splitlines():
        if line.startswith("@"):
            group = line.split()[0]
            members[group] = []
        elif group and (m := re.match(r"\s+([@a-z0-9_-]+)\s*$", line)):
            members[group].append(m[1])
    out: set[str] = set()

    def add(name: str, seen: frozenset[str]) -> None:
        if not name.startswith("@"):
            out.add(name)
        elif name not in members:
            raise SandboxError(f"{name}: no such system-call group. Fix: one of "
                               + ", ".join(sorted(members)))
        elif name not in seen:
            for m in members[name]:
                add(m, seen | {name})
    for g in groups:
        add(g, frozenset())
    return out


def numbers(header: str) -> dict[str, int]:
    """`__NR_name` to its number, from the kernel's asm/unistd_64.h."""
    return {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)", header)}


def allowlist(groups: list[str], listing: str | None = None,
              header: str | None = None) -> dict[str, object]:
    names = expand(groups, listing)
    table = numbers(header if header is not None else UNISTD.read_text())
    return {"groups": groups, "syscalls": {n: table[n] for n in sorted(names) if n in table},
            "not_on_x86_64": sorted(n for n in names if n not in table)}


def program(nrs: list[int]) -> bytes:
    """A classic-BPF seccomp program: a call of another architecture or not in `nrs` gets EPERM."""
    def ins(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)
    deny = SECCOMP_RET_ERRNO | EPERM
    out = [ins(BPF_LD_W_ABS, 0, 0, 4), ins(BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
           ins(BPF_RET_K, 0, 0, deny), ins(BPF_LD_W_ABS, 0, 0, 0)]
    for nr in sorted(set(nrs)):  # two instructions a call: jumps stay within BPF's 8-bit offsets
        out += [ins(BPF_JEQ_K, 0, 1, nr), ins(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]
    out.append(ins(BPF_RET_K, 0, 0, deny))
    if len(out) > 4096:
        raise SandboxError(f"{len(out)} instructions: more than BPF's 4096")
    return b"".join(out)


def install(nrs: list[int]) -> None:
    prog = program(nrs)
    buf = ctypes.create_string_buffer(prog)

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(
            PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise SandboxError(f"prctl: {os.strerror(ctypes.get_errno())}")


def held_devices(match: str) -> dict[str, list[str]]:
    """Device nodes held open (fd) or mapped by processes whose command line contains `match`."""
    out: dict[str, set[str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if match not in cmd or "inference_lab.sandbox" in cmd:
                continue
            nodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            # a mapping's path is its sixth field; anonymous ones have none
            nodes |= {f[5] for f in map(str.split, Path(f"/proc/{pid}/maps").read_text().splitlines())
                      if len(f) > 5}
        except OSError:
            continue
        for n in nodes:
            if n.startswith("/dev/") and not n.startswith(("/dev/shm/", "/dev/pts/")):
                out.setdefault(n, set()).add(pid)
    return {n: sorted(p) for n, p in sorted(out.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m inference_lab.sandbox", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("allowlist", help="systemd groups to x86-64 numbers (where systemd is)")
    a.add_argument("groups", nargs="+", metavar="@GROUP")
    e = sub.add_parser("exec", help="run a command under the seccomp filter of an allowlist")
    e.add_argument("--allow", required=True, type=Path)
    e.add_argument("command", nargs=argparse.REMAINDER)
    d = sub.add_parser("devices", help="device nodes held by matching processes, polled")
    d.add_argument("--match", default="vllm")
    d.add_argument("--seconds", type=float, default=60.0)
    d.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "allowlist":
            print(json.dumps(allowlist(args.groups), indent=1))
        elif args.cmd == "exec":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                raise SandboxError("no command. Fix: exec --allow FILE -- COMMAND ...")
            install(list(json.loads(args.allow.read_text())["syscalls"].values()))
            os.execvp(command[0], command)
        else:
            seen: dict[str, list[str]] = {}
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                for node, pids in held_devices(args.match).items():
                    seen[node] = sorted(set(seen.get(node, [])) | set(pids))
                args.out.write_text(json.dumps(seen, indent=1) + "\n")
                time.sleep(2)
    except (SandboxError, OSError, ValueError, KeyError) as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
