from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, edit

from inference_image.profiles import (
    FLAG_NAME,
    OWNED_FLAGS,
    TRUST_FLAGS,
    ProfileErrors,
    default_profiles_dir,
    extra_args_problems,
    list_tiers,
    resolve,
)
from inference_image.render import node_argv, vllm_argv

TIERS = ["cpu", "cpu-2node", "h100", "h100x8", "h200", "h200x8", "l40s", "rtx4000ada", "rtx6000ada"]


def errors_of(tier: str, pdir: Path, **kw) -> list[str]:
    with pytest.raises(ProfileErrors) as exc:
        resolve(tier, pdir, **kw)
    return [str(e) for e in exc.value.errors]


def test_every_shipped_tier_is_valid():
    assert list_tiers(ROOT / "profiles") == TIERS
    for tier in TIERS:
        r = resolve(tier, ROOT / "profiles")
        assert r.profile.tier == tier


def test_derived_capabilities():
    h100, l40s, cpu = (resolve(t, ROOT / "profiles") for t in ("h100", "l40s", "cpu"))
    assert (h100.fa3_available, h100.fp8_available) == (True, True)
    assert (l40s.fa3_available, l40s.fp8_available) == (False, True)
    assert (cpu.fa3_available, cpu.fp8_available) == (False, False)


@pytest.mark.parametrize("tier", ["h100x8", "h200x8"])
def test_eight_gpu_tiers_are_four_instances_at_tp2_on_disjoint_gpus(tier):
    r = resolve(tier, ROOT / "profiles")
    assert [i.gpu_ids for i in r.instances] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [i.port for i in r.instances] == [8100, 8101, 8102, 8103]


def test_extends_merges_base_values_and_tier_wins():
    r = resolve("h100", ROOT / "profiles")
    assert r.profile.router.port == 8000  # from _base.yaml
    assert r.profile.versions.vllm == "0.26.0"  # from _gpu.yaml
    assert r.profile.model.kv_cache_dtype == "fp8"
    assert r.files[0].endswith("_base.yaml") and r.files[-1].endswith("h100.yaml")


def test_unknown_tier_lists_valid_ones(pdir):
    (err,) = errors_of("h300", pdir)
    assert "unknown tier 'h300'" in err
    assert "use one of: cpu, cpu-2node, h100, h100x8, h200, h200x8, l40s, rtx4000ada, rtx6000ada" in err


def test_unknown_field_names_file_field_and_valid_fields(pdir):
    edit(pdir / "h100.yaml", "  max_num_seqs: 96", "  max_num_seq: 96")
    errs = errors_of("h100", pdir)
    assert any(e.startswith(f"{pdir / 'h100.yaml'}: serving.max_num_seq: unknown field")
               and "max_num_seqs" in e for e in errs), errs


def test_error_in_base_file_names_the_base_file(pdir):
    edit(pdir / "_base.yaml", "  region: tor1\n", "  region: tor1\nrouter:\n  policy: fastest\n")
    errs = errors_of("l40s", pdir)
    assert any(e.startswith(f"{pdir / '_base.yaml'}: router.policy: bad value \"fastest\"")
               for e in errs), errs


def test_instances_times_tp_must_equal_gpu_count(pdir):
    edit(pdir / "h100x8.yaml", "  instances: 4", "  instances: 3")
    (err,) = errors_of("h100x8", pdir)
    assert "serving.instances: instances (3) x tensor_parallel_size (2) = 6 GPUs but " \
           "hardware.gpu_count is 8" in err
    assert "Fix: make instances x tensor_parallel_size equal 8" in err


def test_tensor_parallel_leaves_room_outside_vllms_share(pdir):
    """The h100x8 instance at gpu_memory_utilization 0.92 ran out of memory capturing its
    CUDA graphs on two H100s; 0.88 started (docs/decisions.md#memory-rule). A TP=1 tier keeps _gpu.yaml's 0.92
    (the h100 tier
    serves at it)."""
    (err,) = errors_of("h100x8", pdir, overrides=["serving.gpu_memory_utilization=0.92"])
    assert "serving.gpu_memory_utilization: 0.92 leaves 6.4 GiB a GPU outside vLLM's share at " \
           "TP=2" in err, err
    assert "Fix: set serving.gpu_memory_utilization at most 0.88 on 79.6 GiB" in err
    assert resolve("h100x8", pdir).profile.serving.gpu_memory_utilization == 0.88
    resolve("h100", pdir, overrides=["serving.gpu_memory_utilization=0.92"])


def test_fa3_on_ada_is_refused(pdir):
    edit(pdir / "l40s.yaml", "  max_num_seqs: 40", "  max_num_seqs: 40\n  flash_attention_3: true")
    (err,) = errors_of("l40s", pdir)
    assert "serving.flash_attention_3: FlashAttention 3 runs on Hopper" in err
    assert "NVIDIA L40S is 8.9" in err and "Fix: set serving.flash_attention_3: false" in err


def test_fp8_gemm_dispatch_needs_fp8_weights_and_vllms_kernel_choice(pdir):
    (err,) = errors_of("cpu", pdir, overrides=["serving.fp8_gemm_dispatch=true"])
    assert "serving.fp8_gemm_dispatch: the dispatch wraps vLLM's Cutlass FP8 GEMM" in err
    assert "quantization is none" in err and "Fix: set serving.fp8_gemm_dispatch: false" in err
    (err,) = errors_of("h100", pdir, overrides=["serving.linear_backend=torch"])
    assert "serving.fp8_gemm_dispatch" in err and "linear_backend torch" in err


def test_whole_step_graphs_need_the_flash_attention_3_backend(pdir):
    for mode in ("full", "full_and_decode"):
        (err,) = errors_of("l40s", pdir, overrides=[f"serving.cudagraph_mode={mode}"])
        assert err.startswith(
            "--set: serving.cudagraph_mode: full graphs for steps that read prompts")
        assert ("Fix: set serving.cudagraph_mode: full_and_piecewise, or "
                "serving.flash_attention_3: true") in err
    full = resolve("h100", pdir, overrides=["serving.cudagraph_mode=full"])
    assert full.profile.serving.cudagraph_mode == "full"
    (err,) = errors_of("h100", pdir, overrides=["serving.cudagraph_mode=piecewise"])
    assert "serving.cudagraph_mode: bad value \"piecewise\"" in err


def test_triton_decode_attention_needs_the_flash_attention_backend(pdir):
    (err,) = errors_of("l40s", pdir, overrides=["serving.triton_decode_max_tokens=8"])
    assert "serving.triton_decode_max_tokens: small decode batches are routed inside" in err
    assert "Fix: set serving.triton_decode_max_tokens: 0, or serving.flash_attention_3: true" in err
    (err,) = errors_of("h100", pdir, overrides=["serving.triton_decode_max_tokens=65"])
    assert "serving.triton_decode_max_tokens" in err and "64" in err


def test_triton_verify_needs_a_token_limit(pdir):
    (err,) = errors_of("h100", pdir, overrides=["serving.triton_decode_max_tokens=0",
                                                "serving.triton_decode_verify=true"])
    assert "serving.triton_decode_verify: verify steps go to Triton only within" in err
    assert "Fix: set serving.triton_decode_max_tokens (8 on the h100 profile)" in err
    assert resolve("h100", pdir).profile.serving.triton_decode_verify  # as the profile ships


def test_ngram_gpu_needs_a_gpu_and_no_draft(pdir):
    (err,) = errors_of("cpu", pdir, overrides=["model.speculative.method=ngram_gpu"])
    assert "model.speculative.method: ngram_gpu matches n-grams on a GPU" in err
    assert "Fix: use method: ngram" in err
    # the h100's EAGLE-3 head left in place: a lookup has no draft model to load
    (err,) = errors_of("h100", pdir, overrides=["model.speculative.method=ngram_gpu"])
    assert "model.speculative.draft: method ngram_gpu uses no draft model" in err


def test_early_first_token_needs_the_plugin_a_gpu_tier_loads(pdir):
    (err,) = errors_of("cpu", pdir, overrides=["serving.early_first_token=true"])
    assert "serving.early_first_token: the rule is part of the project's vLLM plugin" in err
    assert "Fix: set serving.early_first_token: false" in err
    assert resolve("h100", pdir, overrides=["serving.early_first_token=true"]).profile.serving \
        .early_first_token


def test_fp8_below_compute_capability_8_9_is_refused(pdir):
    a100 = (pdir / "l40s.yaml").read_text().replace("tier: l40s", "tier: a100").replace(
        'compute_capability: "8.9"', 'compute_capability: "8.0"').replace(
        "gpu_model: NVIDIA L40S", "gpu_model: NVIDIA A100-SXM4-80GB")
    (pdir / "a100.yaml").write_text(a100)
    errs = errors_of("a100", pdir)
    assert any("model.quantization: FP8 needs compute capability >= 8.9; "
               "NVIDIA A100-SXM4-80GB is 8.0" in e for e in errs), errs
    assert any("model.kv_cache_dtype: FP8 KV cache needs compute capability >= 8.9" in e
               for e in errs), errs


def test_model_that_does_not_fit_says_by_how_much(pdir):
    edit(pdir / "rtx4000ada.yaml", "  max_num_seqs: 24", "  max_num_seqs: 64")
    (err,) = errors_of("rtx4000ada", pdir)
    assert "llama-3.1-8b-instruct does not fit one GPU by 8.1 GiB" in err
    assert "KV 16.0 for 64 seqs x 4096 tokens" in err
    assert "Fix: lower serving.max_num_seqs to 31" in err



def test_kv_cache_sized_for_a_shorter_context_admits_more_sequences(pdir):
    # rtx4000ada: 24 x 4096 tokens is its most; 64 sequences fit at 1536 tokens each
    edit(pdir / "rtx4000ada.yaml", "  max_num_seqs: 24", "  max_num_seqs: 64\n  kv_context_per_seq: 1536")
    fit = resolve("rtx4000ada", pdir).fit
    assert fit is not None and fit.kv_gib == pytest.approx(64 * 1536 * 65536 / 1024**3)
    edit(pdir / "rtx4000ada.yaml", "  kv_context_per_seq: 1536", "  kv_context_per_seq: 2048")
    (err,) = errors_of("rtx4000ada", pdir)
    assert "for 64 seqs x 2048 tokens" in err
    assert "Fix: lower serving.max_num_seqs to 63, or kv_context_per_seq" in err


def test_kv_context_per_seq_above_max_model_len_is_one_line(pdir):
    edit(pdir / "rtx4000ada.yaml", "  max_num_seqs: 24", "  max_num_seqs: 24\n  kv_context_per_seq: 5000")
    (err,) = errors_of("rtx4000ada", pdir)
    assert err.endswith("serving.kv_context_per_seq: 5000 is more than max_model_len (4096): no "
                        "sequence is longer. Fix: set at most 4096, or leave it out to size for "
                        "max_model_len"), err

def test_weights_alone_too_big(pdir):
    edit(pdir / "rtx4000ada.yaml", "  target: llama-3.1-8b-instruct", "  target: llama-3.3-70b-instruct")
    (err,) = errors_of("rtx4000ada", pdir)
    assert "the weights alone do not fit" in err


def test_duplicate_ports(pdir):
    edit(pdir / "cpu.yaml", "  instances: 2", "  instances: 2\n  ports: [8100, 8100]")
    (err,) = errors_of("cpu", pdir)
    assert "serving.ports: port 8100 is used by both serving instance vllm-0 and " \
           "serving instance vllm-1" in err


def test_instance_port_clashing_with_router(pdir):
    edit(pdir / "cpu.yaml", "  instances: 2", "  instances: 2\n  base_port: 7999")
    (err,) = errors_of("cpu", pdir)
    assert "port 8000 is used by both serving instance vllm-1 and router.port" in err


def test_yaml_syntax_error_is_one_line(pdir):
    (pdir / "h100.yaml").write_text("tier: h100\nserving: [unclosed\n")
    (err,) = errors_of("h100", pdir)
    assert "YAML syntax error at line" in err and "Fix: fix the YAML syntax" in err


def test_missing_required_field(pdir):
    edit(pdir / "h200.yaml", "  max_model_len: 8192\n", "")
    (err,) = errors_of("h200", pdir)
    assert err.startswith(f"{pdir / 'h200.yaml'}: serving.max_model_len: required field is missing")


def test_speculative_draft_rules(pdir):
    edit(pdir / "h100.yaml", "    draft: llama-3.1-8b-eagle3\n", "")
    (err,) = errors_of("h100", pdir)
    assert "model.speculative.draft: method eagle3 needs a draft model" in err


def test_overrides_are_validated_like_the_file():
    errs = errors_of("h100", ROOT / "profiles", overrides=["serving.flash_attention_3=maybe"])
    assert errs[0].startswith("--set: serving.flash_attention_3: bad value \"maybe\"")
    r = resolve("h100", ROOT / "profiles", overrides=["serving.max_num_seqs=64"])
    assert r.profile.serving.max_num_seqs == 64


def test_every_error_is_reported_at_once(pdir):
    edit(pdir / "l40s.yaml", "  max_num_seqs: 40",
         "  max_num_seqs: 40\n  flash_attention_3: true\n  tensor_parallel_size: 2")
    errs = errors_of("l40s", pdir)
    assert len(errs) >= 2


def test_a_target_scenario_bench_does_not_know_is_one_line(pdir, capsys):
    """Every reader of a scenario name (profile targets, bench, proof) says it the same way."""
    (err,) = errors_of("h100", pdir, overrides=["targets.scenario=essay"])
    assert "targets.scenario" in err and "'essay' is not a bench scenario: use one of chat" in err
    from inference_image import cli
    assert cli.main(["bench", "run", "--scenario", "chat", "--scenario", "essay"]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: --scenario 'essay' is not a bench scenario: use one of chat, summarization, "
        "long-form, shared-prefix")


@pytest.mark.parametrize("sets", [[], ["serving.api_servers=2"], ["serving.stream_interval=4"]])
def test_every_flag_the_render_writes_is_one_extra_args_may_not_repeat(sets: list[str]) -> None:
    """OWNED_FLAGS is the one table of flag to field: every flag vllm_argv (and a node's argv)
    writes is in it, so the extra-args check refuses it with the field to set instead."""
    written: dict[str, str] = {}
    for tier in list_tiers(default_profiles_dir()):
        r = resolve(tier, overrides=sets)
        for inst in r.instances:
            argvs = [vllm_argv(r, inst)] + ([node_argv(r, inst)] if r.profile.serving.nodes > 1 else [])
            for argv in argvs:
                written |= {a: tier for a in argv[3:] if a.startswith("--")}
    assert "--max-num-seqs" in written
    if "serving.api_servers=2" in sets:
        assert "--api-server-count" in written
    assert set(written) - set(OWNED_FLAGS) == set(), {f: written[f] for f in set(written) - set(OWNED_FLAGS)}
    for flag in written:
        problems = extra_args_problems([flag, "1"])
        assert problems and problems[0][0] == 0, f"extra_args {flag} is not refused"


@pytest.mark.parametrize(("setting", "why"), [
    ("router.rate_limit_rps=true", "a boolean where a number belongs"),
    ("router.rate_limit_rps=1:00", "not a plain decimal number"),  # YAML 1.1: 60
    ("router.rate_limit_rps=017", "not a plain decimal number"),   # YAML 1.1: octal 15
    ("serving.max_num_seqs=0x10", "not a plain decimal number"),
    ("serving.max_num_seqs=" + "9" * 40, "not a plain decimal number"),
    ("serving.flash_attention_3=yes", "not true or false"),        # YAML 1.1: true
    ("serving.flash_attention_3=1", "not true or false"),
    ("serving.gpu_memory_utilization=.inf", "not a plain decimal number"),
])
def test_numbers_and_booleans_are_read_as_written_never_as_yaml_1_1_guesses(
        setting: str, why: str) -> None:
    with pytest.raises(ProfileErrors) as exc:
        resolve("h100", overrides=[setting])
    field = setting.split("=")[0]
    assert f"{field}: bad value" in str(exc.value) and why in str(exc.value)


def test_a_profile_file_reads_yaml_scalars_by_the_core_schema(tmp_path: Path) -> None:
    from inference_image.yaml_input import bounded_yaml
    got = bounded_yaml("a: true\nb: yes\nc: 017\nd: 1:00\ne: 0x10\nf: 1.5\ng: 1e3\nh: ~\n"
                       "i: 2026-11-29\nj: .inf\nk: -12\nl: on\nm: 5.\n")
    assert got == {"a": True, "b": "yes", "c": "017", "d": "1:00", "e": "0x10", "f": 1.5,
                   "g": 1000.0, "h": None, "i": "2026-11-29", "j": ".inf", "k": -12, "l": "on",
                   "m": 5.0}
    # in a file, as on the command line: the field and the fix, no guess
    pdir = tmp_path / "profiles"
    shutil.copytree(ROOT / "profiles", pdir)
    edit(pdir / "h100.yaml", "  max_num_seqs: 96", "  max_num_seqs: 0140")
    with pytest.raises(ProfileErrors, match=r"serving.max_num_seqs: bad value \"0140\""):
        resolve("h100", pdir)


def test_a_fleet_of_1_00_workers_is_refused_not_read_as_60(tmp_path: Path) -> None:
    from inference_image.ops import fleet
    f = tmp_path / "fleet.yaml"
    f.write_text("name: f\ntier: h100\nworkers: 1:00\nsnapshot: 123\n")
    with pytest.raises(ProfileErrors, match="workers: bad value \"1:00\""):
        fleet.load(f)


# as YAML's double-quoted escapes write them (a raw U+0085 is a line break YAML folds)
@pytest.mark.parametrize("sep", ["\\L", "\\P", "\\N"])
def test_a_unicode_line_separator_in_any_string_is_refused(sep: str) -> None:
    for setting in (f'description="a{sep}b"', f'serving.extra_args=["--seed", "1{sep}2"]'):
        with pytest.raises(ProfileErrors, match="Unicode line or paragraph separator"):
            resolve("cpu", overrides=[setting])


def test_the_lab_reads_an_args_file_as_inference_run_does(tmp_path: Path) -> None:
    from inference_lab.proof_probes import with_acceptance
    args = tmp_path / "vllm-0.args"
    args.write_text('--speculative-config\n{"method":"eagle3"}\n--x\na\u2028b\n')
    with_acceptance(args, 2.0)
    lines = args.read_text().split("\n")
    assert lines[2:4] == ["--x", "a\u2028b"] and lines[-1] == ""  # still one argument


def test_extra_args_may_add_the_listed_flags_with_values_of_their_kind() -> None:
    args = ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json", "--seed", "7",
            "--override-generation-config", '{"temperature": 0.6}', "--scheduling-policy=priority",
            "--cpu_offload_gb", "1.5"]
    assert extra_args_problems(args) == []
    r = resolve("cpu", overrides=[f"serving.extra_args={json.dumps(args)}"])
    assert list(r.profile.serving.extra_args) == args


@pytest.mark.parametrize(("args", "at", "why"), [
    # flags that widen trust are refused because they are not listed, not because they are named
    (["--trust-request-chat-template"], 0, "not a flag a profile may add"),
    (["--logits-processor-pattern", "x"], 0, "not a flag a profile may add"),
    (["--kv-transfer-config", '{"kv_connector_module_path": "evil"}'], 0, "not a flag"),
    (["--otlp-traces-endpoint", "http://x"], 0, "not a flag a profile may add"),
    (["--data-parallel-address", "0.0.0.0"], 0, "not a flag a profile may add"),
    (["--enforce-eager", "/models/evil"], 1, "vLLM would read it as the model"),
    (["--seed", "1e3"], 1, "--seed takes a whole number"),
    (["--seed=-1"], 0, "--seed takes a whole number"),
    (["--enforce-eager=1"], 0, "--enforce-eager is a switch"),
    (["--generation-config", "/etc"], 1, "takes one of auto, vllm"),
    (["--override-generation-config", "[1]"], 1, "one JSON object"),
    (["--enable-auto"], 0, "written in full: --enable-auto-tool-choice"),
    (["--tool-call-parser"], 0, "--tool-call-parser needs a value"),
    (["--tool-call-parser", "../x"], 1, "takes a name"),
    (["--host", "0.0.0.0"], 0, "set by the render"),
    (["--trust-remote-code"], 0, "runs Python from the model's repository"),
])
def test_extra_args_refuse_all_but_the_listed_flags_naming_the_element(
        args: list[str], at: int, why: str) -> None:
    problems = extra_args_problems(args)
    assert problems and problems[0][0] == at and why in problems[0][1], problems
    with pytest.raises(ProfileErrors, match=rf"serving\.extra_args\.{at}: "):
        resolve("cpu", overrides=[f"serving.extra_args={json.dumps(args)}"])


def test_every_listed_extra_flag_is_one_vllm_reads_and_none_the_render_owns() -> None:
    from inference_image.profiles import EXTRA_FLAGS
    assert not set(EXTRA_FLAGS) & (set(OWNED_FLAGS) | set(TRUST_FLAGS))
    assert all(FLAG_NAME.match(f) and f == f.lower() for f in EXTRA_FLAGS)


def test_a_head_made_for_another_family_is_refused_naming_both_vocabularies() -> None:
    """The README's other model on a tier whose EAGLE-3 head is made for Llama: the render would
    point DRAFT_PATH at a head proposing Llama token ids to Qwen."""
    with pytest.raises(ProfileErrors, match=r"model\.speculative\.draft: llama-3\.1-8b-eagle3 "
                       r"proposes tokens of a 128256-token vocabulary; qwen2\.5-7b-instruct's "
                       r"has 152064"):
        resolve("h100", overrides=["model.target=qwen2.5-7b-instruct", "model.quantization=fp8"])
    r = resolve("h100", overrides=["model.target=qwen2.5-7b-instruct", "model.quantization=fp8",
                                   "model.speculative.method=none", "model.speculative.draft=null"])
    assert r.draft is None


def test_every_field_of_every_model_in_the_schema_is_described() -> None:
    """What `profiles --fields` and the reference print of a field is its description: none is
    bare, the catalog's included."""
    import inspect

    from pydantic import BaseModel

    from inference_image import schema
    bare = [f"{name}.{f}" for name, cls in vars(schema).items()
            if inspect.isclass(cls) and issubclass(cls, BaseModel)
            and cls.__module__ == schema.__name__
            for f, info in cls.model_fields.items() if not info.description]
    assert bare == []
