"""What the GPU proof sends a server beside the bench rows (greedy and sampling checks, first
tokens, decode streams) and the stand-in models and plugin it serves."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from inference_image.ops.bench import metric_samples, read_url
from inference_image.profiles import (
    Resolved,
    default_profiles_dir,
    list_tiers,
    load_catalog,
    project_root,
    resolve,
)
from inference_machine.bounded_http import Answer, fetch

from .proof_machine import FILE_POLL_S, serving
from .proof_plan import DRAFTS, FP8_STANDIN, TARGETS, ProofError, ct_fp8
from .trace import middle

# ---- the steps --------------------------------------------------------------------------------

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def __init__(self):",
           "The quick brown fox", "for i in range(10):", "# Parse the config file\n",
           "return sorted(items, key=", "with open(path) as fh:"]


def post_completion(url: str, body: dict[str, Any], deadline_s: float) -> Answer:
    """The server's whole answer to a completion of `body` within `deadline_s` (the project's
    one bounded HTTP client); OSError when none comes whole in time."""
    return fetch(f"{url}/v1/completions", deadline_s=deadline_s, method="POST",
                 body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


def completion_json(url: str, body: dict[str, Any], deadline_s: float) -> dict[str, Any]:
    """The JSON of a completion that succeeded; OSError naming the status otherwise."""
    a = post_completion(url, body, deadline_s)
    if a.status != 200:
        raise OSError(f"{url}/v1/completions: HTTP {a.status}: "
                      f"{a.body.decode(errors='replace')[:300]}")
    try:
        doc = json.loads(a.body)
    except ValueError:  # cut short, a page, a number past Python's limit
        doc = None
    if not isinstance(doc, dict):
        raise OSError(f"{url}/v1/completions: not a completion: {a.body[:200]!r}")
    return doc


def greedy(url: str, model: str) -> list[dict[str, Any]]:
    """Greedy completions of fixed prompts, one at a time: dummy weights are the same in every
    start, so a kernel or speculation change that alters the output shows as a changed token."""
    res = []
    for p in PROMPTS:
        ch = completion_json(url, {"model": model, "prompt": p, "max_tokens": 64,
                                   "temperature": 0, "ignore_eos": True}, 300)["choices"][0]
        res.append({"prompt": p, "text": ch["text"]})
    return res


# What clients send beside greedy, one request each (sampling_checks): vLLM 0.26 takes a
# request that filters (top-p, top-k) and sets no seed to FlashInfer's sampler on these GPUs
# unless told otherwise, a seeded one to its own. "checkpoint": the target's generation_config
# sampling (catalog generation_defaults), what a request that sets none is served with.
SAMPLINGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("greedy", {"temperature": 0}),
    ("checkpoint", {}),
    ("top-k", {"temperature": 1.0, "top_k": 40}),
    ("top-p-seeded", {"temperature": 0.8, "top_p": 0.95, "seed": 7}),
    ("min-p", {"temperature": 1.0, "min_p": 0.1}))
SAMPLING_TIMEOUT_S = 180  # a FlashInfer build at first use takes tens of seconds where it can


def sampling_checks(port: int, model: str, defaults: dict[str, float]) -> list[dict[str, Any]]:
    """Each of SAMPLINGS once (32 tokens) to the server on `port`, and whether it still answers
    /health after it; after one it does not, the rest are not sent. A request refused with a 4xx
    that leaves the server up is recorded as refused (vLLM 0.26 takes no min_p beside
    speculative decoding).
    A render whose sampler needs what the image lacks (FlashInfer's, built with nvcc) fails
    here, as it would on the image, not only under greedy decoding."""
    rows: list[dict[str, Any]] = []
    for i, (name, fields) in enumerate(SAMPLINGS):
        params = {**(defaults if name == "checkpoint" else {}), **fields}
        row: dict[str, Any] = {"name": name, "params": params}
        if rows and not rows[-1]["serving_after"]:
            rows.append({**row, "ok": False, "error": "not sent: the server had stopped",
                         "serving_after": False})
            continue
        t0 = time.perf_counter()
        try:
            a = post_completion(f"http://127.0.0.1:{port}", {
                "model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 32, **params},
                SAMPLING_TIMEOUT_S)
            if a.status >= 400:
                # a 4xx names what the server does not take and leaves it serving (vLLM 0.26
                # refuses min_p beside speculative decoding); a 5xx is the server's own failure
                row.update(ok=False, refused=a.status < 500, error=f"HTTP {a.status}: "
                           f"{a.body.decode(errors='replace')[:300]}")
            else:
                usage = json.loads(a.body).get("usage") or {}
                row.update(ok=True, tokens=usage.get("completion_tokens"))
        except (OSError, ValueError, AttributeError) as exc:
            row.update(ok=False, error=str(exc)[:300])
        row["s"] = round(time.perf_counter() - t0, 2)
        row["serving_after"] = serving(port)
        rows.append(row)
    return rows


def random_ids(rng: random.Random, n: int) -> list[int]:
    """A prompt of n token ids inside any catalog model's vocabulary, clear of its special tokens."""
    return [rng.randrange(1000, 30000) for _ in range(n)]


def _stream(url: str, body: dict[str, Any], timeout_s: float = 300,
            on_first: Callable[[], None] | None = None,
            stop: threading.Event | None = None) -> float | None:
    """Send a streamed completion, read it to the end; ms to its first data line (None: none).
    on_first: called the moment that line arrives; stop: once set, the stream is closed at its
    next line (vLLM aborts a request whose client has gone)."""
    t0 = time.perf_counter()
    first = None
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body,
                          timeout=httpx.Timeout(timeout_s)) as resp:
            if resp.status_code != 200:
                raise OSError(f"{url}/v1/completions: HTTP {resp.status_code}")
            for line in resp.iter_lines():
                if first is None and line.startswith("data: {"):
                    first = (time.perf_counter() - t0) * 1e3
                    if on_first:
                        on_first()
                if stop is not None and stop.is_set():
                    break
    except httpx.HTTPError as exc:  # a connection refused, reset or timed out, as OSError
        raise OSError(f"{url}/v1/completions: {type(exc).__name__}: {exc}") from None
    return first


# the seed of the one prefix every prefixed first-token prompt begins with (shared_prefix)
PREFIX_SEED = 35


def shared_prefix(tokens: int) -> list[int]:
    """The first `tokens` ids of every prompt of a prefix-hit probe: one fixed draw."""
    return random_ids(random.Random(PREFIX_SEED), tokens)


def first_tokens(url: str, model: str, tokens: int, n: int = 8, seed: int = 0,
                 max_tokens: int = 4, after: int = 0, pause_s: float = 0.0,
                 temperature: float | None = None, prefix: int = 0) -> list[float]:
    """Milliseconds to the first streamed token of n prompts of `tokens` random token ids, one at a
    time: bench's TTFT at c=1 without its harness (the same request: streamed, no temperature,
    the server's default sampling). Each prompt is new (a seeded draw), so no prefix-cache hit
    shortens a prefill. after=N: each is sent the moment an N-token answer to another prompt has
    ended, as bench's closed loop at c=1 sends them; pause_s: each after an idle pause instead.
    prefix=P: every prompt (the answered ones too) begins with shared_prefix(P), new from there;
    once cache_prefix has cached it, each first token reads a hit on P tokens rounded down to
    vLLM's cache blocks (with an EAGLE head, one block fewer)."""
    rng = random.Random(seed)
    head = shared_prefix(prefix) if prefix else []

    def prompt() -> list[int]:
        return head + random_ids(rng, tokens - len(head))

    out = []
    for _ in range(n):
        ids = prompt()
        if after:
            _stream(url, {"model": model, "prompt": prompt(), "max_tokens": after,
                          "ignore_eos": True, "stream": True})
        elif pause_s:
            time.sleep(pause_s)
        body: dict[str, Any] = {"model": model, "prompt": ids, "max_tokens": max_tokens,
                                "ignore_eos": True, "stream": True}
        if temperature is not None:
            body["temperature"] = temperature
        first = _stream(url, body)
        if first is None:
            raise ProofError(f"{url}: a streamed completion sent no token")
        out.append(round(first, 2))
    return out


def decode_streams(url: str, model: str, c: int, during: Callable[[], None],
                   prompt_tokens: int = 512, max_tokens: int = 1024, seed: int = 7,
                   timeout_s: float = 600, end_after: bool = False) -> None:
    """c streamed completions of `prompt_tokens` random ids at once; `during()` runs once every
    one of them has its first token, so the engine's steps from then on are decode steps of c
    sequences (bench's chat row at c after its prefills). max_tokens outlasts what `during` does;
    end_after: the streams are closed once `during` returns instead of read to their end."""
    rng = random.Random(seed)
    prompts = [random_ids(rng, prompt_tokens) for _ in range(c)]
    lock = threading.Lock()
    first = threading.Event()
    stop = threading.Event()
    started = [0]
    errors: list[BaseException] = []

    def decoding() -> None:
        with lock:
            started[0] += 1
            if started[0] == c:
                first.set()

    def one(ids: list[int]) -> None:
        body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True}
        try:
            _stream(url, body, timeout_s, on_first=decoding, stop=stop)
        except BaseException as exc:  # reported below, after the others end
            errors.append(exc)
            first.set()

    threads = [threading.Thread(target=one, args=(ids,), daemon=True) for ids in prompts]
    for t in threads:
        t.start()
    try:
        if not first.wait(timeout_s) or errors:
            raise ProofError(f"{url}: {c} streams did not all start: "
                             f"{errors[0] if errors else 'timed out'}")
        during()
    finally:
        if end_after:
            stop.set()
        for t in threads:
            t.join(timeout_s)
    if errors:
        raise ProofError(f"{url}: a stream failed: {errors[0]}")


def parse_engine_steps(text: str) -> tuple[float, float]:
    """vLLM's engine steps so far (the count of its per-step token histogram) and the tokens it
    generated, from a Prometheus text page (summed over engines)."""
    steps = tokens = 0.0
    for name, _, value in metric_samples(text):
        if name == "vllm:iteration_tokens_total_count":
            steps += value
        elif name == "vllm:generation_tokens_total":
            tokens += value
    return steps, tokens


def engine_steps(url: str) -> tuple[float, float]:
    return parse_engine_steps(read_url(f"{url}/metrics").decode(errors="replace"))


def cache_prefix(url: str, model: str, tokens: int, prefix: int) -> None:
    """One unmeasured `tokens`-token prompt that begins with shared_prefix(prefix), so that the
    server holds the prefix's KV before first_tokens(prefix=...) times hits on it."""
    first_tokens(url, model, tokens, n=1, seed=PREFIX_SEED + 1, max_tokens=1, prefix=prefix)


def first_token_probes(url: str, model: str, tokens: int, answer: int,
                       prefix: int = 0) -> dict[str, Any]:
    """The first token of a `tokens`-token prompt sent to an idle server (after a pause) and sent
    the moment an `answer`-token answer ends (bench's closed loop at c=1): a difference is a step
    the server still runs for the answer that ended. prefix: as first_tokens', cached first."""
    if prefix:
        cache_prefix(url, model, tokens, prefix)
    idle = first_tokens(url, model, tokens, seed=11, pause_s=0.25, prefix=prefix)
    closed = first_tokens(url, model, tokens, seed=12, after=answer, prefix=prefix)
    return {"prompt_tokens": tokens, "prefix_tokens": prefix, "answer_tokens": answer,
            "idle_ms": idle, "after_answer_ms": closed, "idle_median_ms": middle(idle),
            "after_answer_median_ms": middle(closed)}


PLUGIN_MARK = "proof-source-digest"


def plugin_digest() -> str:
    """The plugin's source as this tree has it: its code, tables and build file."""
    root = project_root() / "plugins" / "vllm"
    pkg = root / "inference_image_vllm"
    h = hashlib.sha256()
    for f in sorted([root / "pyproject.toml", *pkg.rglob("*.py"), *pkg.rglob("*.json")]):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def make_models(base: Path, more: dict[str, dict[str, Any]] | None = None) -> dict[str, str]:
    """The draft, EAGLE-3 head and FP8-checkpoint folders beside `base` (config + tokenizer),
    and BASE-suffix for each config change in `more`."""
    made = {}
    models = load_catalog(default_profiles_dir()).models
    variants = {suffix: {**models[name].config_shape(), **extra}
                for name, (suffix, extra) in DRAFTS.items()}
    for name, (bf16, fp8) in TARGETS.items():
        shapes = models[name].config_shape() if bf16 else {}  # "": the folder has them
        if bf16:
            variants[bf16] = shapes
        if fp8 is not None:
            for suffix, q in FP8_STANDIN.values():
                variants[fp8 + suffix] = {**shapes, "quantization_config": ct_fp8(*q)}
    variants.update(more or {})
    for suffix, change in variants.items():
        dst = base.with_name(f"{base.name}-{suffix}")
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(base, dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(change)
        (dst / "config.json").write_text(json.dumps(cfg, indent=1))
        made[suffix] = str(dst)
    return made


def with_acceptance(args_file: Path, length: float | None = None,
                    rates: tuple[float, ...] = ()) -> None:
    """Add vLLM's synthetic rejection sampling at a mean `length` or per-position `rates` to the
    rendered speculative config: the one change a proof makes to the command line the image runs.
    Lines end at "\n" only, as inference-run reads them (str.splitlines would also split at
    U+2028 and U+0085, making one argument two)."""
    lines = args_file.read_text().removesuffix("\n").split("\n")
    try:
        i = lines.index("--speculative-config")
    except ValueError:
        raise ProofError(f"{args_file} has no --speculative-config: the profile speculates "
                         "with no draft, so an acceptance length means nothing") from None
    cfg = json.loads(lines[i + 1])
    cfg["rejection_sample_method"] = "synthetic"
    if rates:
        cfg["synthetic_acceptance_rates"] = list(rates)
    else:
        cfg["synthetic_acceptance_length"] = length
    lines[i + 1] = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    args_file.write_text("\n".join(lines) + "\n")


def tune_models(r: Resolved, profiles_dir: Path | None = None) -> list[str]:
    """tune's --model and --prefill-to arguments: the shapes one GPU multiplies (the 70B at TP=2
    splits each projection in two) for every FP8 tier on this tier's GPU model, this tier's first,
    and the largest step those tiers run. The plugin picks its table by GPU name before
    architecture, so a table tuned on an H100 must hold the h100 tier's 8B and the h100x8 tier's
    70B at TP=2 alike."""
    pdir = profiles_dir or default_profiles_dir()
    gpu = r.profile.hardware.gpu_model
    same = [r] + [x for x in (resolve(t, pdir) for t in list_tiers(pdir) if t != r.profile.tier)
                  if x.profile.hardware.gpu_model == gpu]
    args: list[str] = []
    budget = 0
    for x in same:
        if x.profile.model.quantization == "none":
            continue
        # prefill steps run at their exact row count, up to the largest token budget a step has
        # (vLLM 0.26's default where a profile sets none)
        budget = max(budget, x.profile.serving.max_num_batched_tokens or 8192)
        t, tp = x.target, x.profile.serving.tensor_parallel_size
        if not t.intermediate_size:
            raise ProofError(f"{x.profile.model.target} (tier {x.profile.tier}): the catalog has "
                             "no intermediate_size. Fix: add it (the model's config.json value) "
                             "to tune its FP8 GEMMs")
        m = (f"{t.hidden_size},{t.intermediate_size},{t.num_attention_heads},{t.num_kv_heads},"
             f"{t.head_dim},{tp}")
        if m not in args:
            args += ["--model", m]
    return [*args, "--prefill-to", str(budget)] if args else []


def wait_files(folder: Path, pattern: str, timeout_s: float, seen: frozenset[Path] = frozenset(),
               count: int = 1, rest_s: float = 60) -> list[Path]:
    """The files matching `pattern`, other than `seen`, once their sizes stop changing (a trace is
    written after /stop_profile returns): `count` of them (one a GPU worker), or those there are
    rest_s after the first one was finished (a worker that writes none costs a minute, not the
    whole timeout)."""
    end, last, first = time.monotonic() + timeout_s, None, None
    while time.monotonic() < end:
        files = sorted(f for f in folder.glob(pattern) if f not in seen)
        sizes = [f.stat().st_size for f in files]
        if files and sizes == last:
            first = first or time.monotonic()
            if len(files) >= count or time.monotonic() - first >= rest_s:
                return files
        last = sizes
        time.sleep(FILE_POLL_S)
    raise ProofError(f"no finished trace in {folder} after {timeout_s:.0f} s")


def sum_rows(c: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for the machine out of its instances' rows at the same moment: throughput adds up;
    mean latencies are weighted by requests; a p99 is the worst instance's (an upper bound)."""
    done = [max(1, int(p.get("completed") or 0)) for p in parts]
    total = sum(done)

    def mean(key: str) -> float:
        return round(sum(p[key] * d for p, d in zip(parts, done, strict=True)) / total, 2)

    return {"concurrency": c, "instances": len(parts), "scenario": parts[0].get("scenario"),
            "output_tok_s": round(sum(p["output_tok_s"] for p in parts), 1),
            "ttft_ms_mean": mean("ttft_ms_mean"), "tpot_ms_mean": mean("tpot_ms_mean"),
            "ttft_ms_p99": max(p["ttft_ms_p99"] for p in parts),
            "completed": sum(int(p.get("completed") or 0) for p in parts),
            "failed": sum(int(p.get("failed") or 0) for p in parts),
            "per_instance": parts}


