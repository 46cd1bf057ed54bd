"""Benchmark harness: DigitalOcean's scenarios driven by `vllm bench serve`.

Load generation and metric definitions (output tok/s, TTFT, TPOT, ITL, E2E) are vLLM's own;
this module picks the scenarios and concurrencies, runs them in order with fixed seeds, and
writes JSON, a Markdown table and PNG charts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tqdm import tqdm

from inference_machine import bounded_http
from inference_machine.inputs import InputError, read_text

from ..profiles import ProfileErrors, default_profiles_dir, resolve
from ..schema import SCENARIOS, Scenario, bad_scenario_spec, scenario_spec
from .bench_compare import cmd_compare
from .vllm_bench_batch import GO, MARK

Num = TypeVar("Num", int, float)


CONCURRENCY = [1, 2, 4, 8, 16]
SATURATION = [32, 64]
QUICK = {"scenarios": ["chat"], "concurrency": [1, 4, 16]}


MIN_PROMPTS = 8


def num_prompts(concurrency: int, per: int, floor: int = MIN_PROMPTS) -> int:
    """per x concurrency, at least `floor`: at low concurrency one slow request in a handful
    moves the mean TTFT."""
    return max(floor, per * concurrency)


# Added to a measured run's seed for the warm-up run before it: vLLM's own warm-up (and its ready
# check) sends the run's first prompt, so that prompt was a prefix-cache hit when it was measured
# (every row's first TTFT read a cached prompt).
WARMUP_SEED = 1_000_003

# Output tokens of a warm-up answer after a scenario's first row. The first row's warm-up answers
# in full, so every context length of the scenario has been served once; after it a warm-up only
# needs the row's batch shape (CUDA graphs are captured at start for every size). Full answers
# made the warm-ups the longest part of a 70B proof.
WARMUP_SHORT_OUTPUT = 64


def run_seed(seed: int, sc: Scenario, c: int) -> int:
    """A row's seed: apart per concurrency and per scenario. vLLM's random dataset draws each
    prompt's start from the seed alone, so with one seed a 1024-token prompt began with the
    512-token prompt of the same index, and a scenario run after another was partly prefix-cached."""
    return seed + c + 1000 * list(SCENARIOS).index(sc.name)


def bench_args(
    url: str, model: str, tokenizer: str | None, sc: Scenario, c: int, per: int, seed: int,
    result_dir: Path, result_file: str, floor: int = MIN_PROMPTS, warmup: bool = False,
    output_len: int | None = None, sampling: Mapping[str, float] | None = None,
) -> list[str]:
    """What follows `vllm bench serve` for one scenario at one concurrency; `warmup`: the run
    before it (min(c, 4) prompts of another seed, nothing saved), so that the measured run sends
    only its own prompts; `output_len`: a warm-up's answers, when shorter than the scenario's;
    `sampling`: temperature, top_p, top_k sent with every request (none: the server's defaults,
    which vLLM 0.26 reads from the checkpoint's generation_config.json)."""
    n = min(c, 4) if warmup else num_prompts(c, per, floor)
    out = min(output_len, sc.output_len) if warmup and output_len else sc.output_len
    args = ["--backend", "vllm", "--base-url", url,
            "--model", model, "--dataset-name", "random",
            "--random-input-len", str(sc.input_len - sc.prefix_len),
            "--random-output-len", str(out),
            "--num-prompts", str(n), "--max-concurrency", str(c),
            "--num-warmups", "0", "--ignore-eos",
            "--seed", str(seed + WARMUP_SEED if warmup else seed), "--disable-tqdm"]
    if not warmup:
        # the ready check (off by default in vLLM 0.26 and 0.32) would send the first prompt too
        args += ["--ready-check-timeout-sec", "0",
                 "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                 "--save-result", "--result-dir", str(result_dir), "--result-filename", result_file,
                 # per-request TTFTs: a p99 over 16 requests is one request, and which one it
                 # was (the first of a batch shape, or any) says why
                 "--save-detailed"]
    if sc.prefix_len:
        args += ["--random-prefix-len", str(sc.prefix_len)]
    for key, value in sorted((sampling or {}).items()):
        args += [f"--{key.replace('_', '-')}", str(int(value) if key == "top_k" else value)]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    return args


def bench_command(
    vllm_cmd: list[str], url: str, model: str, tokenizer: str | None, sc: Scenario, c: int,
    per: int, seed: int, result_dir: Path, result_file: str, warmup: bool = False,
) -> list[str]:
    return [*vllm_cmd, "bench", "serve",
            *bench_args(url, model, tokenizer, sc, c, per, seed, result_dir, result_file,
                        warmup=warmup)]


class BenchResult(BaseModel):
    """What a row reads of `vllm bench serve`'s result file (vLLM writes NaN latencies for a row
    where no request finished: read as none)."""
    model_config = ConfigDict(extra="allow")
    completed: int = Field(0, ge=0, description="requests that finished")
    failed: int = Field(0, ge=0, description="requests that failed")


def _result(d: Any, where: str) -> dict[str, Any]:
    """vLLM bench's result as a row reads it; BenchError naming the field that is wrong."""
    try:
        BenchResult.model_validate(d)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise BenchError(f"{where}: vllm bench serve's result has {'.'.join(map(str, e['loc']))}"
                         f" {e.get('input')!r:.60}: {e['msg']}") from None
    return dict(d)


def row_from_result(d: dict[str, Any], scenario: str, c: int, config: str) -> dict[str, Any]:
    def g(k: str) -> float:
        v = d.get(k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return 0.0
        return round(float(v), 3)
    return {
        "config": config, "scenario": scenario, "concurrency": c,
        "completed": int(d.get("completed") or 0), "failed": int(d.get("failed") or 0),
        "duration_s": g("duration"),
        "output_tok_s": g("output_throughput"), "total_tok_s": g("total_token_throughput"),
        "ttft_ms_mean": g("mean_ttft_ms"), "ttft_ms_p50": g("p50_ttft_ms"),
        "ttft_ms_p99": g("p99_ttft_ms"),
        "tpot_ms_mean": g("mean_tpot_ms"), "tpot_ms_p99": g("p99_tpot_ms"),
        "itl_ms_mean": g("mean_itl_ms"), "itl_ms_p99": g("p99_itl_ms"),
        "e2el_ms_mean": g("mean_e2el_ms"), "e2el_ms_p99": g("p99_e2el_ms"),
        **ttft_each(d),
    }


def ttft_each(d: dict[str, Any]) -> dict[str, list[float]]:
    """Each request's TTFT in ms, in the order the requests were sent (vLLM's detailed result;
    empty where it has none), and when it was sent, ms after the row's first request: whether
    two first tokens waited on one step of both prompts or one on the other's is in the sends."""
    ttfts, starts = d.get("ttfts") or [], d.get("start_times") or []
    if not ttfts:
        return {}
    timed = len(starts) == len(ttfts)
    order = sorted(range(len(ttfts)), key=lambda i: starts[i]) if timed else range(len(ttfts))
    each = {"ttft_ms_each": [round(float(ttfts[i] or 0.0) * 1000, 1) for i in order]}
    if timed:
        first = float(starts[order[0]])
        each["sent_ms_each"] = [round((float(starts[i]) - first) * 1000, 1) for i in order]
    return each


def cost_per_mtok(hourly_usd: float, output_tok_s: float) -> float | None:
    if output_tok_s <= 0 or hourly_usd <= 0:
        return None
    return hourly_usd / (output_tok_s * 3600) * 1e6


# scenario, concurrency, result file (None: the warm-up run before a measured one), args
Plan = list[tuple[Scenario, int, str | None, list[str]]]


def _run_each(plan: Plan, vllm_cmd: list[str], timeout_s: int, log: Path | None,
              ) -> Generator[tuple[int, float], None, None]:
    """One `vllm bench serve` process per entry; yields (index, wall seconds)."""
    for k, (sc, c, _, args) in enumerate(plan):
        cmd = [*vllm_cmd, "bench", "serve", *args]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        if log is not None:
            with log.open("a") as fh:
                fh.write(f"$ {shlex.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n")
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise BenchError(f"vllm bench serve failed for {sc.name} c={c} "
                             f"(exit {proc.returncode}): " + " | ".join(tail))
        yield k, time.monotonic() - t0


def _run_batch(plan: Plan, vllm_python: str, timeout_s: int, log: Path | None, tmp: Path,
               ) -> Generator[tuple[int, float], None, None]:
    """Every entry in one process of vLLM's Python (vllm_bench_batch.py); the first entry's wall
    time includes the one import of vLLM. The process starts each entry after the first only
    when told to, which happens when the caller asks for the next one: what the caller reads from
    the server between two entries (its counters) belongs to the entry just finished."""
    plan_file = tmp / "plan.json"
    plan_json = json.dumps([args for *_, args in plan])
    plan_file.write_text(plan_json)
    cmd = [vllm_python, str(Path(__file__).with_name("vllm_bench_batch.py")), str(plan_file)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(timeout_s * len(plan), proc.kill)
    watchdog.start()
    fh = log.open("a") if log is not None else None
    tail: list[str] = []
    done = 0
    try:
        if fh:
            fh.write(f"$ {shlex.join(cmd)}  # {plan_json}\n")
        t0 = time.monotonic()
        assert proc.stdout is not None and proc.stdin is not None
        for line in proc.stdout:
            if fh:
                fh.write(line)
            if not line.startswith(MARK):
                tail = [*tail[-4:], line.strip()]
                continue
            mark = json.loads(line[len(MARK):])
            sc, c, _, _ = plan[mark["i"]]
            if mark["rc"] != 0:
                raise BenchError(f"vllm bench serve failed for {sc.name} c={c}: {mark['error']} | "
                                 + " | ".join(tail))
            done += 1
            yield mark["i"], time.monotonic() - t0
            if done < len(plan):
                proc.stdin.write(GO)
                proc.stdin.flush()
            t0 = time.monotonic()
        rc = proc.wait()
        if done < len(plan):
            why = "timed out" if rc < 0 and not watchdog.is_alive() else f"exit {rc}"
            sc, c, _, _ = plan[done]
            raise BenchError(f"vllm bench serve stopped at {sc.name} c={c} ({why}): "
                             + " | ".join(tail))
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if fh:
            fh.close()


def run(
    *, url: str, model: str, tokenizer: str | None, scenarios: list[str], concurrency: list[int],
    config: str, vllm_cmd: list[str], per: int = 4, seed: int = 0, hourly_usd: float = 0.0,
    timeout_s: int = 1800, log: Path | None = None, vllm_python: str | None = None,
    partial: Path | None = None, min_prompts: int = MIN_PROMPTS,
    metrics_url: str | Sequence[str] | None = None, sampling: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Each row is a warm-up run (prompts of its own) and then the measured run.
    vllm_python: run the whole plan in one process of that interpreter (it must import vllm)
    instead of one `vllm_cmd bench serve` process per run.
    partial: rewritten after every row ("partial": true), so a bench cut off keeps its rows.
    metrics_url: a vLLM server whose /metrics is read before and after every measured run, so
    that each row carries the share of prompt tokens its prefix cache served and, where the
    server speculates, the acceptance length and draft acceptance rate of that run alone; or
    several, every instance behind a router, their counters summed. sampling: bench_args'."""
    rows: list[dict[str, Any]] = []
    meta = {"url": url, "model": model, "config": config, "seed": seed,
            "prompts_per_concurrency": per, "min_prompts": min_prompts, "hourly_usd": hourly_usd,
            "tool": "vllm bench serve", "ignore_eos": True, "one_process": bool(vllm_python),
            "sampling": dict(sampling or {}),
            "warmup": f"min(c, 4) prompts of seed + {WARMUP_SEED} before each row; whole answers "
                      f"before a scenario's first row, {WARMUP_SHORT_OUTPUT} tokens before the others"}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmpdir:
        tmp = Path(tmpdir)
        plan: Plan = []
        for s in scenarios:
            name, own = scenario_spec(s)
            sc = SCENARIOS[name]
            for i, c in enumerate(own or concurrency):
                fname = f"{sc.name}-c{c}.json"
                rs = run_seed(seed, sc, c)
                plan.append((sc, c, None, bench_args(
                    url, model, tokenizer, sc, c, per, rs, tmp, fname, min_prompts, warmup=True,
                    output_len=None if i == 0 else WARMUP_SHORT_OUTPUT, sampling=sampling)))
                plan.append((sc, c, fname, bench_args(url, model, tokenizer, sc, c, per, rs,
                                                      tmp, fname, min_prompts,
                                                      sampling=sampling)))
        # rows done of all, and the next one (stderr: the results go to stdout and files)
        bar = tqdm(total=len(plan) // 2, unit="row", desc="bench", file=sys.stderr,
                   dynamic_ncols=True, postfix=f"{plan[0][0].name} c={plan[0][1]}")
        runs = (_run_batch(plan, vllm_python, timeout_s, log, tmp) if vllm_python
                else _run_each(plan, vllm_cmd, timeout_s, log))
        counters: dict[str, float] | None = None
        # closing: a row refused below stops the one-process bench at once (its finally kills it)
        with contextlib.closing(runs), bar:
            for k, wall in runs:
                sc, c, fname, _ = plan[k]
                if fname is None:  # the warm-up: the measured run's counters start here
                    counters = engine_counters(metrics_url) if metrics_url else None
                    if metrics_url and counters is None and not rows:
                        # no /metrics to read (a router's, an unreadable one): the rows go
                        # without the counters rather than wait on it before and after each
                        print(f"bench: no counters at {metrics_url}/metrics: the rows carry no "
                              "prefix-cache or acceptance figures", file=sys.stderr)
                        metrics_url = None
                    continue
                res = tmp / fname
                if not res.exists():
                    raise BenchError(f"vllm bench serve wrote no result for {sc.name} c={c}")
                try:
                    got = json.loads(read_text(res, "vllm bench serve's result", 256 * 2**20))
                except (InputError, ValueError) as exc:
                    raise BenchError(f"{sc.name} c={c}: {exc}") from None
                row = row_from_result(_result(got, f"{sc.name} c={c}"), sc.name, c, config)
                if row["completed"] == 0:  # vLLM's bench exits 0 when every request failed
                    raise BenchError(f"no request completed at {sc.name} c={c} ({row['failed']} failed). "
                                     f"Fix: check that {url} serves {model!r}"
                                     + (f" (requests' errors: {log})" if log else ""))
                row["wall_s"] = round(wall, 1)
                if sampling:  # none: the server's defaults
                    row["sampling"] = dict(sampling)
                row["usd_per_mtok"] = cost_per_mtok(hourly_usd, row["output_tok_s"])
                if metrics_url:
                    now = engine_counters(metrics_url)
                    row.update(prefix_cache(counters, now))
                    row.update(acceptance(counters, now))
                rows.append(row)
                if partial is not None:
                    partial.write_text(results_json({"meta": meta, "runs": rows, "partial": True},
                                                  indent=2, sort_keys=True) + "\n")
                bar.set_postfix_str(f"{plan[k + 1][0].name} c={plan[k + 1][1]}"
                                    if k + 1 < len(plan) else "done", refresh=False)
                bar.update(1)
    return {"meta": meta, "runs": rows}


def base_url(s: str) -> str:
    """An argparse type: an http(s) URL with a host and, if given, a port 1-65535, and nothing a
    request line could carry further (spaces, control characters, a query or fragment)."""
    from urllib.parse import urlsplit

    why = ""
    try:
        u = urlsplit(s)
        port = u.port  # ValueError past 65535
    except ValueError:
        u, port, why = None, None, "a port 1-65535"
    if not why and (u is None or u.scheme not in ("http", "https") or not u.hostname):
        why = "http:// or https:// and a host"
    if not why and (any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in s)
                    or u.query or u.fragment or u.username or port == 0):
        why = "no spaces, control characters, user, query or fragment, a port 1-65535"
    if why:
        raise argparse.ArgumentTypeError(f"{s!r}: give a base URL ({why}), e.g. "
                                         "https://127.0.0.1:8000")
    return s.rstrip("/")


def finite(doc: Any) -> Any:
    """`doc` with every NaN or infinity made null: what a results file holds is JSON that every
    reader parses (Python writes NaN, which JSON has not), and no row says a figure it never
    measured (vLLM's bench reports NaN latencies for a row where no request finished)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc


def results_json(doc: Any, **kw: Any) -> str:
    """A results document as strict JSON (finite numbers only)."""
    return json.dumps(finite(doc), allow_nan=False, **kw)


class BenchError(Exception):
    pass


METRICS_MAX_BYTES = 16 * 2**20
METRICS_DEADLINE_S = 5.0


def read_url(url: str, max_bytes: int = METRICS_MAX_BYTES, deadline_s: float | None = None
             ) -> bytes:
    """The body at `url`, whole within `deadline_s` (METRICS_DEADLINE_S) and at most `max_bytes`,
    else OSError: a server that answers a byte at a time, or without end, must not hold the run."""
    got = bounded_http.fetch(url, deadline_s=deadline_s or METRICS_DEADLINE_S, max_bytes=max_bytes)
    if got.status >= 400:
        raise OSError(f"{url}: HTTP {got.status}")
    return got.body


def engine_counters(url: str | Sequence[str]) -> dict[str, float] | None:
    """vLLM's prefix-cache and speculative-decoding counters from URL/metrics, or summed over
    several servers (the instances behind one router: which of them served a request is the
    router's choice, so only their sum covers a run); None when any /metrics is not reachable or
    has none, since a sum short of one server would misstate the run."""
    total: dict[str, float] = {}
    for u in [url] if isinstance(url, str) else url:
        try:
            one = parse_engine_counters(read_url(f"{u}/metrics").decode(errors="replace"))
        except OSError:
            return None
        if one is None:
            return None
        for k, v in one.items():
            total[k] = total.get(k, 0.0) + v
    return total or None


# generation tokens and finished requests too: with them, the share of decode steps that carried
# a draft at all (prompt lookup drafts only where an n-gram matches; a model draft every step)
COUNTERS = ("vllm:spec_decode_num", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
            "vllm:generation_tokens", "vllm:request_success")


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text page (name, labels, value), read by prometheus_client's
    parser; [] for a page it cannot read (a server's error page is no metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [(s.name, dict(s.labels), float(s.value))
                for fam in text_string_to_metric_families(text) for s in fam.samples]
    except (ValueError, TypeError, IndexError):
        return []


def parse_engine_counters(text: str) -> dict[str, float] | None:
    """The counters of COUNTERS in a Prometheus text page, summed over label sets (engines,
    models; per position kept apart as NAME[i])."""
    out: dict[str, float] = {}
    for name, labels, value in metric_samples(text):
        # a counter's samples: NAME_total, and NAME_created (a timestamp, not a count)
        if not name.startswith(COUNTERS) or not name.endswith("_total"):
            continue
        if not math.isfinite(value) or value < 0:  # a counter is a finite count: a page that
            return None                            # says otherwise is no reading at all
        pos = labels.get("position")
        key = f"{name}[{pos}]" if pos is not None and pos.isdigit() else name
        out[key] = out.get(key, 0.0) + value
    return out or None


def _delta(before: dict[str, float] | None, after: dict[str, float], key: str) -> float:
    """How much a counter grew between two readings (a counter not read yet counts as 0)."""
    return after.get(key, 0.0) - (before or {}).get(key, 0.0)


def prefix_cache(before: dict[str, float] | None, after: dict[str, float] | None,
                 ) -> dict[str, Any]:
    """The share of prompt tokens the prefix cache served between two counter readings."""
    if not after:
        return {}
    queries = _delta(before, after, "vllm:prefix_cache_queries_total")
    hits = _delta(before, after, "vllm:prefix_cache_hits_total")
    return {"prefix_cache_hit_rate": round(hits / queries, 3)} if queries > 0 else {}


def acceptance(before: dict[str, float] | None, after: dict[str, float] | None,
               ) -> dict[str, Any]:
    """Acceptance length (1 + accepted / drafts: the bonus token counts), the rate at which
    draft tokens were accepted, and the share of decode steps that carried draft slots (vLLM
    counts the slots ngram_gpu could not fill as drafted), over the requests between two counter
    readings."""
    if not after:
        return {}

    def d(k: str) -> float:
        return _delta(before, after, k)
    drafts = d("vllm:spec_decode_num_drafts_total")
    tokens = d("vllm:spec_decode_num_draft_tokens_total")
    acc = d("vllm:spec_decode_num_accepted_tokens_total")
    if drafts <= 0:
        return {}
    per_pos = [round(d(k) / drafts, 3) for k in sorted(
        (k for k in after if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos")),
        key=lambda k: int(k.rsplit("[", 1)[1].rstrip("]")))]
    # Each step hands a request 1 + its accepted tokens, and a request's first step (its prefill)
    # has no draft to verify: what is left is the decode steps, drafted or not.
    decode_steps = (d("vllm:generation_tokens_total") - acc
                    - d("vllm:request_success_total"))
    return {"acceptance_length": round(1 + acc / drafts, 3),
            "draft_acceptance_rate": round(acc / tokens, 3) if tokens else None,
            "acceptance_per_position": per_pos,
            **({"drafted_step_share": round(min(drafts / decode_steps, 1.0), 3)}
               if decode_steps > 0 else {})}


def markdown(runs: list[dict[str, Any]]) -> str:
    # vLLM's ITL is the gap between streamed chunks, not tokens: a speculative step sends several
    # tokens in one, and so does a profile's serving.stream_interval. TPOT is the per-token figure.
    head = ("| config | scenario | c | output tok/s | TTFT mean / p99 ms | TPOT mean ms "
            "| gap between chunks p99 ms | $/Mtok | prefix cache hits | acceptance length |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in runs:
        cost, hit, al = (r.get(k) for k in ("usd_per_mtok", "prefix_cache_hit_rate",
                                             "acceptance_length"))
        lines.append(
            f"| {r['config']} | {r['scenario']} | {r['concurrency']} | {r['output_tok_s']:.1f} "
            f"| {r['ttft_ms_mean']:.1f} / {r['ttft_ms_p99']:.1f} | {r['tpot_ms_mean']:.2f} "
            f"| {r['itl_ms_p99']:.2f} | {'' if cost is None else f'{cost:.3f}'} "
            f"| {'' if hit is None else f'{hit:.0%}'} | {'' if al is None else f'{al:.2f}'} |")
    return head + "\n".join(lines) + "\n"


def charts(runs: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """PNG charts; returns [] when matplotlib is not installed (say so, do not fail)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    keys = sorted({(r["config"], r["scenario"]) for r in runs})
    for metric, label, fname in (
        ("output_tok_s", "output tokens/s", "throughput.png"),
        ("ttft_ms_p99", "TTFT p99 (ms)", "ttft.png"),
        ("usd_per_mtok", "USD per million output tokens", "cost.png"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        plotted = False
        for config, scenario in keys:
            pts = [(r["concurrency"], r[metric]) for r in runs
                   if r["config"] == config and r["scenario"] == scenario and r.get(metric)]
            if pts:
                xs, ys = zip(*sorted(pts), strict=True)
                ax.plot(xs, ys, marker="o", label=f"{config} / {scenario}")
                plotted = True
        if not plotted:
            plt.close(fig)
            continue
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def comma_list(s: str, kind: type[Num], rule: str) -> list[Num]:
    """An argparse type: comma-separated numbers of `kind`, each >= 1 (`rule` says why)."""
    try:
        vals = [kind(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give comma-separated {kind.__name__}s") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: {rule}")
    return vals


def _ints(s: str) -> list[int]:
    return comma_list(s, int, "concurrencies are integers >= 1")


def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: give an integer >= 1")
    return v


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file:
        return read_text(Path(args.api_key_file), "--api-key-file", 4096).strip()
    return os.environ.get("INFERENCE_API_KEY")


def _command(s: str) -> list[str]:
    """An argparse type: a command line, split as a shell would (without running one)."""
    try:
        argv = shlex.split(s)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{s!r}: {exc}; quote it as a shell would") from None
    if not argv:
        raise argparse.ArgumentTypeError("empty: give the command that runs vLLM's CLI, e.g. vllm")
    return argv


LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")  # \Z: no line end after it


def out_problem(out: str) -> str | None:
    """What is wrong with an --out directory, or None: empty, or a symlink (followed, it would
    write where the link points)."""
    if not out.strip():
        return "--out is empty. Fix: give a directory path"
    p = Path(out)
    if p.is_symlink():
        return f"--out {out} is a symbolic link. Fix: give the directory itself"
    if p.exists() and not p.is_dir():
        return f"--out {out} is a file. Fix: give a directory path"
    return None


def cmd_run(args: argparse.Namespace) -> int:
    scenarios = ["chat"] if args.quick else (args.scenario or list(SCENARIOS))
    if why := bad_scenario_spec(scenarios):
        print(f"error: --scenario {why}", file=sys.stderr)
        return 1
    conc = args.concurrency or (QUICK["concurrency"] if args.quick
                                else CONCURRENCY + ([] if args.no_saturation else SATURATION))
    hourly = 0.0
    model = args.model
    if args.profile:
        try:
            r = resolve(args.profile, Path(args.profiles_dir) if args.profiles_dir
                        else default_profiles_dir())
        except ProfileErrors as exc:
            for e in exc.errors:
                print(f"error: {e}", file=sys.stderr)
            return 1
        hourly = r.usd_per_hour
        model = model or r.profile.model.target
    if not model:
        print("error: --model is required without --profile. Fix: pass --model SERVED_NAME",
              file=sys.stderr)
        return 1
    if not re.match(r"^https?://[^/\s]+", args.url):
        print(f"error: --url {args.url!r}: want http:// or https:// and a host. Fix: e.g. "
              "https://127.0.0.1:8000", file=sys.stderr)
        return 1
    if not LABEL.match(args.label):
        print(f"error: --label {args.label!r}: letters, digits, '.', '_' and '-' only (it names "
              "files under --out). Fix: e.g. --label h100-run1", file=sys.stderr)
        return 1
    if why := out_problem(args.out):
        print(f"error: {why}", file=sys.stderr)
        return 1
    # Before the first run, not as an errno after a progress bar.
    exe = args.vllm_python or args.vllm_cmd[0]
    if not shutil.which(exe):
        how = ("--vllm-python names" if args.vllm_python else "--vllm-cmd starts with")
        print(f"error: {how} {exe!r}, which is not an executable here. Fix: install vLLM "
              "(pip install vllm) or pass --vllm-python PYTHON, the Python of the venv vLLM is "
              "installed in", file=sys.stderr)
        return 1
    try:
        key = _api_key(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if key:
        os.environ["OPENAI_API_KEY"] = key  # what `vllm bench serve` sends as a Bearer token
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".bench-"):
            pass  # writable, before the first run rather than after it
        for suffix in (".json", ".md", ".log"):
            f = out / f"{args.label}{suffix}"
            if f.is_dir() or f.is_symlink():
                raise IsADirectoryError(21, f"{f} is a folder or a link")
        (out / f"{args.label}.json").unlink(missing_ok=True)  # no stale result beside a cut-off run
    except OSError as exc:
        print(f"error: --out {args.out}: cannot write the results there ({exc.strerror or exc})."
              " Fix: pass a directory you can write, whose result names are free",
              file=sys.stderr)
        return 1
    try:
        result = run(url=args.url.rstrip("/"), model=model, tokenizer=args.tokenizer,
                     scenarios=scenarios, concurrency=conc, config=args.label,
                     vllm_cmd=args.vllm_cmd, per=args.prompts_per_concurrency,
                     seed=args.seed, hourly_usd=hourly, log=out / f"{args.label}.log",
                     vllm_python=args.vllm_python, partial=out / f"{args.label}.json",
                     min_prompts=args.min_prompts, metrics_url=args.url.rstrip("/"))
    except (BenchError, subprocess.TimeoutExpired, FileNotFoundError) as exc:
        print(f"\nerror: {exc}", file=sys.stderr)  # after the progress bar's line
        return 1
    result["meta"]["profile"] = args.profile
    (out / f"{args.label}.json").write_text(results_json(result, indent=2, sort_keys=True) + "\n")
    table = markdown(result["runs"])
    (out / f"{args.label}.md").write_text(table)
    pngs = charts(result["runs"], out)
    print(table)
    print(f"results: {out / (args.label + '.json')}" +
          (f"; charts: {', '.join(p.name for p in pngs)}" if pngs
           else "; charts skipped (matplotlib is not installed)"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    bp = sub.add_parser("bench", help="benchmark an endpoint, or compare two results")
    bsub = bp.add_subparsers(dest="bench_cmd", required=True, metavar="ACTION")
    rp = bsub.add_parser("run", help="run scenarios x concurrencies against an endpoint")
    rp.add_argument("--url", default="https://127.0.0.1:8000", type=base_url,
                    help="base URL (the public port, the router or an instance); for the public "
                    "port's own certificate set SSL_CERT_FILE=/etc/inference-image/tls/cert.pem")
    rp.add_argument("--profile", metavar="TIER", help="served model name and $/hour from a tier")
    rp.add_argument("--model", help="served model name (default: the profile's target)")
    rp.add_argument("--tokenizer", help="tokenizer path when the served name is not a hub id")
    rp.add_argument("--scenario", action="append",
                    help=f"one of {', '.join(SCENARIOS)}; repeat; NAME:C1,C2 runs that scenario at "
                    "its own concurrencies instead of --concurrency's")
    rp.add_argument("--concurrency", type=_ints, help="e.g. 1,2,4,8,16")
    rp.add_argument("--no-saturation", action="store_true", help="skip concurrency 32 and 64")
    rp.add_argument("--quick", action="store_true", help="chat at c=1,4,16 (the throughput suite)")
    rp.add_argument("--prompts-per-concurrency", type=positive_int, default=4)
    rp.add_argument("--min-prompts", type=positive_int, default=MIN_PROMPTS,
                    help=f"at least this many prompts per run (default {MIN_PROMPTS})")
    rp.add_argument("--seed", type=int, default=0)
    rp.add_argument("--label", default="run", help="config name in results and file names")
    rp.add_argument("--out", default="build/bench")
    rp.add_argument("--api-key-file", help="default: $INFERENCE_API_KEY")
    rp.add_argument("--vllm-cmd", type=_command, default=["vllm"], help="how to call vLLM's CLI")
    rp.add_argument("--vllm-python", metavar="PYTHON",
                    help="run every scenario and concurrency in one process of this interpreter "
                    "(one that imports vllm) instead of one `vllm bench serve` each: saves "
                    "vLLM's import per run")
    rp.set_defaults(func=cmd_run)
    cp = bsub.add_parser("compare", help="ratios B/A side by side")
    for name in ("a", "b"):
        cp.add_argument(name, help="a result of `bench run`, or a proof record of docs/benchmarks/ "
                        "(FILE#MACHINE where it holds several machines' rows)")
    cp.set_defaults(func=cmd_compare)
