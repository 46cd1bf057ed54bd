"""throughput: the benchmark's scenario at the profile's target concurrency, run on the machine
against its public port with vLLM's own `vllm bench serve` (the image's vLLM), checked against the
profile's targets. The failure message shows target vs measured."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import HostKey, Public

from inference_image.ops.bench import SCENARIOS, bench_command, row_from_result, run_seed

pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def measured(root: Any, profile: dict[str, Any], api_key: HostKey, public: Public,
             load_here: None) -> dict[str, Any]:
    t = profile["profile"]["targets"]
    sc = SCENARIOS[t["scenario"]]
    c = int(t["concurrency"])
    target = profile["models"][0]
    vllm = f"{profile['paths']['vllm_venv']}/bin/vllm"
    out_dir = "/var/tmp/inference-image-throughput"
    # bench's way: a warm-up run of other prompts, then the measured one with none of its own
    cmds = [bench_command([vllm], public.url(), profile["served_model_name"], target["path"], sc,
                          c, per=4, seed=run_seed(0, sc, c), result_dir=Path(out_dir),
                          result_file="result.json", warmup=warmup)
            for warmup in (True, False)]
    env = (f"OPENAI_API_KEY={api_key.shell} VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 "
           # the client checks the machine's certificate (Python's ssl reads SSL_CERT_FILE)
           f"{'SSL_CERT_FILE=' + shlex.quote(public.cacert) + ' ' if public.tls else ''}")
    run = root.run(f"mkdir -p {out_dir} && cd {out_dir} && "
                   + " && ".join(env + shlex.join(cmd) for cmd in cmds))
    try:
        assert run.rc == 0, f"vllm bench serve failed ({run.rc}): {run.stderr[-2000:]}"
        result = json.loads(root.file(f"{out_dir}/result.json").content_string)
    finally:
        root.run(f"rm -rf {out_dir}")
    row = row_from_result(result, sc.name, c, "image")
    row["targets"] = t
    # what the failed requests got (vLLM's detailed result keeps each request's error)
    row["errors"] = sorted({str(e)[:300] for e in result.get("errors") or [] if e})[:3]
    return row


def test_no_failed_requests(measured: dict[str, Any]) -> None:
    assert measured["failed"] == 0 and measured["completed"] > 0, (
        f"{measured['failed']} of {measured['failed'] + measured['completed']} requests failed "
        f"at c={measured['concurrency']}: {measured['errors'] or 'no error recorded'}")


def test_output_throughput(measured: dict[str, Any], record_property: Any) -> None:
    t = measured["targets"]
    for k in ("output_tok_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_mean", "completed", "duration_s"):
        record_property(k, measured[k])  # in the JUnit XML
    assert measured["output_tok_s"] >= t["output_tok_s"], (
        f"{t['scenario']} c={t['concurrency']}: output {measured['output_tok_s']:.1f} tok/s, "
        f"target >= {t['output_tok_s']}")


def test_ttft(measured: dict[str, Any]) -> None:
    t = measured["targets"]
    p50, p99 = measured["ttft_ms_p50"], measured["ttft_ms_p99"]
    assert p50 <= t["ttft_p50_ms"] and p99 <= t["ttft_p99_ms"], (
        f"{t['scenario']} c={t['concurrency']}: TTFT p50 {p50:.0f} ms (target <= {t['ttft_p50_ms']}), "
        f"p99 {p99:.0f} ms (target <= {t['ttft_p99_ms']})")
