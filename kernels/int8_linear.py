"""Int8 W8A8 linear layers (compressed-tensors `int-quantized`, llm-compressor's W8A8): the PyTorch reference.

Weights are `[out, in]` int8 with one fp32 scale per output row (`[out, 1]`, symmetric: no zero point);
activations are rounded to int8 per token (one fp32 scale a row of `x`, the row's absolute maximum over 127:
vLLM's dynamic per-token scheme) or with the checkpoint's one static scale. Rounding is to nearest, ties to
even (`torch.round`, as compressed-tensors rounds when it calibrates), then clamped to [-128, 127]. The
product accumulates int8 x int8 in int32 and scales it by `x_scale x w_scale^T` into the output dtype:
what `torch._int_mm` computes where it runs (the CPU; CUDA from 17 rows with K and N multiples of 8), the
int32 sum otherwise taken in fp32 (exact up to 2^24, a relative 2^-24 beyond).

At a few rows (decode) the same weights run W8A16 instead, as fp8 weights do: the activations as they are,
`(x @ w^T) * w_scale^T` (`kernels/dispatch.py` `int8_linear`).
"""

from __future__ import annotations

import torch

INT8_MAX = 127.0
INT8_MIN = -128.0
# A row of zeros would give a zero scale and 0/0 on division; any tiny positive scale keeps it zero.
INT8_MIN_SCALE = 1e-12


def quantize_int8_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`x / scale` rounded to nearest (ties to even) and saturated to int8's [-128, 127]."""
    return torch.round(x.float() / scale).clamp(INT8_MIN, INT8_MAX).to(torch.int8)


def quantize_int8_activations(
    rows: torch.Tensor, input_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation rows `[M, K]` -> (int8 values, fp32 scales `[M, 1]`): per token (dynamic) when `input_scale` is
    None, else the checkpoint's static scale for every row."""
    if input_scale is None:
        scale = (rows.abs().amax(dim=-1, keepdim=True).float() / INT8_MAX).clamp(min=INT8_MIN_SCALE)
    else:
        scale = input_scale.float().reshape(1, 1).expand(rows.shape[0], 1).contiguous()
    return quantize_int8_static(rows, scale), scale


def int_mm_runs(x_int8: torch.Tensor, w_int8: torch.Tensor) -> bool:
    """Whether `torch._int_mm` multiplies these operands: always on the CPU; on CUDA more than 16 rows and K and N
    multiples of 8 (cuBLASLt's int8 GEMM)."""
    if not x_int8.is_cuda:
        return True
    return x_int8.shape[0] > 16 and x_int8.shape[1] % 8 == 0 and w_int8.shape[0] % 8 == 0


def int8_matmul(x_int8: torch.Tensor, x_scale: torch.Tensor, w_int8: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """`(x_int8 @ w_int8^T) * x_scale * w_scale^T + bias` (int32 sums, fp32 scaling), returned in `out_dtype`."""
    exact = int_mm_runs(x_int8, w_int8)
    acc = torch._int_mm(x_int8, w_int8.t()) if exact else x_int8.float() @ w_int8.float().t()
    return scale_product(acc, x_scale, w_scale, bias, out_dtype)


def scale_product(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """`acc * x_scale * w_scale^T (+ bias)` in fp32, in that order, rounded once to `out_dtype` (the reference of
    `triton_int8_scale.py`). In place on one fp32 copy of `acc` (an fp32 `acc` itself): a prefill's `[M, N]`
    temporaries are what the start-up memory profile counts."""
    out = acc.float()
    out.mul_(x_scale.float()).mul_(w_scale.float().reshape(1, -1))
    if bias is not None:
        out.add_(bias.float())
    return out.to(out_dtype)


def int8_linear_ref(
    x: torch.Tensor,
    w_int8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W^T + b` with W in int8: `x` rounded to int8 per token (or with the static `input_scale`)."""
    x_int8, x_scale = quantize_int8_activations(x.reshape(-1, x.shape[-1]), input_scale)
    out = int8_matmul(x_int8, x_scale, w_int8, w_scale, bias, x.dtype)
    return out.reshape(*x.shape[:-1], w_int8.shape[0])
