from __future__ import annotations

import filecmp
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, edit, free_port, runtime

from inference_image import render as render_mod
from inference_image.profiles import ProfileErrors, list_tiers, resolve
from inference_image.render import PATHS, RenderError, render, vllm_argv

GOLDEN = ROOT / "tests" / "golden"


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("tier", ["cpu", "h100", "cpu-2node"])
def test_the_render_writes_data_and_configuration_and_no_program(tmp_path: Path, tier: str) -> None:
    """The machine's programs come from its runtime's wheel (machine/): the render holds no
    program beyond the login banner's one line of glue, and no Python anywhere."""
    r = tmp_path / "r"
    render(resolve(tier, ROOT / "profiles"), r)
    executable = [str(f.relative_to(r)) for f in r.rglob("*") if f.is_file() and f.stat().st_mode & 0o111]
    assert executable == ["etc/update-motd.d/90-inference-image"], executable
    glue = [ln for ln in (r / executable[0]).read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    assert glue == [f"exec {PATHS['startup']} motd 2>/dev/null || true"], glue
    assert not (r / "usr").exists()
    for f in r.rglob("*"):
        if f.is_file():
            assert not any(m in f.read_text() for m in ("<<'PY'", "python3 -c", "python3 -")), f


@pytest.mark.parametrize("tier", list_tiers(ROOT / "profiles"))
def test_render_matches_golden(tier, tmp_path):
    """Golden files: regenerate with `make golden` after an intended change, and review the diff."""
    out = tmp_path / tier
    render(resolve(tier, ROOT / "profiles"), out)
    if os.environ.get("UPDATE_GOLDEN"):
        subprocess.run(["rm", "-rf", str(GOLDEN / tier)], check=True)
        subprocess.run(["cp", "-a", str(out), str(GOLDEN / tier)], check=True)
    cmp = filecmp.dircmp(out, GOLDEN / tier)
    assert tree(out) == tree(GOLDEN / tier), (cmp.diff_files, cmp.left_only, cmp.right_only)


def test_render_is_deterministic(tmp_path):
    r = resolve("h100x8", ROOT / "profiles")
    render(r, tmp_path / "a")
    render(resolve("h100x8", ROOT / "profiles"), tmp_path / "b")
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    assert os.stat(tmp_path / "a/etc/update-motd.d/90-inference-image").st_mode & 0o777 == 0o755


def test_rerender_replaces_previous_output(tmp_path):
    render(resolve("h100", ROOT / "profiles"), tmp_path / "o")
    render(resolve("cpu", ROOT / "profiles"), tmp_path / "o")
    assert not (tmp_path / "o/etc/inference-image/units/vllm-1.env").read_text().count("CUDA")


def test_refuses_to_overwrite_foreign_directory(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o/notes.txt").write_text("mine")
    with pytest.raises(RenderError, match="is not a render output"):
        render(resolve("cpu", ROOT / "profiles"), tmp_path / "o")
    assert (tmp_path / "o/notes.txt").read_text() == "mine"


def test_bad_profile_leaves_nothing(pdir, tmp_path):
    edit(pdir / "h100.yaml", "  instances: 1", "  instances: 2")
    cmd = [sys.executable, "-m", "inference_image.cli", "--profiles-dir", str(pdir),
           "render", "--profile", "h100", "--out", str(tmp_path / "o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profiles"]  # no out dir, no temp dir


def test_h100_instance_flags(tmp_path):
    render(resolve("h100", ROOT / "profiles"), tmp_path)
    args = (tmp_path / "etc/inference-image/units/vllm-0.args").read_text().splitlines()
    for flag, val in [("--kv-cache-dtype", "fp8"),
                      ("--attention-backend", "FLASH_ATTN"), ("--host", "${INFERENCE_HOST}"),
                      ("--attention-config", '{"flash_attn_version":3}')]:
        assert args[args.index(flag) + 1] == val
    # FP8 comes from the checkpoint (static per-tensor scales), not from online quantization.
    assert "--quantization" not in args
    xv = json.loads((tmp_path / "ansible/extra-vars.json").read_text())
    assert xv["models_list"][0]["hub_id"] == "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "${DRAFT_PATH}", "num_speculative_tokens": 3}
    env = (tmp_path / "etc/inference-image/units/vllm-0.env").read_text()
    assert "CUDA_VISIBLE_DEVICES=0\n" in env and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert "INFERENCE_HOST=127.0.0.1\n" in env  # loopback, but on a fleet worker (below)
    assert "INFERENCE_IMAGE_FP8_DISPATCH=1\n" in env  # serving.fp8_gemm_dispatch: the plugin's switch
    assert "INFERENCE_IMAGE_TRITON_DECODE_TOKENS=8\n" in env  # serving.triton_decode_max_tokens
    assert "INFERENCE_IMAGE_EARLY_FIRST_TOKEN=1\n" in env  # serving.early_first_token


def test_gpu_instances_sample_without_a_compiler(tmp_path):
    """FlashInfer's top-p sampler compiles itself with nvcc at first use; no image has nvcc."""
    for tier in ("h100", "h200", "h100x8", "l40s", "cpu"):
        out = tmp_path / tier
        render(resolve(tier, ROOT / "profiles"), out)
        for env_file in (out / "etc/inference-image/units").glob("vllm-*.env"):
            lines = env_file.read_text().splitlines()
            assert ("VLLM_USE_FLASHINFER_SAMPLER=0" in lines) == (tier != "cpu"), env_file
            # vllm-cpu's rejection sampler: the plugin's guard for a step that drafted nothing
            assert ("INFERENCE_IMAGE_EMPTY_TOP_K=1" in lines) == (tier == "cpu"), env_file
    out = tmp_path / "cpu-none"
    render(resolve("cpu", ROOT / "profiles", overrides=["model.speculative.method=none"]), out)
    assert "INFERENCE_IMAGE_EMPTY_TOP_K" not in (
        out / "etc/inference-image/units/vllm-0.env").read_text()


def test_prompt_lookup_on_the_gpu_renders_without_a_draft(tmp_path):
    r = resolve("h100", ROOT / "profiles", overrides=["model.speculative.method=ngram_gpu",
                                                      "model.speculative.draft=null"])
    render(r, tmp_path)
    args = (tmp_path / "etc/inference-image/units/vllm-0.args").read_text().splitlines()
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert "DRAFT_PATH" not in (tmp_path / "etc/inference-image/units/vllm-0.env").read_text()


def test_a_tensor_parallel_instance_shards_its_eagle3_head_like_its_target(tmp_path):
    """vLLM 0.26 loads an EAGLE-3 head with the target's parallel config (Model Runner V2) and
    refuses a draft model at another TP (the V1 runner): the render names no draft TP, so what
    the command line says is what runs (it said 1, which no runner did)."""
    r = resolve("h100x8", ROOT / "profiles", overrides=[
        "model.speculative.method=eagle3", "model.speculative.draft=llama-3.3-70b-eagle3"])
    render(r, tmp_path)
    args = (tmp_path / "etc/inference-image/units/vllm-0.args").read_text().splitlines()
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "${DRAFT_PATH}", "num_speculative_tokens": 3}


def test_online_fp8_tier_sets_the_quantization_flag(tmp_path):
    render(resolve("l40s", ROOT / "profiles"), tmp_path)
    args = (tmp_path / "etc/inference-image/units/vllm-0.args").read_text().splitlines()
    assert args[args.index("--quantization") + 1] == "fp8"
    # The plugin's table was measured on Hopper only: Ada tiers keep vLLM's own FP8 kernel.
    env = (tmp_path / "etc/inference-image/units/vllm-0.env").read_text()
    assert "INFERENCE_IMAGE_FP8_DISPATCH" not in env
    assert "INFERENCE_IMAGE_TRITON_DECODE_TOKENS" not in env  # FA3-only: Hopper tiers


def test_fp8_checkpoint_tier_downloads_the_fp8_repo_and_sets_no_quantization_flag(tmp_path):
    render(resolve("h200", ROOT / "profiles"), tmp_path)
    args = (tmp_path / "etc/inference-image/units/vllm-0.args").read_text().splitlines()
    assert "--quantization" not in args
    xv = json.loads((tmp_path / "ansible/extra-vars.json").read_text())
    target = resolve("h200", ROOT / "profiles").target
    assert target.fp8_hub_id and target.fp8_hub_id != target.hub_id
    assert xv["models_list"][0]["hub_id"] == target.fp8_hub_id
    assert xv["nvidia_driver_fabric_manager"] is False and xv["nvidia_driver_branch"] == "580"


def run_unit(root: Path, unit: str, **env: str) -> subprocess.CompletedProcess[str]:
    # TMPDIR: the unit's is under the image's cache, which a start makes; here it is under root
    full = {"PATH": os.environ["PATH"], "INFERENCE_ROOT": str(root), "INFERENCE_DRY_RUN": "1",
            "TMPDIR": str(root / "cache/tmp"), **env}
    return subprocess.run([*runtime("inference-run"), unit], env=full,
                          capture_output=True, text=True)


def test_runner_expands_variables_and_caller_environment_wins(tmp_path):
    render(resolve("h100", ROOT / "profiles"), tmp_path)
    r = run_unit(tmp_path, "vllm-0", INFERENCE_PYTHON="python3", MODEL_PATH="/tmp/model",
                 INFERENCE_EXTRA_ARGS="--load-format dummy --port 9")
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.strip()
    assert cmd.startswith("python3 -m vllm.entrypoints.openai.api_server --model /tmp/model ")
    assert "/var/lib/inference-image/models/llama-3.1-8b-eagle3" in cmd  # DRAFT_PATH from .env
    assert cmd.endswith("--load-format dummy --port 9")


def test_runner_refuses_unset_variable_and_unknown_unit(tmp_path):
    render(resolve("cpu", ROOT / "profiles"), tmp_path)
    r = run_unit(tmp_path, "router")
    assert r.returncode == 0, r.stderr
    assert "--host 127.0.0.1 --port 8001 " in r.stdout
    assert "--worker-urls http://127.0.0.1:8100 http://127.0.0.1:8101 " in r.stdout
    r = run_unit(tmp_path, "vllm-7")
    assert r.returncode == 2 and "no unit 'vllm-7'" in r.stderr and "vllm-1" in r.stderr
    (tmp_path / "etc/inference-image/units/vllm-0.args").write_text("${NOT_SET_ANYWHERE}\n")
    r = run_unit(tmp_path, "vllm-0")
    assert r.returncode == 2 and "${NOT_SET_ANYWHERE}, which is not set" in r.stderr


def test_a_fleet_worker_serves_its_instances_on_the_network_and_only_there(tmp_path):
    """An instance listens on loopback; on a fleet worker (user-data wrote the fleet file with
    role worker) on every address, for the fleet's router, which the firewall alone lets in. The
    router of a worker stays on loopback."""
    render(resolve("cpu", ROOT / "profiles"), tmp_path)
    assert "--host 127.0.0.1 --port 8100 " in run_unit(tmp_path, "vllm-0").stdout
    fleet = tmp_path / "etc/inference-image/fleet.json"
    fleet.write_text('{"fleet": "f", "instance_ports": [8100, 8101], "role": "worker", '
                     '"router": "http://10.10.0.2:8001"}')
    assert "--host 0.0.0.0 --port 8101 " in run_unit(tmp_path, "vllm-1").stdout
    assert "--host 127.0.0.1 --port 8001 " in run_unit(tmp_path, "router").stdout
    fw = (ROOT / "roles/firewall/templates/etc/nftables.conf.j2").read_text()
    xv = json.loads((tmp_path / "ansible/extra-vars.json").read_text())
    assert xv["firewall_fleet_tcp_ports"] == [8100, 8101]
    assert "ip saddr @fleet_router tcp dport { {{ firewall_fleet_tcp_ports | join(', ') }} } accept" in fw


def test_a_fleet_router_serves_no_instance_and_waits_for_workers_on_its_private_networks(tmp_path):
    """On a fleet's router vllm-router runs the router-fleet command line: every address (for the
    workers' add-worker calls), no worker up front; its own instances are skipped by their
    ExecCondition; the firewall opens vllm-router's port to the fleet_workers set only. A fleet
    file it cannot use leaves the machine serving alone, as rendered."""
    render(resolve("cpu", ROOT / "profiles"), tmp_path)
    fleet = tmp_path / "etc/inference-image/fleet.json"
    fleet.write_text('{"fleet": "f", "role": "router", "worker_tag": "f-worker"}')
    argv = run_unit(tmp_path, "router").stdout
    assert "--host 0.0.0.0 --port 8001 " in argv and "--worker-urls" not in argv, argv
    assert "--host 127.0.0.1 --port 8100 " in run_unit(tmp_path, "vllm-0").stdout
    unit = (tmp_path / "etc/systemd/system/vllm@.service").read_text()
    assert f"ExecCondition={PATHS['join']} --serves-instances" in unit.splitlines()
    fleet.write_text('{"fleet": "f", "role": "boss"}')
    r = run_unit(tmp_path, "router")
    assert "--host 127.0.0.1 --port 8001 " in r.stdout and "--worker-urls" in r.stdout
    assert "'role' is 'boss', not a role. Fix: write worker, router, head or node" in r.stderr
    fw = (ROOT / "roles/firewall/templates/etc/nftables.conf.j2").read_text()
    xv = json.loads((tmp_path / "ansible/extra-vars.json").read_text())
    assert xv["firewall_fleet_router_tcp_port"] == 8001
    assert "ip saddr @fleet_workers tcp dport {{ firewall_fleet_router_tcp_port }} accept" in fw


def test_cpu_instances_split_the_machine_cores(tmp_path):
    render(resolve("cpu", ROOT / "profiles"), tmp_path)
    for unit in ("vllm-0", "vllm-1"):
        (tmp_path / f"etc/inference-image/units/{unit}.args").write_text(
            "echo\n${VLLM_CPU_OMP_THREADS_BIND}\n${VLLM_CPU_KVCACHE_SPACE}\n")
    n = os.cpu_count() or 1
    r0, r1 = (run_unit(tmp_path, u).stdout.split() for u in ("vllm-0", "vllm-1"))
    assert r0[1] == f"0-{max(0, n // 2 - 1)}" and r0[2] == "1"
    assert r1[1] == f"{n // 2}-{n - 1}"


def test_api_key_is_checked_by_nginx_not_passed_on_command_lines(tmp_path):
    # vllm-router's --api-key is what it sends to workers (it lets keyless clients through), so the
    # render must not rely on it; nginx on the public port checks the key from a per-machine map.
    render(resolve("cpu", ROOT / "profiles"), tmp_path)
    units = tmp_path / "etc/inference-image/units"
    for f in units.iterdir():
        assert "api-key" not in f.read_text() and "API_KEY" not in f.read_text(), f.name
    conf = (tmp_path / "etc/nginx/conf.d/inference-image.conf").read_text()
    assert "include /etc/inference-image/public-listen.nginx;" in conf  # tests/machine/test_tls.py
    assert "server 127.0.0.1:8001 max_fails=0;" in conf
    assert "include /etc/inference-image/api-key.ngin[x];" in conf
    health, rest = conf.split("location = /health", 1)[1].split("location / {", 1)
    assert "return 401" not in health and "if ($inference_key_ok = 0)" in rest


def test_triton_decode_attention_reaches_the_unit_environment(tmp_path):
    render(resolve("h100", ROOT / "profiles", overrides=["serving.triton_decode_max_tokens=8",
                                                         "serving.triton_decode_verify=false"]),
           tmp_path)
    env = (tmp_path / "etc/inference-image/units/vllm-0.env").read_text()
    assert "INFERENCE_IMAGE_TRITON_DECODE_TOKENS=8\n" in env  # read by the plugin's register()
    assert "INFERENCE_IMAGE_TRITON_DECODE_VERIFY" not in env


def test_triton_verify_reaches_the_unit_environment_beside_its_token_limit(tmp_path):
    # the h100 profile sets it (docs/decisions.md, "The plugin's own kernels at concurrency 1")
    render(resolve("h100", ROOT / "profiles"), tmp_path)
    env = (tmp_path / "etc/inference-image/units/vllm-0.env").read_text()
    assert "INFERENCE_IMAGE_TRITON_DECODE_TOKENS=8\n" in env
    assert "INFERENCE_IMAGE_TRITON_DECODE_VERIFY=1\n" in env  # read by the plugin's register()


def test_early_first_token_reaches_the_unit_environment_only_when_set(tmp_path):
    def env(*overrides: str) -> str:
        render(resolve("h100", ROOT / "profiles", overrides=list(overrides)), tmp_path)
        return (tmp_path / "etc/inference-image/units/vllm-0.env").read_text()

    assert "INFERENCE_IMAGE_EARLY_FIRST_TOKEN=1\n" in env("serving.early_first_token=true")
    assert "INFERENCE_IMAGE_EARLY_FIRST_TOKEN" not in env("serving.early_first_token=false")


def h100_argv(*overrides: str) -> list[str]:
    """The h100 render's one vLLM command line, with these --set overrides."""
    r = resolve("h100", ROOT / "profiles", overrides=list(overrides))
    return vllm_argv(r, r.instances[0])


def test_several_api_servers_start_from_vllms_cli_before_one_engine(tmp_path):
    one, two = h100_argv("serving.api_servers=1"), h100_argv("serving.api_servers=2")
    # one: vLLM's API server module, as every tier rendered before the field
    assert one[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--api-server-count" not in one
    # several: only vLLM's CLI starts them (one port, SO_REUSEPORT); the rest of the line is the same
    assert two[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    i = two.index("--api-server-count")
    assert two[i + 1] == "2"
    assert two[4:i] + two[i + 2:] == one[3:]


def test_stream_interval_renders_only_where_the_profile_sets_more_than_vllms_one():
    one, four = h100_argv("serving.stream_interval=1"), h100_argv("serving.stream_interval=4")
    assert "--stream-interval" not in one  # vLLM's default: the line every tier rendered before
    i = four.index("--stream-interval")
    assert four[i + 1] == "4"
    assert four[:i] + four[i + 2:] == one


def test_whole_step_graphs_join_the_capture_size_in_one_compilation_config():
    def compilation(*sets: str) -> dict[str, object]:
        argv = h100_argv("serving.cudagraph_prefill_step=null", *sets)  # vLLM's sizes: below
        assert argv.count("--compilation-config") == 1  # a second one would replace the first
        return json.loads(argv[argv.index("--compilation-config") + 1])

    # vLLM's default mode renders nothing new: the line every tier rendered before the field
    assert compilation("serving.cudagraph_mode=full_and_piecewise") == {
        "max_cudagraph_capture_size": 2048}
    # the h100 profile's own
    # (docs/decisions.md#whole-step-graphs-with-decode-graphs-of-their-own-servingcudagraph_mode-h100)
    assert compilation() == {"max_cudagraph_capture_size": 2048,
                             "cudagraph_mode": "FULL"}
    assert compilation("serving.cudagraph_mode=full") == {
        "max_cudagraph_capture_size": 2048, "cudagraph_mode": "FULL"}
    assert compilation("serving.cudagraph_mode=full", "serving.cudagraph_capture_size=null") == {
        "cudagraph_mode": "FULL"}
    # the plugin's decode graphs ride on vLLM's FULL mode: the same command line, one variable more
    assert h100_argv("serving.cudagraph_mode=full_and_decode") == h100_argv(
        "serving.cudagraph_mode=full")


def test_decode_graphs_reach_the_unit_environment_only_in_their_mode(tmp_path):
    def env(*overrides: str) -> str:
        render(resolve("h100", ROOT / "profiles", overrides=list(overrides)), tmp_path)
        return (tmp_path / "etc/inference-image/units/vllm-0.env").read_text()

    assert "INFERENCE_IMAGE_DECODE_GRAPHS=1\n" in env("serving.cudagraph_mode=full_and_decode")
    for mode in ("full", "full_and_piecewise"):
        assert "INFERENCE_IMAGE_DECODE_GRAPHS" not in env(f"serving.cudagraph_mode={mode}")


def test_draft_schedule_reaches_the_unit_environment_where_a_draft_has_other_heads(tmp_path):
    def env(tier: str, *overrides: str) -> str:
        render(resolve(tier, ROOT / "profiles", overrides=list(overrides)), tmp_path)
        return (tmp_path / "etc/inference-image/units/vllm-0.env").read_text()

    on = "INFERENCE_IMAGE_DRAFT_SCHEDULE=1\n"
    # the 70B's EAGLE-3 head: 48 query heads to the target's 64, alone on a GPU or at TP=2
    assert on in env("h200") and on in env("h100x8")
    # the 8B's head has its target's heads: nothing for the plugin to do
    assert "INFERENCE_IMAGE_DRAFT_SCHEDULE" not in env("h100")
    # a draft model of another head size (Llama 3.2 1B: 64 against 128)
    assert on in env("h100", "model.speculative.method=draft_model",
                     "model.speculative.draft=llama-3.2-1b-instruct")
    # no draft, or no FA3 (whose schedule it is)
    assert "INFERENCE_IMAGE_DRAFT_SCHEDULE" not in env("h200", "model.speculative.method=none",
                                                       "model.speculative.draft=null")
    assert "INFERENCE_IMAGE_DRAFT_SCHEDULE" not in env("h200", "serving.flash_attention_3=false")


def test_an_nvswitch_tier_turns_nvlink_multicast_off_in_nccl_and_torch_and_vllm(tmp_path):
    """Every instance of a tier on NVSwitch serves the all-reduces measured
    (docs/decisions.md#nvlink-multicast-off-where-gpus-share-an-nvswitch): NCCL without NVLS, and
    vLLM's own rather than torch's symmetric memory (which vLLM 0.26 takes by default where
    multicast works); a tier of one GPU has no all-reduce to set."""
    off = ("NCCL_NVLS_ENABLE=0\n", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1\n",
           "VLLM_ALLREDUCE_USE_SYMM_MEM=0\n")
    r = resolve("h100x8", ROOT / "profiles")
    render(r, tmp_path / "x8")
    for inst in r.instances:
        env = (tmp_path / "x8" / f"etc/inference-image/units/{inst.name}.env").read_text()
        assert all(v in env for v in off), (inst.name, env)
    render(resolve("h100", ROOT / "profiles"), tmp_path / "x1")
    env = (tmp_path / "x1" / "etc/inference-image/units/vllm-0.env").read_text()
    assert not any(v.split("=")[0] in env for v in off)


def test_runner_refuses_to_start_on_a_full_cache_disk(tmp_path, monkeypatch):
    """An instance whose cache disk has less than the rendered minimum free stops at once with a
    line that names it (the fault suite greps the journal for it), instead of failing mid-compile."""
    monkeypatch.setitem(render_mod.LIMITS, "min_cache_free_mib", 10**12)  # more than any disk
    render(resolve("h100", ROOT / "profiles"), tmp_path)
    r = run_unit(tmp_path, "vllm-0", TMPDIR=str(tmp_path / "tmp"), MODEL_PATH="/m",
                 INFERENCE_PYTHON="python3")
    assert r.returncode == 1
    assert "No space left for vLLM's compile cache" in r.stderr and str(tmp_path / "tmp") in r.stderr
    monkeypatch.setitem(render_mod.LIMITS, "min_cache_free_mib", 1)
    render(resolve("h100", ROOT / "profiles"), tmp_path)
    assert run_unit(tmp_path, "vllm-0", TMPDIR=str(tmp_path / "tmp"), MODEL_PATH="/m",
                    INFERENCE_PYTHON="python3").returncode == 0


@pytest.mark.parametrize("tier", ["cpu", "h100", "h200"])
def test_starting_the_stack_while_baking_is_decided_once(tier):
    """The render's Packer variables and Ansible variables carry the same decision (the role has
    no default of its own): the cpu tier bakes where it serves, GPU tiers bake on a machine
    without their GPU."""
    from inference_image.profiles import resolve
    from inference_image.render import ansible_vars, files, serve_during_build

    r = resolve(tier)
    pkr = files(r)[f"packer/{tier}.pkrvars.hcl"][0]
    want = serve_during_build(r)
    assert want == (tier == "cpu")
    assert f"serve_during_build = {str(want).lower()}" in pkr.splitlines()
    assert ansible_vars(r)["inference_service_start"] is want
    defaults = (ROOT / "roles/inference_service/defaults/main.yml").read_text()
    assert "\ninference_service_start:" not in defaults
    if tier != "cpu":
        # `make image BAKE_ON_GPU=1`: baked on the droplet size it serves on, the build serves
        # (and seals what it compiled); naming that size as build_size is the same choice
        size = r.profile.digitalocean.size
        for override in ("digitalocean.build_size=null", f"digitalocean.build_size={size}"):
            on_gpu = resolve(tier, overrides=[override])
            assert serve_during_build(on_gpu), override
            pkr = files(on_gpu)[f"packer/{tier}.pkrvars.hcl"][0]
            assert f'do_build_size  = "{size}"' in pkr.splitlines(), pkr


SLOW_SERVER = """import http.server, sys, time
time.sleep(1.5)  # a start: nothing answers yet
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"""


def test_a_notify_unit_is_ready_when_its_health_answers_not_when_it_starts(tmp_path):
    """vllm@ is Type=notify: inference-run's helper sends READY=1 to systemd's socket once the
    instance's /health answers, so the unit's TimeoutStartSec bounds a start that hangs."""
    render(resolve("cpu", ROOT / "profiles"), tmp_path)
    unit = (tmp_path / "etc/systemd/system/vllm@.service").read_text().splitlines()
    assert "Type=notify" in unit and "NotifyAccess=all" in unit
    port = free_port()
    (tmp_path / "server.py").write_text(SLOW_SERVER)
    (tmp_path / "etc/inference-image/units/vllm-0.args").write_text(
        f"python3\n{tmp_path / 'server.py'}\n--port\n{port}\n")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(30)
    # the unit's cache and TMPDIR are the image's paths: the start gets its own here, so the test
    # writes nothing on this host outside tmp_path
    (tmp_path / "cache").mkdir()
    env = {"PATH": os.environ["PATH"], "INFERENCE_ROOT": str(tmp_path),
           "INFERENCE_PYTHON": sys.executable, "NOTIFY_SOCKET": str(tmp_path / "notify"),
           "INFERENCE_CACHE": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "cache/tmp")}
    t0 = time.monotonic()
    proc = subprocess.Popen([*runtime("inference-run"), "vllm-0"],
                            env=env, start_new_session=True)
    try:
        msg = sock.recv(4096).decode()
        waited = time.monotonic() - t0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        sock.close()
    assert msg.splitlines() == ["READY=1", f"STATUS=serving on port {port}"]
    assert waited >= 1.5, f"READY=1 after {waited:.2f} s, before the server answered"


@pytest.mark.parametrize(("tier", "sets", "local", "fleet"), [
    ("h100", [], "round_robin", "cache_aware"),  # one instance: nothing to choose
    ("cpu", [], "cache_aware", "cache_aware"),  # two instances
    ("h100x8", [], "cache_aware", "cache_aware"),
    ("h100", ["router.policy=cache_aware"], "cache_aware", "cache_aware"),  # as the profile says
    ("cpu", ["router.policy=power_of_two"], "power_of_two", "power_of_two"),
])
def test_the_routers_policy_is_cache_aware_only_where_it_has_a_choice(tier, sets, local, fleet):
    r = resolve(tier, ROOT / "profiles", overrides=sets)
    for argv, want in ((render_mod.router_argv(r), local),
                       (render_mod.router_argv(r, fleet=True), fleet)):
        assert argv[argv.index("--policy") + 1] == want, argv


@pytest.mark.parametrize("fleet", [False, True])
def test_the_router_asks_a_starting_instance_every_second(fleet: bool) -> None:
    """vllm-router serves nothing until a worker it was started with answers /health, and asks
    every --worker-startup-check-interval seconds (30 by default): the public port opens within
    about a second of the instance, not up to half a minute after it."""
    argv = render_mod.router_argv(resolve("h100", ROOT / "profiles"), fleet=fleet)
    assert argv[argv.index("--worker-startup-check-interval") + 1] == "1", argv


@pytest.mark.parametrize(("tier", "sets", "fleet", "breaker"), [
    ("h100", (), False, False), ("h200", ("router.hold_s=30",), False, False),
    ("cpu", (), False, True), ("h100", (), True, True)])
def test_the_router_holds_what_no_instance_can_take_for_hold_s(tier, sets, fleet, breaker) -> None:
    """vllm-router sends a request again, with backoff, until its waits add up to router.hold_s
    (a restart, a restore, a closed gate; docs/benchmarks.md#2026-12-08-router-hold): the first
    after half a second, none more than 2 s apart. Before one instance its circuit breaker goes
    (open, it answers every request at once); before several, or a fleet's workers, it stays and
    sends the request to another. hold_s 0 leaves the router's own defaults."""
    r = resolve(tier, ROOT / "profiles", overrides=list(sets))
    argv = render_mod.router_argv(r, fleet=fleet)

    def flag(name: str) -> float:
        return float(argv[argv.index(name) + 1])
    attempts = int(flag("--retry-max-retries"))
    first, growth, cap = (flag("--retry-initial-backoff-ms"), flag("--retry-backoff-multiplier"),
                          flag("--retry-max-backoff-ms"))
    waits = [min(first * growth ** i, cap) for i in range(attempts - 1)]
    hold_ms = r.profile.router.hold_s * 1000
    assert sum(waits) >= hold_ms > sum(waits[:-1]), (waits, hold_ms)
    assert (first, cap) == (500, 2000)
    assert ("--disable-circuit-breaker" in argv) is not breaker
    off = render_mod.router_argv(resolve(tier, ROOT / "profiles", [*sets, "router.hold_s=0"]),
                                 fleet=fleet)
    assert not any(a.startswith(("--retry", "--disable-circuit")) for a in off), off


def test_graph_sizes_past_the_decode_steps_are_spaced_by_the_prefill_step() -> None:
    def sizes(*sets: str) -> list[int] | None:
        argv = h100_argv(*sets)
        return json.loads(argv[argv.index("--compilation-config") + 1]).get(
            "cudagraph_capture_sizes")

    shipped = sizes()
    assert shipped is not None
    # vLLM's own list up to the largest decode step (96 sequences x (1 + 3 draft tokens))...
    decode = [n for n in shipped if n <= 384]
    assert decode == [1, 2, 4, *range(8, 256, 8), *range(256, 385, 16)]
    # ...then a graph every 128 tokens to the largest step, which is captured
    assert [n for n in shipped if n > 384] == list(range(512, 2049, 128))
    wide = sizes("serving.cudagraph_prefill_step=256")
    assert [n for n in wide if n > 384] == [512, 768, 1024, 1280, 1536, 1792, 2048]
    # without the field the list is vLLM's (the command line every tier rendered before it)
    assert sizes("serving.cudagraph_prefill_step=null") is None
    # no draft: decode steps are one token a sequence
    plain = sizes("model.speculative.method=none", "model.speculative.draft=null")
    assert plain == [1, 2, 4, *range(8, 97, 8), *range(128, 2049, 128)]


def test_a_prefill_step_without_a_capture_size_is_refused_naming_both() -> None:
    with pytest.raises(ProfileErrors) as exc:
        resolve("h100", ROOT / "profiles", overrides=["serving.cudagraph_capture_size=null"])
    assert "serving.cudagraph_prefill_step" in str(exc.value)
    assert "serving.cudagraph_capture_size" in str(exc.value)
