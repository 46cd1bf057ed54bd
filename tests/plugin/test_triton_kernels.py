"""The Triton kernels a tier's start compiles (plugins/vllm/inference_image_vllm/triton_kernels.py):
the lab's recording as Triton's jit_cache_hook hands each compile over, the list it becomes, and
the build's precompile of it (`inference-startup precompile`), here without Triton: its compiler
stood in for where a test names it. The compile itself is Triton's (JITFunction.preload's reading
of the same data); what it saves a start is measured by `inference-lab proof step ready`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ROOT

from inference_image.profiles import KERNEL_LISTS, resolve
from inference_image.render import vllm_env
from inference_lab.proof_plan import TRITON_RECORD_ENV, Step, step_problem
from inference_machine import BundleError, precompile_kernels

sys.path.insert(0, str(ROOT / "plugins/vllm"))
from inference_image_vllm import switches, triton_kernels

PLUGIN = ROOT / "plugins/vllm"
# as Triton 3.6 serializes a specialization (serialize_specialization_data)
SPEC = {"name": "vllm.v1.sample.ops.topk_topp_triton._topk_topp_kernel",
        "signature": {"LOGITS": "*fp32", "BATCH_SIZE": "i32", "VOCAB_SIZE": "constexpr"},
        "constant_keys": [[2]], "constant_vals": [128256], "attrs_keys": [[0]],
        "attrs_vals": [[["tt.divisibility", 16]]], "options": {"num_warps": 4}, "key": "k"}


def compile_info(module: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The hook's keyword arguments for one compile, as JITFunction._call_hook passes them."""
    return {"key": "k", "repr": "r", "fn": SimpleNamespace(module=module, name="_topk_topp_kernel"),
            "compile": {"specialization_data": json.dumps(spec)}, "is_manual_warmup": False,
            "already_compiled": False}


def test_the_recorder_appends_each_compile_asks_the_hook_before_it_and_never_skips_one(
        tmp_path: Path) -> None:
    rec = tmp_path / "triton.jsonl"
    asked: list[str] = []
    hook = triton_kernels.recorder(rec, lambda **kw: asked.append(kw["fn"].module))
    assert hook(**compile_info("vllm.v1.sample.ops.topk_topp_triton", SPEC)) is None
    # Inductor's generated kernels live in modules no build can import: not recorded
    hook(**compile_info("torch._inductor.runtime.triton_heuristics", SPEC))
    hook(**compile_info("vllm.v1.sample.ops.topk_topp_triton", SPEC))  # a second process's
    lines = rec.read_text().splitlines()
    assert len(lines) == 2 and asked == ["vllm.v1.sample.ops.topk_topp_triton",
                                         "torch._inductor.runtime.triton_heuristics",
                                         "vllm.v1.sample.ops.topk_topp_triton"]
    kernels = triton_kernels.collect(lines)
    assert kernels == [{"module": "vllm.v1.sample.ops.topk_topp_triton",
                        "name": "_topk_topp_kernel", "spec": SPEC}]
    # a chained hook's answer stands (a true one skips the compile, its owner's decision)
    assert triton_kernels.recorder(rec, lambda **kw: True)(**compile_info("m", SPEC)) is True


def test_precompile_says_what_it_compiled_found_cached_and_skipped() -> None:
    doc = {"capability": "9.0", "kernels": [
        {"module": "a", "name": "k1", "spec": SPEC}, {"module": "a", "name": "k2", "spec": SPEC},
        {"module": "gone", "name": "k3", "spec": SPEC}]}

    def compile_one(e: dict[str, Any]) -> tuple[bool, str]:
        if e["module"] == "gone":
            raise ModuleNotFoundError("No module named 'gone'")
        return e["name"] == "k1", "" if e["name"] == "k1" else "AssertionError: libcuda.so cannot found!"

    line = triton_kernels.precompile(doc, compile_one)
    assert line.startswith("1 compiled, 1 already cached, 1 skipped of 3 recorded for compute "
                           "capability 9.0, 1 launchers built, in ")
    assert "(first skipped: gone.k3: ModuleNotFoundError: No module named 'gone')" in line
    assert line.endswith("(first launcher not built: AssertionError: libcuda.so cannot found!)")


def plugin_cli(env: dict[str, str], kernels: Path | None = None) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from inference_image_vllm import triton_kernels as t; "
            + (f"t.KERNELS = __import__('pathlib').Path({str(kernels)!r}); " if kernels else "")
            + "sys.exit(t.main(['precompile']))")
    return subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(PLUGIN), **env},
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_plugins_precompile_reads_the_tier_from_the_units_environment(tmp_path: Path) -> None:
    off = plugin_cli({})
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == ("triton kernels: none to precompile (serving.triton_precompile "
                                  "is off)")
    missing = plugin_cli({switches.TRITON_KERNELS: "h100"}, tmp_path)
    assert missing.returncode == 1
    assert missing.stdout.startswith("triton kernels of h100: no recorded list (")
    (tmp_path / "h100.json").write_text(json.dumps({"schema": 99}))
    bad = plugin_cli({switches.TRITON_KERNELS: "h100"}, tmp_path)
    assert bad.returncode == 1 and "schema 99, this plugin reads 1" in bad.stdout


def test_the_builds_precompile_runs_the_plugin_with_the_units_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`inference-startup precompile --env UNIT.env`: the unit's vLLM Python runs the plugin with
    the unit's environment; a tier with no list fails the build with the plugin's line."""
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the caller's would win over the unit's
    unit = tmp_path / "vllm-0.env"
    cache = tmp_path / "triton"
    lines = [f"INFERENCE_PYTHON={sys.executable}", f"TRITON_CACHE_DIR={cache}",
             f"PYTHONPATH={PLUGIN}"]
    unit.write_text("\n".join(lines) + "\n")
    assert precompile_kernels(unit) == ("triton kernels: none to precompile "
                                        "(serving.triton_precompile is off)")
    unit.write_text("\n".join([*lines, f"{switches.TRITON_KERNELS}=no-such-tier"]) + "\n")
    with pytest.raises(BundleError, match=r"did not precompile the Triton kernels \(exit 1\): "
                       r"triton kernels of no-such-tier: no recorded list"):
        precompile_kernels(unit)
    unit.write_text("TRITON_CACHE_DIR=/x\n")
    with pytest.raises(BundleError, match="names no INFERENCE_PYTHON or TRITON_CACHE_DIR"):
        precompile_kernels(unit)


def test_a_tier_that_precompiles_needs_its_recorded_list_of_its_gpus_architecture() -> None:
    from inference_image.profiles import ProfileErrors

    with pytest.raises(ProfileErrors) as e:
        resolve("l40s", overrides=["serving.triton_precompile=true"])
    text = str(e.value)
    assert "serving.triton_precompile" in text and f"{KERNEL_LISTS}/l40s.json" in text
    assert "inference-lab proof step ready --record-triton" in text


def test_the_names_are_the_plugins() -> None:
    assert TRITON_RECORD_ENV == switches.TRITON_RECORD
    assert (ROOT / KERNEL_LISTS).resolve() == triton_kernels.KERNELS.resolve()
    r = resolve("h100", overrides=["serving.triton_precompile=false"])
    assert switches.TRITON_KERNELS not in vllm_env(r, r.instances[0])


def test_recording_is_a_ready_step_of_the_render_from_the_images_paths() -> None:
    ok = Step(kind="ready", starts=("cold",), image_paths=True, record_triton=True)
    assert step_problem(ok) is None
    assert "give image_paths, and no vanilla" in str(step_problem(
        Step(kind="ready", starts=("cold",), record_triton=True)))
    assert "ready steps only" in str(step_problem(Step(kind="profile", record_triton=True)))


@pytest.mark.parametrize("tier", ["../../etc/passwd", "/etc/passwd", "h100/../x", "", "H100"])
def test_a_kernel_list_is_named_by_its_tier_alone(tier: str) -> None:
    with pytest.raises(ValueError, match="not a tier's name"):
        triton_kernels.list_path(tier)
    assert triton_kernels.list_path("h100").parent == triton_kernels.KERNELS


@pytest.mark.parametrize("tier", sorted(p.stem for p in (PLUGIN / "inference_image_vllm/kernels")
                                        .glob("*.json")))
def test_every_shipped_list_loads_with_its_float_constants(tier: str) -> None:
    """The lists the plugin ships are what the build's precompile reads: each loads, its kernels
    named, and a float constexpr Triton specialised on (a mask's -inf) is the float it was."""
    doc = triton_kernels.load(tier)
    assert doc is not None and doc["tier"] == tier and doc["kernels"], tier
    assert all(k["module"] and k["name"] for k in doc["kernels"])
    text = (PLUGIN / f"inference_image_vllm/kernels/{tier}.json").read_text()
    if "-Infinity" in text:
        assert any(float("-inf") in k["spec"].get("constant_vals", []) for k in doc["kernels"])
