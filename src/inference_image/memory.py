"""Per-GPU memory arithmetic: weights, draft, KV cache. Plain numbers, no framework."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import CatalogModel

GIB = 1024**3


def weight_bytes(m: CatalogModel, quantization: str) -> float:
    """Bytes of weights as served. FP8 checkpoints keep embeddings and lm_head in bf16."""
    total = m.params_b * 1e9
    if quantization == "none":
        return total * 2
    vocab_mats = m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2)
    return (total - vocab_mats) * 1 + vocab_mats * 2


def kv_bytes_per_token(m: CatalogModel, kv_dtype: str, tp: int, pp: int = 1) -> float:
    """K and V for one token on one GPU; KV heads are sharded by TP, replicated below one per GPU;
    layers are split over PP stages (the first stage takes the remainder: the largest)."""
    dtype_bytes = 1 if kv_dtype == "fp8" else 2
    kv_heads_per_gpu = max(1.0, m.num_kv_heads / tp)
    layers = -(-m.num_layers // pp)
    return 2 * layers * kv_heads_per_gpu * m.head_dim * dtype_bytes


def decode_bytes_per_token(m: CatalogModel, quantization: str, kv_dtype: str, context: int) -> float:
    """HBM bytes one decode step reads at batch 1: every linear weight once, the bf16 lm_head
    (a tied embedding is read whole as lm_head; an untied one only a row, ignored), and the KV
    cache of the context. Memory roofline = measured read bandwidth / this."""
    vocab_mat = m.vocab_size * m.hidden_size
    linear = m.params_b * 1e9 - vocab_mat * (1 if m.tie_word_embeddings else 2)
    weight_bytes_each = 2 if quantization == "none" else 1
    return linear * weight_bytes_each + vocab_mat * 2 + context * kv_bytes_per_token(m, kv_dtype, 1)


def _stage_weight_bytes(m: CatalogModel, quantization: str, pp: int) -> float:
    if pp == 1:
        return weight_bytes(m, quantization)
    vocab = m.vocab_size * m.hidden_size * 2 * (1 if m.tie_word_embeddings else 2)  # bf16
    layers = weight_bytes(m, quantization) - vocab
    return layers * -(-m.num_layers // pp) / m.num_layers + vocab


def kv_tokens(max_num_seqs: int, max_model_len: int, kv_context_per_seq: int | None) -> int:
    """Tokens the KV cache must hold at once."""
    per_seq = max_model_len if kv_context_per_seq is None else kv_context_per_seq
    return max(max_num_seqs * per_seq, max_model_len)


@dataclass(frozen=True)
class Fit:
    weights_gib: float
    draft_gib: float
    kv_gib: float
    overhead_gib: float
    available_gib: float
    kv_per_token: float

    @property
    def needed_gib(self) -> float:
        return self.weights_gib + self.draft_gib + self.kv_gib + self.overhead_gib

    @property
    def short_gib(self) -> float:
        return self.needed_gib - self.available_gib


def gpu_fit(
    target: CatalogModel,
    draft: CatalogModel | None,
    *,
    quantization: str,
    kv_dtype: str,
    tp: int,
    max_num_seqs: int,
    max_model_len: int,
    gpu_memory_gib: float,
    gpu_memory_utilization: float,
    overhead_gib: float,
    kv_context_per_seq: int | None = None,
    pp: int = 1,
) -> Fit:
    """One GPU of one instance with every sequence at kv_context_per_seq tokens at once (default
    max_model_len: the worst case), and never less than one sequence at max_model_len. With PP
    stages (one a node) a GPU holds its stage's share of the layers: the largest stage is checked,
    and the embeddings and lm_head (first and last stage) are counted on it whole, to stay safe."""
    kv_tok = kv_bytes_per_token(target, kv_dtype, tp, pp)
    draft_w = 0.0
    if draft is not None:
        kv_tok += kv_bytes_per_token(draft, kv_dtype, tp)
        draft_w = weight_bytes(draft, "none") / tp
    return Fit(
        weights_gib=_stage_weight_bytes(target, quantization, pp) / tp / GIB,
        draft_gib=draft_w / GIB,
        kv_gib=kv_tokens(max_num_seqs, max_model_len, kv_context_per_seq) * kv_tok / GIB,
        overhead_gib=overhead_gib,
        available_gib=gpu_memory_gib * gpu_memory_utilization,
        kv_per_token=kv_tok,
    )
