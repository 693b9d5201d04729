"""Block-scaled fp8 linear (W8A16) in Triton: `out = x @ (w_fp8 * scale)^T (+ bias)` for any row count.

Same contract as `fp8_block_linear.fp8_block_linear_ref`: the weight `[N, K]` is float8_e4m3fn with one fp32
scale a `block_n x block_k` block (`scale[ceil(N / block_n), ceil(K / block_k)]`), the activation is used as it
is. One program owns a `BLOCK_M x BLOCK_N` output tile and walks its K range in BLOCK_K steps; each step loads
the fp8 weight tile, upcasts it in registers to the activation's dtype (exact: every e4m3 value is a bf16 and an
fp16 value), multiplies it with `tl.dot` (fp32 accumulation) and adds the step's product times the scale of its
(n-block, k-block). The tiles never straddle a block (BLOCK_N divides block_n, BLOCK_K divides block_k, both
powers of two), so a step reads one scalar scale, and applying it to the fp32 product keeps the dequantized
weight's rounding out of it: the sum is the reference's up to fp32 order.

Rows: the dispatch runs this kernel above 16 rows; at decode it takes the per-channel fp8 GEMVs' block forms
(`dispatch.fp8_block_kernel`: the same bytes, where this GEMM measured 1.3-1.7x the per-channel GEMV's time at one
row), unless FLOTILLA_FP8_GEMV=0. Up to 16 rows the batch is padded to 16 as the MMA's narrow side and the tile is 64
outputs wide, the weight tile taken as the MMA's first operand ("swap AB", as the fp8 GEMV's `tl.dot` path and
cuBLAS's small-M tiles do; `swap_ab`); a split-K grid axis fills the SMs where the output tiles are too few, each
range writing fp32 partials that torch sums in a fixed order (bit-reproducible, CUDA-graph capturable; no atomics).
Above 64 rows the tiles grow to 128 x 128 (a prefill). Every choice follows from shapes alone. The tiles are leads
to be measured on the card (bench/results/gpu-2026-12-07-s37/fpblock.sh).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from flotilla.kernels.triton_utils import device_sms, dot_dtype, dot_precision

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class BlockGemmConfig:
    """Tiles of one launch: `split_k` K ranges (whole BLOCK_K steps each); `swap_ab`: the weight tile is the MMA's
    first operand (few rows)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    swap_ab: bool = False


def supported(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> bool:
    """Whether the kernel takes these operands: blocks of a power of two of at least 16 each way (whole tiles per
    block), an fp8 weight with contiguous rows, fp32 scales, a float activation."""
    return (all(b >= 16 and b & (b - 1) == 0 for b in block) and w_fp8.dtype == torch.float8_e4m3fn
            and w_fp8.stride(-1) == 1 and scale.dtype == torch.float32 and scale.stride(-1) == 1 and x.dtype in _DTYPES)


def default_config(m: int, n: int, k: int, block: tuple[int, int], sms: int) -> BlockGemmConfig:
    """Tiles from the shapes (module docstring): 16 x 64 x 128 (swap AB) up to 16 rows, 64 x 64 x 128 up to 64,
    128 x 128 x 64 above; split K where fewer than two tiles an SM would run, keeping at least 4 K steps a range."""
    swap = m <= 16
    if swap:
        bm, bn, bk, warps, stages = 16, 64, 128, 4, 4
    elif m <= 64:
        bm, bn, bk, warps, stages = 64, 64, 128, 4, 4
    else:
        bm, bn, bk, warps, stages = 128, 128, 64, 8, 3
    bn, bk = min(bn, block[0]), min(bk, block[1])
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    steps = triton.cdiv(k, bk)
    split = max(1, min(triton.cdiv(2 * sms, tiles), steps // 4)) if m <= 64 else 1
    return BlockGemmConfig(bm, bn, bk, split, warps, stages, swap)


@triton.jit
def _fp8_block_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    k_per_split,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SWAP_AB: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :]
    # this tile's row of block scales: the whole tile lies in one n-block
    s_row = s_ptr + ((pid_n * BLOCK_N) // SCALE_BN) * stride_sn
    if SWAP_AB:  # few rows: the weight tile `[BLOCK_N, BLOCK_K]` is the MMA's wide side, the rows (padded) its narrow
        w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + ks[None, :]
        acc_t = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
            k_ok = (k0 + ks) < K
            w = tl.load(w_ptrs + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            scale = tl.load(s_row + k0 // SCALE_BK)
            acc_t += tl.dot(w.to(DOT_DTYPE), tl.trans(x.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * scale
        acc = tl.trans(acc_t)
    else:  # the weight tile as `[BLOCK_K, BLOCK_N]` (the dot's second operand), read along its contiguous K
        w_ptrs = w_ptr + cols.to(tl.int64)[None, :] * stride_wn + ks[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
            k_ok = (k0 + ks) < K
            x = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs + k0, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            scale = tl.load(s_row + k0 // SCALE_BK)
            acc += tl.dot(x.to(DOT_DTYPE), w.to(DOT_DTYPE), input_precision=DOT_PRECISION) * scale
    ok = row_ok[:, None] & col_ok[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        o_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        p_rows = (split * M + rows).to(tl.int64)  # partials [SPLIT_K, M, N]
        tl.store(part_ptr + p_rows[:, None] * N + cols[None, :], acc, mask=ok)


def fp8_block_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
    config: BlockGemmConfig | None = None,
) -> torch.Tensor:
    """`x @ (w_fp8 * scale)^T (+ bias)` for `x` `[..., K]` in `x`'s dtype (`supported` operands); `config`
    overrides `default_config` (tests and the benchmark)."""
    n, k = w_fp8.shape
    assert x.shape[-1] == k, f"weight {tuple(w_fp8.shape)} does not match x's K = {k}"
    assert tuple(scale.shape) == (triton.cdiv(n, block[0]), triton.cdiv(k, block[1])), "block scales' shape"
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0 or k == 0:
        out.zero_()
        if bias is not None and m and n:
            out.copy_(bias.expand_as(out))
        return out.reshape(*x.shape[:-1], n)
    cfg = config or default_config(m, n, k, block, device_sms(x))
    assert block[0] % cfg.block_n == 0 and block[1] % cfg.block_k == 0, "tiles must not straddle a block"
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per_split)  # ranges that would be empty are not launched
    part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device) if splits > 1 else out
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), splits)
    _fp8_block_kernel[grid](
        x2, w_fp8, scale, bias if bias is not None else out, out, part, m, n, k, x2.stride(0), w_fp8.stride(0),
        scale.stride(0), out.stride(0), k_per_split, SCALE_BN=block[0], SCALE_BK=block[1],
        HAS_BIAS=bias is not None, SPLIT_K=splits, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        NUM_STAGES=cfg.num_stages, DOT_DTYPE=dot_dtype(x.dtype), DOT_PRECISION=dot_precision(x.dtype),
        SWAP_AB=cfg.swap_ab, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if splits > 1:  # the ranges' fp32 sums in a fixed order, the bias, one rounding
        total = part.sum(0)
        if bias is not None:
            total += bias.float()
        out.copy_(total)
    return out.reshape(*x.shape[:-1], n)
