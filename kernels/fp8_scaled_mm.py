"""FP8 linear layers on GPUs with fp8 tensor cores: `torch._scaled_mm` with row-wise scales.

Same contract as `fp8_linear_ref`: the activation is quantized per token (or with a static scale), the
weight `[out, in]` is e4m3 with one fp32 scale per output row. cuBLASLt multiplies the fp8 operands,
accumulates in fp32 and applies both scale vectors in its epilogue. The activation is quantized by one
Triton kernel (`triton_fp8_quant.py`), or by the torch reference's ops with `fused_quant=False` (the
path as first measured on the H200).
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
    fused_quant: bool = True,
) -> torch.Tensor:
    """`x @ W^T + b` through `torch._scaled_mm` (in and out features multiples of 16)."""
    rows = x.reshape(-1, x.shape[-1])
    if fused_quant:
        from flotilla.kernels.triton_fp8_quant import quantize_fp8_rows_triton

        x_fp8, x_scale = quantize_fp8_rows_triton(rows, input_scale)
    else:
        x_fp8, x_scale = quantize_fp8_activations(rows, input_scale)
    # The weight's transpose is the column-major second operand cuBLASLt wants; row-wise scaling takes
    # `[M, 1]` and `[1, N]` fp32 scales.
    out = torch._scaled_mm(
        x_fp8, w_fp8.t(), scale_a=x_scale, scale_b=w_scale.float().reshape(1, -1), out_dtype=x.dtype
    )
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], w_fp8.shape[0])
