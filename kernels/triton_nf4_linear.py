"""bitsandbytes 4-bit linear (nf4 / fp4, W4A16) in Triton: `out = x @ W^T (+ bias)` for any row count.

Same contract as `nf4_linear.nf4_linear_ref`: `packed` uint8 `[N, K / 2]` (the even input in the high nibble),
`absmax` float32 `[N, K / 64]`, `values` the 16 float32 table entries. One program owns a `BLOCK_M x BLOCK_N`
output tile and walks its K range 64 inputs (one absmax block) a step: it loads the step's `[BLOCK_N, 32]` bytes,
splits each into its two codes (interleaved back into input order), looks every code up in the 16-entry table (a
gather the L1 serves: 64 bytes), multiplies by the row's absmax of that block in fp32, rounds the weight tile to
the activation's dtype in registers and feeds it to `tl.dot` (fp32 accumulation). The weight is never written
dequantized: 0.5 byte a weight (+ 1/16 for the absmax) crosses from memory.

Rows: up to 16 (decode) the weight tile is the MMA's wide side and the rows, padded to 16, its narrow one ("swap
AB", as in `triton_fp8_block_linear.py`); a split-K grid axis fills the SMs where the output tiles are few, each
range writing fp32 partials that torch sums in a fixed order (bit-reproducible, no atomics). Above 64 rows the
tiles are 128 x 128. The tiles are leads to measure on the card, not measured yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from flotilla.kernels.nf4_linear import BLOCK
from flotilla.kernels.triton_utils import device_sms, dot_dtype, dot_precision


@dataclass(frozen=True)
class Nf4GemmConfig:
    """Tiles of one launch (a K step is one 64-input absmax block); `split_k` K ranges of whole steps; `swap_ab`:
    the weight tile is the MMA's first operand (few rows)."""

    block_m: int
    block_n: int
    split_k: int
    num_warps: int
    num_stages: int
    swap_ab: bool = False


def default_config(m: int, n: int, k: int, sms: int) -> Nf4GemmConfig:
    """16 x 64 tiles (swap AB) up to 16 rows, 64 x 64 up to 64, 128 x 128 above; split K where fewer than two tiles
    an SM would run, keeping at least 4 steps a range."""
    if m <= 16:
        bm, bn, warps, stages, swap = 16, 64, 4, 4, True
    elif m <= 64:
        bm, bn, warps, stages, swap = 64, 64, 4, 4, False
    else:
        bm, bn, warps, stages, swap = 128, 128, 8, 3, False
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    split = max(1, min(triton.cdiv(2 * sms, tiles), (k // BLOCK) // 4)) if m <= 64 else 1
    return Nf4GemmConfig(bm, bn, split, warps, stages, swap)


@triton.jit
def _nf4_kernel(
    x_ptr,
    w_ptr,
    a_ptr,
    t_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_an,
    stride_om,
    k_per_split,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SWAP_AB: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    half = tl.arange(0, BLOCK_K // 2)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :]
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + half[None, :]
    a_ptrs = a_ptr + cols.to(tl.int64) * stride_an
    # few rows: the weight tile is the MMA's wide side, the accumulator transposed
    acc = tl.zeros([BLOCK_N, BLOCK_M] if SWAP_AB else [BLOCK_M, BLOCK_N], tl.float32)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        # K is whole blocks (the layout's rule): only rows and columns are masked
        byte = tl.load(w_ptrs + k0 // 2, mask=col_ok[:, None], other=0).to(tl.int32)
        codes = tl.reshape(tl.join(byte >> 4, byte & 0xF), [BLOCK_N, BLOCK_K])  # high nibble first
        scale = tl.load(a_ptrs + k0 // BLOCK_K, mask=col_ok, other=0.0)
        w = (tl.load(t_ptr + codes) * scale[:, None]).to(x_ptr.dtype.element_ty).to(DOT_DTYPE)
        x = tl.load(x_ptrs + k0, mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
        if SWAP_AB:
            acc += tl.dot(w, tl.trans(x), input_precision=DOT_PRECISION)
        else:
            acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
    if SWAP_AB:
        acc = tl.trans(acc)
    ok = row_ok[:, None] & col_ok[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        o_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        p_rows = (split * M + rows).to(tl.int64)  # partials [SPLIT_K, M, N]
        tl.store(part_ptr + p_rows[:, None] * N + cols[None, :], acc, mask=ok)


def nf4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    absmax: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: Nf4GemmConfig | None = None,
) -> torch.Tensor:
    """`x @ W^T (+ bias)` for `x` `[..., K]` in `x`'s dtype; `config` overrides `default_config` (tests, benchmarks)."""
    n, k = packed.shape[0], packed.shape[1] * 2
    assert x.shape[-1] == k and k % BLOCK == 0, f"codes {tuple(packed.shape)} do not match x's K = {x.shape[-1]}"
    assert tuple(absmax.shape) == (n, k // BLOCK) and absmax.dtype == torch.float32, "absmax [N, K / 64] float32"
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    packed, absmax, values = packed.contiguous(), absmax.contiguous(), values.float().contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    cfg = config or default_config(m, n, k, device_sms(x))
    k_per_split = triton.cdiv(k // BLOCK, cfg.split_k) * BLOCK
    splits = triton.cdiv(k, k_per_split)  # ranges that would be empty are not launched
    part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device) if splits > 1 else out
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), splits)
    _nf4_kernel[grid](
        x2, packed, absmax, values, bias if bias is not None else out, out, part, m, n, k, x2.stride(0),
        packed.stride(0), absmax.stride(0), out.stride(0), k_per_split, HAS_BIAS=bias is not None, SPLIT_K=splits,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=BLOCK, NUM_STAGES=cfg.num_stages,
        DOT_DTYPE=dot_dtype(x.dtype), DOT_PRECISION=dot_precision(x.dtype), SWAP_AB=cfg.swap_ab,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if splits > 1:  # the ranges' fp32 sums in a fixed order, the bias, one rounding
        total = part.sum(0)
        if bias is not None:
            total += bias.float()
        out.copy_(total)
    return out.reshape(*x.shape[:-1], n)
