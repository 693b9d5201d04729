"""Per-token int8 activation quantization in one Triton kernel (the int8 W8A8 path's input to `torch._int_mm`).

Same contract as `int8_linear.quantize_int8_activations`: rows `[M, K]` -> (int8 values, fp32 scales `[M, 1]`),
the scale a row's absolute maximum over 127 (at least INT8_MIN_SCALE) or the checkpoint's static scale for every
row; values `x / scale` rounded to nearest with ties to even and clamped to [-128, 127]. In torch that is ~8
launches a linear layer (abs, amax, divisions, round, clamp, casts), each a pass over the activation; here one
program per row reads it twice (amax, then scale and round) and writes one byte an element: the fp8 path's kernel
(`triton_fp8_quant.quantize_rows_triton`) on the int8 grid with integer rounding; its divisions round to nearest
(`div_rn`), so the values equal the reference's on the CPU.
"""

from __future__ import annotations

import torch

from flotilla.kernels.triton_fp8_quant import quantize_rows_triton


def quantize_int8_rows_triton(
    rows: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` `[M, K]` -> (int8 values `[M, K]`, fp32 scales `[M, 1]`, contiguous): per token when `input_scale`
    is None, else that one static scale for every row."""
    return quantize_rows_triton(rows, input_scale, torch.int8, -128.0, 127.0, round_int=True)


__all__ = ["quantize_int8_rows_triton"]
