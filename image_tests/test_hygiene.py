"""hygiene (DigitalOcean's marketplace list), on a machine booted from the image: everything that
must be per machine was made after the image was sealed, nothing of the build was left behind.
The build itself is gated by the sysprep role's check; this suite proves the result on a boot.
/etc/inference-image/image.json (written by sysprep) records when the image was sealed."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from conftest import pending_security_updates

HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{30,}")


@pytest.fixture(scope="module", autouse=True)
def sealed_at(root: Any, profile: dict[str, Any]) -> int:
    image_json = profile["paths"]["image_json"]
    f = root.file(image_json)
    if not f.exists:
        pytest.skip(f"{image_json} is missing: this machine was never sysprepped (not booted from an image)")
    return int(json.loads(f.content_string)["sysprepped_at"])


def _mtime(root: Any, path: str) -> int:
    return int(root.run(f"stat -c %Y {path}").stdout.strip() or 0)


def test_per_machine_files_made_after_sealing(root: Any, profile: dict[str, Any], sealed_at: int) -> None:
    old = []
    paths = ["/etc/machine-id", *profile["machine_files"]]  # key, its map, TLS key and cert, ...
    paths += root.run("ls /etc/ssh/ssh_host_*_key 2>/dev/null").stdout.split()
    for p in paths:
        if root.file(p).exists and _mtime(root, p) < sealed_at:
            old.append(p)
    assert not old, f"baked into the image instead of made on this machine: {old}"
    assert root.file("/etc/machine-id").content_string.strip(), "/etc/machine-id is empty after boot"


def test_no_authorized_keys_or_history_from_the_build(root: Any, sealed_at: int) -> None:
    found = root.run(
        "for d in /root /home/*; do for f in .ssh/authorized_keys .bash_history .python_history .viminfo; do "
        "[ -e $d/$f ] && echo $d/$f $(stat -c %Y $d/$f); done; done").stdout.split("\n")
    old = [ln.split()[0] for ln in found if ln.strip() and int(ln.split()[1]) < sealed_at]
    assert not old, f"left from the build: {old}"


def test_cloud_init_state_only_of_this_instance(root: Any) -> None:
    if not root.file("/var/lib/cloud").exists:
        pytest.skip("no cloud-init on this machine")
    instances = root.run("ls /var/lib/cloud/instances 2>/dev/null").stdout.split()
    assert len(instances) <= 1, f"cloud-init state of several machines: {instances}"


def test_no_logs_from_the_build(root: Any, sealed_at: int) -> None:
    old = root.run(
        f"find /var/log -type f -size +0 ! -newermt @{sealed_at} ! -name wtmp ! -name btmp ! -name lastlog"
    ).stdout.split()
    assert not old, f"logs written before the image was sealed: {old[:10]}"


def test_no_hub_token_on_disk(root: Any, profile: dict[str, Any]) -> None:
    where = f"/etc /root /home {profile['paths']['state']} {profile['paths']['cache']} /var/tmp /tmp"
    out = root.run(f"grep -rlsE 'hf_[A-Za-z0-9]{{30,}}' {where} 2>/dev/null | head -5")
    assert not out.stdout.strip(), f"something that looks like a hub token: {out.stdout.split()}"
    env = root.run("cat /etc/environment 2>/dev/null").stdout
    assert not HF_TOKEN.search(env) and "HF_TOKEN" not in env


def test_api_key_only_where_it_belongs(root: Any, profile: dict[str, Any]) -> None:
    key_file = profile["paths"]["api_key"]
    allowed = {key_file, profile["paths"]["api_key_map"]}
    # -f: the key is read from its file, never put on this command line.
    hits = root.run(f"grep -rlsF -f {key_file} /etc /root /home /opt /var/lib /var/log /var/tmp /tmp "
                    "/usr/local 2>/dev/null").stdout.split()
    stray = sorted(set(hits) - allowed)
    assert not stray, f"the API key is also in: {stray}"


def test_firewall_active(root: Any) -> None:
    assert root.service("nftables").is_enabled
    assert "policy drop" in root.run("nft list ruleset").stdout


def test_no_package_caches(root: Any) -> None:
    debs = root.run("find /var/cache/apt -name '*.deb' | head -3").stdout.split()
    assert not debs, f"downloaded packages left: {debs}"
    assert not root.file("/root/.cache/pip").exists, "pip's cache left in /root/.cache/pip"


def test_no_pending_security_updates(root: Any) -> None:
    """DigitalOcean's Marketplace check fails an image with a pending security update."""
    pending = pending_security_updates(root)
    assert not pending, f"{len(pending)} pending security updates: {pending[:5]}"
