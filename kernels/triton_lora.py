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

Base-model tokens (slot -1) read no adapter and leave `y` untouched. Nothing depends on host values
but the shapes, so both kernels can be captured in a CUDA graph that any adapter mix then replays.
References: `lora.py` (`lora_apply_ref`); fp32 accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Shrink programs wanted per launch: about four per SM of an H100/H200 (132 SMs), so that at batch 64
# each program loops over a few K blocks only (the loop does not hide its load latency).
_TARGET_PROGRAMS = 512
_MAX_SPLITS = 64


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


def shrink_splits(tokens: int, row_blocks: int, k: int, block_k: int,
                  target_programs: int = _TARGET_PROGRAMS) -> tuple[int, int]:
    """(splits, features per split) of the shrink's K: enough programs to fill the GPU, each split a
    whole number of K blocks. A function of the shapes only, so a captured graph's choice is fixed."""
    blocks = triton.cdiv(k, block_k)
    wanted = min(max(triton.cdiv(target_programs, tokens * row_blocks), 1), blocks, _MAX_SPLITS)
    per_split = triton.cdiv(blocks, wanted) * block_k
    return triton.cdiv(k, per_split), per_split


def lora_shrink(x: torch.Tensor, a: torch.Tensor, token_slots: torch.Tensor, *, block_k: int = 256,
                target_programs: int = _TARGET_PROGRAMS) -> torch.Tensor:
    """The shrink alone: fp32 partial sums `[splits, T, rows]` of `A[slot(t)] @ x[t]` over K splits
    (zero for base-model tokens); the expand, or a GEMV's LoRA epilogue, sums and rounds them."""
    t, k = x.shape
    rows = a.shape[1]
    assert x.stride(1) == 1 and a.stride(2) == 1
    block_r = min(16, triton.next_power_of_2(rows))
    block_k = min(block_k, triton.next_power_of_2(k))
    row_blocks = triton.cdiv(rows, block_r)
    splits, per_split = shrink_splits(max(t, 1), row_blocks, k, block_k, target_programs)
    part = torch.empty(splits, t, rows, dtype=torch.float32, device=x.device)
    if t:
        _shrink_kernel[(t, row_blocks, splits)](
            x, a, token_slots, part, x.stride(0), a.stride(0), a.stride(1), part.stride(0), part.stride(1),
            k, rows, per_split, BLOCK_R=block_r, BLOCK_K=block_k,
        )
    return part


def lora_apply(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
               slice_sizes: tuple[int, ...], max_rank: int, *, block_k: int = 256, block_n: int | None = None,
               target_programs: int = _TARGET_PROGRAMS) -> None:
    """`y[t, slice i] += B[slot(t), slice i] @ A[slot(t), rows of slice i] @ x[t]` in place.

    `y` `[T, out]` (unit column stride; a merged projection's whole output), `x` `[T, in]`, `a`
    `[S, n_slices * max_rank, in]`, `b` `[S, out, max_rank]`, `token_slots` `[T]` (-1: base model).
    """
    t = x.shape[0]
    rows, n = a.shape[1], y.shape[1]
    assert y.stride(1) == 1 and b.stride(2) == 1
    assert 1 <= len(slice_sizes) <= 3 and sum(slice_sizes) == n and rows == len(slice_sizes) * max_rank
    if t == 0:
        return
    part = lora_shrink(x, a, token_slots, block_k=block_k, target_programs=target_programs)
    splits = part.shape[0]
    if block_n is None:  # batch 1: more, smaller programs; larger batches: fewer partial-sum reloads
        block_n = 64 if t < 16 else 128
    block_n = min(block_n, triton.next_power_of_2(n))
    off1 = slice_sizes[0] if len(slice_sizes) > 1 else n
    off2 = slice_sizes[0] + slice_sizes[1] if len(slice_sizes) > 2 else n
    _expand_kernel[(t, triton.cdiv(n, block_n))](
        y, part, b, token_slots, y.stride(0), part.stride(0), part.stride(1), b.stride(0), b.stride(1),
        n, max_rank, splits, off1, off2, N_SLICES=len(slice_sizes),
        BLOCK_N=block_n, BLOCK_R=triton.next_power_of_2(max_rank), BLOCK_S=max(triton.next_power_of_2(splits), 2),
    )


__all__ = ["lora_apply", "lora_shrink", "shrink_splits"]
