"""FP8 (e4m3) linear layers: the PyTorch reference of W8A8 with row-wise scales.

Weights are `[out, in]` float8_e4m3fn with one fp32 scale per output row (`[out, 1]`); activations are
quantized per token (one fp32 scale per row of `x`, from the row's absolute maximum: vLLM's dynamic
per-token scheme) or with one static scale from the checkpoint. The product accumulates the fp8 values
in fp32 and scales the result by `x_scale x w_scale^T`, exactly what `torch._scaled_mm` computes with
row-wise scales on a GPU with fp8 tensor cores; here the fp8 values are upcast to fp32 for the matmul.

At a few rows (decode) the same weights run W8A16 instead (`fp8_weight_only_linear_ref`, the oracle of
the Triton fp8 GEMV): the activations are used as they are and only the weight is upcast.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
# A row of zeros would give a zero scale and 0/0 on division; any tiny positive scale keeps it zero.
FP8_MIN_SCALE = 1e-12


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` `[rows, cols]` -> (float8 values, fp32 scales `[rows, 1]`) with `x ~= values * scales`."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=FP8_MIN_SCALE)
    return quantize_fp8_static(x, scale), scale


def quantize_fp8_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`x / scale` rounded to float8, saturated at +-448 (a static scale may be exceeded)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_fp8_activations(
    rows: torch.Tensor, input_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation rows `[M, K]` -> (float8 values, fp32 scales `[M, 1]`): per token (dynamic) when
    `input_scale` is None, else the checkpoint's static scale for every row. Both fp8 linear paths use
    it, so the reference and `torch._scaled_mm` see the same operands."""
    if input_scale is None:
        return quantize_fp8_rows(rows)
    # `_scaled_mm`'s row-wise scaling wants a contiguous `[M, 1]` scale, not an expanded view
    x_scale = input_scale.float().reshape(1, 1).expand(rows.shape[0], 1).contiguous()
    return quantize_fp8_static(rows, x_scale), x_scale


def fp8_matmul_ref(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """`(x_fp8 @ w_fp8^T) * x_scale * w_scale^T + bias` in fp32, returned in `out_dtype`."""
    acc = x_fp8.float() @ w_fp8.float().t()
    out = acc * x_scale.float() * w_scale.float().reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def fp8_linear_ref(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W^T + b` with W in fp8: `x` quantized per token (or with the static `input_scale`)."""
    x_fp8, x_scale = quantize_fp8_activations(x.reshape(-1, x.shape[-1]), input_scale)
    out = fp8_matmul_ref(x_fp8, x_scale, w_fp8, w_scale, bias, x.dtype)
    return out.reshape(*x.shape[:-1], w_fp8.shape[0])


def fp8_weight_only_linear_ref(
    x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """W8A16 `x @ (w_fp8 * w_scale)^T + b`: `x` unquantized, `(x @ w_fp8^T) * w_scale^T` in fp32 (the
    per-output-channel scale factors out of the sum over K), rounded once to `x`'s dtype."""
    rows = x.reshape(-1, x.shape[-1]).float()
    out = (rows @ w_fp8.float().t()) * w_scale.float().reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], w_fp8.shape[0])
