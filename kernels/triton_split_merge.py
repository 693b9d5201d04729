"""Merging split-KV partial attention results (flash-decoding's second pass), in Triton.

When a query's context is cut into `NUM_SPLITS` key ranges, each range's program writes its
normalised partial output and its log-sum-exp (base 2); this kernel weighs the partials by
`exp2(lse - max lse)` and writes the final row. An empty range has `lse = -inf` and no weight; a
query with no keys at all gets zeros. Partials are laid out `[rows, heads, splits]` (then
`head_dim`, padded to `BLOCK_D`): in the decode kernel a row is a sequence (its one query token's
output row comes from `query_start_loc`), in the prefill kernel a row is a query token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def store_attention_rows(
    acc,
    m,
    l,
    out_ptr,
    out_offsets,
    part_out_ptr,
    part_lse_ptr,
    part_rows,
    d,
    rows_ok,
    d_ok,
    NUM_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    RECIPROCAL: tl.constexpr = False,
    SKIP_EMPTY: tl.constexpr = False,
):
    """The end of an attention program: its rows' online-softmax state (`acc`, max `m`, sum `l`,
    base 2) normalised into `out` at `out_offsets` (element offsets of each row's head) when there is
    one split, else into the partials at `part_rows` with their log-sum-exps, for the merge.

    An empty context (or an empty split) leaves l == 0: that writes zeros, and lse = -inf so the
    merge gives that split no weight. `RECIPROCAL`: multiply by one reciprocal a row instead of dividing
    every element (a compiled fp32 division is ~4 instructions an element: 128 a thread of a 128 x 128 tile
    at 4 warps); not bit-equal (the product rounds twice), an fp32 ulp apart. `SKIP_EMPTY`: a row that saw no key
    stores only its lse (-inf), not its zero partial (the merge's `LIVE_ONLY` gives it no weight, whatever it holds).
    """
    denominator = tl.where(l > 0, l, 1.0)
    out = acc * (1.0 / denominator)[:, None] if RECIPROCAL else acc / denominator[:, None]
    if NUM_SPLITS == 1:
        o_ptrs = out_ptr + out_offsets[:, None] + d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=rows_ok[:, None] & d_ok[None, :])
    else:
        rows = part_rows.to(tl.int64)
        parts_ok = rows_ok & (l > 0) if SKIP_EMPTY else rows_ok
        tl.store(part_out_ptr + rows[:, None] * BLOCK_D + d[None, :], out, mask=parts_ok[:, None])
        lse = tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + rows, lse, mask=rows_ok)


@triton.jit
def split_merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    split_len,
    num_seqs,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROWS_ARE_SEQS: tl.constexpr,
    PDL: tl.constexpr = False,
    ACTIVE_ONLY: tl.constexpr = False,
    EARLY_DEPENDENTS: tl.constexpr = False,
    LIVE_ONLY: tl.constexpr = False,
):
    """One program per (row, head): the row's `[HEAD_DIM]` output for that head, the splits' partials weighed
    by `exp2(lse - max lse)` (launched by `merge_splits`, which says what the switches mean)."""
    if PDL or EARLY_DEPENDENTS:  # let the next kernel (o_proj's GEMV, launched with PDL, kernels/pdl.py) be
        # scheduled now and start loading its weights; it waits for this one before it reads the output
        tl.extra.cuda.gdc_launch_dependents()
    if PDL:  # launched early (programmatic dependent launch): wait until the partials' kernel is done
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0)
    head = tl.program_id(1)
    if ROWS_ARE_SEQS:
        q_row = tl.load(query_start_loc_ptr + row)
        if tl.load(query_start_loc_ptr + row + 1) != q_row + 1:  # no decode row: a padding sequence (no query),
            return  # or a mixed step's prompt (the prefill kernel's rows, `kernels/mixed_attention.py`)
    else:
        q_row = row
        if LIVE_ONLY and row >= tl.load(query_start_loc_ptr + num_seqs):  # a padding row of a graph: no sequence's
            return
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, BLOCK_D)
    part = (row * NUM_HEADS + head) * NUM_SPLITS + sp
    if ACTIVE_ONLY:  # only the splits that hold keys wrote partials (the decode kernel: `split_len` keys each)
        sp_ok = sp < tl.minimum(tl.cdiv(tl.load(seq_lens_ptr + row), split_len), NUM_SPLITS)
    else:
        sp_ok = sp < NUM_SPLITS
    lse = tl.load(part_lse_ptr + part, mask=sp_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m > float("-inf"), m, 0.0)
    w = tl.where(lse > float("-inf"), tl.exp2(lse - m), 0.0)
    if LIVE_ONLY:  # an empty split stored no partial (its lse is -inf): its bytes are neither read nor needed
        sp_ok = sp_ok & (lse > float("-inf"))
    parts = tl.load(part_out_ptr + part.to(tl.int64)[:, None] * BLOCK_D + d[None, :], mask=sp_ok[:, None], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(parts * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + q_row.to(tl.int64) * stride_ot + head * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d < HEAD_DIM,
    )


def split_length(context: int, num_splits: int, block_n: int) -> int:
    """Keys per split: `context` keys cut into `num_splits` ranges of whole `block_n`-key tiles."""
    return triton.cdiv(triton.cdiv(context, num_splits), block_n) * block_n


def split_buffers(out: torch.Tensor, num_rows: int, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs `[rows * heads * splits, BLOCK_D]` and log-sum-exps (fp32) for a split launch;
    with one split there are no partials (the kernel writes `out`), and `out` stands in for both."""
    if num_splits == 1:
        return out, out
    rows = num_rows * out.shape[1] * num_splits
    block_d = triton.next_power_of_2(out.shape[2])
    part_out = torch.empty(rows, block_d, dtype=torch.float32, device=out.device)
    return part_out, torch.empty(rows, dtype=torch.float32, device=out.device)


def merge_splits(
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    num_rows: int,
    num_splits: int,
    rows_are_seqs: bool,
    pdl: bool = False,
    seq_lens: torch.Tensor | None = None,
    split_len: int = 0,
    early_dependents: bool = False,
    live_only: bool = False,
) -> None:
    """Launch the merge over `num_rows` rows x every head of `out` (`[tokens, heads, head_dim]`).
    `pdl`: launched by programmatic dependent launch (CUDA on Hopper, never under the interpreter): the
    GPU may start it while the kernel ahead (which should signal `gdc_launch_dependents`) still runs;
    it waits for that kernel's completion before reading, so only the launch gap is saved. `seq_lens`
    (rows are sequences): only each sequence's first `cdiv(seq_len, split_len)` splits wrote partials.
    `early_dependents` (with `pdl`): the kernel after this one, launched by PDL, may start at once (it must
    wait for this one's completion before reading its output). `live_only` (rows are tokens): rows past the step's
    last token (`query_start_loc[-1]`: a graph's padding rows) are skipped, and a split whose lse is -inf is not
    read (the partials' kernel stored none: `store_attention_rows`'s `SKIP_EMPTY`)."""
    num_heads, head_dim = out.shape[1], out.shape[2]
    split_merge_kernel[(num_rows, num_heads)](
        part_out,
        part_lse,
        query_start_loc,
        query_start_loc if seq_lens is None else seq_lens,
        out,
        out.stride(0),
        out.stride(1),
        max(split_len, 1),
        query_start_loc.shape[0] - 1,
        NUM_HEADS=num_heads,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        ROWS_ARE_SEQS=rows_are_seqs,
        num_warps=4,
        ACTIVE_ONLY=seq_lens is not None,
        LIVE_ONLY=live_only,
        **({"PDL": True, "launch_pdl": True, "EARLY_DEPENDENTS": early_dependents} if pdl else {}),
    )


__all__ = ["merge_splits", "split_buffers", "split_length", "split_merge_kernel", "store_attention_rows"]
