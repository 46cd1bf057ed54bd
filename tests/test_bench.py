from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inference_image import bench


def test_scenarios_are_digitaloceans():
    s = bench.SCENARIOS
    assert (s["chat"].input_len, s["chat"].output_len) == (512, 512)
    assert (s["summarization"].input_len, s["long-form"].output_len) == (1024, 1024)
    assert s["shared-prefix"].prefix_len / s["shared-prefix"].input_len == 0.7001953125


def test_bench_command_for_shared_prefix():
    cmd = bench.bench_command(["vllm"], "http://h:8000", "m", "/tok", bench.SCENARIOS["shared-prefix"],
                              16, 4, 7, Path("/r"), "f.json")
    a = dict(zip(cmd[::1], [*cmd[1:], ""], strict=True))
    assert a["--random-prefix-len"] == "717" and a["--random-input-len"] == "307"
    assert a["--num-prompts"] == "64" and a["--max-concurrency"] == "16"
    assert "--ignore-eos" in cmd and a["--seed"] == "7" and a["--tokenizer"] == "/tok"
    assert "--save-detailed" in cmd  # the per-request TTFTs below come from it


def test_row_keeps_each_ttft_in_the_order_requests_were_sent():
    d = {"completed": 3, "ttfts": [0.05, 0.141, 0.0432], "start_times": [2.0, 1.0, 3.0]}
    assert bench.row_from_result(d, "chat", 2, "x")["ttft_ms_each"] == [141.0, 50.0, 43.2]
    assert "ttft_ms_each" not in bench.row_from_result({"completed": 1}, "chat", 1, "x")


def test_num_prompts_floor():
    assert bench.num_prompts(1, 4) == 8 and bench.num_prompts(64, 4) == 256
    assert bench.num_prompts(1, 4, 16) == 16 and bench.num_prompts(8, 4, 16) == 32


def test_row_and_cost_and_compare():
    d = {"output_throughput": 1000.0, "mean_ttft_ms": 10, "p99_ttft_ms": 20, "completed": 8}
    a = {"runs": [bench.row_from_result(d, "chat", 4, "A")]}
    b = {"runs": [bench.row_from_result({**d, "output_throughput": 1500.0, "p99_ttft_ms": 10},
                                        "chat", 4, "B")]}
    assert a["runs"][0]["completed"] == 8 and a["runs"][0]["ttft_ms_p99"] == 20
    assert round(bench.cost_per_mtok(3.6, 1000.0), 6) == 1.0
    assert bench.cost_per_mtok(0, 1000) is None
    out = bench.compare(a, b)
    assert "| chat | 4 | 1000.0 | 1500.0 | 1.50x | 20.0 | 10.0 | 0.50x |" in out


def test_markdown_and_recorded_proof_has_the_required_keys():
    md = bench.markdown([bench.row_from_result({"output_throughput": 5}, "chat", 1, "x")])
    assert md.splitlines()[2].startswith("| x | chat | 1 | 5.0 |")
    root = Path(__file__).resolve().parents[1]
    proofs = sorted((root / "docs" / "benchmarks").glob("*-gpu-proof.json"))
    assert proofs
    for p in proofs:
        doc = json.loads(p.read_text())
        assert {"gpu", "vllm_version", "runs", "roofline"} <= set(doc)
        assert {"config", "scenario", "concurrency", "output_tok_s", "ttft_ms_mean", "ttft_ms_p99",
                "tpot_ms_mean"} <= set(doc["runs"][0])
        for cfg in ("vanilla", "optimized"):
            assert {"read_bw_tbs", "bytes_per_token", "c1_fraction"} <= set(doc["roofline"][cfg])


def test_one_process_bench_with_a_python_without_vllm_says_so(tmp_path):
    # the real driver, run by this test's interpreter, which has no vLLM
    with pytest.raises(bench.BenchError) as err:
        bench.run(url="http://127.0.0.1:9", model="m", tokenizer=None, scenarios=["chat"],
                  concurrency=[1, 2], config="x", vllm_cmd=["vllm"], vllm_python=sys.executable,
                  timeout_s=60, log=tmp_path / "log")
    msg = str(err.value)
    assert "chat c=1" in msg and "cannot import vLLM's benchmark" in msg and "Fix:" in msg
    plan = (tmp_path / "log").read_text().splitlines()[0]
    assert "vllm_bench_batch.py" in plan and '"--max-concurrency", "2"' in plan


def test_a_bench_where_every_request_failed_is_an_error_and_earlier_rows_are_kept(tmp_path):
    # vLLM's bench exits 0 and saves a result with 0 completed when the server is unreachable;
    # this writes what it saves: 8 completed at c=1, then nothing at c=2
    fake = ("import json,sys; a=sys.argv; d=a[a.index('--result-dir')+1]; "
            "f=a[a.index('--result-filename')+1]; c=int(a[a.index('--max-concurrency')+1]); "
            "json.dump({'completed': 8 if c == 1 else 0, 'failed': 0 if c == 1 else 8, "
            "'output_throughput': 99.0}, open(d+'/'+f, 'w'))")
    partial = tmp_path / "x.json"
    with pytest.raises(bench.BenchError, match=r"no request completed at chat c=2 \(8 failed\)"):
        bench.run(url="http://127.0.0.1:9", model="m", tokenizer=None, scenarios=["chat"],
                  concurrency=[1, 2], config="x", vllm_cmd=[sys.executable, "-c", fake],
                  partial=partial)
    kept = json.loads(partial.read_text())
    assert kept["partial"] is True
    assert [(r["concurrency"], r["output_tok_s"]) for r in kept["runs"]] == [(1, 99.0)]


def test_min_prompts_reaches_the_bench_and_zero_is_refused(tmp_path):
    # the fake bench reports how many prompts it was asked for as its completed count
    fake = ("import json,sys; a=sys.argv; d=a[a.index('--result-dir')+1]; "
            "f=a[a.index('--result-filename')+1]; n=int(a[a.index('--num-prompts')+1]); "
            "json.dump({'completed': n, 'failed': 0, 'output_throughput': 1.0}, open(d+'/'+f, 'w'))")
    res = bench.run(url="http://127.0.0.1:9", model="m", tokenizer=None, scenarios=["chat"],
                    concurrency=[1, 2, 8], config="x", vllm_cmd=[sys.executable, "-c", fake],
                    min_prompts=16)
    assert [(r["concurrency"], r["completed"]) for r in res["runs"]] == [(1, 16), (2, 16), (8, 32)]
    assert res["meta"]["min_prompts"] == 16
    r = subprocess.run([sys.executable, "-m", "inference_image.cli", "bench", "run", "--model", "m",
                        "--min-prompts", "0", "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--min-prompts: '0': give an integer >= 1" in r.stderr
    assert "Traceback" not in r.stderr
