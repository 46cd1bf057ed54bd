"""Load tier profiles (YAML with `extends:`), validate them, and explain every error.

Every error names the file that set the offending value, the dotted field and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from inference_image_vllm import triton_kernels

# the exporters on loopback: no profile port may take theirs
from inference_machine.contract import DCGM_EXPORTER_PORT, NODE_EXPORTER_PORT, STATUS_EXPORTER_PORT
from inference_machine.inputs import InputError, read_text

from . import memory
from .schema import Catalog, CatalogModel, Profile

# serving.extra_args is read by vllm_flags' allowlist; its names are a profile's rules too
from .vllm_flags import (  # noqa: F401  (re-exported)
    EXTRA_FLAGS,
    FLAG_NAME,
    OWNED_FLAGS,
    TRUST_FLAGS,
    extra_args_problems,
)
from .yaml_input import MAX_DEPTH, ComplexKey, DuplicateKey, TooComplex, bounded_yaml

CATALOG_FILE = "_catalog.yaml"

def project_root() -> Path:
    env = os.environ.get("INFERENCE_IMAGE_HOME")
    if env:
        return Path(env)
    # src/inference_image/profiles.py -> repo root (the package is used from its checkout)
    return Path(__file__).resolve().parents[2]


def default_profiles_dir() -> Path:
    return project_root() / "profiles"


@dataclass(frozen=True)
class ProfileError:
    file: str
    field: str
    message: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"{where}: {self.message}. Fix: {self.fix}"


class ProfileErrors(Exception):
    def __init__(self, errors: list[ProfileError]) -> None:
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class BaseOS:
    """What a DigitalOcean base image is: /etc/os-release's ID and VERSION_ID, and the name Ansible
    gives the distribution (ansible_facts['distribution'], which names the driver role's vars)."""
    id: str
    version_id: str
    distribution: str

    @property
    def release(self) -> str:
        return f"{self.id}:{self.version_id}"


# The base images the roles support, by DigitalOcean slug. The local qemu build uses Debian 12's
# (scripts/make-base-image), whatever the tier's droplet base is.
BASE_IMAGES = {
    "debian-12-x64": BaseOS("debian", "12", "Debian"),
    "ubuntu-24-04-x64": BaseOS("ubuntu", "24.04", "Ubuntu"),
}
LOCAL_BASE_IMAGE = "debian-12-x64"
SUPPORTED_RELEASES = tuple(sorted({b.release for b in BASE_IMAGES.values()}))


@dataclass(frozen=True)
class Instance:
    name: str
    index: int
    port: int
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True)
class Resolved:
    profile: Profile
    target: CatalogModel
    draft: CatalogModel | None
    files: tuple[str, ...]
    instances: tuple[Instance, ...]
    fit: memory.Fit | None
    data: dict[str, Any] = field(repr=False)

    @property
    def is_gpu(self) -> bool:
        return self.profile.hardware.gpu_count > 0

    @property
    def fa3_available(self) -> bool:
        return fa3_available(self.profile.hardware.compute_capability)

    @property
    def fp8_available(self) -> bool:
        return fp8_available(self.profile.hardware.compute_capability)

    @property
    def usd_per_hour(self) -> float:
        """What one droplet of the tier costs an hour: price_per_gpu_hour a GPU, or a droplet on
        the cpu tier (no GPU). Bench's cost per token and fleet's plan both read it."""
        return self.profile.digitalocean.price_per_gpu_hour * max(1, self.profile.hardware.gpu_count)

    @property
    def digest(self) -> str:
        """sha256 of the resolved profile and the catalog entries it uses: the profile hash.
        Fields in DIGEST_AT_DEFAULT are left out while they hold the value that serves as
        before they existed, those in DIGEST_OMITS whatever their value."""
        data = json.loads(json.dumps(self.data))
        for path, default in [*DIGEST_AT_DEFAULT.items(), *((o, None) for o in DIGEST_OMITS)]:
            *parents, leaf = path.split(".")
            node = data
            for part in parents:
                node = node.get(part, {}) if isinstance(node, dict) else {}
            if isinstance(node, dict) and (path in DIGEST_OMITS
                                           or node.get(leaf, default) == default):
                node.pop(leaf, None)
        blob = {"profile": data, "target": self.target.model_dump(mode="json")}
        if self.draft is not None:
            blob["draft"] = self.draft.model_dump(mode="json")
        canon = json.dumps(blob, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()


# Fields added after records of the tiers existed, with the value that serves as before: a
# profile that leaves them there keeps its digest, so the ledger still reads its records as the
# tier as it ships (docs/benchmarks.md). A field whose default changes what serves is not listed.
DIGEST_AT_DEFAULT: dict[str, Any] = {"serving.engine_process": "spawn",
                                     "serving.page_cache_prefetch": False,
                                     "serving.checkpoint": False,
                                     "serving.checkpoint_weights": "host",
                                     "serving.cudagraph_prefill_step": None,
                                     "router.scrape": True}
# Fields of what the image holds beside the serving stack (GPU telemetry, the firewall), of how
# a start builds what it serves (the same kernels, compiled in parallel), or of what the router does
# only while no instance can take a request (its hold), which serve the same whatever their value:
# never in the digest, so neither the ledger's records nor a warm-cache bundle's key depend on them.
DIGEST_OMITS = frozenset({"versions.dcgm", "router.connections_per_address", "router.hold_s",
                          "serving.parallel_compile", "serving.triton_precompile"})


def _cc(cc: str | None) -> tuple[int, int]:
    if not cc:
        return (0, 0)
    major, minor = cc.split(".")
    return (int(major), int(minor))


def fa3_available(cc: str | None) -> bool:
    """FlashAttention 3 uses Hopper-only instructions (wgmma, TMA): compute capability 9.x."""
    return _cc(cc)[0] == 9


def fp8_available(cc: str | None) -> bool:
    """FP8 tensor cores start with Ada (8.9) and Hopper (9.0)."""
    return _cc(cc) >= (8, 9)


def list_tiers(profiles_dir: Path) -> list[str]:
    """The tiers in `profiles_dir`. ProfileErrors when it is not a directory (`validate --all`
    of a missing one must not pass having validated nothing)."""
    if not profiles_dir.is_dir():
        raise ProfileErrors([ProfileError(_rel(profiles_dir), "", "not a directory of profiles",
                                          "give --profiles-dir the directory with the tier files")])
    tiers = sorted(p.stem for p in profiles_dir.glob("*.yaml") if not p.name.startswith("_"))
    if not tiers:
        raise ProfileErrors([ProfileError(_rel(profiles_dir), "", "holds no profile (TIER.yaml)",
                                          "give --profiles-dir the directory with the tier files")])
    return tiers


def _rel(path: Path) -> str:
    try:
        return str(Path(os.path.abspath(path)).relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):  # elsewhere, or no working directory: as given
        return str(path)


# GiB a GPU left outside vLLM's share (gpu_memory_utilization) at tensor parallelism > 1: NCCL's
# buffers and the all-reduces inside CUDA graph capture, which vLLM's own estimate missed. The
# least the h100x8 tier needed to start on two H100s, not a bound derived from vLLM
# (docs/decisions.md#memory-rule).
TP_OUTSIDE_MIN_GIB = 9.5

# A profile is a page of settings: limits far above any real one, far below what hangs a loader.
MAX_FILE_BYTES = 256 * 1024
MAX_SET_CHARS = 4096
def yaml_problem(exc: yaml.YAMLError) -> tuple[str, str]:
    """(what is wrong, the fix) for a YAML error, naming where and what it met."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = str(getattr(exc, "problem", "") or "")
    if isinstance(exc, ComplexKey):
        return str(exc), "write keys as plain words"
    if isinstance(exc, yaml.reader.ReaderError):
        ch = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return (f"a character YAML does not allow (U+{ch:04X}) at character {exc.position}",
                "remove it: a profile is plain UTF-8 text")
    if isinstance(exc, yaml.constructor.ConstructorError) and "tag" in problem:
        tag = re.search(r"tag '([^']*)'", problem)
        name = tag[1].replace("tag:yaml.org,2002:", "!!") if tag else "an explicit tag"
        return (f"a YAML tag ({name}) at {where}: tags are not read",
                "write the plain value, without a tag")
    return f"YAML syntax error at {where or 'an unknown place'}" + (
        f" ({problem})" if problem else ""), "fix the YAML syntax"


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        try:
            text = read_text(path, "profile file", MAX_FILE_BYTES)
        except InputError as exc:
            raise ProfileErrors([ProfileError(_rel(path), "", exc.why, exc.fix)]) from None
        data = bounded_yaml(text)
    except (TooComplex, RecursionError) as exc:
        why = str(exc) if isinstance(exc, TooComplex) else f"nested deeper than {MAX_DEPTH} levels"
        raise ProfileErrors([ProfileError(_rel(path), "", f"refused: {why}",
                                          "write a plain mapping of settings, without deep "
                                          "nesting or repeated aliases")]) from None
    except DuplicateKey as exc:
        raise ProfileErrors([ProfileError(_rel(path), str(exc), "given twice (YAML keeps only the "
                                          "last)", "keep one")]) from None
    except yaml.YAMLError as exc:
        raise ProfileErrors([ProfileError(_rel(path), "", *yaml_problem(exc))]) from None
    if data is None:
        raise ProfileErrors([ProfileError(_rel(path), "", "the file is empty",
                                          "write its `key: value` settings")])
    if not isinstance(data, dict):
        raise ProfileErrors(
            [ProfileError(_rel(path), "", "the file is not a mapping", "write `key: value` pairs")]
        )
    return data


def _merge(
    base: dict[str, Any], over: dict[str, Any], prov: dict[str, str], src: str, prefix: str = ""
) -> dict[str, Any]:
    """Deep-merge `over` into a copy of `base`: mappings merge, everything else (lists too) replaces."""
    out = dict(base)
    for key, val in over.items():
        path = f"{prefix}{key}"
        if isinstance(val, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], val, prov, src, path + ".")
        else:
            out[key] = val
            prov[path] = src
            if isinstance(val, dict):
                _mark(val, prov, src, path + ".")
    return out


def _mark(d: dict[str, Any], prov: dict[str, str], src: str, prefix: str) -> None:
    for key, val in d.items():
        prov[f"{prefix}{key}"] = src
        if isinstance(val, dict):
            _mark(val, prov, src, f"{prefix}{key}.")


# profiles extend at most this many others: the shipped chains are two deep
MAX_EXTENDS = 8


def _load_chain(path: Path, prov: dict[str, str], chain: list[Path]) -> dict[str, Any]:
    if len(chain) > MAX_EXTENDS:
        raise ProfileErrors([ProfileError(
            _rel(chain[0]), "extends", f"a chain of more than {MAX_EXTENDS} profiles ("
            + " -> ".join(p.name for p in chain[:4]) + " -> ...)",
            "extend a profile that extends few others, e.g. `extends: _gpu.yaml`")])
    data = read_yaml(path)  # first: a file that cannot be read (a link loop) is said as such
    if path.resolve() in [c.resolve() for c in chain]:
        raise ProfileErrors(
            [ProfileError(_rel(path), "extends", "extends loops back to itself", "break the cycle")]
        )
    chain.append(path)
    parent = data.pop("extends", None)
    merged: dict[str, Any] = {}
    if parent is not None:
        if not isinstance(parent, str):
            raise ProfileErrors(
                [ProfileError(_rel(path), "extends", "must be a file name", "e.g. `extends: _gpu.yaml`")]
            )
        # Only a sibling: a profile must not read files from elsewhere on the machine.
        if "/" in parent or "\\" in parent or parent.startswith(".") or not parent.endswith(".yaml"):
            raise ProfileErrors([ProfileError(
                _rel(path), "extends", f"{parent!r} is not a profile file beside this one",
                "name a .yaml file of the profiles directory, e.g. `extends: _gpu.yaml`")])
        merged = _load_chain(path.parent / parent, prov, chain)
    return _merge(merged, data, prov, _rel(path))


def load_catalog(profiles_dir: Path) -> Catalog:
    path = profiles_dir / CATALOG_FILE
    data = read_yaml(path)
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        raise ProfileErrors(pydantic_errors(exc, Catalog, {}, _rel(path))) from None


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The valid field names of the (sub)model that loc points into."""
    cur: Any = model
    for part in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        info = cur.model_fields.get(str(part))
        if info is None:
            return None
        ann = info.annotation
        cur = next((a for a in getattr(ann, "__args__", ()) if isinstance(a, type)), ann)
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return None


def pydantic_errors(
    exc: ValidationError, model: type[BaseModel], prov: dict[str, str], default_file: str
) -> list[ProfileError]:
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        dotted = ".".join(str(p) for p in loc)
        src = default_file
        for i in range(len(loc), 0, -1):
            key = ".".join(str(p) for p in loc[:i])
            if key in prov:
                src = prov[key]
                break
        kind = err["type"]
        if kind == "extra_forbidden":
            valid = _fields_at(model, loc[:-1]) or []
            out.append(ProfileError(src, dotted, "unknown field",
                                    f"remove it or use one of: {', '.join(valid)}"))
        elif kind == "missing":  # the tier file is where it must be added
            out.append(ProfileError(default_file, dotted, "required field is missing",
                                    "add it (see profiles/_base.yaml for an example)"))
        else:
            got = err.get("input")
            shown = json.dumps(got) if isinstance(got, str | int | float | bool) else type(got).__name__
            out.append(ProfileError(src, dotted, f"bad value {shown}: {err['msg']}",
                                    "set a value of the right type and range"))
    return out


def _apply_overrides(data: dict[str, Any], overrides: list[str], prov: dict[str, str]) -> None:
    """FIELD=VALUE pairs (VALUE parsed as YAML) from the command line, validated like the file."""
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            raise ProfileErrors([ProfileError("--set", item, "not FIELD=VALUE",
                                              "write e.g. --set serving.max_num_seqs=64")])
        if len(raw) > MAX_SET_CHARS:
            raise ProfileErrors([ProfileError("--set", path, f"a value of {len(raw)} characters",
                                              f"give at most {MAX_SET_CHARS}")])
        try:
            value = bounded_yaml(raw)
        except (TooComplex, RecursionError) as exc:
            raise ProfileErrors([ProfileError("--set", path, f"refused: {exc}",
                                              "give a plain value")]) from None
        except yaml.YAMLError:
            value = raw
        keys = path.split(".")
        cur = data
        for k in keys[:-1]:
            nxt = cur.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise ProfileErrors([ProfileError("--set", path, f"{k} is not a mapping",
                                                  "override a field inside a mapping")])
            cur = nxt
        cur[keys[-1]] = value
        prov[path] = "--set"


def resolve(tier: str, profiles_dir: Path | None = None,
            overrides: list[str] | None = None) -> Resolved:
    """Load, merge and validate one tier. Raises ProfileErrors with every problem found."""
    pdir = profiles_dir or default_profiles_dir()
    tiers = list_tiers(pdir)
    if tier not in tiers:
        raise ProfileErrors([ProfileError(
            _rel(pdir), "tier", f"unknown tier {tier!r}", f"use one of: {', '.join(tiers)}")])
    path = pdir / f"{tier}.yaml"
    prov: dict[str, str] = {}
    data = _load_chain(path, prov, [])
    _apply_overrides(data, overrides or [], prov)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileErrors(pydantic_errors(exc, Profile, prov, _rel(path))) from None
    catalog = load_catalog(pdir)
    errors = _check(profile, catalog, prov, _rel(path), _rel(pdir / CATALOG_FILE))
    if profile.tier != tier:
        errors.insert(0, ProfileError(prov.get("tier", _rel(path)), "tier",
                                      f"says {profile.tier!r} but the file is {tier}.yaml",
                                      f"set `tier: {tier}` or rename the file"))
    if errors:
        raise ProfileErrors(errors)
    target = catalog.models[profile.model.target]
    spec = profile.model.speculative
    draft = catalog.models[spec.draft] if spec.draft else None
    return Resolved(
        profile=profile,
        target=target,
        draft=draft,
        files=tuple(dict.fromkeys(prov.values())),
        instances=_instances(profile),
        fit=_fit(profile, target, draft) if profile.hardware.gpu_count else None,
        data=profile.model_dump(mode="json"),
    )


def _instances(p: Profile) -> tuple[Instance, ...]:
    s = p.serving
    out = []
    for i in range(s.instances):
        if s.gpu_ids is not None:
            gpus = tuple(s.gpu_ids[i])
        elif p.hardware.gpu_count:
            gpus = tuple(range(i * s.tensor_parallel_size, (i + 1) * s.tensor_parallel_size))
        else:
            gpus = ()
        port = s.ports[i] if s.ports else s.base_port + i
        out.append(Instance(name=f"vllm-{i}", index=i, port=port, gpu_ids=gpus))
    return tuple(out)


def _fit(p: Profile, target: CatalogModel, draft: CatalogModel | None) -> memory.Fit:
    s = p.serving
    return memory.gpu_fit(
        target, draft,
        quantization=p.model.quantization,
        kv_dtype=p.model.kv_cache_dtype,
        tp=s.tensor_parallel_size,
        max_num_seqs=s.max_num_seqs,
        max_model_len=s.max_model_len,
        kv_context_per_seq=s.kv_context_per_seq,
        pp=s.nodes,
        gpu_memory_gib=p.hardware.gpu_memory_gib,
        gpu_memory_utilization=s.gpu_memory_utilization,
        overhead_gib=s.runtime_overhead_gib,
    )


ErrFn = Callable[[str, str, str], None]


def _check_models(p: Profile, catalog: Catalog, err: ErrFn, catalog_file: str
                  ) -> tuple[CatalogModel | None, CatalogModel | None]:
    """The target and the draft: in the catalog, of one vocabulary. (target, draft)."""
    m = p.model
    known = ", ".join(catalog.models)
    target = catalog.models.get(m.target)
    if target is None:
        err("model.target", f"{m.target!r} is not in {catalog_file}", f"use one of: {known}")
    elif target.local_config and not (project_root() / target.local_config).is_file():
        err("model.target", f"its local_config {target.local_config} is not a script of this "
            f"project ({catalog_file})", "name one under scripts/, e.g. scripts/make-test-model")
    spec = m.speculative
    draft = None
    if spec.uses_draft:
        if spec.draft is None:
            err("model.speculative.draft", f"method {spec.method} needs a draft model",
                f"name one from {catalog_file}, or use method ngram, ngram_gpu or none")
        elif spec.draft not in catalog.models:
            err("model.speculative.draft", f"{spec.draft!r} is not in {catalog_file}",
                f"use one of: {known}")
        else:
            draft = catalog.models[spec.draft]
            # a draft model or an EAGLE head proposes token ids of its target's vocabulary: one
            # made for another family proposes tokens the target never accepts (or stops vLLM)
            if target and draft.vocab_size != target.vocab_size:
                err("model.speculative.draft",
                    f"{spec.draft} proposes tokens of a {draft.vocab_size}-token vocabulary; "
                    f"{m.target}'s has {target.vocab_size}",
                    "pick a draft or head made for the target's model family, or set "
                    "model.speculative.method: none")
    elif spec.draft is not None:
        err("model.speculative.draft", f"method {spec.method} uses no draft model",
            "remove the draft or set method: draft_model or eagle3")
    return target, draft


# serving fields a GPU tier's render writes and the cpu tier's does not: (field, its default,
# what it does); the plugin's FP8 and Triton attention fields are refused by what they need
GPU_ONLY: tuple[tuple[str, object, str], ...] = (
    ("engine_process", "spawn", "a forked engine core is a GPU tier's start"),
    ("parallel_compile", False, "a pool compiling Inductor's Triton kernels is for GPU kernels"),
    ("triton_precompile", False, "the build compiles a GPU tier's recorded Triton kernels"),
)


def _check_hardware(p: Profile, target: CatalogModel | None, err: ErrFn, catalog_file: str
                    ) -> None:
    """What the GPU (or its absence) allows: FP8, FlashAttention 3 and what rides on it."""
    hw, s, m = p.hardware, p.serving, p.model
    cc = p.hardware.compute_capability
    spec = p.model.speculative
    if hw.gpu_count == 0:
        if s.tensor_parallel_size != 1:
            err("serving.tensor_parallel_size", "the cpu tier has no GPUs to split over", "set 1")
        if hw.compute_capability or hw.gpu_model:
            err("hardware.gpu_count", "0 GPUs but a GPU model or compute capability is set",
                "set gpu_count or drop gpu_model/compute_capability")
        if s.cpu_kv_cache_gib is None:
            err("serving.cpu_kv_cache_gib", "the cpu tier needs a KV cache size",
                "set serving.cpu_kv_cache_gib (GiB of host memory per instance)")
        if m.quantization != "none":
            err("model.quantization", "FP8 weights need a GPU with compute capability >= 8.9",
                "set model.quantization: none on the cpu tier")
        if s.early_first_token:
            err("serving.early_first_token", "the rule is part of the project's vLLM plugin, "
                "which the cpu tier's vLLM does not load", "set serving.early_first_token: false")
        # what a GPU tier's render turns into a switch the cpu tier's render does not write: a
        # value here would be accepted and serve nothing of it
        for name, off, why in GPU_ONLY:
            if getattr(s, name) != off:
                err(f"serving.{name}", f"{why}, which the cpu tier's render does not set",
                    f"leave serving.{name} out of a cpu profile (its default: {off})")
        if spec.method == "ngram_gpu":
            err("model.speculative.method", "ngram_gpu matches n-grams on a GPU, and the cpu tier "
                "has none", "use method: ngram (the same lookup on the host)")
    else:
        if not hw.gpu_model or not cc:
            err("hardware.compute_capability", "a GPU tier needs gpu_model and compute_capability",
                "set both, e.g. 'NVIDIA H100 80GB HBM3' and '9.0'")
        used = s.instances * s.tensor_parallel_size
        if used != hw.gpu_count:
            err("serving.instances",
                f"instances ({s.instances}) x tensor_parallel_size ({s.tensor_parallel_size}) = "
                f"{used} GPUs but hardware.gpu_count is {hw.gpu_count}",
                f"make instances x tensor_parallel_size equal {hw.gpu_count}")
        if m.quantization != "none" and not fp8_available(cc):
            err("model.quantization", f"FP8 needs compute capability >= 8.9; {hw.gpu_model} is {cc}",
                "set model.quantization: none")
        if m.kv_cache_dtype == "fp8" and not fp8_available(cc):
            err("model.kv_cache_dtype", f"FP8 KV cache needs compute capability >= 8.9, this is {cc}",
                "set model.kv_cache_dtype: auto")
    if s.flash_attention_3 and not fa3_available(cc):
        err("serving.flash_attention_3",
            f"FlashAttention 3 runs on Hopper (compute capability 9.x) only; "
            f"{hw.gpu_model or 'the cpu tier'} is {cc or 'no GPU'}",
            "set serving.flash_attention_3: false (vLLM picks FlashAttention 2 or its own kernels)")
    if s.cudagraph_mode != "full_and_piecewise" and not s.flash_attention_3:
        err("serving.cudagraph_mode", "full graphs for steps that read prompts need an attention "
            "backend that vLLM can capture whole at any batch; of this project's, FlashAttention 3",
            "set serving.cudagraph_mode: full_and_piecewise, or serving.flash_attention_3: true")
    if s.cudagraph_prefill_step and not s.cudagraph_capture_size:
        err("serving.cudagraph_prefill_step", "spaces the graph sizes up to "
            "serving.cudagraph_capture_size, which this profile leaves to vLLM",
            "set serving.cudagraph_capture_size, or remove serving.cudagraph_prefill_step")
    if s.triton_decode_max_tokens and not s.flash_attention_3:
        err("serving.triton_decode_max_tokens",
            "small decode batches are routed inside vLLM's FlashAttention backend, which this "
            "profile does not use (flash_attention_3 is false)",
            "set serving.triton_decode_max_tokens: 0, or serving.flash_attention_3: true")
    if s.triton_decode_verify and not s.triton_decode_max_tokens:
        err("serving.triton_decode_verify",
            "verify steps go to Triton only within serving.triton_decode_max_tokens, which is 0",
            "set serving.triton_decode_max_tokens (8 on the h100 profile), or "
            "serving.triton_decode_verify: false")
    if s.fp8_gemm_dispatch and (m.quantization == "none" or s.linear_backend != "auto"):
        err("serving.fp8_gemm_dispatch",
            "the dispatch wraps vLLM's Cutlass FP8 GEMM, so it needs FP8 weights and linear_backend "
            f"auto (quantization is {m.quantization}, linear_backend {s.linear_backend})",
            "set serving.fp8_gemm_dispatch: false, or an FP8 quantization and linear_backend auto")
    if target and m.quantization == "fp8-checkpoint" and not target.fp8_hub_id:
        err("model.quantization", f"{m.target} has no fp8_hub_id in {catalog_file}",
            "use quantization: fp8 (online) or add the FP8 checkpoint to the catalog")
    if s.triton_precompile:
        _check_kernel_list(p, err)


# the Triton kernels a tier's start compiles, recorded on a GPU (the plugin's triton_kernels.py)
KERNEL_LISTS = "plugins/vllm/inference_image_vllm/kernels"


def _check_kernel_list(p: Profile, err: ErrFn) -> None:
    path = project_root() / KERNEL_LISTS / f"{p.tier}.json"
    record = ("record one on a GPU of the tier's architecture (inference-lab proof step ready "
              "--record-triton) or set serving.triton_precompile: false")
    if not path.is_file():
        err("serving.triton_precompile", f"no recorded kernel list for tier {p.tier} "
            f"({KERNEL_LISTS}/{p.tier}.json)", record)
        return
    try:
        recorded = triton_kernels.load_path(path)["capability"]
    except (OSError, ValueError) as exc:
        err("serving.triton_precompile", f"{KERNEL_LISTS}/{p.tier}.json is not a kernel list "
            f"({str(exc).removeprefix(str(path) + ': ')})", record)
        return
    if recorded != p.hardware.compute_capability:
        err("serving.triton_precompile", f"{KERNEL_LISTS}/{p.tier}.json was recorded on compute "
            f"capability {recorded}, the tier's GPU is {p.hardware.compute_capability}: its "
            "kernels are another architecture's", record)


def _check_layout(p: Profile, target: CatalogModel | None, err: ErrFn) -> None:
    """Instances, GPUs, nodes and the droplet size agree; extra_args are allowed flags."""
    hw, s, m = p.hardware, p.serving, p.model
    spec = p.model.speculative
    if s.checkpoint:
        # CUDA's checkpoint API writes one process's GPU state; an engine core forked from its API
        # server keeps NVIDIA device files it cannot release
        # (docs/decisions.md#checkpoint-and-restore-criu-with-cudas-checkpoint-api)
        fix = "set serving.checkpoint: false"
        if hw.gpu_count == 0:
            err("serving.checkpoint", "a checkpoint holds CUDA processes; the cpu tier has none",
                fix)
        elif s.tensor_parallel_size != 1 or s.nodes != 1:
            err("serving.checkpoint", "only an instance of one GPU on one machine is checkpointed "
                f"(tensor_parallel_size {s.tensor_parallel_size}, nodes {s.nodes})", fix)
        if s.engine_process != "spawn":
            err("serving.checkpoint", "an engine core forked from its API server keeps device "
                "files CUDA's checkpoint cannot release", f"set serving.engine_process: spawn, "
                f"or {fix.removeprefix('set ')}")
        if s.checkpoint_weights == "files" and target is not None and target.local_config:
            err("serving.checkpoint_weights", "files: vLLM reads weights again only from a "
                "model's files, and this tier's test model has none (it is served with random "
                "weights)", "set serving.checkpoint_weights: host")
    elif s.checkpoint_weights != "host":
        err("serving.checkpoint_weights", f"{s.checkpoint_weights}: says where a checkpoint's "
            "weights are, and serving.checkpoint is off", "set serving.checkpoint: true, or drop "
            "serving.checkpoint_weights")
    if s.nodes > 1:
        if s.instances != 1:
            err("serving.nodes", f"{s.instances} instances, but an instance over {s.nodes} nodes "
                "is the one model those machines serve", "set serving.instances: 1")
        if spec.method != "none":
            err("serving.nodes", f"speculative decoding ({spec.method}) across nodes is not "
                "served: vLLM's default model runner refuses EAGLE-3 with pipeline stages "
                "(docs/tiers/cpu-2node.md#speculative)",
                "set model.speculative.method: none, or serving.nodes: 1")
        if target and target.num_layers < s.nodes:
            err("serving.nodes", f"{m.target} has {target.num_layers} layers, fewer than "
                f"{s.nodes} pipeline stages", f"set at most {target.num_layers}")
    if s.gpu_ids is not None:
        if len(s.gpu_ids) != s.instances:
            err("serving.gpu_ids", f"{len(s.gpu_ids)} entries for {s.instances} instances",
                "give one list of GPU ids per instance")
        flat = [g for ids in s.gpu_ids for g in ids]
        if any(len(ids) != s.tensor_parallel_size for ids in s.gpu_ids):
            err("serving.gpu_ids", f"each instance needs {s.tensor_parallel_size} GPU ids (TP)",
                "give tensor_parallel_size ids per instance")
        if len(set(flat)) != len(flat):
            err("serving.gpu_ids", "a GPU is given to two instances", "use each GPU id once")
        if any(g < 0 or g >= hw.gpu_count for g in flat):
            err("serving.gpu_ids", f"ids must be 0..{hw.gpu_count - 1}", "use existing GPU ids")
    for i, why, fix in extra_args_problems(list(s.extra_args)):
        err(f"serving.extra_args.{i}", why, fix)
    gpus_in_size = re.match(r"^gpu-[a-z0-9]+?x(\d+)-", p.digitalocean.size)
    if hw.gpu_count and not gpus_in_size:
        err("digitalocean.size", f"{p.digitalocean.size!r} is not a GPU droplet size",
            "use a gpu-... slug, e.g. gpu-h100x1-80gb")
    elif gpus_in_size and int(gpus_in_size.group(1)) != hw.gpu_count:
        err("hardware.gpu_count", f"{hw.gpu_count} GPUs, but droplet size {p.digitalocean.size} has "
            f"{gpus_in_size.group(1)}", "make hardware.gpu_count match the droplet size")
    if s.ports is not None and len(s.ports) != s.instances:
        err("serving.ports", f"{len(s.ports)} ports for {s.instances} instances",
            "give one port per instance, or drop ports to use base_port + index")


def _check_ports(p: Profile, err: ErrFn) -> None:
    """Every port a machine of the tier listens on is its own."""
    s = p.serving
    ports: dict[int, str] = {}
    inst_ports = s.ports or [s.base_port + i for i in range(s.instances)]
    if max(inst_ports) > 65535:  # only base_port + index can pass the end: ports are typed
        err("serving.base_port", f"instances {s.instances} from port {s.base_port} end at "
            f"{max(inst_ports)}, past 65535", f"set at most {65536 - s.instances}")
    # the node exporter first: a profile port that takes its port is the field to change
    named = [("the node exporter (observability role)", NODE_EXPORTER_PORT)]
    named.append(("the status counter, mtail (observability role)", STATUS_EXPORTER_PORT))
    if p.hardware.gpu_count:
        named.append(("the DCGM exporter (observability role)", DCGM_EXPORTER_PORT))
    named += [(f"serving instance vllm-{i}", port) for i, port in enumerate(inst_ports)]
    named += [("router.port", p.router.port), ("router.internal_port", p.router.internal_port),
              ("router.metrics_port", p.router.metrics_port)]
    if s.nodes > 1:
        named.append(("serving.node_port", s.node_port))
    for what, port in named:
        if port in ports:
            fld = "serving.ports" if what.startswith("serving") and s.ports else (
                "serving.base_port" if what.startswith("serving") else what)
            err(fld, f"port {port} is used by both {ports[port]} and {what}",
                "give every instance, the router and its metrics a port of their own")
        else:
            ports[port] = what


def _check_fit(p: Profile, target: CatalogModel, draft: CatalogModel | None, err: ErrFn,
               clean: bool) -> None:
    """The model's shapes against the serving settings, and the memory each GPU needs
    (`clean`: no error so far, so the sizes are worth computing)."""
    hw, s, m = p.hardware, p.serving, p.model
    if s.max_model_len > target.max_position_embeddings:
        err("serving.max_model_len",
            f"{s.max_model_len} exceeds {m.target}'s {target.max_position_embeddings} positions",
            f"set at most {target.max_position_embeddings}")
    tp = s.tensor_parallel_size
    if target.num_attention_heads % tp:
        err("serving.tensor_parallel_size",
            f"{target.num_attention_heads} attention heads do not split over TP={tp}",
            "use a TP that divides the head count")
    per_seq = s.kv_context_per_seq or s.max_model_len
    if per_seq > s.max_model_len:
        err("serving.kv_context_per_seq",
            f"{per_seq} is more than max_model_len ({s.max_model_len}): no sequence is longer",
            f"set at most {s.max_model_len}, or leave it out to size for max_model_len")
    if not s.chunked_prefill and (s.max_num_batched_tokens or 0) < s.max_model_len:
        err("serving.max_num_batched_tokens",
            "without chunked prefill a whole prompt must fit one batch",
            f"set max_num_batched_tokens >= max_model_len ({s.max_model_len})")
    outside = hw.gpu_memory_gib * (1 - s.gpu_memory_utilization)
    if hw.gpu_count and tp > 1 and outside < TP_OUTSIDE_MIN_GIB:
        most = int((1 - TP_OUTSIDE_MIN_GIB / hw.gpu_memory_gib) * 100) / 100
        err("serving.gpu_memory_utilization",
            f"{s.gpu_memory_utilization} leaves {outside:.1f} GiB a GPU outside vLLM's share at "
            f"TP={tp}, where NCCL's and CUDA's own buffers live: leave at least "
            f"{TP_OUTSIDE_MIN_GIB} (docs/tiers/h100x8.md#gpu_memory_utilization)",
            f"set serving.gpu_memory_utilization at most {most} on {hw.gpu_memory_gib} GiB")
    if hw.gpu_count and clean:
        fit = _fit(p, target, draft)
        if fit.short_gib > 0:
            room = fit.available_gib - fit.weights_gib - fit.draft_gib - fit.overhead_gib
            seqs = int(room * memory.GIB // (per_seq * fit.kv_per_token)) if room > 0 else 0
            fix = (f"lower serving.max_num_seqs to {seqs}, or kv_context_per_seq (sequences "
                   "beyond it are preempted when the cache is full) or max_model_len, use "
                   "kv_cache_dtype fp8 / FP8 weights, or more tensor parallelism or nodes" if seqs
                   else "the weights alone do not fit: use FP8 weights, a smaller model, "
                   "more tensor parallelism, or more nodes (serving.nodes)")
            err("serving.max_num_seqs",
                f"{m.target} does not fit one GPU by {fit.short_gib:.1f} GiB"
                + (f" (one of {s.nodes} nodes' pipeline stages)" if s.nodes > 1 else "")
                + f": needs "
                f"{fit.needed_gib:.1f} GiB (weights {fit.weights_gib:.1f} + draft "
                f"{fit.draft_gib:.1f} + KV {fit.kv_gib:.1f} for {s.max_num_seqs} seqs x "
                f"{per_seq} tokens + overhead {fit.overhead_gib:.1f}) of "
                f"{fit.available_gib:.1f} GiB ({hw.gpu_memory_gib} GiB x "
                f"gpu_memory_utilization {s.gpu_memory_utilization})", fix)
    if hw.gpu_count == 0 and s.cpu_kv_cache_gib:
        need = memory.kv_tokens(s.max_num_seqs, s.max_model_len, s.kv_context_per_seq) * \
            memory.kv_bytes_per_token(target, m.kv_cache_dtype, 1) / memory.GIB
        if need > s.cpu_kv_cache_gib:
            err("serving.max_num_seqs",
                f"KV for {s.max_num_seqs} seqs x {per_seq} tokens needs {need:.2f} GiB, "
                f"more than cpu_kv_cache_gib {s.cpu_kv_cache_gib} by {need - s.cpu_kv_cache_gib:.2f}",
                "lower max_num_seqs or max_model_len, or raise cpu_kv_cache_gib")


def _check(
    p: Profile, catalog: Catalog, prov: dict[str, str], tier_file: str, catalog_file: str
) -> list[ProfileError]:
    errs: list[ProfileError] = []

    def err(fld: str, msg: str, fix: str) -> None:
        errs.append(ProfileError(prov.get(fld, tier_file), fld, msg, fix))

    if p.digitalocean.base_image not in BASE_IMAGES:
        err("digitalocean.base_image", f"{p.digitalocean.base_image!r} is not a base image the roles "
            "support", f"use one of: {', '.join(BASE_IMAGES)}")
    target, draft = _check_models(p, catalog, err, catalog_file)
    _check_hardware(p, target, err, catalog_file)
    _check_layout(p, target, err)
    _check_ports(p, err)
    if target:
        _check_fit(p, target, draft, err, clean=not errs)
    return errs
