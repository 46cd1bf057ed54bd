"""The plugin's reload (inference_image_vllm/reload.py) reads a model's safetensors files whole
and cuts them into tensors on the device: every tensor as the safetensors library reads it, an
offset the format allows but no dtype aligns included. Needs torch (the GPU machine; on a CPU the
device is the CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs torch (GPU machine only)")
from safetensors.torch import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "vllm"))
from inference_image_vllm.reload import file_weights, weight_files  # noqa: E402
from inference_lab import standin_weights  # noqa: E402
from inference_lab.proof_plan import ct_fp8  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_every_tensor_of_the_files_comes_as_the_library_reads_it(tmp_path: Path) -> None:
    src = tmp_path / "standin"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 3, "vocab_size": 1001, "quantization_config": ct_fp8(
            "channel", "token", True)}))
    standin_weights.write(src, tmp_path / "files", workers=2, limit=30_000)
    files = weight_files(str(tmp_path / "files"))
    got = dict(file_weights(files, DEVICE))
    want = {k: v for f in files for k, v in load_file(str(f)).items()}
    assert len(files) > 1 and set(got) == set(want)
    for name, t in want.items():
        assert got[name].device.type == DEVICE and got[name].dtype == t.dtype
        assert torch.equal(got[name].cpu().view(torch.uint8), t.view(torch.uint8)), name


def test_a_tensor_at_an_offset_its_type_does_not_align_is_read(tmp_path: Path) -> None:
    head = json.dumps({"a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]}}).encode()
    head += b" " * (-len(head) % 8)
    f = tmp_path / "odd.safetensors"
    f.write_bytes(len(head).to_bytes(8, "little") + head + bytes([1, 2, 3])
                  + torch.tensor([1.5, -2.25]).numpy().tobytes())
    got = dict(file_weights([f], DEVICE))
    assert got["a"].tolist() == [1, 2, 3] and got["b"].tolist() == [1.5, -2.25]
