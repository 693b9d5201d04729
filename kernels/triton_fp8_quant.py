"""Per-token fp8 activation quantization in one Triton kernel (the W8A8 path's input to `_scaled_mm`).

Same contract as `fp8_linear.quantize_fp8_activations`: rows `[M, K]` -> (float8_e4m3fn values, fp32
scales `[M, 1]`), the scale a row's absolute maximum over 448 (at least FP8_MIN_SCALE) or the
checkpoint's static scale for every row; values `x / scale` clamped to +-448 and rounded to nearest.
In torch that is ~8 kernels a linear layer (abs, amax, casts, divisions, clamps), each a launch and a
pass over the activation; here one program per row reads it twice (amax, then scale and cast) and
writes one byte an element. Divisions round to nearest (`div_rn`), as torch's do on the CPU, so the
values equal the reference's computed there (torch on CUDA divides by a Python scalar through its
reciprocal: a scale one ulp off at times, seen on the H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.fp8_linear import FP8_DTYPE

FP8_MAX = 448.0
MIN_SCALE = tl.constexpr(1e-12)  # fp8_linear.FP8_MIN_SCALE
_MAX_BLOCK = 2048


@triton.jit
def _round_half_even(v):
    """`v` rounded to the nearest integer, ties to the even one (torch.round's rule; libdevice's `rint` does not run
    in the interpreter)."""
    down = tl.floor(v)
    frac = v - down
    odd = (down - 2.0 * tl.floor(down * 0.5)) == 1.0
    return down + ((frac > 0.5) | ((frac == 0.5) & odd)).to(tl.float32)


@triton.jit
def _quant_rows_kernel(
    x_ptr,
    out_ptr,
    scale_ptr,
    static_scale_ptr,
    K,
    stride_xm,
    stride_om,
    STATIC: tl.constexpr,
    BLOCK_K: tl.constexpr,
    QMIN: tl.constexpr,
    QMAX: tl.constexpr,
    ROUND_INT: tl.constexpr,
):
    """One row: its scale (amax / QMAX, or the static one), then `x / scale` clamped to [QMIN, QMAX], rounded to an
    integer (ties to even) when ROUND_INT, cast to the output's dtype (fp8: the cast rounds)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    ks = tl.arange(0, BLOCK_K)
    if STATIC:
        scale = tl.load(static_scale_ptr).to(tl.float32)
    else:
        amax = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_row + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, 0), QMAX), MIN_SCALE)
    tl.store(scale_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):
        ok = k0 + ks < K
        x = tl.load(x_row + k0 + ks, mask=ok, other=0.0).to(tl.float32)
        q = tl.clamp(tl.math.div_rn(x, scale), QMIN, QMAX)
        if ROUND_INT:
            q = _round_half_even(q)
        tl.store(out_ptr + row * stride_om + k0 + ks, q.to(out_ptr.dtype.element_ty), mask=ok)


def quantize_rows_triton(
    rows: torch.Tensor, input_scale: torch.Tensor | None, dtype: torch.dtype, qmin: float, qmax: float,
    round_int: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` `[M, K]` -> (`dtype` values `[M, K]`, fp32 scales `[M, 1]`, contiguous) on the grid [qmin, qmax]
    (integers when `round_int`): per token when `input_scale` is None, else that one static scale for every row.
    The fp8 path's and int8 W8A8's (`triton_int8_quant.py`) activation quantization."""
    m, k = rows.shape
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(m, k, dtype=dtype, device=rows.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=rows.device)
    if m:
        static = input_scale.float().reshape(1) if input_scale is not None else scale
        _quant_rows_kernel[(m,)](
            rows, out, scale, static, k, rows.stride(0), out.stride(0),
            STATIC=input_scale is not None, BLOCK_K=min(_MAX_BLOCK, triton.next_power_of_2(max(k, 16))),
            QMIN=qmin, QMAX=qmax, ROUND_INT=round_int,
        )  # fmt: skip
    return out, scale


def quantize_fp8_rows_triton(
    rows: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` `[M, K]` -> (float8 values `[M, K]`, fp32 scales `[M, 1]`, contiguous): per token when
    `input_scale` is None, else that one static scale for every row."""
    return quantize_rows_triton(rows, input_scale, FP8_DTYPE, -FP8_MAX, FP8_MAX, round_int=False)


__all__ = ["quantize_fp8_rows_triton", "quantize_rows_triton"]
