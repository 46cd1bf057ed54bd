from __future__ import annotations

import pytest
from conftest import ROOT

from inference_image import memory
from inference_image.profiles import load_catalog

CAT = load_catalog(ROOT / "profiles").models
L8 = CAT["llama-3.1-8b-instruct"]


def test_weight_bytes():
    assert memory.weight_bytes(L8, "none") == pytest.approx(8.03e9 * 2)
    vocab = 128256 * 4096 * 2  # embedding + lm_head stay bf16 in FP8 checkpoints
    assert memory.weight_bytes(L8, "fp8") == pytest.approx((8.03e9 - vocab) + vocab * 2)


def test_kv_bytes_per_token_llama_8b():
    # 2 (K,V) x 32 layers x 8 KV heads x 128 dims x 2 bytes
    assert memory.kv_bytes_per_token(L8, "auto", 1) == 131072
    assert memory.kv_bytes_per_token(L8, "fp8", 1) == 65536
    assert memory.kv_bytes_per_token(L8, "fp8", 2) == 32768
    # KV heads are replicated, not split, past one head per GPU
    assert memory.kv_bytes_per_token(L8, "fp8", 16) == memory.kv_bytes_per_token(L8, "fp8", 8)


def test_decode_bytes_per_token_counts_lm_head_in_bf16():
    lin = 8.03e9 - 2 * 128256 * 4096
    assert memory.decode_bytes_per_token(L8, "fp8", "fp8", 0) == pytest.approx(
        lin + 128256 * 4096 * 2)
    assert memory.decode_bytes_per_token(L8, "none", "auto", 100) == pytest.approx(
        lin * 2 + 128256 * 4096 * 2 + 100 * 131072)


def test_fit_adds_draft_weights_and_kv():
    kw = dict(quantization="fp8", kv_dtype="fp8", tp=1, max_num_seqs=10, max_model_len=1000,
              gpu_memory_gib=80, gpu_memory_utilization=0.9, overhead_gib=2)
    alone = memory.gpu_fit(L8, None, **kw)
    drafted = memory.gpu_fit(L8, CAT["llama-3.2-1b-instruct"], **kw)
    assert drafted.draft_gib > 2.3 and drafted.kv_gib > alone.kv_gib
    assert alone.available_gib == 72
