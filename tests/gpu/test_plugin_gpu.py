"""The vLLM plugin's kernels against a float32 reference, on a CUDA GPU (the GPU machine:
`pytest tests/gpu` with vLLM importable). Skipped, with the reason, everywhere else."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the plugin's kernels need torch (GPU machine only)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here: these run on the GPU machine", allow_module_level=True)
if torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("FP8 needs compute capability >= 8.9", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins/vllm"))
from inference_image_vllm import dispatch, gemv, tune  # noqa: E402

FP8 = torch.float8_e4m3fn
SHAPES = [(n, k) for k, n in tune.SHAPES.values()]  # Llama-3.1-8B (N, K), as tune measures them
KERNEL = "triton:8:512:4:2"


def _operands(m: int, n: int, k: int, scales: str, bias: bool, out: torch.dtype):
    """Fresh random FP8 operands in vLLM's layout: a [M, K] row-major, b [K, N] column-major."""
    a = (torch.randn(m, k, device="cuda") * 2).to(FP8)
    b = (torch.randn(n, k, device="cuda") * 2).to(FP8).t()
    sa = torch.rand(m if scales in ("token", "both") else 1, 1, device="cuda") + 0.5
    sb = torch.rand(1, n if scales in ("channel", "both") else 1, device="cuda") + 0.5
    sa = sa if scales in ("token", "both") else sa.reshape(1)
    sb = sb if scales in ("channel", "both") else sb.reshape(1)
    bi = torch.randn(n, device="cuda").to(out) if bias else None
    return dispatch.FP8Operands(a, b, sa, sb, bi, out)


def _reference(ops: dispatch.FP8Operands) -> torch.Tensor:
    a, b, sa, sb, bi, _ = ops
    ref = (a.float() * sa.reshape(-1, 1).float()) @ (b.float() * sb.reshape(1, -1).float())
    return ref + bi.float() if bi is not None else ref


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("scales", ["tensor", "token", "channel", "both"])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gemv_matches_float32(n, k, m, scales, bias, out):
    ops = _operands(m, n, k, scales, bias, out)
    assert gemv.supports(ops)
    got = torch.full((m, n), float("nan"), device="cuda", dtype=out)
    got.copy_(gemv.fp8_gemv(KERNEL, ops))
    ref = _reference(ops)
    assert not torch.isnan(got).any(), "an output element was never written"
    err = (got.float() - ref).norm() / ref.norm()
    assert err < 1e-2, f"relative error {err:.2e}"


def test_strided_scale_is_not_taken_by_the_gemv():
    ops = _operands(2, 4096, 4096, "channel", False, torch.bfloat16)
    wide = torch.rand(2, 3, device="cuda") + 0.5
    sa = wide[:, 1:2]  # a column of a wider tensor: per-token values, not contiguous
    assert not sa.is_contiguous()
    assert not gemv.supports(ops._replace(scale_a=sa))
    assert gemv.supports(ops._replace(scale_a=sa.contiguous()))


def test_a_failing_triton_kernel_costs_one_gemm_not_the_engine(monkeypatch):
    vllm_kernel = pytest.importorskip("inference_image_vllm.vllm_kernel",
                                      reason="needs vLLM (GPU machine)")
    ops = _operands(1, 4096, 4096, "tensor", False, torch.bfloat16)

    def broken(*_args, **_kw):
        raise RuntimeError("Triton compile failed (planted)")
    monkeypatch.setattr(gemv, "fp8_gemv", broken)

    class OneKernel:
        def kernel(self, m, n, k):
            return KERNEL
    monkeypatch.setattr(dispatch, "table", lambda: OneKernel())
    got = vllm_kernel._fp8_mm(*ops)
    ref = _reference(ops)
    assert (got.float() - ref).norm() / ref.norm() < 1e-2
