"""Batched LoRA in Triton: one shrink and one expand per projection, each token reading its own slot.

A projection's delta is `y[t] += B[slot(t)] @ (A[slot(t)] @ x[t])`, where a merged projection (QKV,
gate/up) stacks its slices' A matrices (`[slots, n_slices * max_rank, in]`) and its B matrices along
the output (`[slots, out, max_rank]`). Two launches per projection whatever its slice count:

- shrink, grid (token, block of A rows, K split): a GEMV of the token's x against its adapter's A
  over one split of the input features, written as fp32 partial sums `[splits, T, rows]`. At batch 1
  the rows are few (16 to 48), so the split over K is what spreads the work over the GPU's SMs; at
  larger batches the tokens do and the split count drops to a few, then 1 (`shrink_splits`).
- expand, grid (token, block of output features): sums the partials of each slice (rounded once to
  the activation dtype, as the reference does), then adds `B[slot] @ buf` of the slice each output
  column belongs to into `y`.

From `GROUPED_MIN_TOKENS` tokens on, the pair is grouped by adapter instead (SGMV-like, tensor
cores): a program owns one slot and one block of up to 64 tokens, and only that slot's tokens of the
block take part (the others are masked out of every load and store, so no host-side sort is needed
and the grouping lives in the graph's persistent slot row). Per token block an adapter's A and B are
read once, not once per token: at batch 64 with 8 adapters that is 8 reads of each instead of 64.
A program whose block holds none of its slot's tokens returns at once.

- grouped shrink, grid (slot x token block, block of A rows, K split): `tl.dot` of the block's x
  `[BLOCK_T, BLOCK_K]` with the slot's A tile, fp32 partial sums as above;
- grouped expand, grid (slot x token block, block of output features): each slice's partials summed
  and rounded, `tl.dot` with the slot's B tile, added into `y`.

Base-model tokens (slot -1) read no adapter and leave `y` untouched. Nothing depends on host values
but the shapes, so every kernel can be captured in a CUDA graph that any adapter mix then replays.
References: `lora.py` (`lora_apply_ref`); fp32 accumulation (bf16/fp16 `tl.dot` on tensor cores,
IEEE fp32 `tl.dot` for fp32 inputs).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Shrink programs wanted per launch: about four per SM of an H100/H200 (132 SMs), so that at batch 64
# each program loops over a few K blocks only (the loop does not hide its load latency).
_TARGET_PROGRAMS = 512
_MAX_SPLITS = 64
# From this many tokens on, the grouped (per adapter, tensor-core) kernels replace the per-token GEMVs.
GROUPED_MIN_TOKENS = 16
# Grouped shrink programs wanted per launch; fewer than the GEMV's since each expand program re-reads
# its tokens' partial sums once per split.
_GROUPED_TARGET_PROGRAMS = 256
_BLOCK_T = 64
# The grouped expand unrolls its loads of the split partials (all in flight at once): at most this many.
_GROUPED_MAX_SPLITS = 16


@triton.jit(do_not_specialize=["K_PER_SPLIT"])
def _shrink_kernel(x_ptr, a_ptr, slots_ptr, part_ptr, stride_x, stride_as, stride_ar, stride_ps, stride_pt,
                   K, R, K_PER_SPLIT, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    rs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    split = tl.program_id(2)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    k_start = split * K_PER_SPLIT
    # A base-model token (slot -1) masks every load: its partial sums come out zero.
    k_stop = tl.where(slot >= 0, tl.minimum(k_start + K_PER_SPLIT, K), 0)
    slot = tl.maximum(slot, 0)
    r_ok = rs < R
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        ks = k_start + k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_stop
        x = tl.load(x_ptr + t * stride_x + ks, mask=k_ok, other=0.0).to(tl.float32)
        a_ptrs = a_ptr + slot * stride_as + rs[:, None] * stride_ar + ks[None, :]
        a = tl.load(a_ptrs, mask=r_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(part_ptr + split * stride_ps + t * stride_pt + rs, acc, mask=r_ok)


@triton.jit
def _slice_delta(part_ptr, t, b, index, stride_ps, stride_pt, splits, R,
                 BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """`B @ buf` for slice `index`: its shrink partials summed over the splits, rounded like the reference."""
    ss = tl.arange(0, BLOCK_S)
    rs = tl.arange(0, BLOCK_R)
    ptrs = part_ptr + ss[:, None] * stride_ps + t * stride_pt + index * R + rs[None, :]
    part = tl.load(ptrs, mask=(ss[:, None] < splits) & (rs[None, :] < R), other=0.0)
    buf = tl.sum(part, axis=0).to(OUT_DTYPE).to(tl.float32)
    return tl.sum(b * buf[None, :], axis=1)


@triton.jit
def _expand_kernel(y_ptr, part_ptr, b_ptr, slots_ptr, stride_y, stride_ps, stride_pt, stride_bs, stride_bn,
                   N, R, SPLITS, OFF1, OFF2, N_SLICES: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rs = tl.arange(0, BLOCK_R)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    # A base-model token (slot -1) masks every load and the store: its row is left as it is.
    n_end = tl.where(slot >= 0, N, 0)
    slot = tl.maximum(slot, 0)
    n_ok = ns < n_end
    b_ptrs = b_ptr + slot * stride_bs + ns[:, None] * stride_bn + rs[None, :]
    b = tl.load(b_ptrs, mask=n_ok[:, None] & (rs[None, :] < R), other=0.0).to(tl.float32)
    out_dtype = y_ptr.dtype.element_ty
    delta = _slice_delta(part_ptr, t, b, 0, stride_ps, stride_pt, SPLITS, R, BLOCK_R, BLOCK_S, out_dtype)
    if N_SLICES > 1:  # each column takes the delta of the slice it belongs to
        other = _slice_delta(part_ptr, t, b, 1, stride_ps, stride_pt, SPLITS, R, BLOCK_R, BLOCK_S, out_dtype)
        delta = tl.where(ns >= OFF1, other, delta)
    if N_SLICES > 2:
        other = _slice_delta(part_ptr, t, b, 2, stride_ps, stride_pt, SPLITS, R, BLOCK_R, BLOCK_S, out_dtype)
        delta = tl.where(ns >= OFF2, other, delta)
    y = tl.load(y_ptr + t * stride_y + ns, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * stride_y + ns, (y + delta).to(out_dtype), mask=n_ok)


@triton.jit
def _token_block(slots_ptr, T, TOKEN_BLOCKS, BLOCK_T: tl.constexpr):
    """(slot, token rows, which of them are the slot's) of a grouped program (axis 0: slot x token block)."""
    pid = tl.program_id(0)
    slot = pid // TOKEN_BLOCKS
    ts = (pid % TOKEN_BLOCKS) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_slots = tl.load(slots_ptr + ts, mask=ts < T, other=-1)
    return slot.to(tl.int64), ts.to(tl.int64), token_slots == slot


@triton.jit
def _dot(p, q, acc, DOT_FP32: tl.constexpr):
    """`acc + p @ q`: on tensor cores in the operands' dtype, or in IEEE fp32 (no TF32) when DOT_FP32."""
    if DOT_FP32:
        return tl.dot(p.to(tl.float32), q.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(p, q, acc)


@triton.jit(do_not_specialize=["K_PER_SPLIT"])
def _grouped_shrink_kernel(x_ptr, a_ptr, slots_ptr, part_ptr, stride_x, stride_as, stride_ar, stride_ps, stride_pt,
                           T, K, R, K_PER_SPLIT, TOKEN_BLOCKS, DOT_FP32: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    slot, ts, mine = _token_block(slots_ptr, T, TOKEN_BLOCKS, BLOCK_T)
    if tl.max(mine.to(tl.int32), axis=0) == 0:  # none of this slot's tokens in the block
        return
    rs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    k_start = tl.program_id(2) * K_PER_SPLIT
    k_stop = tl.minimum(k_start + K_PER_SPLIT, K)
    r_ok = rs < R
    acc = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        ks = k_start + k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_stop
        # Other slots' tokens are masked: their rows of x are never read.
        x = tl.load(x_ptr + ts[:, None] * stride_x + ks[None, :], mask=mine[:, None] & k_ok[None, :], other=0.0)
        a_ptrs = a_ptr + slot * stride_as + rs[None, :] * stride_ar + ks[:, None]
        a = tl.load(a_ptrs, mask=r_ok[None, :] & k_ok[:, None], other=0.0)
        acc = _dot(x, a, acc, DOT_FP32)
    part_ptrs = part_ptr + tl.program_id(2) * stride_ps + ts[:, None] * stride_pt + rs[None, :]
    tl.store(part_ptrs, acc, mask=mine[:, None] & r_ok[None, :])


@triton.jit
def _grouped_slice_delta(part_ptr, ts, mine, b, index, stride_ps, stride_pt, SPLITS: tl.constexpr, R,
                         DOT_FP32: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                         OUT_DTYPE: tl.constexpr):
    """`buf @ B^T` for slice `index` of a token block: partials summed over the splits, rounded like the
    reference, then one tensor-core product with the slot's B tile `[BLOCK_R, BLOCK_N]`."""
    rs = tl.arange(0, BLOCK_R)
    ptrs = part_ptr + ts[:, None] * stride_pt + index * R + rs[None, :]
    mask = mine[:, None] & (rs[None, :] < R)
    buf = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
    for split in tl.static_range(SPLITS):  # unrolled: every split's load issued before the sum waits
        buf += tl.load(ptrs + split * stride_ps, mask=mask, other=0.0)
    return _dot(buf.to(OUT_DTYPE), b, tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32), DOT_FP32)


@triton.jit
def _grouped_expand_kernel(y_ptr, part_ptr, b_ptr, slots_ptr, stride_y, stride_ps, stride_pt, stride_bs, stride_bn,
                           T, N, R, OFF1, OFF2, TOKEN_BLOCKS, SPLITS: tl.constexpr, N_SLICES: tl.constexpr,
                           DOT_FP32: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_R: tl.constexpr):
    slot, ts, mine = _token_block(slots_ptr, T, TOKEN_BLOCKS, BLOCK_T)
    if tl.max(mine.to(tl.int32), axis=0) == 0:
        return
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rs = tl.arange(0, BLOCK_R)
    n_ok = ns < N
    b_ptrs = b_ptr + slot * stride_bs + ns[None, :] * stride_bn + rs[:, None]
    out_dtype = y_ptr.dtype.element_ty
    b = tl.load(b_ptrs, mask=(rs[:, None] < R) & n_ok[None, :], other=0.0).to(out_dtype)
    delta = _grouped_slice_delta(part_ptr, ts, mine, b, 0, stride_ps, stride_pt, SPLITS, R, DOT_FP32,
                                 BLOCK_T, BLOCK_N, BLOCK_R, out_dtype)
    if N_SLICES > 1:  # each column takes the delta of the slice it belongs to
        other = _grouped_slice_delta(part_ptr, ts, mine, b, 1, stride_ps, stride_pt, SPLITS, R, DOT_FP32,
                                     BLOCK_T, BLOCK_N, BLOCK_R, out_dtype)
        delta = tl.where(ns[None, :] >= OFF1, other, delta)
    if N_SLICES > 2:
        other = _grouped_slice_delta(part_ptr, ts, mine, b, 2, stride_ps, stride_pt, SPLITS, R, DOT_FP32,
                                     BLOCK_T, BLOCK_N, BLOCK_R, out_dtype)
        delta = tl.where(ns[None, :] >= OFF2, other, delta)
    y_ptrs = y_ptr + ts[:, None] * stride_y + ns[None, :]
    mask = mine[:, None] & n_ok[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + delta).to(out_dtype), mask=mask)


def shrink_splits(tokens: int, row_blocks: int, k: int, block_k: int,
                  target_programs: int = _TARGET_PROGRAMS, max_splits: int = _MAX_SPLITS) -> tuple[int, int]:
    """(splits, features per split) of the shrink's K: enough programs to fill the GPU, each split a
    whole number of K blocks. A function of the shapes only, so a captured graph's choice is fixed."""
    blocks = triton.cdiv(k, block_k)
    wanted = min(max(triton.cdiv(target_programs, tokens * row_blocks), 1), blocks, max_splits)
    per_split = triton.cdiv(blocks, wanted) * block_k
    return triton.cdiv(k, per_split), per_split


def lora_apply(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
               slice_sizes: tuple[int, ...], max_rank: int, *, block_k: int = 256, block_n: int | None = None,
               target_programs: int = _TARGET_PROGRAMS, grouped_min_tokens: int = GROUPED_MIN_TOKENS) -> None:
    """`y[t, slice i] += B[slot(t), slice i] @ A[slot(t), rows of slice i] @ x[t]` in place.

    `y` `[T, out]` (unit column stride; a merged projection's whole output), `x` `[T, in]`, `a`
    `[S, n_slices * max_rank, in]`, `b` `[S, out, max_rank]`, `token_slots` `[T]` (-1: base model).
    Below `grouped_min_tokens` tokens: per-token GEMVs; from it on: per-adapter token groups.
    """
    t, k = x.shape
    rows, n = a.shape[1], y.shape[1]
    assert x.stride(1) == 1 and a.stride(2) == 1 and y.stride(1) == 1 and b.stride(2) == 1
    assert 1 <= len(slice_sizes) <= 3 and sum(slice_sizes) == n and rows == len(slice_sizes) * max_rank
    if t == 0:
        return
    if t >= grouped_min_tokens:
        _grouped_apply(y, x, a, b, token_slots, slice_sizes, max_rank, block_k, block_n)
        return
    block_r = min(16, triton.next_power_of_2(rows))
    block_k = min(block_k, triton.next_power_of_2(k))
    row_blocks = triton.cdiv(rows, block_r)
    splits, per_split = shrink_splits(t, row_blocks, k, block_k, target_programs)
    part = torch.empty(splits, t, rows, dtype=torch.float32, device=x.device)
    _shrink_kernel[(t, row_blocks, splits)](
        x, a, token_slots, part, x.stride(0), a.stride(0), a.stride(1), part.stride(0), part.stride(1),
        k, rows, per_split, BLOCK_R=block_r, BLOCK_K=block_k,
    )
    if block_n is None:  # batch 1: more, smaller programs; larger batches: fewer partial-sum reloads
        block_n = 64 if t < 16 else 128
    block_n = min(block_n, triton.next_power_of_2(n))
    off1, off2 = _slice_offsets(slice_sizes, n)
    _expand_kernel[(t, triton.cdiv(n, block_n))](
        y, part, b, token_slots, y.stride(0), part.stride(0), part.stride(1), b.stride(0), b.stride(1),
        n, max_rank, splits, off1, off2, N_SLICES=len(slice_sizes),
        BLOCK_N=block_n, BLOCK_R=triton.next_power_of_2(max_rank), BLOCK_S=max(triton.next_power_of_2(splits), 2),
    )


def _slice_offsets(slice_sizes: tuple[int, ...], n: int) -> tuple[int, int]:
    """First output column of slices 1 and 2 (`n`, past the end, where there is no such slice)."""
    off1 = slice_sizes[0] if len(slice_sizes) > 1 else n
    off2 = slice_sizes[0] + slice_sizes[1] if len(slice_sizes) > 2 else n
    return off1, off2


def _grouped_apply(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
                   slice_sizes: tuple[int, ...], max_rank: int, block_k: int, block_n: int | None) -> None:
    """`lora_apply` by adapter groups: grid axis 0 is every (slot, block of `_BLOCK_T` tokens) pair, fixed
    by the shapes (slot count, tokens), so a captured graph serves any adapter mix."""
    (t, k), (slots, rows, _), n = x.shape, a.shape, y.shape[1]
    block_t = min(_BLOCK_T, max(triton.next_power_of_2(t), 16))
    token_blocks = triton.cdiv(t, block_t)
    # tl.dot takes tiles of at least 16 a side.
    block_r = max(16, min(64, triton.next_power_of_2(rows)))
    block_k = max(16, min(block_k, triton.next_power_of_2(k)))
    # fp32 stays IEEE (no TF32) to match the reference; the interpreter's numpy dot has no bf16, so
    # there the (exact) bf16 -> fp32 products go through the fp32 path too.
    dot_fp32 = x.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
    row_blocks = triton.cdiv(rows, block_r)
    splits, per_split = shrink_splits(slots * token_blocks, row_blocks, k, block_k, _GROUPED_TARGET_PROGRAMS,
                                      _GROUPED_MAX_SPLITS)
    part = torch.empty(splits, t, rows, dtype=torch.float32, device=x.device)
    _grouped_shrink_kernel[(slots * token_blocks, row_blocks, splits)](
        x, a, token_slots, part, x.stride(0), a.stride(0), a.stride(1), part.stride(0), part.stride(1),
        t, k, rows, per_split, token_blocks, DOT_FP32=dot_fp32, BLOCK_T=block_t, BLOCK_R=block_r, BLOCK_K=block_k,
    )
    block_n = max(16, min(block_n or 128, triton.next_power_of_2(n)))
    off1, off2 = _slice_offsets(slice_sizes, n)
    _grouped_expand_kernel[(slots * token_blocks, triton.cdiv(n, block_n))](
        y, part, b, token_slots, y.stride(0), part.stride(0), part.stride(1), b.stride(0), b.stride(1),
        t, n, max_rank, off1, off2, token_blocks, SPLITS=splits, N_SLICES=len(slice_sizes), DOT_FP32=dot_fp32,
        BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_R=max(16, triton.next_power_of_2(max_rank)),
    )


__all__ = ["GROUPED_MIN_TOKENS", "lora_apply", "shrink_splits"]
