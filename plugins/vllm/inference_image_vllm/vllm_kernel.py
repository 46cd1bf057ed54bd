"""The FP8 decode kernel as a vLLM 0.26 scaled-mm linear kernel, first in vLLM's CUDA list.

The batch-size decision lives inside one opaque custom op: torch.compile traces a single call
and every CUDA graph (one per captured batch size) records the branch taken for its size.
"""

import logging
from typing import Optional

import torch
from vllm import _custom_ops as ops
from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassFP8ScaledMMLinearKernel
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearLayerConfig,
)
from vllm.platforms import current_platform

from . import fp8_gemv

logger = logging.getLogger("vllm.inference_image_vllm")  # under vLLM's configured logger
_lib = torch.library.Library("inference_image", "FRAGMENT")


def _fp8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                bias: Optional[torch.Tensor], per_token: bool) -> torch.Tensor:  # noqa: UP045 (torch schema)
    m, k = x.shape
    if m <= fp8_gemv.threshold(w.shape[1], k):
        return fp8_gemv.w8a16_mm(x, w, w_scale.reshape(-1), bias)
    xq, xs = ops.scaled_fp8_quant(x, use_per_token_if_dynamic=per_token)
    return ops.cutlass_scaled_mm(xq, w, scale_a=xs, scale_b=w_scale, out_dtype=x.dtype, bias=bias)


def _fp8_linear_fake(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                     bias: Optional[torch.Tensor], per_token: bool) -> torch.Tensor:  # noqa: UP045
    return x.new_empty((x.shape[0], w.shape[1]))


class InferenceImageFp8Kernel(CutlassFP8ScaledMMLinearKernel):
    """Cutlass' weight layout and padding, with decode-sized batches on fp8_gemv."""

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        if not current_platform.is_cuda():
            return False, "requires CUDA"
        cap = compute_capability
        if cap is None:
            cap = current_platform.get_device_capability().to_int()
        if cap < 89:
            return False, "needs FP8 tensor data (sm89 or newer)"
        return True, None

    @classmethod
    def can_implement(cls, c: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        act = c.activation_quant_key.scale
        if act.static:
            return False, "static activation scales"
        if not (act.group_shape.is_per_tensor() or act.group_shape.is_per_token()):
            return False, "activation scales neither per tensor nor per token"
        wgs = c.weight_quant_key.scale.group_shape
        if not (wgs.is_per_tensor() or wgs.is_per_channel()):
            return False, "weight scales neither per tensor nor per channel"
        if c.out_dtype not in (None, torch.bfloat16, torch.float16):
            return False, "output dtype"
        return True, None

    def __init__(self, c: FP8ScaledMMLinearLayerConfig, layer_param_names: list[str]) -> None:
        super().__init__(c, layer_param_names)
        self.per_token = c.activation_quant_key.scale.group_shape.is_per_token()

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        super().process_weights_after_loading(layer)
        w = self._get_layer_params(layer)[0]
        # The split-K workspace exists before vLLM captures any CUDA graph.
        fp8_gemv.workspace(w.device, 64 * w.shape[1])

    def apply_weights(self, layer: torch.nn.Module, x: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
        w, w_s, _, x_s_ub = self._get_layer_params(layer)
        if (not isinstance(x, torch.Tensor) or x_s_ub is not None
                or self.logical_output_size != w.shape[1] or x.shape[-1] != w.shape[0]):
            return super().apply_weights(layer, x, bias)
        out = torch.ops.inference_image.fp8_linear(x.reshape(-1, x.shape[-1]), w, w_s, bias,
                                                   self.per_token)
        return out.view(*x.shape[:-1], w.shape[1])


_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum
    from vllm.utils.torch_utils import direct_register_custom_op

    direct_register_custom_op("fp8_linear", _fp8_linear, fake_impl=_fp8_linear_fake, target_lib=_lib)
    kernels = linear._POSSIBLE_FP8_KERNELS[PlatformEnum.CUDA]
    if InferenceImageFp8Kernel not in kernels:
        kernels.insert(0, InferenceImageFp8Kernel)
    _installed = True
    logger.info("inference-image FP8 decode kernel installed (tuning: %s)", fp8_gemv.tuning_source())
