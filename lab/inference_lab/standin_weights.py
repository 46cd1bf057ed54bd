"""Stand-in weight files: a stand-in model folder's weights written as safetensors under the
names, shapes and dtypes its real checkpoint has, for the starts that must read their weights
from files rather than draw them (`--load-format dummy` reads none): a checkpoint that reloads
its weights at a restore (serving.checkpoint_weights: files) reloads them only from files.

The values stand in for trained ones as vLLM's dummy loader's do: small, finite, the same at
every write. FP8 weights are e4m3 bytes whose exponent keeps them inside [2^-6, 3.75] (never a
NaN), scaled by a fixed per-tensor or per-channel scale; bf16 weights are uniform in +-1e-3;
norms are ones. Each tensor is a window of a random pool whose length divides no row, so no two
rows of a matrix are the same. Architectures: Llama (bf16, or compressed-tensors FP8 as the
proof's FP8 stand-ins are) and its EAGLE-3 head.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

MARK = "standin-weights.json"
SHARD_BYTES = 2 * 2**30
# the files a stand-in folder holds beside its weights, copied along (config and tokenizer)
KEEP = (".json", ".txt", ".model", ".jinja")
# safetensors dtype -> bytes an element
ITEMSIZE = {"F8_E4M3": 1, "BF16": 2, "F32": 4, "I64": 8}
WEIGHT_SCALE = 2.0**-11  # an FP8 weight's scale: e4m3 values of [2^-6, 3.75] become <= 2e-3
INPUT_SCALE = 2.0**-6  # a static activation scale: normed activations stay inside e4m3's range
# the random pools' lengths in elements: odd, so a window of one never repeats a matrix's rows
POOL = {"F8_E4M3": 2**24 + 4099, "BF16": 2**23 + 2053}


class StandinError(ValueError):
    """A stand-in folder whose weights this module cannot write (its architecture, its
    quantization)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # safetensors' name of it
    shape: tuple[int, ...]
    fill: str  # random | ones | zeros | weight_scale | input_scale

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


def _fp8(config: dict[str, Any]) -> tuple[str, bool] | None:
    """A compressed-tensors FP8 config as (weight scale strategy, static activation scale);
    None for an unquantized model."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    try:
        group = next(iter(qc["config_groups"].values()))
        w, a = group["weights"], group["input_activations"]
        ok = (qc["quant_method"] == "compressed-tensors" and w["num_bits"] == 8
              and w["type"] == "float" and w["strategy"] in ("tensor", "channel"))
    except (KeyError, TypeError, StopIteration, AttributeError):
        ok = False
    if not ok:
        raise StandinError("stand-in weights are written for compressed-tensors FP8 (8-bit "
                           "float weights, per-tensor or per-channel scales) or no quantization; "
                           f"this config has {json.dumps(qc)[:200]}")
    return w["strategy"], not a.get("dynamic", False)


def _linear(name: str, out: int, inp: int, fp8: tuple[str, bool] | None) -> list[Tensor]:
    if fp8 is None:
        return [Tensor(f"{name}.weight", "BF16", (out, inp), "random")]
    strategy, static = fp8
    return [Tensor(f"{name}.weight", "F8_E4M3", (out, inp), "random"),
            Tensor(f"{name}.weight_scale", "F32", (1,) if strategy == "tensor" else (out, 1),
                   "weight_scale"),
            *([Tensor(f"{name}.input_scale", "F32", (1,), "input_scale")] if static else [])]


def _layer(prefix: str, c: dict[str, Any], fp8: tuple[str, bool] | None,
           attn_in: int) -> list[Tensor]:
    h, inter = c["hidden_size"], c["intermediate_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    hd = c.get("head_dim") or h // heads
    return [Tensor(f"{prefix}.input_layernorm.weight", "BF16", (h,), "ones"),
            *_linear(f"{prefix}.self_attn.q_proj", heads * hd, attn_in, fp8),
            *_linear(f"{prefix}.self_attn.k_proj", kv * hd, attn_in, fp8),
            *_linear(f"{prefix}.self_attn.v_proj", kv * hd, attn_in, fp8),
            *_linear(f"{prefix}.self_attn.o_proj", h, heads * hd, fp8),
            Tensor(f"{prefix}.post_attention_layernorm.weight", "BF16", (h,), "ones"),
            *_linear(f"{prefix}.mlp.gate_proj", inter, h, fp8),
            *_linear(f"{prefix}.mlp.up_proj", inter, h, fp8),
            *_linear(f"{prefix}.mlp.down_proj", h, inter, fp8)]


def plan(config: dict[str, Any]) -> list[Tensor]:
    """Every tensor of the checkpoint `config` (a config.json) describes, in the order written."""
    arch = (config.get("architectures") or ["?"])[0]
    try:
        h, vocab = config["hidden_size"], config["vocab_size"]
        if arch == "LlamaForCausalLM":
            fp8 = _fp8(config)
            out = [Tensor("model.embed_tokens.weight", "BF16", (vocab, h), "random")]
            for i in range(config["num_hidden_layers"]):
                out += _layer(f"model.layers.{i}", config, fp8, h)
            out.append(Tensor("model.norm.weight", "BF16", (h,), "ones"))
            if not config.get("tie_word_embeddings", False):
                out.append(Tensor("lm_head.weight", "BF16", (vocab, h), "random"))  # never FP8
            return out
        if arch == "LlamaForCausalLMEagle3":
            if config.get("quantization_config"):
                raise StandinError("an EAGLE-3 head is written in bf16 only")
            if config.get("num_hidden_layers", 1) != 1:
                raise StandinError("an EAGLE-3 head of one layer (midlayer) only")
            target = config.get("target_hidden_size", h)
            draft_vocab = config.get("draft_vocab_size") or vocab
            # a head as wide as its target shares the target's embeddings; a narrower one has
            # its own (as inference_lab.standin.sitecustomize assumes)
            own_embed = [Tensor("embed_tokens.weight", "BF16", (vocab, h), "random")] \
                if target != h else []
            return [*own_embed, *_layer("midlayer", config, None, 2 * h),
                    Tensor("midlayer.hidden_norm.weight", "BF16", (h,), "ones"),
                    Tensor("fc.weight", "BF16", (h, 3 * target), "random"),
                    Tensor("norm.weight", "BF16", (h,), "ones"),
                    Tensor("lm_head.weight", "BF16", (draft_vocab, h), "random"),
                    Tensor("d2t", "I64", (draft_vocab,), "zeros")]
    except (KeyError, TypeError) as exc:
        raise StandinError(f"config.json lacks {exc} for {arch}") from None
    raise StandinError(f"no stand-in weights for architecture {arch} (have LlamaForCausalLM, "
                       "LlamaForCausalLMEagle3)")


def shards(tensors: list[Tensor], limit: int = SHARD_BYTES) -> list[list[Tensor]]:
    """Tensors in order, in files of at most `limit` bytes (or one tensor, if larger)."""
    out: list[list[Tensor]] = [[]]
    size = 0
    for t in tensors:
        if out[-1] and size + t.nbytes > limit:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.nbytes
    return out


def header(tensors: list[Tensor]) -> bytes:
    """The safetensors header: its length (8 bytes, little-endian), then the JSON, padded with
    spaces to a multiple of 8 (the format's alignment)."""
    meta: dict[str, Any] = {"__metadata__": {"format": "pt", "written_by": "inference-lab"}}
    at = 0
    for t in tensors:
        meta[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [at, at + t.nbytes]}
        at += t.nbytes
    blob = json.dumps(meta, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return len(blob).to_bytes(8, "little") + blob


def _pool(dtype: str) -> np.ndarray:
    """Two copies of the dtype's random pool end to end (so any window of one pool's length is
    one slice), as raw little-endian elements."""
    import numpy as np

    rng = np.random.default_rng(20261203)
    n = POOL[dtype]
    if dtype == "F8_E4M3":
        # sign | exponent 1..8 | mantissa: e4m3fn values of magnitude 2^-6 .. 3.75, no NaN
        pool = ((rng.integers(0, 2, n, dtype=np.uint8) << 7)
                | (rng.integers(1, 9, n, dtype=np.uint8) << 3)
                | rng.integers(0, 8, n, dtype=np.uint8))
    else:  # BF16: the top half of float32 values in +-1e-3
        f = rng.uniform(-1e-3, 1e-3, n).astype("<f4")
        pool = (f.view("<u4") >> 16).astype("<u2")
    return np.concatenate([pool, pool])


def _constant(t: Tensor) -> bytes:
    import numpy as np

    one: dict[str, Any] = {
        "ones": np.array([0x3F80], "<u2"), "zeros": np.zeros(1, "<i8" if t.dtype == "I64" else "<u2"),
        "weight_scale": np.array([WEIGHT_SCALE], "<f4"), "input_scale": np.array([INPUT_SCALE], "<f4")}
    return one[t.fill].tobytes()


def write_file(path: Path, tensors: list[Tensor]) -> int:
    """One safetensors file of `tensors`, written beside its name and renamed into place; its
    size."""
    pools: dict[str, np.ndarray] = {}
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("wb") as fh:
        fh.write(header(tensors))
        for t in tensors:
            if t.fill != "random":
                value = _constant(t)
                fh.write(value * (t.nbytes // len(value)))
                continue
            pool = pools.get(t.dtype)
            if pool is None:
                pool = pools[t.dtype] = _pool(t.dtype)
            n, size = t.nbytes // ITEMSIZE[t.dtype], POOL[t.dtype]
            at = int.from_bytes(hashlib.sha256(t.name.encode()).digest()[:8], "little") % size
            while n:
                take = min(n, size)
                fh.write(memoryview(pool[at:at + take]))
                n -= take
    os.replace(tmp, path)
    return path.stat().st_size


def _digest(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def write(src: Path, dest: Path, workers: int = 0, limit: int = SHARD_BYTES) -> dict[str, Any]:
    """The stand-in folder `src` (config, tokenizer) at `dest` with its weights as files: what
    was written (files, bytes, seconds). A `dest` already written from the same config is kept."""
    import time

    # only a folder this tool wrote (its mark) is replaced: anything else there is somebody's
    if dest.is_symlink() or (dest.is_dir() and not (dest / MARK).is_file()
                             and any(dest.iterdir())):
        raise StandinError(f"{dest} holds files this tool did not write (no {MARK}): nothing "
                           "removed. Fix: move them, or give --weight-files another folder")
    config = json.loads((src / "config.json").read_text())
    files = shards(plan(config), limit)
    mark = dest / MARK
    if mark.is_file():
        with_mark = json.loads(mark.read_text())
        if with_mark.get("config_sha256") == _digest(config):
            return {**with_mark, "kept": True}
    t0 = time.monotonic()
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix in KEEP:
            shutil.copy2(f, dest / f.name)
    names = [dest / f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
             for i in range(len(files))]
    with ProcessPoolExecutor(max_workers=workers or min(len(files), os.cpu_count() or 1)) as ex:
        sizes = list(ex.map(write_file, names, files))
    done = {"config_sha256": _digest(config), "files": len(files), "bytes": sum(sizes),
            "tensors": sum(len(f) for f in files), "s": round(time.monotonic() - t0, 1)}
    mark.write_text(json.dumps(done, indent=1))
    return done
