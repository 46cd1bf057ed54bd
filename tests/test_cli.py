from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, edit

from inference_image import cli as ii_cli
from inference_image.profiles import list_tiers, resolve


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inference_image.cli", *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_profiles_table():
    r = cli("profiles")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["TIER", "GPU", "GPUS"]
    rows = {ln.split()[0]: ln for ln in lines[2:]}
    assert set(rows) == {"cpu", "cpu-2node", "h100", "h100x8", "h200", "h200x8", "l40s", "rtx4000ada",
                         "rtx6000ada"}
    assert rows["cpu-2node"].rstrip().endswith("1 x 1 on 2 nodes")
    assert "gpu-h100x8-640gb" in rows["h100x8"] and rows["h100x8"].rstrip().endswith("4 x 2")
    assert " yes  yes " in rows["h200"] and " no   yes " in rows["l40s"]


def test_validate_all_ok():
    r = cli("validate", "--all")
    tiers = list_tiers(ROOT / "profiles")
    assert r.returncode == 0 and [ln.split()[1].rstrip(":") for ln in r.stdout.splitlines()] == tiers


def test_validate_bad_profile_exits_1_with_one_line_per_error(pdir):
    edit(pdir / "h100.yaml", "  instances: 1", "  instances: 2")
    r = cli("--profiles-dir", str(pdir), "validate", "h100", "cpu")
    assert r.returncode == 1
    assert "ok  cpu" in r.stdout
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    assert "serving.instances" in r.stderr and "Fix:" in r.stderr


def test_unknown_tier_render():
    r = cli("render", "--profile", "h300")
    assert r.returncode == 1 and "unknown tier 'h300'" in r.stderr and "Traceback" not in r.stderr


def test_render_writes_files(tmp_path):
    r = cli("render", "--profile", "cpu", "--out", str(tmp_path / "cpu"), "-v")
    assert r.returncode == 0, r.stderr
    assert "etc/systemd/system/vllm@.service" in r.stdout
    assert (tmp_path / "cpu/packer/cpu.pkrvars.hcl").exists()


@pytest.mark.parametrize("argv", [
    ["render", "--profile", "cpu", "--out", "{file}"],
    ["bench", "run", "--url", "http://127.0.0.1:9", "--model", "m", "--out", "{dir}",
     "--vllm-cmd", "/nonexistent/vllm"],
    ["bench", "run", "--url", "http://127.0.0.1:9", "--model", "m", "--out", "{file}",
     "--vllm-python", sys.executable],
    ["proof", "step", "assemble", "--out", "{file}"],
])
def test_bad_paths_are_one_line_not_a_traceback(argv, tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    args = [a.format(file=f, dir=tmp_path / "out") for a in argv]
    assert ii_cli.main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Errno" not in err
    assert len(err.strip().splitlines()) == 1 and "Fix:" in err, err
    assert "[" not in err.split("error:")[0]  # no progress bar before the error


def test_readme_tiers_table_matches_the_profiles():
    """The README's table is typed by hand: every row must say what `inference-image profiles`
    says for the columns both have."""
    rows = {ln.split()[0]: ln.split() for ln in cli("profiles").stdout.splitlines()[2:]}
    names = cli("profiles", "--names").stdout.split()
    assert names == sorted(rows)
    readme = (ROOT / "README.md").read_text()
    table = [ln for ln in readme.splitlines() if ln.startswith("| ") and ln.split("|")[1].strip() in rows]
    assert sorted(ln.split("|")[1].strip() for ln in table) == names
    for ln in table:
        cells = [c.strip() for c in ln.split("|")[1:-1]]
        tier, size, fa3, fp8, spec, layout = cells[0], cells[2], cells[3], cells[4], cells[7], cells[8]
        r = resolve(tier, ROOT / "profiles")
        assert size == r.profile.digitalocean.size, tier
        assert (fa3, fp8) == ("yes" if r.fa3_available else "no", "yes" if r.fp8_available else "no"), tier
        method = r.profile.model.speculative.method
        shown = {"eagle3": "eagle-3", "draft_model": "draft"}.get(method, method)
        assert spec.lower().startswith(shown), tier
        p = r.profile.serving
        nodes = f" on {p.nodes} nodes" if p.nodes > 1 else ""
        assert layout == f"{p.instances} x {p.tensor_parallel_size}{nodes}", tier
