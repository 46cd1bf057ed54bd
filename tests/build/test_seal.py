"""The build's last step against a real sshd (Debian's openssh-server, unpacked under build/):
sshd reads its host keys and the authorized keys for every new connection, so once sysprep
removed them a build step that opened a new connection failed ("ssh: handshake failed: EOF").
The seal removes them inside the session that ends the build."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

from inference_image.profiles import resolve
from inference_image.render import PATHS, files

SEAL = ROOT / "roles/sysprep/files/inference-seal"
SSHD_DEBS = ROOT / "build/test-sshd"


def sshd_binary() -> Path:
    """Debian's sshd and the one library the host may lack, unpacked once from the archive (the
    host need not run an SSH server)."""
    sshd = SSHD_DEBS / "root/usr/sbin/sshd"
    if not sshd.exists():
        SSHD_DEBS.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(["apt-get", "download", "openssh-server", "libwrap0"], cwd=SSHD_DEBS,
                             capture_output=True, text=True, check=False)
        assert got.returncode == 0, f"apt-get download openssh-server: {got.stderr[-400:]}"
        for deb in SSHD_DEBS.glob("*.deb"):
            subprocess.run(["dpkg", "-x", str(deb), str(SSHD_DEBS / "root")], check=True)
    return sshd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Machine:
    """A tree laid out as an image's (etc/ssh, root/.ssh, etc/passwd) served by a real sshd."""
    root: Path
    port: int
    key: Path

    def ssh(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", "-p", str(self.port), "-i", str(self.key), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "ConnectTimeout=10", "root@127.0.0.1", command],
            capture_output=True, text=True, timeout=60, check=False)

    def host_keys(self) -> list[Path]:
        return sorted((self.root / "etc/ssh").glob("ssh_host_*"))

    def make_host_key(self) -> None:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        str(self.root / "etc/ssh/ssh_host_ed25519_key")], check=True)


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("needs root and unshare (sshd runs in a mount namespace with its own passwd)")
    sshd = sshd_binary()
    root = tmp_path / "image"
    (root / "etc/ssh").mkdir(parents=True)
    (root / "root/.ssh").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    key = tmp_path / "build_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    shutil.copy(f"{key}.pub", root / "root/.ssh/authorized_keys")
    m = Machine(root, free_port(), key)
    m.make_host_key()
    # sshd needs its privilege-separation user and /run/sshd: both only inside its namespace
    passwd = tmp_path / "passwd"
    passwd.write_text(Path("/etc/passwd").read_text()
                      + "sshd:x:65533:65534::/run/sshd:/usr/sbin/nologin\n")
    conf = tmp_path / "sshd_config"
    conf.write_text(f"Port {m.port}\nListenAddress 127.0.0.1\n"
                    f"HostKey {root}/etc/ssh/ssh_host_ed25519_key\n"
                    f"AuthorizedKeysFile {root}/root/.ssh/authorized_keys\n"
                    f"PidFile {tmp_path}/sshd.pid\nUsePAM no\nStrictModes no\n"
                    "PermitRootLogin prohibit-password\n")
    libs = ":".join(str(SSHD_DEBS / "root" / d) for d in ("lib/x86_64-linux-gnu",
                                                          "usr/lib/x86_64-linux-gnu"))
    script = (f"mount --bind {passwd} /etc/passwd && mount -t tmpfs -o mode=755 tmpfs /run && "
              f"mkdir -m 755 /run/sshd && LD_LIBRARY_PATH={libs} exec {sshd} -D -e -f {conf}")
    log = tmp_path / "sshd.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", m.port)) == 0:
                    break
            assert proc.poll() is None, f"sshd did not start: {log.read_text()[-500:]}"
            time.sleep(0.1)
        yield m
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_new_connection_fails_once_the_host_keys_are_gone(machine: Machine) -> None:
    """The failure as the build met it: the keys removed (sysprep did it in its play), then a new
    connection (Packer's shutdown command)."""
    assert machine.ssh("true").returncode == 0
    for f in machine.host_keys():
        f.unlink()
    late = machine.ssh("shutdown -P now")
    assert late.returncode == 255, late


def test_the_seal_removes_the_keys_inside_the_session_that_ends_the_build(machine: Machine) -> None:
    """What both builders run last: the seal, then the power-off, in one session. Every key goes,
    the command after it still runs and answers, and no further connection is possible (so no
    build step may come after it)."""
    sealed = machine.ssh(f"SEAL_ROOT={machine.root} {SEAL} echo powering-off")
    assert sealed.returncode == 0 and sealed.stdout.strip() == "powering-off", sealed
    assert machine.host_keys() == []
    assert not (machine.root / "root/.ssh/authorized_keys").exists()
    assert machine.ssh("true").returncode == 255


def test_the_seal_fails_when_it_cannot_remove_a_key(tmp_path: Path) -> None:
    (tmp_path / "etc/ssh/ssh_host_rsa_key").mkdir(parents=True)  # a directory: rm -f leaves it
    (tmp_path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    r = subprocess.run([str(SEAL), "echo", "powering-off"], env={**os.environ,
                       "SEAL_ROOT": str(tmp_path)}, capture_output=True, text=True, check=False)
    assert r.returncode == 1 and "powering-off" not in r.stdout
    assert "ssh_host_rsa_key" in r.stderr


def test_both_builders_end_with_the_seal_and_nothing_after_it() -> None:
    """qemu: the shutdown command is the seal (Packer opens no connection after it). DigitalOcean:
    powers off through its API, so the seal is the last provisioner, for that builder only."""
    hcl = (ROOT / "packer/inference-image.pkr.hcl").read_text()
    shutdown = re.search(r'^\s*shutdown_command\s*=\s*"(.*)"$', hcl, re.M)
    assert shutdown and shutdown[1].startswith("${var.seal_command} "), shutdown
    build = hcl[hcl.index("\nbuild {"):]
    provisioners = re.findall(r'^  provisioner "(\w[\w-]*)" \{\n(.*?)^  \}', build, re.M | re.S)
    kind, body = provisioners[-1]
    assert kind == "shell" and re.search(r'only\s*=\s*\["digitalocean\.droplet"\]', body)
    assert re.search(r"inline\s*=\s*\[var\.seal_command\]", body)
    # the command is the one the sysprep role installs (inference_paths.seal)
    pkrvars = files(resolve("h100"))["packer/h100.pkrvars.hcl"][0]
    assert f'seal_command   = "{PATHS["seal"]}"' in pkrvars
