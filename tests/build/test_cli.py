from __future__ import annotations

import re
import shlex
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
    assert lines[0].split()[:4] == ["TIER", "GPU", "DO", "SIZE"]
    assert max(len(ln) for ln in lines) <= 132  # one wide terminal, not 186 columns
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


def test_readme_status_table_names_every_tier_once():
    """The README's status table is typed by hand: each tier `inference-image profiles` knows is
    in it exactly once, and a tier's layout, where its row gives one, is the profile's."""
    names = cli("profiles", "--names").stdout.split()
    readme = (ROOT / "README.md").read_text()
    status = readme[readme.index("## Status"):readme.index("\n## ", readme.index("## Status") + 1)]
    rows = [ln.split("|")[1:-1] for ln in status.splitlines() if ln.startswith("| ") and "---" not in ln]
    listed = [t.strip() for cells in rows[1:] for t in cells[0].split(",")]
    assert sorted(listed) == sorted(names)
    for cells in rows[1:]:
        for tier in (t.strip() for t in cells[0].split(",")):
            p = resolve(tier, ROOT / "profiles").profile.serving
            if m := re.search(r"(\d+) x TP=(\d+)", cells[1]):
                assert (int(m[1]), int(m[2])) == (p.instances, p.tensor_parallel_size), tier


def test_the_users_help_lists_no_lab_step():
    """The GPU lab has its own console script (inference-lab); the product's help is the product."""
    out = cli("--help").stdout
    assert "proof" not in out and "render" in out
    lab = subprocess.run([sys.executable, "-m", "inference_lab.cli", "--help"], capture_output=True,
                         text=True, check=False)
    assert lab.returncode == 0 and "proof" in lab.stdout


def test_render_names_a_tier_as_validate_does(tmp_path):
    assert ii_cli.main(["render", "cpu", "--out", str(tmp_path / "a")]) == 0
    assert ii_cli.main(["render", "--profile", "cpu", "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "a/ansible/extra-vars.json").read_text() == \
        (tmp_path / "b/ansible/extra-vars.json").read_text()
    assert ii_cli.main(["render"]) == 1 and ii_cli.main(["render", "cpu", "--profile", "cpu"]) == 1


def test_the_readmes_other_model_commands_run_as_written(tmp_path):
    """The README's "Serve another model" block, each command as written (render into a scratch
    directory instead of build/)."""
    readme = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "model.target=qwen" in b]
    # the path `make setup` installs the CLI at (VENV ?= .venv): a bare `inference-image` after
    # it is "command not found"
    venv = re.search(r"^VENV \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert venv, "the Makefile names no VENV"
    for line in block.strip().splitlines():
        argv = shlex.split(line)
        assert argv[0] == f"{venv[1]}/bin/inference-image", line
        argv = [str(tmp_path / "out") if a == "build/l40s-qwen" else a for a in argv[1:]]
        r = cli(*argv)
        assert r.returncode == 0, (line, r.stderr)
    extra = (tmp_path / "out/ansible/extra-vars.json").read_text()
    assert '"Qwen/Qwen2.5-7B-Instruct"' in extra


def test_validate_says_what_the_memory_bandwidth_allows_one_stream():
    """hardware.memory_bandwidth_tbs is read: one stream's decode bound scales with it."""
    def bound(*sets: str) -> int:
        r = cli("validate", "h100", *(a for s in sets for a in ("--set", s)))
        assert r.returncode == 0, r.stderr
        m = re.search(r"one stream decodes at most ([0-9,]+) tok/s before speculation", r.stdout)
        assert m, r.stdout
        return int(m[1].replace(",", ""))

    full, half = bound(), bound("hardware.memory_bandwidth_tbs=1.675")
    assert abs(full - 2 * half) <= 1, (full, half)
    assert bound("model.quantization=none", "serving.fp8_gemm_dispatch=false") < full  # bf16
