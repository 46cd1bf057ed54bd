"""The sysprep role's check and the marketplace suite's OS checks against a Debian 12 and an Ubuntu
24.04 root (each base image's /etc/os-release and account files, the host's own tools copied in),
run in a chroot: the check as the role runs it, the suite through testinfra's chroot backend.
A GPU tier builds on Ubuntu 24.04 and the cpu tier on Debian 12 (a check that refused
every release but Debian 12 once stopped every GPU tier's DigitalOcean build)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from inference_image.profiles import BASE_IMAGES, resolve
from inference_image.render import ansible_vars

CHECK = ROOT / "roles/sysprep/files/inference-sysprep-check"
TOOLS = ("bash", "sh", "awk", "find", "grep", "ls", "cat", "head", "cut", "rm", "sed", "passwd",
         "usermod", "getent", "id", "env", "sync", "echo", "true", "uname", "test")
# /etc/os-release as each base image ships it (the fields the checks read, and its NAME)
OS_RELEASE = {
    "debian-12-x64": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
                     'VERSION_ID="12"\nVERSION_CODENAME=bookworm\nID=debian\n',
    "ubuntu-24-04-x64": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
                        'VERSION_CODENAME=noble\nID=ubuntu\nID_LIKE=debian\n',
}
SUPPORTED = " ".join(ansible_vars(resolve("cpu"))["sysprep_supported_releases"])


def copy_tool(root: Path, name: str) -> None:
    path = Path(shutil.which(name) or f"/usr/bin/{name}").resolve()
    dst = root / str(path).lstrip("/")
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, dst)
    for alias in {f"/usr/bin/{name}", f"/bin/{name}", f"/usr/sbin/{name}"}:
        link = root / alias.lstrip("/")
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path)
    libs = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False).stdout
    for lib in (w for w in libs.split() if w.startswith("/")):
        target = root / lib.lstrip("/")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(lib).resolve(), target)


MOUNTED: list[Path] = []


@pytest.fixture(autouse=True)
def unmount() -> Iterator[None]:
    yield
    while MOUNTED:
        subprocess.run(["umount", "-l", str(MOUNTED.pop())], check=False)


def make_root(tmp: Path, base_image: str, root_password: str = "*") -> Path:
    """A sealed-looking tree: the base image's os-release, root and one user from uid 1000, empty
    logs and caches, cloud-init present (a stand-in script: only its presence is checked), the
    seal installed, the build's SSH host key still there (the seal removes it later)."""
    if os.geteuid() != 0:
        pytest.fail("needs root (chroot)")
    root = tmp / base_image
    for d in ("etc/ssh", "etc/inference-image", "root", "home/ada", "tmp", "var/tmp", "var/log",
              "var/lib/apt/lists", "var/cache/apt", "usr/local/sbin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        copy_tool(root, tool)
    (root / "etc/os-release").write_text(OS_RELEASE[base_image])
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                     "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                                     "ada:x:1000:1000::/home/ada:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\nada:x:1000:\n")
    (root / "etc/shadow").write_text(f"root:{root_password}:20000:0:99999:7:::\n"
                                     "nobody:*:20000:0:99999:7:::\nada:!:20000:0:99999:7:::\n")
    (root / "etc/shadow").chmod(0o640)
    (root / "etc/machine-id").write_text("")
    (root / "etc/ssh/ssh_host_ed25519_key").write_text("build key\n")
    cloud_init = root / "usr/bin/cloud-init"
    cloud_init.write_text("#!/bin/sh\necho 24.1\n")
    cloud_init.chmod(0o755)
    shutil.copy2(ROOT / "roles/sysprep/files/inference-seal", root / "usr/local/sbin/inference-seal")
    for what, args in (("dev", ["--bind", "/dev"]), ("proc", ["-t", "proc", "proc"])):
        (root / what).mkdir()
        subprocess.run(["mount", *args, str(root / what)], check=True)
        MOUNTED.append(root / what)
    return root


def check(root: Path, supported: str = SUPPORTED) -> subprocess.CompletedProcess[str]:
    shutil.copy2(CHECK, root / "usr/local/sbin/inference-sysprep-check")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SYSPREP_SEAL": "/usr/local/sbin/inference-seal",
           "SYSPREP_SUPPORTED_RELEASES": supported, "SYSPREP_MACHINE_FILES": "/etc/inference-image/api-key",
           "SYSPREP_BUILD_STAGE": "/var/tmp/inference-image-build"}
    try:
        return subprocess.run(["chroot", str(root), "/bin/bash", "/usr/local/sbin/inference-sysprep-check"],
                              env=env, capture_output=True, text=True, timeout=60, check=False)
    finally:
        (root / "usr/local/sbin/inference-sysprep-check").unlink()


def role_task(name: str) -> str:
    tasks = yaml.safe_load((ROOT / "roles/sysprep/tasks/main.yml").read_text())
    (task,) = [t for t in tasks if t["name"] == name]
    return task["ansible.builtin.shell"]


@pytest.mark.parametrize("base_image", sorted(BASE_IMAGES))
def test_the_check_passes_a_clean_root_of_each_supported_base_image(tmp_path: Path,
                                                                    base_image: str) -> None:
    r = check(make_root(tmp_path, base_image))
    assert (r.returncode, r.stdout.strip()) == (0, "sysprep-check: clean"), r.stdout + r.stderr


def test_the_check_refuses_a_release_no_base_image_has(tmp_path: Path) -> None:
    root = make_root(tmp_path, "debian-12-x64")
    (root / "etc/os-release").write_text('ID=debian\nVERSION_ID="11"\n')
    r = check(root)
    assert r.returncode == 1
    assert f"not a supported release: debian:11 (supported: {SUPPORTED})" in r.stdout
    assert "SYSPREP_SUPPORTED_RELEASES is not set" in check(root, supported="").stdout


@pytest.mark.parametrize("base_image", sorted(BASE_IMAGES))
def test_a_locked_root_password_is_refused_and_the_role_seals_it_as_digitalocean_accepts(
        tmp_path: Path, base_image: str) -> None:
    """cloud-init locks root's password ("!*"); DigitalOcean's check accepts only !, !! or *."""
    root = make_root(tmp_path, base_image, root_password="!*")
    r = check(root)
    assert r.returncode == 1 and "root has a password field DigitalOcean's check refuses" in r.stdout
    task = role_task("No password on root and user accounts, in the form DigitalOcean's check accepts")
    done = subprocess.run(["chroot", str(root), "/bin/bash", "-c", task], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0 and done.stdout.split() == ["sealed", "root"], done
    assert (root / "etc/shadow").read_text().splitlines()[0].split(":")[1] == "*"
    assert check(root).returncode == 0


def test_the_seal_must_be_installed_while_the_host_keys_are_there(tmp_path: Path) -> None:
    root = make_root(tmp_path, "ubuntu-24-04-x64")
    (root / "usr/local/sbin/inference-seal").unlink()
    r = check(root)
    assert r.returncode == 1 and "the SSH keys would stay in the image" in r.stdout


@pytest.mark.parametrize("base_image", sorted(BASE_IMAGES))
def test_the_marketplace_suite_os_and_account_checks_on_each_base_image(tmp_path: Path,
                                                                        base_image: str) -> None:
    root = make_root(tmp_path, base_image)
    (root / "etc/ssh/ssh_host_ed25519_key").unlink()  # sealed
    tests = ("test_checkOS_supported_release", "test_checkRoot_and_checkUsers_password_field",
             "test_no_ssh_host_keys")

    def suite(*names: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               str(ROOT / "image_tests/test_marketplace.py"), f"--hosts={root}",
                               "--connection=chroot", "-k", " or ".join(names)],
                              capture_output=True, text=True, check=False, cwd=ROOT / "image_tests")

    r = suite(*tests)
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout[-1500:]
    (root / "etc/os-release").write_text('ID=ubuntu\nVERSION_ID="22.04"\n')
    r = suite(tests[0])
    assert r.returncode == 1 and "ubuntu:22.04" in r.stdout, r.stdout[-1500:]


def test_every_gpu_tier_builds_on_a_base_image_the_driver_role_has_packages_for() -> None:
    """The roles read the distribution from the machine (include_vars by its name): a tier's base
    image, and the local qemu build's Debian 12, must each have the driver role's package names."""
    from inference_image.profiles import LOCAL_BASE_IMAGE, list_tiers

    for tier in list_tiers(ROOT / "profiles"):
        r = resolve(tier)
        if not r.is_gpu:
            continue
        for slug in (r.profile.digitalocean.base_image, LOCAL_BASE_IMAGE):
            dist = BASE_IMAGES[slug].distribution
            vars_file = ROOT / f"roles/nvidia_driver/vars/{dist}.yml"
            assert vars_file.is_file(), f"{tier}: {slug} is {dist}; the driver role has no {vars_file}"
            assert "nvidia_driver_user_packages" in yaml.safe_load(vars_file.read_text())
