"""Stand-in weight files (inference_lab.standin_weights): the proof's stand-in folders written as
safetensors of their real checkpoints' names, shapes and dtypes, readable by the safetensors
library, with finite values and no repeated rows, for a checkpoint that reads weights again from
the model's files."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from inference_image.profiles import default_profiles_dir, load_catalog
from inference_lab import standin_weights as sw
from inference_lab.proof_plan import DRAFTS, EAGLE3, FP8_STANDIN, ct_fp8

CATALOG = load_catalog(default_profiles_dir()).models


def _config(name: str, **more: object) -> dict[str, object]:
    return {"architectures": ["LlamaForCausalLM"], **CATALOG[name].config_shape(), **more}


def _head(name: str) -> dict[str, object]:
    return {**CATALOG[name].config_shape(), **DRAFTS[name][1]}


@pytest.mark.parametrize("scales", list(FP8_STANDIN))
def test_the_70b_fp8_stand_in_weighs_what_its_parameters_do(scales: str) -> None:
    """Every parameter of Llama 3.3 70B once, FP8 where the checkpoint is (its linear layers),
    bf16 elsewhere: the bytes are the catalog's parameter count at one byte each, plus a second
    byte for the embeddings and lm_head; the scales are the stand-in's kind."""
    m = CATALOG["llama-3.3-70b-instruct"]
    tensors = sw.plan(_config("llama-3.3-70b-instruct",
                              quantization_config=ct_fp8(*FP8_STANDIN[scales][1])))
    names = {t.name: t for t in tensors}
    assert len(names) == len(tensors)
    elements = sum(math.prod(t.shape) for t in tensors if not t.name.endswith("_scale"))
    assert abs(elements / 1e9 - m.params_b) / m.params_b < 0.01
    embed = m.vocab_size * m.hidden_size
    norms = sum(math.prod(t.shape) for t in tensors if t.name.endswith("norm.weight"))
    # the bf16 tensors' second bytes: embeddings, lm_head and norms
    assert sum(t.nbytes for t in tensors if "scale" not in t.name) == elements + 2 * embed + norms
    q = names["model.layers.79.self_attn.q_proj.weight"]
    assert (q.dtype, q.shape) == ("F8_E4M3", (m.num_attention_heads * m.head_dim, m.hidden_size))
    assert names["lm_head.weight"].dtype == "BF16"
    w = names["model.layers.0.mlp.down_proj.weight_scale"].shape
    assert w == ((1,) if scales == "static-tensor" else (m.hidden_size, 1))
    assert ("model.layers.0.mlp.down_proj.input_scale" in names) == (scales == "static-tensor")


@pytest.mark.parametrize("head,own_embed", [("llama-3.3-70b-eagle3", True),
                                            ("llama-3.1-8b-eagle3", False)])
def test_an_eagle3_head_has_its_midlayer_fc_and_draft_vocabulary(head: str, own_embed: bool) -> None:
    """The names vLLM's EAGLE-3 loader reads (midlayer, fc over three target layers, d2t); a head
    narrower than its target carries its own embeddings, as the proof's stand-ins assume."""
    c = _head(head)
    names = {t.name: t for t in sw.plan(c)}
    h, target = int(c["hidden_size"]), int(c.get("target_hidden_size", c["hidden_size"]))
    assert names["fc.weight"].shape == (h, 3 * target)
    assert names["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * h
    assert names["lm_head.weight"].shape == (EAGLE3["draft_vocab_size"], h)
    assert names["d2t"].dtype == "I64"
    assert ("embed_tokens.weight" in names) == own_embed


@pytest.mark.parametrize("config,why", [
    ({"architectures": ["MixtralForCausalLM"], "hidden_size": 8, "vocab_size": 8},
     "no stand-in weights for architecture MixtralForCausalLM"),
    (_config("llama-3.1-8b-instruct", quantization_config={"quant_method": "gptq", "bits": 4}),
     "compressed-tensors FP8"),
    ({"architectures": ["LlamaForCausalLM"], "vocab_size": 8}, "config.json lacks 'hidden_size'"),
])
def test_a_config_it_cannot_write_is_one_error_naming_why(config: dict[str, object],
                                                          why: str) -> None:
    with pytest.raises(sw.StandinError, match=why):
        sw.plan(config)


TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 3, "vocab_size": 1000, "tie_word_embeddings": False,
        "quantization_config": ct_fp8("tensor", "tensor", False)}


def _read(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Each tensor of a safetensors file as (dtype, shape, raw bytes), by the format's header."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    head.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items()}


def test_written_files_hold_every_tensor_once_finite_and_no_two_rows_alike(tmp_path: Path) -> None:
    src = tmp_path / "standin"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(TINY))
    (src / "tokenizer.json").write_text("{}")
    done = sw.write(src, tmp_path / "files", workers=2, limit=40_000)
    dest = tmp_path / "files"
    files = sorted(dest.glob("*.safetensors"))
    assert done["files"] == len(files) > 1 and (dest / "tokenizer.json").is_file()
    assert done["bytes"] == sum(f.stat().st_size for f in files)
    tensors: dict[str, tuple[str, list[int], bytes]] = {}
    for f in files:
        with safe_open(str(f), framework="numpy") as fh:  # the library reads the header too
            keys = set(fh.keys())
        got = _read(f)
        assert keys == set(got)
        tensors.update(got)
    assert set(tensors) == {t.name for t in sw.plan(TINY)}
    dtype, shape, raw = tensors["model.layers.1.mlp.up_proj.weight"]
    fp8 = np.frombuffer(raw, np.uint8)
    exponent = (fp8 >> 3) & 0xF
    assert dtype == "F8_E4M3" and len(raw) == math.prod(shape)
    assert exponent.min() >= 1 and exponent.max() <= 8  # no NaN (exponent 15), nothing huge
    rows = {bytes(r) for r in fp8.reshape(shape)}
    assert len(rows) == shape[0]
    _, _, scale = tensors["model.layers.1.mlp.up_proj.weight_scale"]
    assert np.frombuffer(scale, "<f4").tolist() == [sw.WEIGHT_SCALE]
    _, shape, raw = tensors["lm_head.weight"]
    bf16 = (np.frombuffer(raw, "<u2").astype("<u4") << 16).view("<f4").reshape(shape)
    assert np.isfinite(bf16).all() and np.abs(bf16).max() <= 1e-3
    assert len({r.tobytes() for r in bf16}) == shape[0]
    _, _, norm = tensors["model.norm.weight"]
    assert set(np.frombuffer(norm, "<u2").tolist()) == {0x3F80}  # 1.0


def test_a_second_write_keeps_files_of_the_same_config_and_rewrites_another(tmp_path: Path) -> None:
    src, dest = tmp_path / "standin", tmp_path / "files"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(TINY))
    first = sw.write(src, dest, workers=1)
    before = {f.name: f.stat().st_mtime_ns for f in dest.glob("*.safetensors")}
    assert sw.write(src, dest, workers=1) == {**first, "kept": True}
    assert {f.name: f.stat().st_mtime_ns for f in dest.glob("*.safetensors")} == before
    (src / "config.json").write_text(json.dumps({**TINY, "num_hidden_layers": 1}))
    again = sw.write(src, dest, workers=1)
    assert "kept" not in again and again["tensors"] < first["tensors"]
    assert not list(dest.glob("*.partial"))
