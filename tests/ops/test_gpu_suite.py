"""The gpu suite's reading of a vLLM instance's journal (image_tests/test_gpu.py), on the log lines
an H200 and an H100 printed (their records' `backends`, linked from
docs/decisions.md#a-vllm-plugin-that-picks-the-fp8-gemm-per-batch-size; the table at the image's
path): the check passes on the image's own table and fails, naming the fix, on another chip's;
each plugin part the profile turns on must have logged."""

from __future__ import annotations

import importlib.util
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / "image_tests/test_gpu.py")
assert spec and spec.loader
gpu_suite = importlib.util.module_from_spec(spec)
with warnings.catch_warnings():  # its marks are registered by image_tests/conftest.py, not here
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    spec.loader.exec_module(gpu_suite)

LOG = """Using FlashAttention version 3
inference-image FP8 dispatch installed (table: {table}, measured on {device})
Selected InferenceImageFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8
"""
H200_TABLE = "/opt/vllm/lib/python3.12/site-packages/inference_image_vllm/tables/nvidia-h200.json"
PROFILE = {"profile": {"serving": {"flash_attention_3": True, "fp8_gemm_dispatch": True},
                       "model": {"quantization": "fp8-checkpoint"}},
           "instances": [{"name": "vllm-0"}], "paths": {"units": "/etc/inference-image/units"}}


class Host:
    """The instance's journal and its rendered environment file, as the image has them."""

    def __init__(self, log: str, env: str = "INFERENCE_UNIT=vllm-0\n") -> None:
        self.log, self.env = log, env

    def run(self, cmd: str) -> Any:
        if cmd == "cat /etc/inference-image/units/vllm-0.env":
            return SimpleNamespace(stdout=self.env, rc=0, stderr="")
        assert cmd.startswith("journalctl -u vllm@vllm-0 ")
        return SimpleNamespace(stdout=self.log, rc=0, stderr="")


def check(log: str) -> None:
    gpu_suite.test_vllm_log_shows_fa3_and_fp8(Host(log), PROFILE, {"gpu_model": "NVIDIA H200"})


def test_the_tiers_own_table_passes() -> None:
    check(LOG.format(table=H200_TABLE, device="NVIDIA H200"))


def test_another_chips_table_fails_with_the_fix() -> None:
    hopper = H200_TABLE.replace("nvidia-h200", "hopper")
    with pytest.raises(AssertionError, match=r"measured on NVIDIA H100 80GB HBM3, not NVIDIA H200: "
                       r"tune one on this GPU"):
        check(LOG.format(table=hopper, device="NVIDIA H100 80GB HBM3"))


def test_no_table_and_no_plugin_fail() -> None:
    with pytest.raises(AssertionError, match="no kernel table for this GPU"):
        check(LOG.format(table="none: /x.json was measured on compute capability 8.9", device="-"))
    with pytest.raises(AssertionError, match="vLLM chose another FP8 kernel"):
        check(LOG.format(table=H200_TABLE, device="NVIDIA H200").replace(
            "InferenceImageFP8ScaledMMLinearKernel", "CutlassFP8ScaledMMLinearKernel"))


# the h100 profile as committed then (eft-on-3): the two plugin parts beside the FP8 dispatch
H100_LOG = LOG.format(table=H200_TABLE.replace("nvidia-h200", "hopper"),
                      device="NVIDIA H100 80GB HBM3") + """\
(EngineCore pid=3646) INFO inference-image: decode batches of <= 8 tokens, one query token a \
sequence, use Triton attention inside the FlashAttention backend
(EngineCore pid=3646) INFO inference-image: a step that only prefills returns its first tokens \
before the next step is launched
"""
H100 = {"profile": {"serving": {**PROFILE["profile"]["serving"], "triton_decode_max_tokens": 8,
                                "early_first_token": True},
                    "model": PROFILE["profile"]["model"]},
        "instances": PROFILE["instances"], "paths": PROFILE["paths"]}


def check_h100(log: str) -> None:
    gpu_suite.test_vllm_log_shows_fa3_and_fp8(Host(log), H100,
                                              {"gpu_model": "NVIDIA H100 80GB HBM3"})


def test_the_plugin_parts_the_profile_turns_on_logged() -> None:
    check_h100(H100_LOG)
    with pytest.raises(AssertionError, match="triton_decode_max_tokens is set but"):
        check_h100(H100_LOG.replace("<= 8 tokens", "<= 4 tokens"))
    with pytest.raises(AssertionError, match="early_first_token is set but"):
        check_h100(H100_LOG.replace("a step that only prefills", "a step"))


# plugin parts the h100 profile turns on (the section after
# docs/decisions.md#whole-step-graphs-with-decode-graphs-of-their-own-servingcudagraph_mode-h100
# and that one): the setting, the line the part logged there, and what the suite says when the line is missing
PARTS = {
    "decode-graphs": ({"cudagraph_mode": "full_and_decode"},
                      "uniform decode steps get whole-step graphs of their own beside FULL's "
                      "mixed-batch graphs", "full_and_decode but the plugin did not install"),
    "triton-verify": ({"triton_decode_verify": True},
                      "verify steps of <= 8 tokens use Triton's split-KV attention inside the "
                      "FlashAttention backend", "triton_decode_verify is set but"),
}


@pytest.mark.parametrize("part", list(PARTS))
def test_a_plugin_part_the_profile_turns_on_is_logged(part: str) -> None:
    setting, line, missing = PARTS[part]
    profile = {**H100, "profile": {**H100["profile"], "serving": {
        **H100["profile"]["serving"], **setting}}}

    def check(text: str) -> None:
        gpu_suite.test_vllm_log_shows_fa3_and_fp8(Host(text), profile,
                                                  {"gpu_model": "NVIDIA H100 80GB HBM3"})

    check(H100_LOG + f"(EngineCore pid=995) INFO inference-image: {line}\n")
    with pytest.raises(AssertionError, match=missing):
        check(H100_LOG)
    check_h100(H100_LOG)  # the part off: no such line asked for


def test_a_draft_of_other_heads_has_the_plugins_schedule_where_the_render_turned_it_on() -> None:
    """The h200 and h100x8 renders turn the draft schedule on (their EAGLE-3 head has 48 query
    heads to the 70B's 64); the part's line must then be in the instance's log."""
    h200 = LOG.format(table=H200_TABLE, device="NVIDIA H200")
    line = ("(EngineCore pid=1480) INFO 11-27 11:16:26 [schedule.py:66] inference-image: "
            "FlashAttention layers of other heads than the target's (a draft's) run without the "
            "target's FA3 schedule\n")  # an H200's log
    switch = "INFERENCE_UNIT=vllm-0\nINFERENCE_IMAGE_DRAFT_SCHEDULE=1\n"

    def check(log: str, env: str) -> None:
        gpu_suite.test_vllm_log_shows_fa3_and_fp8(Host(log, env), PROFILE,
                                                  {"gpu_model": "NVIDIA H200"})

    check(h200 + line, switch)
    with pytest.raises(AssertionError, match="did not install its schedule"):
        check(h200, switch)
    check(h200, "INFERENCE_UNIT=vllm-0\n")  # switch off (the h100's 8B head): no line asked for


def test_a_boot_that_compiled_built_inductors_kernels_on_the_pool_where_the_profile_says_so() -> None:
    """serving.parallel_compile: a boot that compiled (vLLM saved an AOT-compiled function) must
    have logged the plugin's pool; a boot that loaded its compiled model from a warm cache starts
    none (the lines of such boots' logs; docs/decisions.md#ready-time)."""
    compiled = ("(EngineCore pid=1803) INFO 12-01 19:05:11 [decorators.py:708] saved AOT compiled "
                "function to /var/cache/inference-image/vllm/torch_compile_cache/torch_aot_compile"
                "/c7/rank_0_0/model\n")
    pool = ("(EngineCore pid=1803) INFO 12-01 19:04:38 [compile_pool.py:59] inference-image: "
            "Inductor compiles this start's kernels on 16 worker processes until the model is "
            "warmed up\n")
    profile = {**H100, "profile": {**H100["profile"], "serving": {
        **H100["profile"]["serving"], "parallel_compile": True}}}

    def check(log: str, prof: dict[str, Any] = profile) -> None:
        gpu_suite.test_vllm_log_shows_fa3_and_fp8(Host(log), prof,
                                                  {"gpu_model": "NVIDIA H100 80GB HBM3"})

    check(H100_LOG + pool + compiled)
    check(H100_LOG)  # loaded from the warm cache: no compile, no pool
    with pytest.raises(AssertionError, match="compiled without the plugin's pool"):
        check(H100_LOG + compiled)
    check(H100_LOG + compiled, H100)  # the setting off: no pool asked for
