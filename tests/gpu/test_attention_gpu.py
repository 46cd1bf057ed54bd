"""The plugin's Triton decode-attention route against FA3 on the same KV cache, on a CUDA GPU
with vLLM importable (the GPU machine: `pytest tests/gpu`). Skipped, with the reason, elsewhere.

Each case starts from one KV cache filled by FA3's own cache write (the prefill both routes share),
then runs one step twice on two copies of it: once through vLLM's FlashAttentionImpl as shipped,
once through the same class with the plugin installed. Both outputs are checked against a float32
attention over the dequantized cache, the two caches must be byte-identical afterwards, and the
route each call took is counted, so a silent fallback to FA3 cannot pass as the Triton route.
Every case runs with the plugin's `verify` off (`serving.triton_decode_verify: false`: more than
one query token a sequence goes to FA3) and on (the h100 profile: such steps of at most
MAX_TOKENS tokens go to Triton's split-KV kernel too).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs torch (GPU machine only)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here: these run on the GPU machine", allow_module_level=True)
if torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("the FP8 KV cache needs compute capability >= 8.9", allow_module_level=True)
pytest.importorskip("vllm", reason="the attention route patches vLLM's FlashAttention backend")

from vllm.v1.attention.backends import flash_attn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins/vllm"))
from inference_image_vllm import attention  # noqa: E402

FP8 = torch.float8_e4m3fn
HEADS, KV_HEADS, HEAD = 32, 8, 128  # Llama-3.1-8B
BLOCK, BLOCKS = 16, 2048  # 8 sequences of up to 2,050 tokens: 129 blocks each
MAX_TOKENS = 8  # the h100 profile's serving.triton_decode_max_tokens
# context lengths (tokens already cached) of the sequences a step may use: one token, a block
# boundary, mid-length and long enough for Triton's split-KV segments
CONTEXTS = [1, 16, 37, 300, 2049, 700, 95, 5]
Q_SCALE, K_SCALE, V_SCALE = 0.02, 0.025, 0.03  # not 1.0: a dropped scale must show
PATCHED = ("forward", "do_kv_cache_update", "fused_output_quant_supported")


@dataclass
class Routes:
    fa_forward: int = 0
    fa_cache: int = 0


@pytest.fixture(scope="module")
def plugin():
    """FlashAttentionImpl with the plugin installed over counting wrappers of vLLM's methods, so
    every call the plugin hands back to FA3 is seen; vLLM's class is restored afterwards."""
    assert attention._installed == 0, "the plugin is already installed in this process"
    cls = flash_attn.FlashAttentionImpl
    saved = {name: cls.__dict__.get(name) for name in PATCHED}
    vanilla_forward, vanilla_cache = cls.forward, cls.do_kv_cache_update
    routes = Routes()

    def counting_forward(*args, **kwargs):
        routes.fa_forward += 1
        return vanilla_forward(*args, **kwargs)

    def counting_cache(*args, **kwargs):
        routes.fa_cache += 1
        return vanilla_cache(*args, **kwargs)

    cls.forward, cls.do_kv_cache_update = counting_forward, counting_cache
    attention.install(MAX_TOKENS)
    patched = {name: getattr(cls, name) for name in PATCHED}
    for name, fn in saved.items():  # the reference route runs vLLM's class as shipped
        if fn is None:
            delattr(cls, name)
        else:
            setattr(cls, name, fn)
    yield patched, vanilla_forward, vanilla_cache, routes
    attention._installed = 0


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for name, v in (("_q_scale", Q_SCALE), ("_k_scale", K_SCALE), ("_v_scale", V_SCALE)):
            self.register_buffer(name, torch.tensor(v, dtype=torch.float32, device="cuda"))


def _impl(kv_dtype: str):
    return flash_attn.FlashAttentionImpl(HEADS, HEAD, HEAD ** -0.5, KV_HEADS, None, None, kv_dtype)


def _cache(kv_dtype: str) -> torch.Tensor:
    # vLLM's NHD memory layout, seen through the logical (blocks, heads, slots, 2 x head) shape
    dtype = torch.uint8 if kv_dtype == "fp8" else torch.bfloat16
    return torch.zeros(BLOCKS, BLOCK, KV_HEADS, 2 * HEAD, dtype=dtype,
                       device="cuda").permute(0, 2, 1, 3)


def _metadata(q_lens, seq_lens, block_table, slots):
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                       device="cuda")
    return flash_attn.FlashAttentionMetadata(
        num_actual_tokens=sum(q_lens), max_query_len=max(q_lens), query_start_loc=qsl,
        max_seq_len=max(seq_lens), seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        block_table=block_table, slot_mapping=slots, use_cascade=False, common_prefix_len=0,
        cu_prefix_query_lens=None, prefix_kv_lens=None, suffix_kv_lens=None)


def _slots(block_table, positions_per_seq, pad_to: int) -> torch.Tensor:
    out = []
    for seq, positions in enumerate(positions_per_seq):
        for p in positions:
            out.append(int(block_table[seq, p // BLOCK]) * BLOCK + p % BLOCK)
    out += [-1] * (pad_to - len(out))  # CUDA-graph padding: rows that write nothing
    return torch.tensor(out, dtype=torch.int64, device="cuda")


def _dequant(cache: torch.Tensor, kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = cache.transpose(1, 2).split(HEAD, dim=-1)  # (blocks, slots, heads, head)
    if kv_dtype == "fp8":
        return k.view(FP8).float() * K_SCALE, v.view(FP8).float() * V_SCALE
    return k.float(), v.float()


def _reference(query, cache, kv_dtype, q_lens, seq_lens, block_table) -> torch.Tensor:
    """float32 causal attention of each sequence's new tokens over its cached keys and values."""
    keys, values = _dequant(cache, kv_dtype)
    q = query.float() * (Q_SCALE if query.dtype == FP8 else 1.0)
    out, start = [], 0
    for seq, (ql, sl) in enumerate(zip(q_lens, seq_lens, strict=True)):
        blocks = block_table[seq, : (sl + BLOCK - 1) // BLOCK]
        k = keys[blocks].reshape(-1, KV_HEADS, HEAD)[:sl].repeat_interleave(HEADS // KV_HEADS, 1)
        v = values[blocks].reshape(-1, KV_HEADS, HEAD)[:sl].repeat_interleave(HEADS // KV_HEADS, 1)
        s = torch.einsum("qhd,khd->hqk", q[start:start + ql], k) * HEAD ** -0.5
        visible = torch.arange(sl, device="cuda")[None, :] <= (sl - ql + torch.arange(
            ql, device="cuda"))[:, None]
        s = s.masked_fill(~visible[None], float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), v))
        start += ql
    return torch.cat(out)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


# (new tokens per sequence, rows the step is padded to[, cached tokens per sequence]): what each
# case stands for
STEPS: dict[str, tuple[list[int], int] | tuple[list[int], int, list[int]]] = {
    "decode-1": ([1], 1),
    "decode-4": ([1, 1, 1, 1], 4),
    "decode-8": ([1] * 8, 8),
    # 2 sequences x (1 + 3 speculative tokens): the EAGLE-3 verify step the h100 profile runs;
    # more than one query token a sequence, so FA3 attends unless verify (the cache write is
    # Triton's)
    "verify-2x4": ([4, 4], 8),
    "verify-1x4": ([4], 4),
    "mixed": ([5, 1, 1, 1], 8),
    # 257 and 513 tokens: the split-KV kernel's last segment holds the last 1 key alone (tiles of
    # 16 or 32 keys, 16 segments), which the first of 4 query tokens may not see: a segment where
    # a row sees nothing must add nothing
    "verify-edge": ([4, 4], 8, [253, 509]),
    # a long-form context beside a short one: many keys a segment for one, few for the other
    "verify-long": ([4, 4], 8, [2040, 60]),
    # 3 real tokens in a 16-row CUDA graph: the cache write sees 16 rows and goes to FA3,
    # the attention sees 3 and goes to Triton (the two routes meet on one step)
    "split-routes": ([1, 1, 1], 16),
    # above the limit: both parts stay on FA3, and the result must be FA3's, bit for bit
    "fa3-only": ([4, 4, 4], 12),
}


@pytest.fixture(params=[False, True], ids=["decode-only", "verify"])
def verify(request):
    """The plugin's verify switch for one test (serving.triton_decode_verify)."""
    attention._verify = request.param
    yield request.param
    attention._verify = False


@pytest.mark.parametrize("fused_quant", [False, True], ids=["bf16-out", "fp8-out"])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("step", list(STEPS))
def test_triton_route_matches_fa3(plugin, verify, step, kv_dtype, fused_quant):
    _check_step(plugin, verify, step, kv_dtype, fused_quant)


@pytest.mark.parametrize("count", [32, 64, 128])
@pytest.mark.parametrize("step", ["verify-edge", "verify-long", "decode-4"])
def test_other_split_counts_match_fa3(plugin, step, count):
    """The split counts the proof's `attention` step times beside vLLM's 16 (the plugin's
    `_segments`) give FA3's answer too, where a segment holds a few keys or none."""
    attention._verify, attention._segments = True, count
    try:
        _check_step(plugin, True, step, "fp8", False)
    finally:
        attention._verify, attention._segments = False, None


def _check_step(plugin, verify, step, kv_dtype, fused_quant):
    patched, vanilla_forward, vanilla_cache, routes = plugin
    if fused_quant and kv_dtype != "fp8":
        pytest.skip("the o_proj FP8 fusion is only used with the FP8 profile (FP8 KV)")
    q_lens, rows, *given = STEPS[step]
    n = sum(q_lens)
    torch.manual_seed(len(step) * 7 + n)
    impl, layer = _impl(kv_dtype), Layer().cuda()
    contexts = given[0] if given else CONTEXTS[: len(q_lens)]
    seq_lens = [c + q for c, q in zip(contexts, q_lens, strict=True)]
    perm = torch.randperm(BLOCKS, device="cuda")  # scattered blocks, as a busy cache has them
    per_seq = (max(seq_lens) + BLOCK - 1) // BLOCK
    block_table = perm[: len(q_lens) * per_seq].reshape(len(q_lens), per_seq).to(torch.int32)

    # the prefill both routes share: every context token written by FA3's cache write
    cache = _cache(kv_dtype)
    total = sum(contexts)
    k0 = torch.randn(total, KV_HEADS, HEAD, device="cuda", dtype=torch.bfloat16)
    v0 = torch.randn(total, KV_HEADS, HEAD, device="cuda", dtype=torch.bfloat16)
    vanilla_cache(impl, layer, k0, v0, cache,
                  _slots(block_table, [range(c) for c in contexts], total))

    query = torch.randn(rows, HEADS, HEAD, device="cuda", dtype=torch.bfloat16)
    key = torch.randn(rows, KV_HEADS, HEAD, device="cuda", dtype=torch.bfloat16)
    value = torch.randn(rows, KV_HEADS, HEAD, device="cuda", dtype=torch.bfloat16)
    if kv_dtype == "fp8":  # what vLLM's Attention layer hands an FP8-KV FA3 backend
        query = (query.float() / Q_SCALE).clamp(-448, 448).to(FP8)
    slots = _slots(block_table, [range(c, s) for c, s in zip(contexts, seq_lens, strict=True)],
                   rows)
    meta = _metadata(q_lens, seq_lens, block_table, slots)
    out_scale = torch.tensor(0.01, dtype=torch.float32, device="cuda") if fused_quant else None
    out_dtype = FP8 if fused_quant else torch.bfloat16

    fa_cache = cache.clone()
    vanilla_cache(impl, layer, key, value, fa_cache, slots)
    fa_out = torch.empty(rows, HEADS, HEAD, dtype=torch.bfloat16, device="cuda")
    vanilla_forward(impl, layer, query, key, value, fa_cache, meta, fa_out)

    tr_cache = cache.clone()
    before = Routes(routes.fa_forward, routes.fa_cache)
    patched["do_kv_cache_update"](impl, layer, key, value, tr_cache, slots)
    tr_out = torch.full((rows, HEADS, HEAD), float("nan"), dtype=torch.bfloat16,
                        device="cuda").to(out_dtype)
    patched["forward"](impl, layer, query, key, value, tr_cache, meta, tr_out, out_scale)
    took_fa = Routes(routes.fa_forward - before.fa_forward, routes.fa_cache - before.fa_cache)

    # the cache write routes on the padded row count, the attention on the real token count and,
    # unless verify, on one query token a sequence
    fa_attends = n > MAX_TOKENS or (max(q_lens) > 1 and not verify)
    expect_fa = Routes(fa_forward=int(fa_attends), fa_cache=int(rows > MAX_TOKENS))
    assert took_fa == expect_fa, f"routes: {took_fa}, wanted {expect_fa}"
    assert patched["fused_output_quant_supported"](impl, _fp8_static_key())
    assert torch.equal(tr_cache.contiguous().view(torch.uint8),
                       fa_cache.contiguous().view(torch.uint8)), "the two cache writes differ"

    got = tr_out[:n].float() * (0.01 if fused_quant else 1.0)
    assert not torch.isnan(got).any(), "an output row was never written"
    ref = _reference(query[:n], fa_cache, kv_dtype, q_lens, seq_lens, block_table)
    fa_err, tr_err = _rel(fa_out[:n], ref), _rel(got, ref)
    # FP8 queries and cache: both kernels see the same quantized inputs, so the float32
    # reference over those inputs bounds both; an FP8 output adds its own rounding (3 mantissa
    # bits: a relative error of 2^-4 / sqrt(3) RMS)
    bound = 0.08 if fused_quant else 0.03 if kv_dtype == "fp8" else 0.02
    print(f"{step} verify={verify} kv={kv_dtype} out={out_dtype}: rel error FA3 {fa_err:.2e}, "
          f"route {tr_err:.2e}")
    fa_bound = 0.05 if kv_dtype == "fp8" else 0.02  # FA3's FP8 path also rounds P to FP8
    assert fa_err < fa_bound, f"FA3 itself is off the reference ({fa_err:.2e}): the test is wrong"
    assert tr_err < bound, f"relative error {tr_err:.2e} against float32 (FA3: {fa_err:.2e})"
    if fa_attends and not fused_quant:
        assert torch.equal(tr_out[:n], fa_out[:n]), "FA3's own route must give FA3's bits"


def _fp8_static_key():
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8StaticTensorSym
    return kFp8StaticTensorSym
