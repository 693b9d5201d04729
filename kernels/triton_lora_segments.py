"""Batched LoRA by adapter segments (SGMV-like) in Triton: tokens sorted by adapter once per step.

The per-token pair (`triton_lora.py`) reads a token's adapter A and B once per token: at batch 64 with
8 adapters that is 64 reads of each projection's adapter matrices where 8 would do, and every read
feeds CUDA-core FMAs of one token. Here the step's tokens are grouped by adapter slot once per step
(`lora_segments`, one small kernel; a graph captures it with the model), and a program owns one
*segment block*: up to BLOCK_M tokens of one slot, gathered through the sorted order. Per segment
block an adapter's A and B tiles are read once and meet the tokens in one `tl.dot`.

Segments: `order` `[T]` int32 lists token ids slot by slot (in token order within a slot; base-model
tokens, slot -1, come last and are never touched), `starts` `[S + 1]` int32 where slot s owns
`order[starts[s]:starts[s + 1]]`. A slot of c tokens has ceil(c / BLOCK_M) segment blocks; all slots
together have at most `ceil(T / BLOCK_M) + S` of them, which is the grid's first axis (a function of
the shapes only, so a captured graph serves any adapter mix). Each program finds its slot and block
from `starts` (a prefix sum over at most S counts) and returns at once when it is past the last
block. An earlier variant without the sort (branch loragraph2) gave every (slot, 64-token block)
program the whole token block with other slots' rows masked: 8x the tile work at batch 64, 16 split
partials reloaded per slice per program, and fp32 `[64, 128]` tiles x 3 slices in registers; it
measured 2.21x the base step against 1.50x for the per-token pair.

- shrink, grid (segment block, 16-row block of the stacked A, K split): `x[tokens] @ A[slot]^T` over
  one K range into fp32 partials `[splits, T, rows]`, stored at the tokens' own rows. At most 16
  splits, chosen from the shapes so that the segment blocks of a decode batch fill the GPU.
- expand, grid (segment block, column block): the column blocks are laid out slice by slice, so a
  program's columns belong to one slice: it sums that slice's partials (rounded once to the
  activation dtype, as the reference and PEFT), multiplies by `B[slot]`'s tile on tensor cores and
  adds the delta into the tokens' rows of `y`.

Reference: `lora.py` (`lora_apply_ref`); fp32 accumulation; bf16/fp16 `tl.dot` on tensor cores, IEEE
fp32 for fp32 inputs and under the interpreter (`triton_utils.dot_dtype`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.triton_utils import dot_dtype, dot_precision

# Shrink programs wanted per launch (about two per SM of an H200) and the most K splits: each expand
# program reloads its tokens' partials once per split (16 tokens x 16 ranks x 4 bytes a split), so
# splits are kept few, and fewer for wide outputs, whose many column blocks would otherwise reload
# more partial bytes than they read of B (gate/up: 224 column blocks of 128 a segment block).
_TARGET_PROGRAMS = 256
_MAX_SPLITS = 16
_MAX_SPLITS_WIDE = 8
_WIDE_OUT = 8192
_BLOCK_R = 16  # A rows per shrink program (tl.dot's smallest side): rank-16 slices are one block each
_SEGMENT_BLOCK_T = 256  # tokens per step of the segments kernel's loops


def segment_block_m(tokens: int) -> int:
    """Tokens per segment block: 16 (tl.dot's smallest side) for decode batches, where a slot holds a
    few tokens; 64 for long steps (prefill), where an adapter's tile then serves four times as many."""
    return 16 if tokens <= 256 else 64


@triton.jit
def _segments_kernel(slots_ptr, order_ptr, starts_ptr, T, S, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr):
    """One program: counts per slot (base-model tokens in bucket S), their exclusive prefix sum
    `starts`, then each token's place in the slot-major order (a running per-bucket rank)."""
    buckets = tl.arange(0, BLOCK_S)
    counts = tl.zeros([BLOCK_S], dtype=tl.int32)
    for t0 in range(0, T, BLOCK_T):
        ts = t0 + tl.arange(0, BLOCK_T)
        slot = tl.load(slots_ptr + ts, mask=ts < T, other=-1).to(tl.int32)
        key = tl.where(ts < T, tl.where(slot < 0, S, slot), -1)
        counts += tl.sum((key[None, :] == buckets[:, None]).to(tl.int32), axis=1)
    starts = tl.cumsum(counts, axis=0) - counts
    tl.store(starts_ptr + buckets, starts, mask=buckets <= S)
    running = starts
    for t0 in range(0, T, BLOCK_T):
        ts = t0 + tl.arange(0, BLOCK_T)
        slot = tl.load(slots_ptr + ts, mask=ts < T, other=-1).to(tl.int32)
        key = tl.where(ts < T, tl.where(slot < 0, S, slot), -1)
        match = (key[None, :] == buckets[:, None]).to(tl.int32)
        before = tl.cumsum(match, axis=1) - match  # earlier tokens of the same bucket in this chunk
        place = tl.sum(match * (running[:, None] + before), axis=0)
        tl.store(order_ptr + place, ts, mask=ts < T)
        running += tl.sum(match, axis=1)


@triton.jit
def _segment_block(order_ptr, starts_ptr, T, S, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr,
                   WITH_BASE: tl.constexpr):
    """(slot, token ids, which are real) of this program's segment block (grid axis 0). Without
    WITH_BASE the blocks cover the adapters' tokens and slot >= S means the program is past the last
    block; with it the base-model tokens (`order[starts[S]:T]`) follow as slot S's blocks and slot > S
    means past the last."""
    b = tl.program_id(0)
    ss = tl.arange(0, BLOCK_S)
    if WITH_BASE:  # BLOCK_S > S: bucket S (the base model) ends at T
        begin = tl.load(starts_ptr + ss, mask=ss <= S, other=0)
        end = tl.where(ss == S, T, tl.load(starts_ptr + ss + 1, mask=ss < S, other=0))
    else:
        begin = tl.load(starts_ptr + ss, mask=ss < S, other=0)
        end = tl.load(starts_ptr + ss + 1, mask=ss < S, other=0)
    blocks = (end - begin + BLOCK_M - 1) // BLOCK_M
    last = tl.cumsum(blocks, axis=0)  # one past each slot's last block
    slot = tl.sum((last <= b).to(tl.int32), axis=0)
    first = tl.sum(tl.where(ss == slot, last - blocks, 0), axis=0)
    seg_begin = tl.sum(tl.where(ss == slot, begin, 0), axis=0)
    seg_end = tl.sum(tl.where(ss == slot, end, 0), axis=0)
    at = seg_begin + (b - first) * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = at < seg_end
    tokens = tl.load(order_ptr + at, mask=valid, other=0).to(tl.int64)
    return slot, tokens, valid


@triton.jit(do_not_specialize=["K_PER_SPLIT"])
def _shrink_kernel(x_ptr, a_ptr, order_ptr, starts_ptr, part_ptr, stride_x, stride_as, stride_ar, stride_ps,
                   stride_pt, K, R, S, K_PER_SPLIT, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr):
    slot, tokens, valid = _segment_block(order_ptr, starts_ptr, 0, S, BLOCK_M, BLOCK_S, False)
    if slot >= S:
        return
    slot = slot.to(tl.int64)
    rs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rs < R
    k_start = tl.program_id(2) * K_PER_SPLIT
    k_stop = tl.minimum(k_start + K_PER_SPLIT, K)
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        ks = k_start + k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_stop
        x = tl.load(x_ptr + tokens[:, None] * stride_x + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        a = tl.load(a_ptr + slot * stride_as + rs[:, None] * stride_ar + ks[None, :],
                    mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x.to(DOT_DTYPE), tl.trans(a.to(DOT_DTYPE)), acc, input_precision=DOT_PRECISION)
    part_ptrs = part_ptr + tl.program_id(2) * stride_ps + tokens[:, None] * stride_pt + rs[None, :]
    tl.store(part_ptrs, acc, mask=valid[:, None] & r_ok[None, :])


@triton.jit
def _slice_columns(SIZE0, SIZE1, SIZE2, BLOCK_N: tl.constexpr):
    """(slice index, output columns, which are real) of this program's column block (grid axis 1): the
    column blocks are laid out slice by slice (the grid holds exactly theirs), so a block is in one slice."""
    pid_n = tl.program_id(1)
    blocks0 = tl.cdiv(SIZE0, BLOCK_N)
    blocks1 = tl.cdiv(SIZE1, BLOCK_N)
    index = (pid_n >= blocks0).to(tl.int32) + (pid_n >= blocks0 + blocks1).to(tl.int32)
    first_block = tl.where(index >= 1, blocks0, 0) + tl.where(index >= 2, blocks1, 0)
    offset = tl.where(index >= 1, SIZE0, 0) + tl.where(index >= 2, SIZE1, 0)
    size = tl.where(index == 0, SIZE0, tl.where(index == 1, SIZE1, SIZE2))
    cs = (pid_n - first_block) * BLOCK_N + tl.arange(0, BLOCK_N)
    return index, offset + cs, cs < size


@triton.jit
def _expand_kernel(y_ptr, part_ptr, b_ptr, order_ptr, starts_ptr, stride_y, stride_ps, stride_pt, stride_bs,
                   stride_bn, R, S, SIZE0, SIZE1, SIZE2, SPLITS: tl.constexpr,
                   DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    slot, tokens, valid = _segment_block(order_ptr, starts_ptr, 0, S, BLOCK_M, BLOCK_S, False)
    if slot >= S:
        return
    slot = slot.to(tl.int64)
    index, ns, c_ok = _slice_columns(SIZE0, SIZE1, SIZE2, BLOCK_N)
    rs = tl.arange(0, BLOCK_R)
    r_ok = rs < R
    part_ptrs = part_ptr + tokens[:, None] * stride_pt + index * R + rs[None, :]
    mask = valid[:, None] & r_ok[None, :]
    buf = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for split in tl.static_range(SPLITS):  # unrolled: every split's load in flight before the sum waits
        buf += tl.load(part_ptrs + split * stride_ps, mask=mask, other=0.0)
    out_dtype = y_ptr.dtype.element_ty
    buf = buf.to(out_dtype)  # the shrink's result rounded once, as the reference and PEFT do
    b = tl.load(b_ptr + slot * stride_bs + ns[None, :] * stride_bn + rs[:, None], mask=r_ok[:, None] & c_ok[None, :],
                other=0.0)
    delta = tl.dot(buf.to(DOT_DTYPE), b.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    y_ptrs = y_ptr + tokens[:, None] * stride_y + ns[None, :]
    y_mask = valid[:, None] & c_ok[None, :]
    y = tl.load(y_ptrs, mask=y_mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + delta).to(out_dtype), mask=y_mask)


def lora_segments(token_slots: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(order, starts)` of a step's `[T]` slots (-1: base model) over `num_slots` slots: one launch."""
    t = token_slots.shape[0]
    order = torch.empty(t, dtype=torch.int32, device=token_slots.device)
    starts = torch.empty(num_slots + 1, dtype=torch.int32, device=token_slots.device)
    block_s = triton.next_power_of_2(num_slots + 1)
    _segments_kernel[(1,)](token_slots, order, starts, t, num_slots,
                           BLOCK_T=min(_SEGMENT_BLOCK_T, max(16, triton.next_power_of_2(t))), BLOCK_S=block_s)
    return order, starts


def segment_splits(segment_blocks: int, row_blocks: int, k: int, block_k: int, n: int = 0) -> tuple[int, int]:
    """(splits, features per split) of the shrink's K for `segment_blocks` busy segment blocks of an
    `n`-output projection: about `_TARGET_PROGRAMS` programs, at most `_MAX_SPLITS` (`_MAX_SPLITS_WIDE`
    above `_WIDE_OUT` outputs), each split a whole number of K blocks. A function of the shapes only,
    so a captured graph's choice is fixed."""
    blocks = triton.cdiv(k, block_k)
    most = _MAX_SPLITS_WIDE if n > _WIDE_OUT else _MAX_SPLITS
    wanted = min(max(_TARGET_PROGRAMS // (segment_blocks * row_blocks), 1), blocks, most)
    per_split = triton.cdiv(blocks, wanted) * block_k
    return triton.cdiv(k, per_split), per_split


def lora_apply_segments(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                        segments: tuple[torch.Tensor, torch.Tensor], slice_sizes: tuple[int, ...], max_rank: int,
                        *, block_k: int = 256, block_n: int = 128) -> None:
    """`lora_apply` (same contract) over the step's `segments` (`lora_segments` of its token slots)."""
    order, starts = segments
    (t, k), (slots, rows, _), n = x.shape, a.shape, y.shape[1]
    assert x.stride(1) == 1 and a.stride(2) == 1 and y.stride(1) == 1 and b.stride(2) == 1
    assert 1 <= len(slice_sizes) <= 3 and sum(slice_sizes) == n and rows == len(slice_sizes) * max_rank
    assert order.shape[0] == t and starts.shape[0] == slots + 1
    if t == 0:
        return
    block_m = segment_block_m(t)
    grid_m = triton.cdiv(t, block_m) + slots  # every segment block of any adapter mix
    block_s = triton.next_power_of_2(slots)
    # 64-token blocks take 128-wide K steps: at 256 the shrink needs 255 registers and spills (ptxas, sm_90).
    block_k = max(16, min(block_k if block_m == 16 else min(block_k, 128), triton.next_power_of_2(k)))
    row_blocks = triton.cdiv(rows, _BLOCK_R)
    # A decode batch spread over adapters has about twice as many busy blocks as full ones.
    busy = min(grid_m, 2 * triton.cdiv(t, block_m))
    splits, per_split = segment_splits(busy, row_blocks, k, block_k, n)
    part = torch.empty(splits, t, rows, dtype=torch.float32, device=x.device)
    dt, prec = dot_dtype(x.dtype), dot_precision(x.dtype)
    _shrink_kernel[(grid_m, row_blocks, splits)](
        x, a, order, starts, part, x.stride(0), a.stride(0), a.stride(1), part.stride(0), part.stride(1),
        k, rows, slots, per_split, DOT_DTYPE=dt, DOT_PRECISION=prec, BLOCK_M=block_m, BLOCK_R=_BLOCK_R,
        BLOCK_K=block_k, BLOCK_S=block_s,
    )
    sizes = tuple(slice_sizes) + (0,) * (3 - len(slice_sizes))
    block_n = max(16, min(block_n if block_m == 16 else 64, triton.next_power_of_2(max(slice_sizes))))
    col_blocks = sum(triton.cdiv(s, block_n) for s in slice_sizes)
    _expand_kernel[(grid_m, col_blocks)](
        y, part, b, order, starts, y.stride(0), part.stride(0), part.stride(1), b.stride(0), b.stride(1),
        max_rank, slots, sizes[0], sizes[1], sizes[2], SPLITS=splits, DOT_DTYPE=dt,
        DOT_PRECISION=prec, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=max(16, triton.next_power_of_2(max_rank)),
        BLOCK_S=block_s,
    )


__all__ = ["lora_apply_segments", "lora_segments", "segment_block_m", "segment_splits"]
