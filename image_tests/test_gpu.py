"""gpu: the driver and GPUs the profile asks for (GPU tiers only)."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType
from typing import Any

import pytest

from inference_image.profiles import project_root


def plugin_lines() -> ModuleType:
    """The project's vLLM plugin package as this checkout has it (the lines its parts log: its
    __init__ imports nothing of vLLM or torch)."""
    init = project_root() / "plugins/vllm/inference_image_vllm/__init__.py"
    # a package, so that its own imports (the switches' names) resolve beside it
    spec = importlib.util.spec_from_file_location("inference_image_vllm_lines", init,
                                                  submodule_search_locations=[str(init.parent)])
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def line_pattern(template: str) -> re.Pattern[str]:
    """A plugin line with {fields} (LOG_FP8_DISPATCH) as a pattern: each field a named group that
    ends where the template's next literal text begins."""
    parts = re.split(r"\{(\w+)\}", template)
    return re.compile("".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>.+?)"
                              for i, p in enumerate(parts)))


@pytest.fixture(scope="module")
def hw(profile: dict[str, Any], request: pytest.FixtureRequest,
       record_testsuite_property: Any) -> dict[str, Any]:
    h = profile["profile"]["hardware"]
    if not h["gpu_count"]:
        pytest.skip(f"tier {profile['tier']} has no GPU")
    stand_in = request.config.getoption("--stand-in-gpu")
    if stand_in:
        # said in the report: what was checked is the stand-in, not the tier's own GPU
        record_testsuite_property("stand_in_gpu", f"{stand_in} for {h['gpu_model']}")
        return dict(h, gpu_model=stand_in)
    return h


@pytest.fixture(scope="module")
def packaged_driver(root: Any, hw: dict[str, Any]) -> None:
    """The driver as the image installs it: Debian's packages. A container whose driver is its
    host's, its libraries and nvidia-smi bound in (NVIDIA's container toolkit's way), has none
    of its own to check."""
    if root.run("systemd-detect-virt --container").rc != 0:
        return
    packages = root.run("dpkg-query -W -f '${db:Status-Abbrev}${Package}\\n' 'nvidia-*' "
                        "'libnvidia-*' 2>/dev/null | grep '^ii'")
    if not packages.stdout.strip() and root.run("nvidia-smi -L").rc == 0:
        pytest.skip("the driver is this container's host's, bound in: no packages of its own")


@pytest.mark.serving  # needs the GPU itself: not there when a GPU tier is built without one
def test_nvidia_smi_sees_the_gpus(root: Any, hw: dict[str, Any]) -> None:
    out = root.run("nvidia-smi --query-gpu=name --format=csv,noheader")
    assert out.rc == 0, f"nvidia-smi failed: {out.stderr.strip()}"
    names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
    assert len(names) == hw["gpu_count"], f"{len(names)} GPUs, profile says {hw['gpu_count']}"
    assert all(hw["gpu_model"].lower() in n.lower() for n in names), f"{names} vs {hw['gpu_model']}"


@pytest.mark.serving  # asks the loaded driver
def test_driver_is_the_pinned_branch(root: Any, profile: dict[str, Any], hw: dict[str, Any]) -> None:
    branch = profile["profile"]["versions"]["driver_branch"]
    v = root.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()
    assert v and all(x.startswith(f"{branch}.") for x in v), f"driver {v}, pinned branch {branch}"


def test_nvidia_packages_share_one_version(root: Any, hw: dict[str, Any],
        packaged_driver: None) -> None:
    out = root.run("dpkg-query -W -f '${Package} ${Version}\\n' 'nvidia-*' 'libnvidia-*' 2>/dev/null")
    versions = {}
    for line in out.stdout.splitlines():
        name, _, ver = line.partition(" ")
        # Debian versions the persistence daemon separately (its own source package), and its
        # packaging helpers (nvidia-support, nvidia-installer-cleanup) by date, not by driver.
        ver = ver.split(":")[-1].split("-")[0]
        if re.fullmatch(r"\d+\.\d+(\.\d+)?", ver) and name != "nvidia-persistenced":
            versions[name] = ver
    assert versions, "no NVIDIA packages installed"
    assert len(set(versions.values())) == 1, f"mixed versions: {versions}"


def test_kernel_and_driver_held(root: Any, hw: dict[str, Any],
        packaged_driver: None) -> None:
    held = root.run("dpkg --get-selections | awk '$2 == \"hold\" {print $1}'").stdout.split()
    assert any("nvidia" in p for p in held), "no NVIDIA package is held"
    if root.run("systemd-detect-virt --container").rc == 0:
        pytest.skip("a container runs its host's kernel: no kernel package of its own to hold")
    kernel = root.run("uname -r").stdout.strip()
    assert any(kernel in p for p in held), f"the running kernel {kernel} is not held"


def test_persistence_daemon_enabled(root: Any, hw: dict[str, Any],
        packaged_driver: None) -> None:
    assert root.service("nvidia-persistenced").is_enabled


def test_fabric_manager_only_on_nvswitch(root: Any, hw: dict[str, Any]) -> None:
    fm = root.service("nvidia-fabricmanager")
    if hw["nvswitch"]:
        assert fm.is_running, "NVSwitch machine without an active fabric manager"
    else:
        assert not fm.is_running, "fabric manager running on a machine without NVSwitch"


@pytest.mark.serving  # reads the running instance's log
def test_vllm_log_shows_fa3_and_fp8(root: Any, profile: dict[str, Any], hw: dict[str, Any]) -> None:
    serving = profile["profile"]["serving"]
    name = profile["instances"][0]["name"]
    log = root.run(f"journalctl -u vllm@{name} -b --no-pager -o cat").stdout
    assert log, f"no journal for vllm@{name} on this boot"
    if serving["flash_attention_3"]:
        assert "FlashAttention version 3" in log or ("FLASH_ATTN" in log and "version 3" in log), \
            "vLLM did not log FlashAttention 3"
    lines = plugin_lines()
    if profile["profile"]["model"]["quantization"].startswith("fp8"):
        # e.g. "Selected CutlassFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8" (checkpoint)
        # or "... for Fp8PerTensorOnlineLinearMethod" (online): an FP8 GEMM kernel was chosen.
        chosen = re.search(r"Selected (\w*FP8\w*Kernel) for (\w*Fp8\w*)", log, re.IGNORECASE)
        assert chosen, "vLLM's log names no FP8 linear kernel (FP8 weights not in use?)"
        if serving.get("fp8_gemm_dispatch"):
            # The project's plugin took over vLLM's FP8 GEMM and loaded a table for this chip
            # (a table from another compute capability loads as "none: ...": Cutlass everywhere).
            assert chosen.group(1) == "InferenceImageFP8ScaledMMLinearKernel", \
                "serving.fp8_gemm_dispatch is on but vLLM chose another FP8 kernel"
            table = line_pattern(lines.LOG_FP8_DISPATCH).search(log)
            assert table, "the inference-image vLLM plugin did not log its table"
            source, device = table.group("table"), table.group("device")
            assert not source.startswith("none"), f"no kernel table for this GPU: {source}"
            # The profile's speeds were measured with a table tuned on its own GPU model (tables
            # are picked by GPU name, then architecture): another chip's table is not what was
            # measured, though it runs.
            assert device.strip().lower() == hw["gpu_model"].lower(), (
                f"the FP8 table in use ({source}) was measured on {device}, not "
                f"{hw['gpu_model']}: tune one on this GPU (inference-image proof step tune) and "
                "ship it as the plugin's tables/<gpu-name>.json")
    if serving.get("triton_decode_max_tokens"):
        assert lines.LOG_TRITON_DECODE.format(serving["triton_decode_max_tokens"]) in log, \
            "serving.triton_decode_max_tokens is set but the plugin did not install it"
        if serving.get("triton_decode_verify"):
            assert lines.LOG_TRITON_VERIFY.format(serving["triton_decode_max_tokens"]) in log, \
                "serving.triton_decode_verify is set but the plugin did not route verify steps"
    if serving.get("early_first_token"):
        assert lines.LOG_EARLY_FIRST_TOKEN in log, \
            "serving.early_first_token is set but the plugin did not install it"
    if serving.get("cudagraph_mode") == "full_and_decode":
        assert lines.LOG_DECODE_GRAPHS in log, \
            "serving.cudagraph_mode is full_and_decode but the plugin did not install its graphs"
    if serving.get("parallel_compile") and "saved AOT compiled function" in log:
        # this boot compiled (no warm cache matched), so Inductor's kernels were built on the pool
        assert line_pattern(lines.LOG_COMPILE_POOL).search(log), \
            "serving.parallel_compile is set but this boot compiled without the plugin's pool"
    # the render decides this part from the draft's heads, so the suite reads the unit's switch
    env = root.run(f"cat {profile['paths']['units']}/{name}.env").stdout
    if "INFERENCE_IMAGE_DRAFT_SCHEDULE=1" in env.splitlines():
        assert lines.LOG_DRAFT_SCHEDULE in log, \
            "the draft's heads differ from the target's but the plugin did not install its schedule"
