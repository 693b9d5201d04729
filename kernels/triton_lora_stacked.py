"""Batched LoRA with the shrink inside the base GEMM: the expand of a stacked projection, in Triton.

A decode step of a few dozen tokens is memory-bound: the base GEMM streams the projection's weight
once whatever the batch, and extra output rows cost only their bytes. So `LoRALinear` keeps the base
weight and the A stack of every device slot in one tensor, `[out + slots * rows, in]` (the base weight
is its first `out` rows, a contiguous view the base layer keeps using; `rows` = slices x max rank),
and a LoRA step multiplies `x` by all of it in one GEMM: `y_ext[t] = [W x_t | A[0] x_t | ... |
A[S-1] x_t]`. The shrink of every slot comes out of the base GEMM, rounded once to the activation
dtype as the reference (`lora.py`) and PEFT round it, in no launch of its own; a token needs only its
own slot's columns. On the H200 (Llama-3.1-8B shape, batch 64, 8 adapters) the separate shrink was
128 launches a step and 877 us of 1,730 us of LoRA kernel time (profile of 2026-12-03, sixth session),
while the A stack of 8 slots adds ~10 MB a layer to the base GEMMs' ~436 MB.

The expand (this kernel) writes a new, contiguous `y` `[T, out]`: grid (segment block, column block),
the segment blocks of `triton_lora_segments` with the base-model tokens as one more bucket (slot S).
A program loads its tokens' base outputs, their slot's shrink columns `[BLOCK_M, rank]` and the
slot's B tile `[rank, BLOCK_N]` (all three in flight together: one dependent load after the segment
lookup), adds `buf @ B` (tensor cores; zero for base-model tokens, whose rows are copied unchanged)
and stores the sum rounded once, as `lora_expand_ref` does. No fp32 split partials are reloaded:
the old expand read 8-16 of them per program.

Reference: `lora.py` (`lora_stacked_expand_ref`); fp32 accumulation; bf16/fp16 `tl.dot` on tensor
cores, IEEE fp32 for fp32 inputs and under the interpreter (`triton_utils.dot_dtype`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.triton_lora_segments import _segment_block, _slice_columns, segment_block_m
from flotilla.kernels.triton_utils import dot_dtype, dot_precision


@triton.jit
def _stacked_expand_kernel(out_ptr, ext_ptr, b_ptr, order_ptr, starts_ptr, T, stride_o, stride_e, stride_bs,
                           stride_bn, N, R, ROWS, S, SIZE0, SIZE1, SIZE2, DOT_DTYPE: tl.constexpr,
                           DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    slot, tokens, valid = _segment_block(order_ptr, starts_ptr, T, S, BLOCK_M, BLOCK_S, True)
    if slot > S:
        return
    rank = tl.where(slot < S, R, 0)  # slot S: base-model tokens, copied (every rank masked: a zero delta)
    slot = slot.to(tl.int64)
    index, ns, c_ok = _slice_columns(SIZE0, SIZE1, SIZE2, BLOCK_N)
    rs = tl.arange(0, BLOCK_R)
    r_ok = rs < rank
    rows = tokens[:, None] * stride_e
    y_mask = valid[:, None] & c_ok[None, :]
    base = tl.load(ext_ptr + rows + ns[None, :], mask=y_mask, other=0.0)
    # This slot's shrink columns of this slice: `N + slot * ROWS + index * R ...` of the stacked output.
    buf = tl.load(ext_ptr + rows + N + slot * ROWS + index * R + rs[None, :], mask=valid[:, None] & r_ok[None, :],
                  other=0.0)
    b = tl.load(b_ptr + slot * stride_bs + ns[None, :] * stride_bn + rs[:, None], mask=r_ok[:, None] & c_ok[None, :],
                other=0.0)
    delta = tl.dot(buf.to(DOT_DTYPE), b.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    out = base.to(tl.float32) + delta
    tl.store(out_ptr + tokens[:, None] * stride_o + ns[None, :], out.to(out_ptr.dtype.element_ty), mask=y_mask)


def lora_stacked_expand(y_ext: torch.Tensor, b: torch.Tensor, segments: tuple[torch.Tensor, torch.Tensor],
                        slice_sizes: tuple[int, ...], max_rank: int, *, block_n: int = 128) -> torch.Tensor:
    """`y` `[T, out]` from the stacked GEMM's output `y_ext` `[T, out + slots * rows]`: base columns
    plus each adapter token's `B[slot] @ buf` per slice (`lora_stacked_expand_ref`'s contract), over the
    step's `segments` (`lora_segments` of its token slots)."""
    order, starts = segments
    slots, n, _ = b.shape
    t = y_ext.shape[0]
    rows = len(slice_sizes) * max_rank
    assert y_ext.shape[1] == n + slots * rows and y_ext.stride(1) == 1 and b.stride(2) == 1
    assert 1 <= len(slice_sizes) <= 3 and sum(slice_sizes) == n
    assert order.shape[0] == t and starts.shape[0] == slots + 1
    out = torch.empty(t, n, dtype=y_ext.dtype, device=y_ext.device)
    if t == 0:
        return out
    block_m = segment_block_m(t)
    grid_m = triton.cdiv(t, block_m) + slots + 1  # every segment block of any mix, base-model tokens included
    sizes = tuple(slice_sizes) + (0,) * (3 - len(slice_sizes))
    block_n = max(16, min(block_n, triton.next_power_of_2(max(slice_sizes))))
    col_blocks = sum(triton.cdiv(s, block_n) for s in slice_sizes)
    _stacked_expand_kernel[(grid_m, col_blocks)](
        out, y_ext, b, order, starts, t, out.stride(0), y_ext.stride(0), b.stride(0), b.stride(1), n, max_rank, rows,
        slots, sizes[0], sizes[1], sizes[2], DOT_DTYPE=dot_dtype(y_ext.dtype), DOT_PRECISION=dot_precision(y_ext.dtype),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=max(16, triton.next_power_of_2(max_rank)),
        BLOCK_S=triton.next_power_of_2(slots + 1),
    )
    return out


__all__ = ["lora_stacked_expand"]
