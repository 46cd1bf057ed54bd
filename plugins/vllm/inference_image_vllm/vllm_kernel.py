"""vLLM 0.26's Cutlass FP8 linear kernel with measured batch padding, first in vLLM's CUDA list.

Only the GEMM call changes: activation quantization stays in vLLM's compiled graph (where
Inductor fuses it into the preceding norm), and the padding decision lives inside one opaque
custom op, so each captured CUDA graph (one per batch size) records the choice for its size.
"""

import logging
from typing import Optional

import torch
from vllm import _custom_ops as ops
from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassFP8ScaledMMLinearKernel
from vllm.platforms import current_platform

from . import fp8_pad

logger = logging.getLogger("vllm.inference_image_vllm")  # under vLLM's configured logger
_lib = torch.library.Library("inference_image", "FRAGMENT")


def _fp8_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
            bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:  # noqa: UP045 (torch schema)
    m = a.shape[0]
    p = fp8_pad.padded_m(m, b.shape[1], b.shape[0])
    if p > m:
        a = fp8_pad.pad_rows(a, p - m)
        if scale_a.numel() > 1:  # per-token activation scales: one per row
            scale_a = fp8_pad.pad_rows(scale_a.reshape(m, -1), p - m, 1.0)
    out = ops.cutlass_scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, bias=bias)
    return out[:m] if p > m else out


def _fp8_mm_fake(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:  # noqa: UP045
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


class InferenceImageFp8Kernel(CutlassFP8ScaledMMLinearKernel):
    """Cutlass, with decode batches padded to the row count Cutlass runs fastest at."""

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

    def apply_scaled_mm(self, *, A: torch.Tensor, B: torch.Tensor, out_dtype: torch.dtype,
                        As: torch.Tensor, Bs: torch.Tensor, bias: torch.Tensor | None,
                        output_shape: list) -> torch.Tensor:
        if B.shape[1] != self.logical_output_size or A.shape[1] != B.shape[0]:
            # Cutlass' own alignment padding is in play: leave the whole call to it.
            return super().apply_scaled_mm(A=A, B=B, out_dtype=out_dtype, As=As, Bs=Bs, bias=bias,
                                           output_shape=output_shape)
        out = torch.ops.inference_image.fp8_mm(A, B, As, Bs, bias, out_dtype)
        return out.view(*output_shape[:-1], B.shape[1])


_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum
    from vllm.utils.torch_utils import direct_register_custom_op

    direct_register_custom_op("fp8_mm", _fp8_mm, fake_impl=_fp8_mm_fake, target_lib=_lib)
    kernels = linear._POSSIBLE_FP8_KERNELS[PlatformEnum.CUDA]
    if InferenceImageFp8Kernel not in kernels:
        kernels.insert(0, InferenceImageFp8Kernel)
    _installed = True
    logger.info("inference-image FP8 batch padding installed (tuning: %s)", fp8_pad.tuning().source)
