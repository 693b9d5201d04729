"""Int4 weight-only GEMM in Triton: `out = x @ dequant(W)^T (+ bias)`, W never materialised.

Same contract as `packed_int_linear_ref` at 4 bits (layout in `packed_int_linear.py`): `packed` int32
`[N, K/8]` (input `8j + i` of a row in bits `4i..4i+3` of word `j`), `scales` `[N, K/group]`,
`zeros` uint8 `[N, K/group]`. One program owns a `[BLOCK_M, BLOCK_N]` output tile and walks K in
BLOCK_K steps; each step loads the tile's packed words (a quarter of the bytes of a bf16 weight), its
rows' scale and zero point for the step's group (BLOCK_K divides the group, so one of each per row),
dequantizes in registers and feeds `tl.dot` in the activation dtype with fp32 accumulation.
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
        codes = ((words >> shifts) & 0xF).to(tl.float32)
        group = k0 // GROUP
        scale = tl.load(scales_ptr + cols.to(tl.int64) * stride_sn + group, mask=col_ok, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + cols.to(tl.int64) * stride_zn + group, mask=col_ok, other=0).to(tl.float32)
        w = ((codes - zero[:, None]) * scale[:, None]).to(DOT_DTYPE)  # [BLOCK_N, BLOCK_K]
        acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


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
    block_m: int = 16,
    block_n: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """`x` `[..., K]` times the int4 weight `[N, K]` (transposed), plus `bias`; in `x`'s dtype."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    m, k = rows.shape
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


__all__ = ["int4_gemm_supported", "int4_linear"]
