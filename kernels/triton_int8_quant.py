"""Per-token int8 activation quantization in one Triton kernel (the int8 W8A8 path's input to `torch._int_mm`).

Same contract as `int8_linear.quantize_int8_activations`: rows `[M, K]` -> (int8 values, fp32 scales `[M, 1]`),
the scale a row's absolute maximum over 127 (at least INT8_MIN_SCALE) or the checkpoint's static scale for every
row; values `x / scale` rounded to nearest with ties to even and clamped to [-128, 127]. In torch that is ~8
launches a linear layer (abs, amax, divisions, round, clamp, casts), each a pass over the activation; here one
program per row reads it twice (amax, then scale and round) and writes one byte an element. The fp8 twin is
`triton_fp8_quant.py`; as there, divisions round to nearest (`div_rn`), so the values equal the reference's on
the CPU. Ties to even are computed from `floor` (libdevice's `rint` does not run in the interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

INT8_MAX = tl.constexpr(127.0)
INT8_MIN = tl.constexpr(-128.0)
MIN_SCALE = tl.constexpr(1e-12)  # int8_linear.INT8_MIN_SCALE
_MAX_BLOCK = 2048


@triton.jit
def _round_half_even(v):
    """`v` rounded to the nearest integer, ties to the even one (torch.round's rule)."""
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
):
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
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, 0), INT8_MAX), MIN_SCALE)
    tl.store(scale_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):
        ok = k0 + ks < K
        x = tl.load(x_row + k0 + ks, mask=ok, other=0.0).to(tl.float32)
        q = _round_half_even(tl.clamp(tl.math.div_rn(x, scale), INT8_MIN, INT8_MAX))
        tl.store(out_ptr + row * stride_om + k0 + ks, q.to(tl.int8), mask=ok)


def quantize_int8_rows_triton(
    rows: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` `[M, K]` -> (int8 values `[M, K]`, fp32 scales `[M, 1]`, contiguous): per token when `input_scale`
    is None, else that one static scale for every row."""
    m, k = rows.shape
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(m, k, dtype=torch.int8, device=rows.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=rows.device)
    if m:
        static = input_scale.float().reshape(1) if input_scale is not None else scale
        _quant_rows_kernel[(m,)](
            rows, out, scale, static, k, rows.stride(0), out.stride(0),
            STATIC=input_scale is not None, BLOCK_K=min(_MAX_BLOCK, triton.next_power_of_2(max(k, 16))),
        )  # fmt: skip
    return out, scale


__all__ = ["quantize_int8_rows_triton"]
