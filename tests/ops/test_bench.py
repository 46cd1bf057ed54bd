from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from inference_image.ops import bench, bench_compare


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
    # vLLM's warm-up and ready check send the run's first prompt: none of its own
    assert a["--num-warmups"] == "0" and a["--ready-check-timeout-sec"] == "0"


def test_the_warm_up_sends_prompts_of_its_own_and_saves_nothing():
    sc = bench.SCENARIOS["chat"]
    w = bench.bench_command(["vllm"], "http://h:8000", "m", None, sc, 16, 4, 7, Path("/r"),
                            "f.json", warmup=True)
    a = dict(zip(w, [*w[1:], ""], strict=True))
    assert a["--seed"] == str(7 + bench.WARMUP_SEED) and a["--num-prompts"] == "4"
    assert a["--num-warmups"] == "0" and "--ready-check-timeout-sec" not in w
    assert "--save-result" not in w and "--result-filename" not in w


def test_requests_sample_as_asked_or_as_the_server_defaults():
    """vLLM 0.26's bench sends no temperature unless told: the server's defaults (the checkpoint's
    generation_config) apply, which a stand-in's config does not carry."""
    sc = bench.SCENARIOS["chat"]
    plain = bench.bench_args("http://h:8000", "m", None, sc, 4, 4, 7, Path("/r"), "f.json")
    assert not {"--temperature", "--top-p", "--top-k"} & set(plain)
    for warmup in (False, True):
        args = bench.bench_args("http://h:8000", "m", None, sc, 4, 4, 7, Path("/r"), "f.json",
                                warmup=warmup, sampling={"top_p": 0.9, "temperature": 0.6,
                                                         "top_k": 40.0})
        a = dict(zip(args, [*args[1:], ""], strict=True))
        assert (a["--temperature"], a["--top-p"], a["--top-k"]) == ("0.6", "0.9", "40")


def test_rows_of_different_scenarios_draw_different_prompts():
    """vLLM's random dataset starts prompt i where the seed says, whatever its length: with one
    seed a summarization prompt began with the chat prompt before it, and found it cached."""
    seeds = {bench.run_seed(0, bench.SCENARIOS[s], c) for s in bench.SCENARIOS for c in (1, 2, 16)}
    assert len(seeds) == len(bench.SCENARIOS) * 3
    assert bench.run_seed(0, bench.SCENARIOS["chat"], 16) == 16  # chat rows keep their seeds


def test_row_keeps_each_ttft_in_the_order_requests_were_sent():
    d = {"completed": 3, "ttfts": [0.05, 0.141, 0.0432], "start_times": [2.0, 1.0, 3.0]}
    row = bench.row_from_result(d, "chat", 2, "x")
    assert row["ttft_ms_each"] == [141.0, 50.0, 43.2]
    assert row["sent_ms_each"] == [0.0, 1000.0, 2000.0]
    assert "ttft_ms_each" not in bench.row_from_result({"completed": 1}, "chat", 1, "x")
    # without send times the order is vLLM's, and no send time is made up
    bare = bench.row_from_result({**d, "start_times": []}, "chat", 2, "x")
    assert bare["ttft_ms_each"] == [50.0, 141.0, 43.2] and "sent_ms_each" not in bare


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
    out = bench_compare.compare(a, b)
    assert "| chat | 4 | 1000.0 | 1500.0 | 1.50x | 20.0 | 10.0 | 0.50x |" in out


def test_markdown_and_recorded_proof_has_the_required_keys():
    md = bench.markdown([bench.row_from_result({"output_throughput": 5}, "chat", 1, "x")])
    assert md.splitlines()[2].startswith("| x | chat | 1 | 5.0 |")
    assert "| gap between chunks p99 ms |" in md.splitlines()[0]  # vLLM's ITL, named for what it is
    root = Path(__file__).resolve().parents[2]
    proofs = sorted((root / "docs" / "benchmarks").glob("*-gpu-proof.json"))
    assert proofs
    for p in proofs:  # the bench's rows, as the ledger's schema holds them (one machine a record)
        (machine,) = json.loads(p.read_text())["machines"].values()
        assert {"gpu", "vllm_version", "runs", "roofline"} <= set(machine)
        for cfg in ("vanilla", "optimized"):
            assert {"config", "scenario", "concurrency", "output_tok_s", "ttft_ms_mean",
                    "ttft_ms_p99", "tpot_ms_mean"} <= set(machine["runs"][cfg][0])
            assert {"read_bw_tbs", "bytes_per_token", "c1_fraction"} <= set(machine["roofline"][cfg])


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
    fake = ("import json,sys; a=sys.argv; '--save-result' in a or sys.exit(0); "
            "d=a[a.index('--result-dir')+1]; "
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
    fake = ("import json,sys; a=sys.argv; '--save-result' in a or sys.exit(0); "
            "d=a[a.index('--result-dir')+1]; "
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


def test_warm_ups_answer_in_full_only_before_a_scenarios_first_row(tmp_path):
    """The first row's warm-up serves every context length of its scenario once; the others need
    only their batch shape, and their measured runs keep the scenario's whole answers."""
    calls = tmp_path / "calls"
    fake = ("import json,sys; a=sys.argv; g=lambda k: a[a.index(k)+1]; "
            f"open({str(calls)!r}, 'a').write(' '.join(('save' if '--save-result' in a else 'warm', "
            "g('--max-concurrency'), g('--random-output-len'))) + '\\n'); "
            "'--save-result' in a or sys.exit(0); "
            "json.dump({'completed': 1, 'output_throughput': 1.0}, "
            "open(g('--result-dir')+'/'+g('--result-filename'), 'w'))")
    res = bench.run(url="http://127.0.0.1:9", model="m", tokenizer=None,
                    scenarios=["chat", "long-form"], concurrency=[1, 8, 64], config="x",
                    vllm_cmd=[sys.executable, "-c", fake])
    assert calls.read_text().split("\n")[:-1] == [
        "warm 1 512", "save 1 512", "warm 8 64", "save 8 512", "warm 64 64", "save 64 512",
        "warm 1 1024", "save 1 1024", "warm 8 64", "save 8 1024", "warm 64 64", "save 64 1024"]
    assert f"{bench.WARMUP_SHORT_OUTPUT} tokens" in res["meta"]["warmup"]


def test_a_scenario_may_bring_its_own_concurrencies(tmp_path):
    """long-form at the run's list, chat at 2 and 32 only: one server start for both."""
    calls = tmp_path / "calls"
    fake = ("import json,sys; a=sys.argv; g=lambda k: a[a.index(k)+1]; "
            "'--save-result' in a or sys.exit(0); "
            f"open({str(calls)!r}, 'a').write("
            "g('--random-output-len') + ' ' + g('--max-concurrency') + '\\n'); "
            "json.dump({'completed': 1, 'output_throughput': 1.0}, "
            "open(g('--result-dir')+'/'+g('--result-filename'), 'w'))")
    res = bench.run(url="http://127.0.0.1:9", model="m", tokenizer=None,
                    scenarios=["long-form", "chat:2,32"], concurrency=[1, 64], config="x",
                    vllm_cmd=[sys.executable, "-c", fake])
    assert [(r["scenario"], r["concurrency"]) for r in res["runs"]] == [
        ("long-form", 1), ("long-form", 64), ("chat", 2), ("chat", 32)]
    assert calls.read_text().split() == ["1024", "1", "1024", "64", "512", "2", "512", "32"]
    r = subprocess.run([sys.executable, "-m", "inference_image.cli", "bench", "run", "--model", "m",
                        "--scenario", "chat:0", "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "after 'chat:' give its concurrencies" in r.stderr
    assert "Traceback" not in r.stderr


class _Counters(http.server.BaseHTTPRequestHandler):
    """A vLLM /metrics page whose counters a fake bench raises by GET /add?k=v,..."""

    values: ClassVar[dict[str, float]] = {}

    def do_GET(self) -> None:
        if self.path.startswith("/add?"):
            for kv in self.path[5:].split(","):
                k, v = kv.split("=")
                self.values[k] = self.values.get(k, 0.0) + float(v)
            body = b"ok"
        else:
            body = "".join(f'vllm:{k}_total{{engine="0",model_name="m"}} {v}\n'
                           for k, v in self.values.items()).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


# A stand-in for `vllm bench serve`: a warm-up run (it saves nothing) sends 100 prompt tokens,
# none cached, and 10 drafts, none accepted; a measured run of 1000 tokens, 250 cached, 100 drafts
# of 3 tokens, 150 accepted, and saves its result.
FAKE_BENCH = """
import json, urllib.request
def bench(a):
    url = a[a.index("--base-url") + 1]
    measured = "--save-result" in a
    add = ("prefix_cache_queries=1000,prefix_cache_hits=250,spec_decode_num_drafts=100,"
           "spec_decode_num_draft_tokens=300,spec_decode_num_accepted_tokens=150" if measured
           else "prefix_cache_queries=100,prefix_cache_hits=0,spec_decode_num_drafts=10,"
           "spec_decode_num_draft_tokens=30,spec_decode_num_accepted_tokens=0")
    urllib.request.urlopen(url + "/add?" + add).read()
    if measured:
        out = a[a.index("--result-dir") + 1] + "/" + a[a.index("--result-filename") + 1]
        json.dump({"completed": 4, "failed": 0, "output_throughput": 10.0}, open(out, "w"))
"""


@pytest.mark.parametrize("one_process", [False, True])
def test_each_row_counts_its_measured_requests_only(tmp_path, monkeypatch, one_process):
    """The prefix-cache share and acceptance of a row come from the counters read right before
    and right after its measured run: not its warm-up's requests, nor the next row's (the
    one-process bench waits to be told before it starts the next run)."""
    _Counters.values = {}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counters)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    kw: dict = {}
    if one_process:
        # vLLM's bench module as the one-process driver imports it
        pkg = tmp_path / "fake" / "vllm"
        (pkg / "benchmarks").mkdir(parents=True)
        (pkg / "utils").mkdir()
        for d in (pkg, pkg / "benchmarks", pkg / "utils"):
            (d / "__init__.py").write_text("")
        (pkg / "benchmarks" / "serve.py").write_text(
            FAKE_BENCH + "def add_cli_args(p): pass\ndef main(argv): bench(argv)\n")
        (pkg / "utils" / "argparse_utils.py").write_text(
            "class FlexibleArgumentParser:\n    def parse_args(self, argv): return argv\n")
        monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
        kw["vllm_python"] = sys.executable
    try:
        res = bench.run(url=url, model="m", tokenizer=None, scenarios=["chat", "summarization"],
                        concurrency=[1, 2], config="x", metrics_url=url,
                        vllm_cmd=[sys.executable, "-c", FAKE_BENCH + "import sys; bench(sys.argv)"],
                        timeout_s=60, **kw)
    finally:
        srv.shutdown()
    rows = res["runs"]
    assert [(r["scenario"], r["concurrency"]) for r in rows] == [
        ("chat", 1), ("chat", 2), ("summarization", 1), ("summarization", 2)]
    for r in rows:
        assert r["prefix_cache_hit_rate"] == 0.25 and r["acceptance_length"] == 2.5, r
        assert r["draft_acceptance_rate"] == 0.5
    assert bench.markdown(rows).splitlines()[2].endswith("| 25% | 2.50 |")


def test_counters_of_the_instances_behind_a_router_are_summed():
    """Behind a router each instance served some of a row's requests, so the row's acceptance is
    the sum of every instance's counters (not one instance's, not an average of their lengths);
    an instance whose /metrics does not answer leaves the row without counters rather than short
    of one server."""
    class One(_Counters):
        values: ClassVar[dict[str, float]] = {
            "spec_decode_num_drafts": 100.0, "spec_decode_num_accepted_tokens": 50.0}

    class Two(_Counters):
        values: ClassVar[dict[str, float]] = {
            "spec_decode_num_drafts": 300.0, "spec_decode_num_accepted_tokens": 330.0}

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), h) for h in (One, Two)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    try:
        both = bench.engine_counters(urls)
        assert both == {"vllm:spec_decode_num_drafts_total": 400.0,
                        "vllm:spec_decode_num_accepted_tokens_total": 380.0}
        # 1 + 380 / 400; the two instances' own lengths are 1.5 and 2.1
        assert bench.acceptance(None, both)["acceptance_length"] == 1.95
        assert bench.engine_counters(urls[0]) == {"vllm:spec_decode_num_drafts_total": 100.0,
                                                  "vllm:spec_decode_num_accepted_tokens_total": 50.0}
        servers[1].shutdown()
        servers[1].server_close()
        assert bench.engine_counters(urls) is None
    finally:
        servers[0].shutdown()


def test_compare_sets_a_row_against_its_own_configuration_only():
    """A result of several configurations (a proof's vanilla and image rows) compared with itself
    reads one times itself in every row: rows of two configurations at one concurrency are never crossed."""
    def row(config, tok):
        return bench.row_from_result({"output_throughput": tok, "p99_ttft_ms": 10}, "chat", 4, config)
    both = {"runs": [row("vanilla", 1000.0), row("image", 1970.0)]}
    out = bench_compare.compare(both, both)
    ratios = re.findall(r"\| (\d+\.\d+)x \|", out)
    assert ratios and set(ratios) == {"1.00"}, out


def test_results_files_hold_finite_json_only(tmp_path) -> None:
    """vLLM's bench reports NaN where no request of a row finished; a results file says null."""
    import json as _json

    from inference_lab import proof

    doc = {"runs": [{"ttft_ms_mean": float("nan"), "tok_s": float("inf"), "c": 1}], "x": -1.5}
    text = bench.results_json(doc)
    assert _json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {text}")) == {
        "runs": [{"ttft_ms_mean": None, "tok_s": None, "c": 1}], "x": -1.5}
    runner = proof.Runner(plan=proof.Plan(tier="cpu"), out=tmp_path, work=tmp_path,
                          model_dir=tmp_path)
    runner.results = {"runs": {"a": [{"output_tok_s": float("nan")}]}}
    runner.save()
    assert "NaN" not in (tmp_path / "proof.json").read_text()


def test_compare_reads_the_records_the_readme_links(capsys) -> None:
    """`bench compare` takes a proof record of docs/benchmarks/ (the README's status table links
    them): one machine's rows as FILE#MACHINE, set against another file's; a record whose rows
    are of several machines names them, never mixing two."""
    from conftest import ROOT

    from inference_image.cli import main
    readme = (ROOT / "README.md").read_text()
    run = re.search(r"docs/benchmarks\.md#run-(\d+)", readme)[1]
    (record,) = (ROOT / "docs/benchmarks").glob(f"*-proof-run{run}.json")
    machines = [n for n, m in json.loads(record.read_text())["machines"].items() if m.get("runs")]
    first = f"{record}#{machines[0]}"
    assert main(["bench", "compare", first, first]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")][1:]
    assert rows and all("| 1.00x |" in ln for ln in rows), rows
    if len(machines) > 1:
        assert main(["bench", "compare", str(record), first]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and all(m in err for m in machines) and "#MACHINE" in err
    assert main(["bench", "compare", f"{record}#no-such-machine", first]) == 1
    assert "no machine 'no-such-machine'" in capsys.readouterr().err
