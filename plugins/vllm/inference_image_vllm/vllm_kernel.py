"""vLLM 0.26's Cutlass FP8 linear kernel with the per-batch-size kernel choice, first in vLLM's
CUDA list.

Only the GEMM call changes: activation quantization stays in vLLM's compiled graph (where Inductor
fuses it into the preceding norm), and the choice lives inside one opaque custom op, so each
captured CUDA graph (one per batch size) records the kernel for its size.
"""

import logging
from typing import Any, Optional

import torch
from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassFP8ScaledMMLinearKernel
from vllm.platforms import current_platform

from . import LOG_FP8_DISPATCH, dispatch, once

logger = logging.getLogger("vllm.inference_image_vllm")  # under vLLM's configured logger
_lib = torch.library.Library("inference_image", "FRAGMENT")


def _fp8_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045 (torch infers the op schema from it)
    out_dtype: torch.dtype,
) -> torch.Tensor:
    kern = dispatch.table().kernel(a.shape[0], b.shape[1], b.shape[0])
    ops = dispatch.FP8Operands(a, b, scale_a, scale_b, bias, out_dtype)
    try:
        return dispatch.run(kern, ops)
    except Exception:  # a Triton compile or launch failure must cost a GEMM, not the engine
        if kern == "cutlass":
            raise
        _warn_once(kern, a.shape[0], b.shape[1], b.shape[0])
        return dispatch.run("cutlass", ops)


_warned: set[str] = set()


def _warn_once(kern: str, m: int, n: int, k: int) -> None:
    if kern not in _warned:
        _warned.add(kern)
        logger.warning("inference-image FP8 dispatch: %s failed at %dx%dx%d; Cutlass serves "
                       "this kernel's batches from now on", kern, m, n, k, exc_info=True)


def _fp8_mm_fake(a: torch.Tensor, b: torch.Tensor, *rest: Any) -> torch.Tensor:
    # The op's schema is _fp8_mm's; its fake is called with the same arguments and needs only
    # the shapes and the output dtype (the last argument).
    return a.new_empty((a.shape[0], b.shape[1]), dtype=rest[-1])


class InferenceImageFP8ScaledMMLinearKernel(CutlassFP8ScaledMMLinearKernel):
    """Cutlass, or cuBLASLt or the Triton GEMV where the measured table says it is faster at this
    batch size."""

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        if not current_platform.is_cuda():
            return False, "requires CUDA"
        cap = compute_capability
        if cap is None:
            cap = current_platform.get_device_capability().to_int()
        if cap < 89:
            return False, "needs FP8 tensor cores (sm89 or newer)"
        return True, None

    def apply_scaled_mm(
        self,
        *,
        A: torch.Tensor,
        B: torch.Tensor,
        out_dtype: torch.dtype,
        As: torch.Tensor,
        Bs: torch.Tensor,
        bias: torch.Tensor | None,
        output_shape: list,
    ) -> torch.Tensor:
        if B.shape[1] != self.logical_output_size or A.shape[1] != B.shape[0]:
            # Cutlass' own alignment padding is in play: leave the whole call to it.
            return super().apply_scaled_mm(
                A=A, B=B, out_dtype=out_dtype, As=As, Bs=Bs, bias=bias, output_shape=output_shape
            )
        out = torch.ops.inference_image.fp8_mm(A, B, As, Bs, bias, out_dtype)
        return out.view(*output_shape[:-1], B.shape[1])


@once
def install() -> None:
    # The table first: a missing or malformed one stops the install here (the caller logs that
    # vLLM's kernels serve), before any GEMM could reach it.
    t = dispatch.table()
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum
    from vllm.utils.torch_utils import direct_register_custom_op

    direct_register_custom_op("fp8_mm", _fp8_mm, fake_impl=_fp8_mm_fake, target_lib=_lib)
    kernels = linear._POSSIBLE_FP8_KERNELS[PlatformEnum.CUDA]
    if InferenceImageFP8ScaledMMLinearKernel not in kernels:
        kernels.insert(0, InferenceImageFP8ScaledMMLinearKernel)
    logger.info(LOG_FP8_DISPATCH.format(table=t.source, device=t.device or "-"))
