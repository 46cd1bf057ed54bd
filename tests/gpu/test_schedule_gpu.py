"""The plugin's draft schedule (plugins/vllm/inference_image_vllm/schedule.py) on vLLM's own FA3
backend, on a Hopper GPU with vLLM importable (the GPU machine: `pytest tests/gpu`). Skipped,
with the reason, elsewhere.

Each case is one prompt step of Llama 3.3 70B with its EAGLE-3 head, at TP=2 (the h100x8 tier's
instance: 32 query and 4 KV heads a GPU for the target, 24 and 4 for the head) or alone on a GPU
(the h200 tier: 64 and 8, 48 and 8); vLLM 0.26 computes the step's FA3 schedule for the target's.
The draft's layer runs as vLLM ships it (where FA3 splits its keys otherwise than the target's, it
raises) and with the plugin, whose answer must be the float32 attention's, as the target's layer's
is with its schedule.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs torch (GPU machine only)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here: these run on the GPU machine", allow_module_level=True)
if torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("FA3's ahead-of-time schedule is Hopper's", allow_module_level=True)
pytest.importorskip("vllm", reason="the draft schedule patches vLLM's FlashAttention backend")

from vllm.v1.attention.backends import flash_attn  # noqa: E402
from vllm.vllm_flash_attn.flash_attn_interface import get_scheduler_metadata  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins/vllm"))
from inference_image_vllm import schedule  # noqa: E402

HEAD = 128
# (target's query heads, draft's query heads, KV heads) a GPU
SHAPES = {"tp2": (32, 24, 4), "tp1": (64, 48, 8)}
BLOCK = 16
# (prompt tokens a sequence, sequences): 528 and 544 tokens alone are the lengths of 16-4096 (in
# 16s) whose step raised at TP=2 as vLLM 0.26 ships on an H200 (this file run as a script; none at
# TP=1; docs/decisions.md#a-draft-of-other-heads-gets-fa3s-schedule-of-its-own); a short and a long
# prompt, and a step of four
STEPS = [(528, 1), (544, 1), (128, 1), (2048, 1), (512, 4)]


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for name in ("_q_scale", "_k_scale", "_v_scale"):
            self.register_buffer(name, torch.tensor(1.0, dtype=torch.float32, device="cuda"))


class Impl(flash_attn.FlashAttentionImpl):
    """vLLM's class, so the plugin's wrap patches this one and not the process's."""


class Builder(flash_attn.FlashAttentionMetadataBuilder):
    """Wrapped beside Impl; the schedule of each step here is computed by hand (_step)."""


def _impl(cls: type, heads: int, kv_heads: int):
    return cls(heads, HEAD, HEAD ** -0.5, kv_heads, None, None, "auto")


def _step(shape: str, tokens: int, seqs: int):
    """A prompt step over a random bf16 cache: the metadata with the target's FA3 schedule (as
    vLLM's builder computes it: num_splits 0 outside a CUDA graph), the cache, the block table."""
    target, _, kv_heads = SHAPES[shape]
    blocks = (tokens + BLOCK - 1) // BLOCK
    cache = torch.randn(seqs * blocks, BLOCK, kv_heads, 2 * HEAD, device="cuda",
                        dtype=torch.bfloat16).permute(0, 2, 1, 3)
    table = torch.arange(seqs * blocks, dtype=torch.int32, device="cuda").reshape(seqs, blocks)
    qsl = torch.arange(0, (seqs + 1) * tokens, tokens, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((seqs,), tokens, dtype=torch.int32, device="cuda")
    sched = get_scheduler_metadata(
        batch_size=seqs, max_seqlen_q=tokens, max_seqlen_k=tokens, num_heads_q=target,
        num_heads_kv=kv_heads, headdim=HEAD, cache_seqlens=seq_lens, qkv_dtype=torch.bfloat16,
        cu_seqlens_q=qsl, page_size=BLOCK, causal=True, window_size=(-1, -1), num_splits=0)
    meta = flash_attn.FlashAttentionMetadata(
        num_actual_tokens=seqs * tokens, max_query_len=tokens, query_start_loc=qsl,
        max_seq_len=tokens, seq_lens=seq_lens, block_table=table, slot_mapping=torch.full(
            (seqs * tokens,), -1, dtype=torch.int64, device="cuda"),
        use_cascade=False, common_prefix_len=0, cu_prefix_query_lens=None, prefix_kv_lens=None,
        suffix_kv_lens=None, scheduler_metadata=sched)
    setattr(meta, schedule.STAMP, (target, kv_heads, HEAD))  # what the wrapped builder stamps
    return meta, cache, table


def _reference(query, cache, tokens: int, seqs: int, table) -> torch.Tensor:
    """float32 causal attention of each sequence's prompt over its cached keys and values."""
    heads, kv_heads = query.shape[1], cache.shape[1]
    k_all, v_all = cache.transpose(1, 2).float().split(HEAD, dim=-1)  # (blocks, slots, kv, head)
    mask = torch.ones(tokens, tokens, device="cuda").triu(1).bool()[None]
    out = []
    for s in range(seqs):
        k, v = (x[table[s]].reshape(-1, kv_heads, HEAD)[:tokens].repeat_interleave(
            heads // kv_heads, 1) for x in (k_all, v_all))
        q = query[s * tokens:(s + 1) * tokens].float()
        w = (torch.einsum("qhd,khd->hqk", q, k) * HEAD ** -0.5).masked_fill(mask, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", w.softmax(-1), v))
    return torch.cat(out)


def _run(impl, meta, cache) -> tuple[torch.Tensor, torch.Tensor]:
    n = meta.num_actual_tokens
    query = torch.randn(n, impl.num_heads, HEAD, device="cuda", dtype=torch.bfloat16)
    kv = torch.empty(n, impl.num_kv_heads, HEAD, device="cuda", dtype=torch.bfloat16)
    out = torch.full((n, impl.num_heads, HEAD), float("nan"), device="cuda", dtype=torch.bfloat16)
    impl.forward(Layer(), query, kv, kv, cache, meta, out)
    torch.cuda.synchronize()
    return query, out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def shipped(shape: str, steps) -> dict[tuple[int, int], str | None]:
    """The draft's FA3 call as vLLM 0.26 makes it, per step: None where it ran, else its error."""
    _, draft, kv_heads = SHAPES[shape]
    impl = _impl(flash_attn.FlashAttentionImpl, draft, kv_heads)
    said: dict[tuple[int, int], str | None] = {}
    for tokens, seqs in steps:
        meta, cache, _ = _step(shape, tokens, seqs)
        try:
            _run(impl, meta, cache)
            said[(tokens, seqs)] = None
        except RuntimeError as e:
            said[(tokens, seqs)] = str(e).splitlines()[0]
    return said


@pytest.fixture(scope="module")
def patched():
    schedule.wrap(Builder, Impl)
    return Impl


def test_vllm_hands_a_draft_of_other_heads_a_schedule_it_rejects():
    """The failure the plugin exists for, on this vLLM (the crash at TP=2 of
    docs/decisions.md#a-draft-of-other-heads-gets-fa3s-schedule-of-its-own): if no step raises
    any more, vLLM has fixed it and schedule.py can go, with its render switch."""
    said = shipped("tp2", STEPS)
    failed = {step: e for step, e in said.items() if e}
    assert failed, f"no step raised as vLLM ships it: {said}"
    assert all("scheduler_metadata" in e for e in failed.values()), failed


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize(("tokens", "seqs"), STEPS)
def test_a_draft_of_other_heads_attends_without_the_targets_schedule(patched, shape, tokens,
                                                                     seqs):
    torch.manual_seed(tokens + seqs)
    _, draft, kv_heads = SHAPES[shape]
    meta, cache, table = _step(shape, tokens, seqs)
    query, out = _run(_impl(patched, draft, kv_heads), meta, cache)
    assert meta.scheduler_metadata is not None, "the step's own metadata lost the schedule"
    err = _rel(out, _reference(query, cache, tokens, seqs, table))
    assert err < 2e-2, f"relative error {err:.2e}"


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize(("tokens", "seqs"), STEPS)
def test_the_targets_layers_keep_their_schedule(patched, shape, tokens, seqs, monkeypatch):
    torch.manual_seed(tokens * seqs)
    target, _, kv_heads = SHAPES[shape]
    meta, cache, table = _step(shape, tokens, seqs)
    seen = []
    real = flash_attn.flash_attn_varlen_func

    def spy(*args, **kwargs):
        seen.append(kwargs.get("scheduler_metadata"))
        return real(*args, **kwargs)

    monkeypatch.setattr(flash_attn, "flash_attn_varlen_func", spy)
    query, out = _run(_impl(patched, target, kv_heads), meta, cache)
    assert len(seen) == 1 and seen[0] is meta.scheduler_metadata
    err = _rel(out, _reference(query, cache, tokens, seqs, table))
    assert err < 2e-2, f"relative error {err:.2e}"


if __name__ == "__main__":
    # which prompt steps of one sequence fail as vLLM ships it, per shape (a probe, not a test)
    for shape in SHAPES:
        said = shipped(shape, [(t, 1) for t in range(16, 4097, 16)])
        bad = [t for (t, _), e in said.items() if e]
        print(shape, f"{len(bad)} of {len(said)} prompt lengths raise:", bad[:40])
