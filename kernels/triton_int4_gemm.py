"""Int4 weight-only GEMM in Triton: `out = x @ dequant(W)^T (+ bias)`, W never materialised.

Same contract as `packed_int_linear_ref` at 4 bits (layout in `packed_int_linear.py`): `packed` int32
`[N, K/8]` (input `8j + i` of a row in bits `4i..4i+3` of word `j`), `scales` `[N, K/group]`,
`zeros` uint8 `[N, K/group]`. One program owns a `[BLOCK_M, BLOCK_N]` output tile and walks K in
BLOCK_K steps; each step loads the tile's packed words (a quarter of the bytes of a bf16 weight), its
rows' scale and zero point for the step's group (BLOCK_K divides the group, so one of each per row),
dequantizes in registers and feeds `tl.dot` in the activation dtype with fp32 accumulation. A code
becomes a float without an int->float conversion (a quarter of the FMA rate or less): placed in the
mantissa of 2^23 (`0x4B000000 | c`, bitcast) it reads `2^23 + c`, and the zero point's subtraction
takes the 2^23 away with it, exactly.

Where to use which int4 kernel (`kernels.dispatch.packed_int_linear`): a few rows take the GEMV
(`triton_int4_gemv.py`), up to `INT4_GEMM_MAX_ROWS` this GEMM, and more rows `int4_dequantize` (the
whole weight to the activation dtype, one pass) then cuBLAS: a tile of rows here dequantizes every
weight again, so at a prefill's thousands of rows (the start-up memory profile runs 16,384) the
dequantization work grows with M while cuBLAS's dense GEMM runs at tensor-core rate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.triton_utils import dot_dtype, dot_precision


@triton.jit
def _int4_gemm_kernel(
    x_ptr,
    packed_ptr,
    scales_ptr,
    zeros_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_pn,
    stride_sn,
    stride_zn,
    stride_om,
    GROUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    shifts = ((ks % 8) * 4)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + k0 + ks[None, :], mask=row_ok[:, None],
                    other=0.0).to(DOT_DTYPE)
        words = tl.load(packed_ptr + cols[:, None].to(tl.int64) * stride_pn + (k0 + ks[None, :]) // 8,
                        mask=col_ok[:, None], other=0)
        codes = (((words >> shifts) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)  # 2^23 + c, exact
        group = k0 // GROUP
        scale = tl.load(scales_ptr + cols.to(tl.int64) * stride_sn + group, mask=col_ok, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + cols.to(tl.int64) * stride_zn + group, mask=col_ok, other=0).to(tl.float32)
        w = ((codes - (zero + 8388608.0)[:, None]) * scale[:, None]).to(DOT_DTYPE)  # [BLOCK_N, BLOCK_K]
        acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _int4_dequant_kernel(
    packed_ptr,
    scales_ptr,
    zeros_ptr,
    out_ptr,
    N,
    K,
    stride_pn,
    stride_sn,
    stride_zn,
    stride_on,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (cols < N)[:, None] & (ks < K)[None, :]
    cols64 = cols.to(tl.int64)[:, None]
    words = tl.load(packed_ptr + cols64 * stride_pn + (ks // 8)[None, :], mask=ok, other=0)
    codes = (((words >> ((ks % 8) * 4)[None, :]) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)  # 2^23 + c
    group = (ks // GROUP)[None, :]
    scale = tl.load(scales_ptr + cols64 * stride_sn + group, mask=ok, other=0.0).to(tl.float32)
    zero = tl.load(zeros_ptr + cols64 * stride_zn + group, mask=ok, other=0).to(tl.float32)
    w = (codes - (zero + 8388608.0)) * scale
    tl.store(out_ptr + cols64 * stride_on + ks[None, :], w.to(out_ptr.dtype.element_ty), mask=ok)


def int4_dequantize(
    packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int, dtype: torch.dtype
) -> torch.Tensor:
    """The weight `[N, K]` in `dtype`, `(code - zero) * scale` (`dequantize_packed` at 4 bits, computed in
    fp32 and rounded once), in one pass: for cuBLAS at many rows."""
    n, k = packed.shape[0], packed.shape[1] * 8
    assert packed.stride(-1) == 1 and scales.stride(-1) == 1 and zeros.stride(-1) == 1
    out = torch.empty(n, k, dtype=dtype, device=packed.device)
    if n and k:
        block_n, block_k = 32, 128
        _int4_dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
            packed, scales, zeros, out, n, k, packed.stride(0), scales.stride(0), zeros.stride(0), out.stride(0),
            GROUP=group_size, BLOCK_N=block_n, BLOCK_K=block_k,
        )  # fmt: skip
    return out


def int4_gemm_supported(k: int, group_size: int, block_k: int = 64) -> bool:
    """True when the kernel's K step fits the shape: it divides both K and the group."""
    return k % block_k == 0 and group_size % block_k == 0


def int4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    block_n: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """`x` `[..., K]` times the int4 weight `[N, K]` (transposed), plus `bias`; in `x`'s dtype. `block_m`
    defaults to 16 rows up to 16 (the MMA's narrow side) and 64 above (each weight tile dequantized
    once per 64 rows instead of per 16)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    m, k = rows.shape
    block_m = block_m or (16 if m <= 16 else 64)
    n = packed.shape[0]
    assert int4_gemm_supported(k, group_size, block_k), "BLOCK_K must divide K and the group size"
    assert packed.stride(-1) == 1 and scales.stride(-1) == 1 and zeros.stride(-1) == 1
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
        _int4_gemm_kernel[grid](
            rows, packed, scales, zeros, bias if bias is not None else out, out,
            m, n, k, rows.stride(0), packed.stride(0), scales.stride(0), zeros.stride(0), out.stride(0),
            GROUP=group_size, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            DOT_DTYPE=dot_dtype(x.dtype), DOT_PRECISION=dot_precision(x.dtype), num_warps=num_warps,
        )
    return out.reshape(*x.shape[:-1], n)


__all__ = ["int4_dequantize", "int4_gemm_supported", "int4_linear"]
