"""FP8 linear layers on GPUs with fp8 tensor cores: `torch._scaled_mm` with row-wise scales.

Same contract as `fp8_linear_ref`: the activation is quantized per token (or with a static scale), the
weight `[out, in]` is e4m3 with one fp32 scale per output row. cuBLASLt multiplies the fp8 operands,
accumulates in fp32 and applies both scale vectors in its epilogue.
"""

from __future__ import annotations

import torch

from flotilla.kernels.fp8_linear import quantize_fp8_activations


def fp8_linear_scaled_mm(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W^T + b` through `torch._scaled_mm` (in and out features multiples of 16)."""
    x_fp8, x_scale = quantize_fp8_activations(x.reshape(-1, x.shape[-1]), input_scale)
    # The weight's transpose is the column-major second operand cuBLASLt wants; row-wise scaling takes
    # `[M, 1]` and `[1, N]` fp32 scales.
    out = torch._scaled_mm(
        x_fp8, w_fp8.t(), scale_a=x_scale, scale_b=w_scale.float().reshape(1, -1), out_dtype=x.dtype
    )
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], w_fp8.shape[0])
