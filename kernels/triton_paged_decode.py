"""Paged decode attention in Triton: one new token per sequence, split-KV (flash-decoding).

Same contract as `paged_attention_ref` for the case `q_len == 1` (layout in `paged_attention.py`).
One program handles one (sequence, KV head, split): it loads the KV head's whole group of query
heads as the rows of one `tl.dot` (GQA: each K/V tile is read once for the group) and walks its
slice of the context through the block table, page by page, with an online softmax. When a
sequence's context is split, each split writes a partial output and its log-sum-exp, and a second
small kernel merges them (`triton_split_merge.py`). Splitting is what lets one long sequence fill
the GPU: batch 1 with 8 KV heads is only 8 programs without it.

The number of splits is picked from tensor shapes alone (batch, heads, block-table width), never
from `seq_lens` values, so a call never syncs with the host and can be captured in a CUDA graph.
"""

from __future__ import annotations

import os
import re

import torch
import triton
import triton.language as tl

from flotilla.kernels.card_tables import DEFAULT, device_card, for_card
from flotilla.kernels.fp8_linear import FP8_DTYPE
from flotilla.kernels.pdl import PDL_ENABLED
from flotilla.kernels.switches import env_flag
from flotilla.kernels.triton_split_merge import merge_splits, split_buffers, split_length, store_attention_rows
from flotilla.kernels.triton_utils import INTERPRETING, device_sms, dot_dtype, dot_precision, paged_attention_shapes

_LOG2E = 1.4426950408889634


# Four e4m3 bytes (one 32-bit register) to four fp16 (two f16x2 registers), each value x 2^-8: every
# byte moved to the high byte of a 16-bit half (prmt), then sign kept and exponent + mantissa shifted one
# bit right into fp16's fields, two halves per 32-bit op (~2.5 instructions a value; Triton's e4m3 ->
# bf16 is a cvt per two values plus one per value, on the slow conversion pipe).
_E4M3X4_TO_F16X4 = tl.constexpr("""{
.reg .b32 a, b, s, t;
prmt.b32 a, 0, $2, 0x5040;
prmt.b32 b, 0, $2, 0x7060;
shr.b32 s, a, 1;
shr.b32 t, b, 1;
and.b32 s, s, 0x3F803F80;
and.b32 t, t, 0x3F803F80;
and.b32 a, a, 0x80008000;
and.b32 b, b, 0x80008000;
or.b32 $0, a, s;
or.b32 $1, b, t;
}""")

# The same values, x 2^-8, in seven instructions for four (the sequence above takes ten, and the byte placement
# ahead of it two more): the high bytes of all four fp16 (sign, then exponent and mantissa but its lowest bit)
# and their low bytes (that bit at bit 7) each by one shift and mask of the 32-bit word, then two byte
# permutes interleave them into the two fp16x2 results.
_E4M3X4_TO_F16X4_BYTES = tl.constexpr("""{
.reg .b32 s, t, hi, lo;
shr.b32 s, $2, 1;
and.b32 t, s, 0x3F3F3F3F;
and.b32 hi, $2, 0x80808080;
or.b32 hi, hi, t;
shl.b32 lo, $2, 7;
and.b32 lo, lo, 0x80808080;
prmt.b32 $0, lo, hi, 0x5140;
prmt.b32 $1, lo, hi, 0x7362;
}""")

# The hardware conversion (two values a cvt, exact: no 2^-8) as inline PTX: like the sequence above, an
# impure asm keeps V's conversion in its load layout without a select.
_E4M3X4_TO_F16X4_CVT = tl.constexpr("""{
.reg .b16 lo, hi;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.e4m3x2 $0, lo;
cvt.rn.f16x2.e4m3x2 $1, hi;
}""")


@triton.jit
def _kv_operand(
    x, mask, DOT_DTYPE: tl.constexpr, KV_FP8: tl.constexpr, KEEP_LAYOUT: tl.constexpr, SELECT: tl.constexpr = True
):
    """A loaded K/V tile as a `tl.dot` operand. KV_FP8 0: `x` is already a float tile (bf16/fp16/fp32,
    or fp8 upcast by Triton's conversion, which goes through shared memory byte by byte and, to bf16,
    converts each value twice). 1, 2 and 4: `x` is raw e4m3 bytes (the fp8 pool viewed as uint8) made
    fp16 with integer ops: sign to bit 15, exponent and mantissa shifted into fp16's fields, which is
    exactly the value x 2^-8 (normals and subnormals alike: fp16's exponent bias is 8 above e4m3's);
    the caller folds 2^8 into the scales. 1 does it per value in Triton ops, 2 four values at a time
    in PTX (`_E4M3X4_TO_F16X4`), 4 four at a time in fewer instructions (`_E4M3X4_TO_F16X4_BYTES`).
    3: `x` is the e4m3 tile, converted to fp16 by the hardware (`cvt.rn.f16x2.e4m3x2`, exact) and
    kept in its load layout like 1 and 2; 5: the same cvt as inline PTX on the raw bytes.

    KEEP_LAYOUT (V always; K where the launch asks): Triton moves an elementwise conversion of a
    `tl.dot` operand after the shared-memory read into the tensor-core operand layout, and an 8-bit V
    tile (the reduction runs over tokens, not over contiguous bytes) is then read back one byte at a
    time (`ld.shared.b8` x 64 a tile, sm_90 PTX). Kept in its load layout, V is converted once and
    reaches the tensor cores as fp16 through ldmatrix. Modes 1-3 keep it there by a select (one
    instruction a value); 4 and 5 by marking the asm impure, which Triton does not move. K's bytes are
    contiguous along the reduction, so by default K keeps the moved conversion; kept in its load layout
    too, both operands are plain fp16 tiles and the query's fragments come by ldmatrix (four registers
    an instruction) instead of 8-byte reads and register moves, at the cost of K's own fp16 round trip
    through shared memory. SELECT False (the lean loop's unpredicated tiles, `_attend_heads_t`): no select, so modes
    1-3 then leave V's conversion to Triton's placement (the lean loop is meant for the PTX modes).
    """
    if KV_FP8 == 1:
        b = x.to(tl.int16)
        h = (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.float16, bitcast=True)
        if KEEP_LAYOUT and SELECT:
            h = tl.where(mask, h, 0.0)
        return h.to(DOT_DTYPE)
    elif KV_FP8 == 2:
        h = tl.inline_asm_elementwise(_E4M3X4_TO_F16X4, "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4)
        if KEEP_LAYOUT and SELECT:
            h = tl.where(mask, h, 0.0)
        return h.to(DOT_DTYPE)
    elif KV_FP8 == 4:
        h = tl.inline_asm_elementwise(_E4M3X4_TO_F16X4_BYTES, "=r,=r,r", [x], dtype=tl.float16,
                                      is_pure=not KEEP_LAYOUT, pack=4)  # fmt: skip
        return h.to(DOT_DTYPE)
    elif KV_FP8 == 5:
        h = tl.inline_asm_elementwise(_E4M3X4_TO_F16X4_CVT, "=r,=r,r", [x], dtype=tl.float16,
                                      is_pure=not KEEP_LAYOUT, pack=4)  # fmt: skip
        return h.to(DOT_DTYPE)
    elif KV_FP8 == 3:
        h = x.to(tl.float16)  # the hardware conversion, two values per cvt, no bf16 step
        if KEEP_LAYOUT and SELECT:
            h = tl.where(mask, h, 0.0)
        return h.to(DOT_DTYPE)
    else:
        return x.to(DOT_DTYPE)


@triton.jit
def _page_of(tok, PAGE: tl.constexpr):
    """Table index of token positions (>= 0): unsigned, so a power-of-two page is one shift."""
    return (tok.to(tl.uint32) // PAGE).to(tl.int32)


@triton.jit
def _in_page(tok, PAGE: tl.constexpr):
    return (tok.to(tl.uint32) % PAGE).to(tl.int32)


@triton.jit
def _attend_streams(
    q, k_cache_ptr, v_cache_ptr, table, start, end, qk_scale, kv_head, stride_b, stride_s, stride_h, d, d_ok,
    WS: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, K_LOAD_LAYOUT: tl.constexpr,
):  # fmt: skip
    """The loop as a batched `tl.dot` over WS interleaved streams of the split's keys: each `BLOCK_N` tile is WS
    sub-tiles of `BLOCK_N // WS` keys, each stream with its own scores and online-softmax state, merged once at
    the end. WS = num_warps puts one stream on each warp, so the row max and sum and P's way to the second
    product stay within a warp (no shared-memory reductions or barriers per tile) and the query's mma
    fragments stay in registers, at the price of a full accumulator per warp (registers). On the H200 the fp8
    pool's fastest kernel: 146.3 us at 32/2/4 with 2 streams against 161.8 for the plain loop at 64/4/3
    (2026-12-04 s7 call 4). WS = 1 (the plain loop's arithmetic with the query in registers: fewer instructions
    in the sm_90 SASS) measured slower there, 268 us. Returns (acc, m, l) of the query rows."""
    SUB: tl.constexpr = BLOCK_N // WS
    w = tl.arange(0, WS)[:, None]
    t = tl.arange(0, SUB)[None, :]
    tok = start + w * SUB + t
    next_page = tl.load(table + _page_of(tok, PAGE), mask=tok < end, other=0)
    q3 = tl.broadcast_to(q[None, :, :], (WS, GROUP_PAD, BLOCK_D))
    m = tl.full([WS, GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([WS, GROUP_PAD], tl.float32)
    acc = tl.zeros([WS, GROUP_PAD, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + w * SUB + t
        tok_ok = tok < end
        page = next_page.to(tl.int64)
        next_page = tl.load(table + _page_of(tok + BLOCK_N, PAGE), mask=tok + BLOCK_N < end, other=0)
        in_page = _in_page(tok, PAGE)
        kv_mask = tok_ok[:, :, None] & d_ok[None, None, :]
        kv_off = page * stride_b + in_page * stride_s + kv_head * stride_h
        k = tl.load(k_cache_ptr + kv_off[:, :, None] + d[None, None, :], mask=kv_mask, other=0.0)
        k = _kv_operand(k, kv_mask, DOT_DTYPE, KV_FP8, K_LOAD_LAYOUT)
        s = tl.dot(q3, tl.permute(k, (0, 2, 1)), input_precision=DOT_PRECISION) * qk_scale  # [WS, G, SUB]
        s = tl.where(tok_ok[:, None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 2))
        m_use = tl.where(m_new > float("-inf"), m_new, 0.0)  # a stream with no key yet (the last tile's tail)
        alpha = tl.exp2(m - m_use)
        p = tl.exp2(s - m_use[:, :, None])
        l = l * alpha + tl.sum(p, 2)
        v = tl.load(v_cache_ptr + kv_off[:, :, None] + d[None, None, :], mask=kv_mask, other=0.0)
        v = _kv_operand(v, kv_mask, DOT_DTYPE, KV_FP8, True)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m = m_new
    m_all = tl.max(m, 0)
    m_use = tl.where(m_all > float("-inf"), m_all, 0.0)
    wgt = tl.exp2(m - m_use[None, :])  # 0 for a stream that saw no key
    return tl.sum(acc * wgt[:, :, None], 0), m_all, tl.sum(l * wgt, 0)


@triton.jit
def _load_tile(cache_ptr, kv_off, d, kv_mask, PREDICATED: tl.constexpr):
    """The K or V tile at `kv_off` ([WS, keys]) x head dims `d`; PREDICATED False: every element, no mask."""
    if not PREDICATED:
        return tl.load(cache_ptr + kv_off[:, :, None] + d[None, None, :])
    return tl.load(cache_ptr + kv_off[:, :, None] + d[None, None, :], mask=kv_mask, other=0.0)


@triton.jit
def _tile_t(
    k_cache_ptr, v_cache_ptr, kv_off, d, kv_mask, tok_ok, qt3, qk_scale, m, l, acc,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr, K_LOAD_LAYOUT: tl.constexpr,
    MASKED: tl.constexpr = True, PREDICATED: tl.constexpr = True,
):  # fmt: skip
    """One tile of the transposed streams' loop (`_attend_streams_t`, `_attend_heads_t`): the keys and values at
    `kv_off` ([WS, keys]) scored against `qt3` ([WS, BLOCK_D, G]), transposed (`K Q^T`: keys on the rows), and
    folded into each stream's online softmax (`m`, `l` [WS, G]; `acc` [WS, BLOCK_D, G]). A stream with no key yet
    (the last tile's tail) keeps m = -inf. MASKED False (a tile whose keys are all below the split's end: the lean
    loop's full tiles): no key mask and no -inf scores (`kv_mask` then masks only the head dims), the same numbers
    without a compare and select per key; PREDICATED False (with MASKED False, a power-of-two head dim): no load
    predicate and no V select at all (`kv_mask` unused). Returns the new (m, l, acc)."""
    k = _load_tile(k_cache_ptr, kv_off, d, kv_mask, PREDICATED)
    k = _kv_operand(k, kv_mask, DOT_DTYPE, KV_FP8, K_LOAD_LAYOUT, PREDICATED)
    s = tl.dot(k, qt3, input_precision=DOT_PRECISION) * qk_scale  # [WS, keys, G]
    if MASKED:
        s = tl.where(tok_ok[:, :, None], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_use = tl.where(m_new > float("-inf"), m_new, 0.0) if MASKED else m_new  # unmasked: every stream has keys
    alpha = tl.exp2(m - m_use)
    p = tl.exp2(s - m_use[:, None, :])
    l = l * alpha + tl.sum(p, 1)
    v = _load_tile(v_cache_ptr, kv_off, d, kv_mask, PREDICATED)
    v = _kv_operand(v, kv_mask, DOT_DTYPE, KV_FP8, True, PREDICATED)
    acc = acc * alpha[:, None, :] + tl.dot(tl.permute(v, (0, 2, 1)), p.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    return m_new, l, acc


@triton.jit
def _attend_streams_t(
    q, k_cache_ptr, v_cache_ptr, table, start, end, qk_scale, kv_head, stride_b, stride_s, stride_h, d, d_ok,
    WS: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, K_LOAD_LAYOUT: tl.constexpr,
):  # fmt: skip
    """`_attend_streams` with both products transposed: keys and head dims are the tensor-core rows, the group's
    query heads the columns (scores `K @ Q^T` [SUB, G], output `V^T @ P^T` [d, G]). With a GQA group of 4 the
    row form pads the query heads to 16 mma rows (12 of 16 wasted, a [16, d] fp32 accumulator: 64 registers a
    thread, each rescaled every tile); here the heads are padded only to GROUP_PAD columns (the launcher passes 8,
    one mma n-tile), so a warp issues half the mma instructions per key, and the accumulator and its rescale
    are half the size. Returns (acc [GROUP_PAD, BLOCK_D], m, l) like `_attend_streams`."""
    SUB: tl.constexpr = BLOCK_N // WS
    w = tl.arange(0, WS)[:, None]
    t = tl.arange(0, SUB)[None, :]
    # A stream's sub-tile lies in one page when SUB divides PAGE (tiles start at multiples of BLOCK_N): then its
    # page number is one value a stream, [WS, 1], not one a key (fewer table loads and 64-bit offset products).
    ONE_PAGE: tl.constexpr = PAGE % SUB == 0
    if ONE_PAGE:
        first = start + w * SUB
        next_page = tl.load(table + _page_of(first, PAGE), mask=first < end, other=0)
    else:
        tok = start + w * SUB + t
        next_page = tl.load(table + _page_of(tok, PAGE), mask=tok < end, other=0)
    qt3 = tl.broadcast_to(tl.trans(q)[None, :, :], (WS, BLOCK_D, GROUP_PAD))
    m = tl.full([WS, GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([WS, GROUP_PAD], tl.float32)
    acc = tl.zeros([WS, BLOCK_D, GROUP_PAD], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + w * SUB + t
        tok_ok = tok < end
        page = next_page.to(tl.int64)
        if ONE_PAGE:
            first = n0 + w * SUB + BLOCK_N
            next_page = tl.load(table + _page_of(first, PAGE), mask=first < end, other=0)
            in_page = _in_page(n0 + w * SUB, PAGE) + t
        else:
            next_page = tl.load(table + _page_of(tok + BLOCK_N, PAGE), mask=tok + BLOCK_N < end, other=0)
            in_page = _in_page(tok, PAGE)
        kv_mask = tok_ok[:, :, None] & d_ok[None, None, :]
        kv_off = page * stride_b + in_page * stride_s + kv_head * stride_h
        m, l, acc = _tile_t(k_cache_ptr, v_cache_ptr, kv_off, d, kv_mask, tok_ok, qt3, qk_scale, m, l, acc,
                            DOT_DTYPE, DOT_PRECISION, KV_FP8, K_LOAD_LAYOUT)  # fmt: skip
    m_all = tl.max(m, 0)
    m_use = tl.where(m_all > float("-inf"), m_all, 0.0)
    wgt = tl.exp2(m - m_use[None, :])  # 0 for a stream that saw no key
    return tl.trans(tl.sum(acc * wgt[:, None, :], 0)), m_all, tl.sum(l * wgt, 0)


@triton.jit
def _heads_tile(
    n0, next_page, table, end, t, sub0, head_off, k_cache_ptr, v_cache_ptr, stride_b, stride_s, d, d_ok, qt3,
    qk_scale, m, l, acc, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, KS: tl.constexpr, ONE_PAGE: tl.constexpr,
    PAGES: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
    K_LOAD_LAYOUT: tl.constexpr, MASKED: tl.constexpr, D_FULL: tl.constexpr, PAGE_PTRS: tl.constexpr = False,
):  # fmt: skip
    """One tile of `_attend_heads_t`'s loop at key `n0`: the next tile's pages asked for, this tile's (`next_page`)
    attended (`_tile_t`). PAGE_PTRS: K and V addressed as a pointer a page + 32-bit offsets (LEAN). Returns (the next
    tile's pages, m, l, acc)."""
    # KS = 1: [1, BLOCK_N], the same keys for every stream; else [WS, SUB]
    tok = n0 + t if KS == 1 else n0 + sub0 + t
    tok_ok = tok < end
    page = next_page.to(tl.int64)
    if ONE_PAGE:
        first = n0 + sub0  # [WS, 1]: a tensor also where the interpreter's loop index is an int
        next_page = tl.load(table + _page_of(first + BLOCK_N, PAGE), mask=first + BLOCK_N < end, other=0)
        in_page = _in_page(first, PAGE) + t
    elif PAGES:  # whole pages a stream: the first key's page + t // PAGE
        first = n0 + BLOCK_N + sub0  # [WS, 1]
        next_page = tl.load(table + _page_of(first, PAGE) + t // PAGE, mask=first + (t // PAGE) * PAGE < end, other=0)
        in_page = t % PAGE
    else:
        next_page = tl.load(table + _page_of(tok + BLOCK_N, PAGE), mask=tok + BLOCK_N < end, other=0)
        in_page = _in_page(tok, PAGE)
    if PAGE_PTRS:  # a page's pointer, then 32-bit offsets in the page (the same every tile)
        kv_off = in_page * stride_s + head_off  # [WS, BLOCK_N]
        k_base = k_cache_ptr + (page * stride_b)[:, :, None]  # expanded before the pointer: no layout conversion
        v_base = v_cache_ptr + (page * stride_b)[:, :, None]
    else:
        kv_off = page * stride_b + in_page * stride_s + head_off  # [WS, BLOCK_N]
        k_base, v_base = k_cache_ptr, v_cache_ptr
    # KS = 1: [1, BLOCK_N, BLOCK_D], broadcast over heads; unmasked: the head dims only (unused with D_FULL)
    kv_mask = tok_ok[:, :, None] & d_ok[None, None, :] if MASKED else d_ok[None, None, :]
    m, l, acc = _tile_t(k_base, v_base, kv_off, d, kv_mask, tok_ok, qt3, qk_scale, m, l, acc, DOT_DTYPE,
                        DOT_PRECISION, KV_FP8, K_LOAD_LAYOUT, MASKED, MASKED or not D_FULL)  # fmt: skip
    return next_page, m, l, acc


@triton.jit
def _attend_heads_t(
    q3, k_cache_ptr, v_cache_ptr, table, start, end, qk_scale, kv_base, stride_b, stride_s, stride_h, d, d_ok,
    WS: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, K_LOAD_LAYOUT: tl.constexpr, KS: tl.constexpr = 1, LEAN: tl.constexpr = False,
    D_FULL: tl.constexpr = False,
):  # fmt: skip
    """`_attend_streams_t`'s products with the streams over WS / KS neighbouring KV heads (`kv_base + w // KS`)
    instead of over keys only: KS = 1, every stream reads the same `BLOCK_N` keys of its own head; KS > 1, each head's
    keys are cut into KS interleaved streams of `BLOCK_N // KS` (as `_attend_streams_t` cuts them), so a program of
    WS warps covers WS / KS heads with KS warps a head. A key's heads lie side by side in the pool (WS / KS x 128
    contiguous bytes for the fp8 pool instead of 128) and the program's warps ask for them in the same iteration, so
    DRAM serves each row segment to one program at once instead of to several programs at different times. `q3` is
    [WS, GROUP_PAD, BLOCK_D] (each stream's head's query); returns (acc [WS / KS * GROUP_PAD, BLOCK_D], m, l), one row
    a query head (KS > 1: each head's KS streams merged at the end, as `_attend_streams_t` merges its streams).

    LEAN (FLOTILLA_DECODE_FP8_LEAN, the fp8 pool): the same numbers in fewer instructions a key. The tiles whose keys
    all lie below `end` run without key masks (no compare and select per key on the loads and scores; `D_FULL`, the
    head dim a power of two: no load predicate at all), the last partial tile after them with the masks; and a
    stream of several whole pages (`BLOCK_N // KS` a multiple of PAGE: 32-key streams, 64-key tiles) finds its pages
    as its first page plus `t // PAGE` (one table entry a page, `t % PAGE` in the page) instead of dividing every
    key's position; and the loads address a pointer a page plus 32-bit offsets in the page, the same every tile (one
    64-bit add an address, not a 64-bit product and two adds)."""
    HS: tl.constexpr = WS // KS
    SUB: tl.constexpr = BLOCK_N // KS
    w = tl.arange(0, WS)[:, None]
    t = tl.arange(0, SUB)[None, :]
    sub0 = (w % KS) * SUB  # [WS, 1]: a stream's first key in a tile (0 for every stream when KS = 1)
    ONE_PAGE: tl.constexpr = PAGE % SUB == 0  # a stream's keys of a tile in one page: one table entry a stream
    PAGES: tl.constexpr = LEAN and SUB % PAGE == 0 and SUB > PAGE  # whole pages a stream (tiles start on a page)
    if ONE_PAGE:
        first = start + sub0  # [WS, 1], as in the loop
        next_page = tl.load(table + _page_of(first, PAGE), mask=first < end, other=0)
    elif PAGES:
        first = start + sub0 + (t // PAGE) * PAGE  # [WS, SUB]: each key's page's first position
        next_page = tl.load(table + _page_of(start + sub0, PAGE) + t // PAGE, mask=first < end, other=0)
    elif KS == 1:
        tok = start + t
        next_page = tl.load(table + _page_of(tok, PAGE), mask=tok < end, other=0)
    else:
        tok = start + sub0 + t
        next_page = tl.load(table + _page_of(tok, PAGE), mask=tok < end, other=0)
    if KS == 1:
        qt3 = tl.permute(q3, (0, 2, 1))  # [WS, BLOCK_D, GROUP_PAD]
    else:  # q3 is [HS, GROUP_PAD, BLOCK_D]: each head's query broadcast to its KS streams
        qt = tl.permute(q3, (0, 2, 1))
        qt3 = tl.reshape(tl.broadcast_to(qt[:, None, :, :], (HS, KS, BLOCK_D, GROUP_PAD)), (WS, BLOCK_D, GROUP_PAD))
    m = tl.full([WS, GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([WS, GROUP_PAD], tl.float32)
    acc = tl.zeros([WS, BLOCK_D, GROUP_PAD], tl.float32)
    head_off = (kv_base + w // KS) * stride_h  # [WS, 1]
    tail = start
    if LEAN:  # the full tiles, unmasked
        tail = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
        for n0 in range(start, tail, BLOCK_N):
            next_page, m, l, acc = _heads_tile(
                n0, next_page, table, end, t, sub0, head_off, k_cache_ptr, v_cache_ptr, stride_b, stride_s, d, d_ok,
                qt3, qk_scale, m, l, acc, PAGE, BLOCK_N, KS, ONE_PAGE, PAGES, DOT_DTYPE, DOT_PRECISION, KV_FP8,
                K_LOAD_LAYOUT, False, D_FULL, LEAN,
            )  # fmt: skip
    for n0 in range(tail, end, BLOCK_N):  # every tile (LEAN: the partial last one, if any)
        next_page, m, l, acc = _heads_tile(
            n0, next_page, table, end, t, sub0, head_off, k_cache_ptr, v_cache_ptr, stride_b, stride_s, d, d_ok, qt3,
            qk_scale, m, l, acc, PAGE, BLOCK_N, KS, ONE_PAGE, PAGES, DOT_DTYPE, DOT_PRECISION, KV_FP8, K_LOAD_LAYOUT,
            True, D_FULL, LEAN,
        )  # fmt: skip
    if KS > 1:  # each head's KS streams into one (weights 0 for a stream that saw no key)
        m4 = tl.reshape(m, (HS, KS, GROUP_PAD))
        m_all = tl.max(m4, 1)
        m_use = tl.where(m_all > float("-inf"), m_all, 0.0)
        wgt = tl.exp2(m4 - m_use[:, None, :])
        acc = tl.sum(tl.reshape(acc, (HS, KS, BLOCK_D, GROUP_PAD)) * wgt[:, :, None, :], 1)  # [HS, BLOCK_D, G]
        l = tl.sum(tl.reshape(l, (HS, KS, GROUP_PAD)) * wgt, 1)
        m = m_all
    acc = tl.reshape(tl.permute(acc, (0, 2, 1)), (HS * GROUP_PAD, BLOCK_D))
    return acc, tl.reshape(m, (HS * GROUP_PAD,)), tl.reshape(l, (HS * GROUP_PAD,))


@triton.jit
def _query_and_length(query_start_loc_ptr, seq_lens_ptr, seq):
    """(the sequence's first query row, whether it has a decode row, its length: 0 for a sequence without one)."""
    q_row = tl.load(query_start_loc_ptr + seq)
    # exactly one new token: a padding sequence has none, and a mixed step's prompts (more than one) are the
    # prefill kernel's (`kernels/mixed_attention.py`)
    has_query = tl.load(query_start_loc_ptr + seq + 1) == q_row + 1
    return q_row, has_query, tl.where(has_query, tl.load(seq_lens_ptr + seq), 0)


@triton.jit
def _prefetch_split(
    k_cache_ptr, v_cache_ptr, t, page, end, kv_head, stride_b, stride_s, stride_h,
    PAGE: tl.constexpr, BLOCK_D: tl.constexpr, LINE_ELEMS: tl.constexpr,
):  # fmt: skip
    """Ask L2 for the split's keys and values at tokens `t` (pages `page`) at once (`prefetch.global.L2`, one per
    128-byte line of a token's head), so that DRAM streams the whole split from the first round trip instead of
    tile by tile behind the loop's page-table reads (a latency-bound batch-1 program owns a few tiles). Lanes at
    or past `end` prefetch the pool's first line."""
    off = page.to(tl.int64) * stride_b + _in_page(t, PAGE) * stride_s + kv_head * stride_h
    line = tl.arange(0, BLOCK_D // LINE_ELEMS) * LINE_ELEMS
    off = tl.where((t < end)[:, None], off[:, None] + line[None, :], 0)
    # the addresses as 64-bit integers ("l")
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [(k_cache_ptr + off).to(tl.int64)],
                              dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [(v_cache_ptr + off).to(tl.int64)],
                              dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


# num_tokens (read only by EARLY_QUERY) unspecialised: a batch of one token would else compile the kernel once more
# for num_tokens == 1 (and each divisibility by 16), whatever the switch
@triton.jit(do_not_specialize=["num_tokens"])
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    ticket_ptr,
    qk_scale,
    out_scale,
    stride_qt,
    stride_qh,
    stride_b,
    stride_s,
    stride_h,
    stride_bt,
    stride_ot,
    stride_oh,
    split_len,
    table_tokens,
    num_tokens,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    GROUP_P2: tl.constexpr,
    MERGE_CHUNK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    K_LOAD_LAYOUT: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    KEY_STREAMS: tl.constexpr = 0,
    EARLY_DEPENDENTS: tl.constexpr = False,
    EARLY_START: tl.constexpr = False,
    PREFETCH_TOKENS: tl.constexpr = 0,
    LINE_ELEMS: tl.constexpr = 64,
    DYN_SPLIT: tl.constexpr = False,
    TRANSPOSED: tl.constexpr = False,
    HEAD_STREAMS: tl.constexpr = False,
    KEY_SUB: tl.constexpr = 1,
    LEAN: tl.constexpr = False,
    EARLY_QUERY: tl.constexpr = False,
    SPLIT_TILES: tl.constexpr = 0,
):
    tl.static_assert(not EARLY_QUERY or not (EARLY_START or HEAD_STREAMS), "EARLY_QUERY: not by PDL, not over heads")
    tl.static_assert(SPLIT_TILES == 0 or not (DYN_SPLIT or HEAD_STREAMS or KEY_STREAMS > 0), "SPLIT_TILES: row form")
    if EARLY_DEPENDENTS:  # the next kernel, launched with PDL, may be scheduled now and wait there
        tl.extra.cuda.gdc_launch_dependents()
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    if DYN_SPLIT:
        # `split_len` is the keys a split aims at: this sequence's length is cut into floor(length / split_len)
        # equal ranges (whole pages; at least one), so a length just past a multiple of it (the engine's
        # context 4,096 + the tokens decoded so far) adds no split of a few keys (a program more than the SMs
        # take in one wave). The pages then wait for the length (one round trip more).
        q_row, has_query, seq_len = _query_and_length(query_start_loc_ptr, seq_lens_ptr, seq)
        ranges = tl.maximum(tl.minimum(seq_len // split_len, NUM_SPLITS), 1)
        split_len = tl.maximum(tl.cdiv(tl.cdiv(seq_len, ranges), PAGE) * PAGE, PAGE)
    start = split * split_len
    # Latency matters at small batch (a program may own only one or two tiles), so without DYN_SPLIT the first
    # tile's page numbers are fetched before, not after, the sequence's length arrives: they only need the
    # table's width, and are used only for tokens below the length.
    tok = start + tl.arange(0, BLOCK_N)
    next_page = tl.load(table + _page_of(tok, PAGE), mask=tok < table_tokens, other=0)
    if SPLIT_TILES > 0:
        # every tile's page numbers of the split (`[BLOCK_N, SPLIT_TILES]`, a key's page each) in the same first round
        # trip, so that the key loop holds no table read: the software pipeline then issues later tiles' K/V copies
        # at once instead of one table round trip a tile (flag "pages"). Tiles on the second axis: the loop's select
        # then sums within a warp (sm_90, Triton 3.9: shuffles; on the first axis it crossed warps, 12 barriers more)
        split_tok = start + tl.arange(0, SPLIT_TILES)[None, :] * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]
        split_pages = tl.load(table + _page_of(split_tok, PAGE), mask=split_tok < table_tokens, other=0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    if EARLY_QUERY:
        # the query read at row `seq` (a decode batch's row: one token a sequence) in the first round trip, with the
        # pages and the length, instead of after the row's offset arrives; another row is read again below
        g_spec = tl.arange(0, GROUP_PAD)
        q_spec = tl.load(q_ptr + seq.to(tl.int64) * stride_qt + (kv_head * GROUP + g_spec)[:, None] * stride_qh
                         + d[None, :], mask=(g_spec < tl.where(seq < num_tokens, GROUP, 0))[:, None] & d_ok[None, :],
                         other=0.0)  # fmt: skip
    if PREFETCH_TOKENS > 0:  # the split's pages for the L2 prefetch, in the same round trip
        pf_tok = start + tl.arange(0, PREFETCH_TOKENS)
        pf_ok = (pf_tok < start + split_len) & (pf_tok < table_tokens)
        pf_page = tl.load(table + _page_of(pf_tok, PAGE), mask=pf_ok, other=0)
    if not DYN_SPLIT:
        q_row, has_query, seq_len = _query_and_length(query_start_loc_ptr, seq_lens_ptr, seq)
    end = tl.minimum(start + split_len, seq_len)
    active = tl.minimum(tl.cdiv(seq_len, split_len), NUM_SPLITS)  # splits that hold keys
    if NUM_SPLITS > 1 and split >= active:
        # No keys (a table wider than the context, or a padding sequence): no partial, no ticket; both merges
        # read only the active splits, so a wide table's extra programs end here.
        return
    if PREFETCH_TOKENS > 0:
        _prefetch_split(k_cache_ptr, v_cache_ptr, pf_tok, pf_page, end, kv_head, stride_b, stride_s, stride_h, PAGE,
                        BLOCK_D, LINE_ELEMS)  # fmt: skip
    if EARLY_START:
        # Launched by programmatic dependent launch: everything above (the sequence's length, its pages, the L2
        # prefetch of its keys and values) may overlap the kernel ahead; the query, and the newest token's K/V,
        # are that kernel's writes, read only after it completes.
        tl.extra.cuda.gdc_wait()

    if HEAD_STREAMS:  # KEY_STREAMS / KEY_SUB neighbouring KV heads a program (`_attend_heads_t`), KEY_SUB streams
        # a head: the query rows stream * GROUP_PAD + g (a head's query once for each of its streams)
        HP: tl.constexpr = KEY_STREAMS // KEY_SUB
        r = tl.arange(0, HP * GROUP_PAD)  # rows w * GROUP_PAD + g, one a (head, query head)
        g = r % GROUP_PAD
        heads = (kv_head * HP + r // GROUP_PAD) * GROUP + g
        head_ok = g < tl.where(has_query, GROUP, 0)
        q = tl.load(
            q_ptr + q_row.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
            mask=head_ok[:, None] & d_ok[None, :],
            other=0.0,
        ).to(DOT_DTYPE)
        acc, m, l = _attend_heads_t(
            tl.reshape(q, (HP, GROUP_PAD, BLOCK_D)), k_cache_ptr, v_cache_ptr, table, start, end, qk_scale,
            kv_head * HP, stride_b, stride_s, stride_h, d, d_ok, KEY_STREAMS, GROUP_PAD, BLOCK_D, PAGE,
            BLOCK_N, DOT_DTYPE, DOT_PRECISION, KV_FP8, K_LOAD_LAYOUT, KEY_SUB, LEAN, HEAD_DIM == BLOCK_D,
        )  # fmt: skip
        acc = acc * out_scale
        store_attention_rows(
            acc, m, l, out_ptr, q_row.to(tl.int64) * stride_ot + heads * stride_oh, part_out_ptr, part_lse_ptr,
            (seq * NUM_HEADS + heads) * NUM_SPLITS + split, d, head_ok, d_ok, NUM_SPLITS, BLOCK_D,
        )  # fmt: skip
    else:
        g = tl.arange(0, GROUP_PAD)
        heads = kv_head * GROUP + g
        head_ok = g < tl.where(has_query, GROUP, 0)  # no rows at all for a padding sequence
        if EARLY_QUERY:
            q = q_spec
            if q_row != seq:  # a padded or mixed batch: the sequence's query is another row
                q = tl.load(q_ptr + q_row.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
                            mask=head_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
            q = tl.where(head_ok[:, None], q, 0.0).to(DOT_DTYPE)
        else:
            q = tl.load(
                q_ptr + q_row.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=head_ok[:, None] & d_ok[None, :],
                other=0.0,
            ).to(DOT_DTYPE)

        if KEY_STREAMS > 0 and TRANSPOSED:
            acc, m, l = _attend_streams_t(
                q, k_cache_ptr, v_cache_ptr, table, start, end, qk_scale, kv_head, stride_b, stride_s, stride_h, d,
                d_ok, KEY_STREAMS, GROUP_PAD, BLOCK_D, PAGE, BLOCK_N, DOT_DTYPE,
                DOT_PRECISION, KV_FP8, K_LOAD_LAYOUT,
            )  # fmt: skip
        elif KEY_STREAMS > 0:
            acc, m, l = _attend_streams(
                q, k_cache_ptr, v_cache_ptr, table, start, end, qk_scale, kv_head, stride_b, stride_s, stride_h, d,
                d_ok, KEY_STREAMS, GROUP_PAD, BLOCK_D, PAGE, BLOCK_N, DOT_DTYPE,
                DOT_PRECISION, KV_FP8, K_LOAD_LAYOUT,
            )  # fmt: skip
        else:
            m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
            l = tl.zeros([GROUP_PAD], tl.float32)
            acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
            for n0 in range(start, end, BLOCK_N):
                tok = n0 + tl.arange(0, BLOCK_N)
                tok_ok = tok < end
                if SPLIT_TILES > 0:  # the tile's row of the split's pages: a select, no memory access
                    row = (tl.arange(0, SPLIT_TILES) == (n0 - start) // BLOCK_N)[None, :]
                    page = tl.sum(tl.where(row, split_pages, 0), 1).to(tl.int64)
                else:
                    page = next_page.to(tl.int64)
                    next_page = tl.load(table + _page_of(tok + BLOCK_N, PAGE), mask=tok + BLOCK_N < end, other=0)
                in_page = _in_page(tok, PAGE)
                kv_mask = tok_ok[:, None] & d_ok[None, :]
                kv_off = page * stride_b + in_page * stride_s + kv_head * stride_h  # K and V pools share a layout
                k = tl.load(k_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
                k = _kv_operand(k, kv_mask, DOT_DTYPE, KV_FP8, K_LOAD_LAYOUT)
                s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # log2 domain
                s = tl.where(tok_ok[None, :], s, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, 1))
                alpha = tl.exp2(m - m_new)
                p = tl.exp2(s - m_new[:, None])
                l = l * alpha + tl.sum(p, 1)
                v = tl.load(v_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
                v = _kv_operand(v, kv_mask, DOT_DTYPE, KV_FP8, True)
                acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
                m = m_new

        acc = acc * out_scale  # v_scale, and 2^8 after the e4m3 -> fp16 bit moves (V at 2^-8 of its value)
        # Partials are `[batch, heads, splits]`.
        store_attention_rows(
            acc, m, l, out_ptr, q_row.to(tl.int64) * stride_ot + heads * stride_oh, part_out_ptr, part_lse_ptr,
            (seq * NUM_HEADS + heads) * NUM_SPLITS + split, d, head_ok, d_ok, NUM_SPLITS, BLOCK_D,
        )  # fmt: skip
        if NUM_SPLITS > 1 and FUSED_MERGE:
            # The last active split of this (sequence, KV head) to finish merges the group's partials instead of
            # a merge kernel (an option: slower on the H200, see `paged_decode_attention`). The barrier
            # orders every thread's partial stores before the release of the ticket; the acquire orders
            # the winner's reads after all of them.
            tl.debug_barrier()
            ticket = ticket_ptr + seq * tl.num_programs(1) + kv_head
            if tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == active - 1:
                tl.atomic_xchg(ticket, 0, sem="relaxed", scope="gpu")  # zero again for the next call
                if has_query:
                    _merge_group(part_out_ptr, part_lse_ptr, out_ptr, seq, kv_head, q_row.to(tl.int64) * stride_ot,
                                 stride_oh, d, d_ok, active, NUM_HEADS, NUM_SPLITS, SPLITS_PAD, GROUP, GROUP_P2,
                                 BLOCK_D, MERGE_CHUNK)  # fmt: skip


@triton.jit
def _merge_group(
    part_out_ptr, part_lse_ptr, out_ptr, seq, kv_head, out_row, stride_oh, d, d_ok, active,
    NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr, BLOCK_D: tl.constexpr, MERGE_CHUNK: tl.constexpr,
):  # fmt: skip
    """`split_merge_kernel`'s weighting for the GROUP query heads of one KV head, all heads at once, in one pass:
    each chunk of `MERGE_CHUNK` splits is one `[GROUP_P2, MERGE_CHUNK, BLOCK_D]` tile, merged online (the running
    maximum rescales what came before, as the split loop does over keys), so no load waits on an earlier chunk's
    arithmetic and the compiler may issue every chunk's loads together. Session 10's two passes (every chunk's
    log-sum-exps for the maximum, then every chunk again) paid two L2 round trips a chunk: fused at 64 and 128
    splits (chunks of 8) took 26.3 and 49.8 us at batch 1 x 4,096 on the H200 against 10.7 at 32 splits (one
    chunk; 2026-12-04 s10 call 5). Only the `active` splits (those that hold keys) are read; the others are
    known empty. Partials come through L2 (`.cg`): other SMs wrote them during this kernel. With one active
    split (a short context) the result is that split's partial, as the merge kernel's."""
    g = tl.arange(0, GROUP_P2)
    heads = kv_head * GROUP + g
    g_ok = g < GROUP
    CHUNKS: tl.constexpr = (SPLITS_PAD + MERGE_CHUNK - 1) // MERGE_CHUNK
    c = tl.arange(0, MERGE_CHUNK)
    base = (seq * NUM_HEADS + heads) * NUM_SPLITS  # [GROUP_P2]
    mx = tl.full([GROUP_P2], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_P2], tl.float32)
    acc = tl.zeros([GROUP_P2, BLOCK_D], tl.float32)
    for ci in tl.static_range(CHUNKS):
        sp = ci * MERGE_CHUNK + c
        ok = g_ok[:, None] & (sp < active)[None, :]
        rows = base[:, None] + sp[None, :]  # [GROUP_P2, MERGE_CHUNK]
        lse = tl.load(part_lse_ptr + rows, mask=ok, other=float("-inf"), cache_modifier=".cg")
        parts = tl.load(part_out_ptr + rows.to(tl.int64)[:, :, None] * BLOCK_D + d[None, None, :],
                        mask=ok[:, :, None], other=0.0, cache_modifier=".cg")  # fmt: skip
        mx_new = tl.maximum(mx, tl.max(lse, 1))
        mx_use = tl.where(mx_new > float("-inf"), mx_new, 0.0)  # a padding row, or no split yet
        alpha = tl.exp2(mx - mx_use)  # 0 before the first split, 1 while the maximum stays
        w = tl.where(lse > float("-inf"), tl.exp2(lse - mx_use[:, None]), 0.0)
        total = total * alpha + tl.sum(w, 1)
        acc = acc * alpha[:, None] + tl.sum(parts * w[:, :, None], 1)
        mx = mx_new
    merged = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + out_row + heads[:, None] * stride_oh + d[None, :], merged.to(out_ptr.dtype.element_ty),
             mask=g_ok[:, None] & d_ok[None, :])  # fmt: skip


def default_num_splits(
    batch: int, num_kv_heads: int, max_context: int, num_sms: int, block_n: int, wave: int | None = None
) -> int:
    """Splits per sequence: as many as fit one wave of ~4 programs per SM, each over >= 2 tiles.

    One wave, not more: on an H200 (batch 16, 8 KV heads) 4 splits = 512 programs ran at 3,780 GB/s
    and 5 splits = 640 programs, a second partial wave, at 3,130 GB/s. A batch that fills the wave
    alone gets no split, so no partials and no merge. `wave`: programs an SM to fill instead of `_wave()`'s.
    """
    programs = batch * num_kv_heads
    want = ((wave or _wave()) * num_sms) // programs
    most = max(1, triton.cdiv(max_context, 2 * block_n))
    return int(max(1, min(want, most, 64)))


# (block_n, num_warps, num_stages[, fp8_kv, key_streams]) per pool, from the H200 sweeps at batch 64 x 4,096
# (bench/fp8_kv_decode.py, 2026-12-04 s7): bf16 64/4/2 240.9-248.0 us (~4,330-4,460 GB/s). fp8 "cvtpx" 64/4/3, the
# plain loop: 172.9 us in call 2 (kv7 @250e64f; engine step bs64 x ctx 4,096 0.819x bf16-KV's), 161.8 in call 4
# (@d97ebf7, one K/V offset); s6's "asm" 244.7, "cvt16" 204.1, "perm" 167.2-182.2, the "_k" paths 248-337.
# Fastest kernel in call 4: 32/2/4 with 2 key streams (one a warp), 146.3 us (3,669 GB/s), but its engine step was
# not reached in that call. Session 9 call 1 (`KV7_FP8_LAUNCH=32,2,4,cvtpx,2 STAGES="fp8kv bf16 tests summary"
# bash bench/results/kv7-gpu.sh`, bench/results/gpu-2026-12-04-s9/call1/kv7): engine step bs64 x ctx 4,096 fp8 KV
# 9.778 ms vs bf16 KV 12.482 (0.783x; 0.819x at the plain loop 64/4/3 in s7), so it is the default.
_BF16_LAUNCH = (64, 4, 2)
# Session 16 call 2 (an H100: no H200 was lent; bench/results/gpu-2026-12-05-s16/call2/kv15): launch form "h2" (one
# four-warp program over 2 neighbouring KV heads, a token's 256 contiguous fp8 bytes asked for in one iteration) at
# 32/4/3 with one wave of 2 programs an SM: kernel 185.0 vs 196.1 us (t 32/2/4), engine step bs64 x ctx 4,096
# 11.834 vs 12.240 ms, 0.679x the bf16-KV step (17.421) vs 0.703x; greedy tokens identical. Was (32, 2, 4) "t".
# Session 25 (an H200, bench/results/gpu-2026-12-06-s25/call2/kvfp8): h2 64/4/3 129.3-129.4 us (4,150 GB/s, lean or
# not) vs 32/4/3 146.7; engine step bs64 x ctx 4,096 A B B A 8.721 (64/4/3 lean) vs 9.212 ms (0.947x). On the H100,
# where the kernel is bandwidth-bound, 64/4/3 costs ~1 % (s24 call 6: 181.0 vs 179.5 us, step 1.009x). Was 32/4/3.
_FP8_LAUNCH = (64, 4, 3, "cvtpx", 4)
# The key streams' form (`paged_decode_attention`'s `form`): "" rows, "t" transposed, "h" over KV heads. "t" since
# session 11: the H200's kernel at batch 64 x 4,096 134.7-135.2 us vs 141.9-142.0 for "" (calls 3 and 4), the engine
# step 9.411 vs 9.765 ms (call 3, two engines) and 9.227 vs 9.479 (call 4, one engine, A B B A): 0.753x / 0.740x
# the bf16-KV step (bench/results/gpu-2026-12-04-s11/call{3,4}/fp8kv11/).
_FP8_FORM = "h2"
# Programs an SM the fp8 pool's split count fills (None: `_wave()`, 4). The transposed streams' 128 registers let 8
# two-warp programs share an SM: 8 gives 2 splits at batch 64 x 8 KV heads on 132 SMs (fp8kv11's grid).
_FP8_WAVE: int | None = 2  # h2 at 32/4: 2 programs an SM, one split at batch 64 (session 16 call 2)
# The fp8 pool's launch per card (`card_tables.py`): ((block_n, num_warps, num_stages, fp8_kv, key_streams), form,
# wave). DEFAULT is the launch above, measured on both cards (its history above); a card's own entry holds only what
# a call measured on that card (session 30 prepared bench/results/gpu-2026-12-07-s30/next.sh, whose `SUMMARY kv30
# adopt:` line names an entry; the decode launch's warps an SM differ by card only through this table).
FP8_LAUNCHES: dict[str, tuple[tuple[int, int, int, str, int], str, int | None]] = {
    DEFAULT: (_FP8_LAUNCH, _FP8_FORM, _FP8_WAVE),
}
_PDL_MERGE = False  # the merge kernel by programmatic dependent launch (`paged_decode_attention`'s pdl_merge)


def _wave() -> int:
    """Programs per SM that `default_num_splits` fills (4); FLOTILLA_DECODE_WAVE overrides it so that one device
    call can time the engine at what a kernel sweep found (bench/decode_short_ctx.py)."""
    return int(os.environ.get("FLOTILLA_DECODE_WAVE", "") or 4)


def _launch_defaults(fp8: bool, card: str | None = None) -> tuple[int, int, int, str, int, str]:
    """The pool's launch defaults (block_n, num_warps, num_stages, fp8_kv, key_streams; 0: the plain loop,
    streams form: "" the row form, "t" transposed (`_attend_streams_t`), "h" transposed with the streams over
    neighbouring KV heads (`_attend_heads_t`), "h<N>" over N heads, key_streams / N streams a head).
    FLOTILLA_DECODE_FP8_LAUNCH="block_n,warps,stages,fp8_kv[,key_streams[t|h[N]]]" overrides the fp8 pool's and
    FLOTILLA_DECODE_BF16_LAUNCH="block_n,warps,stages[,key_streams[t|h[N]]]" the float pool's, so that one device
    call can time the engine step at what its kernel sweep found best (bench/results/kv7-gpu.sh, fp8kv11-gpu.sh,
    kv15-gpu.sh). Unset, the fp8 pool's is `card`'s `FP8_LAUNCHES` entry (None, or a card without one: DEFAULT's)."""
    if not fp8:
        env = os.environ.get("FLOTILLA_DECODE_BF16_LAUNCH", "").strip()
        if env:
            tile = env.split(",")
            streams, form = _streams_field(tile[3] if len(tile) > 3 else "0", "FLOTILLA_DECODE_BF16_LAUNCH")
            return int(tile[0]), int(tile[1]), int(tile[2]), "cvt", streams, form
        return (*_BF16_LAUNCH, "cvt", 0, "")
    env = os.environ.get("FLOTILLA_DECODE_FP8_LAUNCH", "").strip()
    if env:
        block_n, warps, stages, mode, *more = env.split(",")
        assert mode in FP8_KV_MODES, f"FLOTILLA_DECODE_FP8_LAUNCH: fp8_kv {mode!r} not in {sorted(FP8_KV_MODES)}"
        assert len(more) <= 1, f"FLOTILLA_DECODE_FP8_LAUNCH: {more}: key_streams?"
        streams, form = _streams_field(more[0] if more else "0", "FLOTILLA_DECODE_FP8_LAUNCH")
        return int(block_n), int(warps), int(stages), mode, streams, form
    launch, form, _ = for_card(FP8_LAUNCHES, card)
    return (*launch, form)


def _fp8_wave(card: str | None) -> int | None:
    """Programs an SM the fp8 pool's split count fills on `card` (its `FP8_LAUNCHES` entry's; None: `_wave()`)."""
    return for_card(FP8_LAUNCHES, card)[2]


def _streams_field(text: str, name: str) -> tuple[int, str]:
    """A launch string's key_streams field: digits, then `t` (transposed), `h` (over heads), `h<N>` (over N heads,
    key_streams / N streams a head: `_form_heads`) or nothing."""
    match = re.fullmatch(r"(\d+)(t|h|h[1-9]\d*)?", text)
    assert match and (match.group(1) != "0" or not match.group(2)), f"{name}: {text!r}: key_streams[t|h[N]]?"
    return int(match.group(1)), match.group(2) or ""


def _form_heads(form: str, key_streams: int) -> int:
    """KV heads a program covers in form "h" (all `key_streams` streams over heads, one a head) or "h<N>" (N heads,
    key_streams / N interleaved key streams a head); 1 in the other forms."""
    if not form.startswith("h"):
        return 1
    return int(form[1:]) if form[1:] else key_streams


# Small grids: batch x KV heads <= _SMALL_GRID (batch 1 or 2 at Llama's 8 KV heads), where a step's attention is
# a few hundred short programs and latency (launch, ramp, the merge's L2 round trip, a second kernel's launch gap)
# outweighs bandwidth: at batch 1 x 4,096 the general launch (64/4/2, 32 splits, the merge kernel) took 11.7 us on
# the H200 and its best variant 11.2 us (128 splits of 32 keys, merge by PDL; 2026-12-04 s7 call 2), 1,503 GB/s of
# K+V against issue 19's 2,000. `_SMALL_LAUNCH` is (block_n, num_warps, num_stages, split_tokens, merge,
# merge_chunk): keys per split (the split count is the table's width over it, so a table wider than the context
# leaves the extra splits empty instead of stretching every split: the engine's graphs pad the table to a bucket),
# "kernel", "pdl" (the merge kernel by programmatic dependent launch) or "fused" (the last split program of each KV
# head merges), with "+early" (the split kernel by PDL: `early_start`), "+prefetch" (`_prefetch_split`) and "+dep"
# (the fused kernel lets o_proj's PDL-launched GEMV start: `dependents`) added,
# and the fused merge's chunk (`_merge_chunk`; 0: its default). None: the general launch. Set from the H200, session
# 11 call 3 (bench/results/gpu-2026-12-04-s11/call3/attn11/): in the engine's conditions (4,288-key table) this
# launch took 10.11 us against the general launch's 11.69; the engine's bs1 x 4,096 step 4.692 -> 4.651 ms with the
# profile's attention 20.5 -> 10.7 us a layer, greedy tokens identical (64-key tiles: bit-equal to the general
# launch at <= 64 keys).
_SMALL_GRID = 16
_SMALL_LAUNCH: tuple[int, int, int, int, str, int] | None = (64, 4, 3, 256, "fused+dep", 0)
_MAX_SPLITS = 128  # a small launch's splits at most (the fused merge unrolls its chunks)
MERGES = ("kernel", "pdl", "fused")
FLAGS = ("early", "prefetch", "dep", "dyn", "pages")
_PAGES_TOKENS = 1024  # "pages": a split's keys at most (its page numbers held in registers: 8 a thread at 4 warps)


# Short tables: a small grid whose block table holds at most `_SHORT_TABLE` tokens (the engine's 1,024-token graph
# bucket; bench/latency.py's context-512 engine pads to 704) may take a launch of its own, `_SHORT_LAUNCH` (the small
# launch's fields; None: the small launch at every width). Why: `_SMALL_LAUNCH`'s 256-key splits give a 704-key table
# 3 splits x 8 KV heads = 24 programs of up to four 64-key tiles, the same serial chain a program runs at 4,096 keys,
# and on the H200 that chain is the time: one tile a program at 4,096's grid took 6.79 us against four tiles' 10.26
# (session 25 call 2, bench/early_query_ab.py's b1fix / b1e rows), and the engine's attention at context 512 took
# 9.06 us a layer for 2.1 MB of K+V (session 14's bs1 profile) against 10.7 at 4,096. One-tile splits at a short table
# (64 keys: 11 splits, 88 programs at 704; 16 splits at 1,024, one merge tile) should cut ~3 us a layer, ~100 us a
# batch-1 step. Measured (session 35, H100, bench/results/gpu-2026-12-07-s35/call1: attn.sh): the kernel alone at
# context 530 in the 704 table 8.37 us (the small launch) -> 5.96 us with one 32-key tile a program (32,4,3,32 with
# the fused merge, +dep), 5.98 in the 1,024 bucket; in one engine at bs1 ctx 512 (main B B main, 64 graphed steps a
# phase, every phase below main's) bf16 5.405 -> 5.314 ms (-91 us), int4 W4A16 2.504 -> 2.365 ms (-139 us, greedy
# tokens equal; int4 / bf16 0.463x -> 0.445x). The switch below still overrides it ("0": the small launch).
_SHORT_TABLE = 1024
_SHORT_LAUNCH: tuple[int, int, int, int, str, int] | None = (32, 4, 3, 32, "fused+dep", 0)


def _parse_launch(env: str, name: str) -> tuple[int, int, int, int, str, int]:
    """A small launch from its switch's text "block_n,warps,stages,split_tokens,merge[+flag...][,merge_chunk]"."""
    fields = env.split(",")
    nums, merge, chunk = fields[:4], fields[4] if len(fields) > 4 else "", fields[5:]
    # ValueError, not assert: `python -O` would let a mistyped switch through to the kernel launch.
    if len(fields) not in (5, 6) or not all(x.isdigit() for x in nums + chunk):
        raise ValueError(f"{name}: {env!r} is not block_n,warps,stages,split_tokens,merge[+flag...][,merge_chunk]")
    base, *flags = merge.split("+")
    if base not in MERGES or not set(flags) <= set(FLAGS):
        raise ValueError(f"{name}: merge {merge!r} is not one of {sorted(MERGES)} with flags from {sorted(FLAGS)}")
    block_n, warps, stages, split_tokens = (int(x) for x in nums)
    return block_n, warps, stages, split_tokens, merge, int(chunk[0]) if chunk else 0


def _small_launch(table_tokens: int | None = None) -> tuple[int, int, int, int, str, int] | None:
    """The float pool's launch at small grids (`_SMALL_LAUNCH`; the last field the fused merge's chunk, 0: its
    default). FLOTILLA_DECODE_SMALL_LAUNCH=
    "block_n,warps,stages,split_tokens,merge[+early][+prefetch][+dep][,merge_chunk]" overrides it ("0": the general
    launch), so that one device call can time the engine step at what the batch-1 kernel rows
    found (bench/results/kv10-gpu.sh). A block table of at most `_SHORT_TABLE` tokens (`table_tokens`) takes
    `_short_launch()` instead where that is set."""
    env = os.environ.get("FLOTILLA_DECODE_SMALL_LAUNCH", "").strip()
    if env == "0":
        return None
    short = _short_launch() if table_tokens is not None and table_tokens <= _SHORT_TABLE else None
    if short is not None:
        return short
    return _parse_launch(env, "FLOTILLA_DECODE_SMALL_LAUNCH") if env else _SMALL_LAUNCH


def _short_launch() -> tuple[int, int, int, int, str, int] | None:
    """The small grid's launch at a block table of at most `_SHORT_TABLE` tokens: `_SHORT_LAUNCH`, or
    FLOTILLA_DECODE_SHORT_LAUNCH in FLOTILLA_DECODE_SMALL_LAUNCH's syntax ("0": none, the small launch there too).
    Read at each call: a benchmark sets it, then captures the decode graphs again."""
    env = os.environ.get("FLOTILLA_DECODE_SHORT_LAUNCH", "").strip()
    if env == "0":
        return None
    return _parse_launch(env, "FLOTILLA_DECODE_SHORT_LAUNCH") if env else _SHORT_LAUNCH


def _fp8_lean_env() -> bool:
    """FLOTILLA_DECODE_FP8_LEAN: "1" runs the fp8 pool's "h" forms with `_attend_heads_t`'s LEAN loop (unmasked full
    tiles, a stream's pages a page at a time); "0": the masked loop. On by default since session 25: the H200's
    engine step was timed with it at `_FP8_LAUNCH` (the kernel is as fast without it there: 129.3 vs 129.4 us)."""
    return bool(env_flag("FLOTILLA_DECODE_FP8_LEAN", True))


def _fused_merge_env() -> bool | None:
    """FLOTILLA_DECODE_FUSED_MERGE: "1" merges in the split kernel whenever a launch splits, "0" never; unset:
    the launch's own choice."""
    return env_flag("FLOTILLA_DECODE_FUSED_MERGE", None)


def _early_query_env() -> bool:
    """FLOTILLA_DECODE_EARLY_QUERY: "1" reads each program's query at the row of its sequence's index with the
    pages and the length, in the small-grid launch (`paged_decode_attention`'s `early_query`); unset or "0": off
    (issue 19, to be measured on the H200)."""
    return env_flag("FLOTILLA_DECODE_EARLY_QUERY", False)


def _merge_chunk(num_splits: int, group: int, block_d: int, num_warps: int) -> int:
    """Splits per tile of the fused merge: all of them when the `[group, splits, block_d]` fp32 tile is at most 128
    values a thread (one L2 round trip; sm_90 compile at 4 warps, group 4, 32 splits: 160 registers against the
    plain kernel's 122, no spills), else chunks of 8 (124 registers at 32 splits, 127 at 128: ptxas then does not
    keep every chunk's loads in flight, and at 128 splits x 4 warps whole-tile chunks of 32 took 214 registers,
    2 CTAs an SM)."""
    splits = triton.next_power_of_2(num_splits)
    whole = triton.next_power_of_2(group) * splits * block_d <= 128 * 32 * num_warps
    return splits if whole else min(splits, 8)


def _pdl_capable(tensor: torch.Tensor) -> bool:
    """Programmatic dependent launch needs a CUDA device of compute capability 9.0 or later (and a
    compiled kernel: never under the interpreter)."""
    return tensor.is_cuda and not INTERPRETING and torch.cuda.get_device_capability(tensor.device) >= (9, 0)


_TICKETS: dict[torch.device, torch.Tensor] = {}


def _tickets(device: torch.device, count: int) -> torch.Tensor:
    """Per-(sequence, KV head) arrival counters for the fused merge, zero between calls (the merging
    program resets its own), so one buffer per device serves every call and every captured graph.
    Allocated once at a size no batch reaches in practice (graph capture must not allocate it)."""
    buf = _TICKETS.get(device)
    if buf is None or buf.numel() < count:
        buf = _TICKETS[device] = torch.zeros(max(count, 1 << 16), dtype=torch.int32, device=device)
    return buf


# fp8_kv name -> (KV_FP8, K_LOAD_LAYOUT); "_k": K converted in its load layout too (see `_kv_operand`).
FP8_KV_MODES = {"cvt": (0, False), "bits": (1, False), "asm": (2, False), "cvt16": (3, False), "perm": (4, False),
                "cvtpx": (5, False), "perm_k": (4, True), "cvtpx_k": (5, True)}  # fmt: skip
_BIT_MOVES = (1, 2, 4)  # the modes that read the pool as bytes and give values x 2^-8


def _fp8_mode(k_cache: torch.Tensor, fp8_kv: str) -> tuple[int, bool]:
    """The kernel's (KV_FP8, K_LOAD_LAYOUT) for this pool: 0 for a float pool or "cvt". Inline PTX never
    runs under the interpreter, so "asm" and "perm" are tested there as "bits" (the same arithmetic) and
    "cvtpx" as "cvt16" (the same conversion)."""
    if k_cache.dtype != FP8_DTYPE:
        return 0, False
    mode, k_layout = FP8_KV_MODES[fp8_kv]
    if INTERPRETING:
        mode = {2: 1, 4: 1, 5: 3}.get(mode, mode)
    return mode, k_layout


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    fp8_kv: str | None = None,
    fused_merge: bool | None = None,
    pdl_merge: bool | None = None,
    key_streams: int | None = None,
    form: str | None = None,
    split_tokens: int | None = None,
    merge_chunk: int | None = None,
    early_start: bool | None = None,
    prefetch: bool | None = None,
    dependents: bool | None = None,
    dynamic_splits: bool | None = None,
    lean: bool | None = None,
    early_query: bool | None = None,
    pages_ahead: bool | None = None,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention (at most one new token per sequence) over the paged KV pool.

    Arguments as `paged_attention_ref`; each sequence has `query_start_loc[i + 1] -
    query_start_loc[i]` in {0, 1}, or any other count when `out` is given: then only the sequences of one new
    token are attended (their rows of `out` written, the others' left as they are; a mixed step's decode rows,
    `kernels/mixed_attention.py`). `num_splits` defaults to a choice from shapes only (no host
    sync); the tile and launch knobs are exposed for tests and the benchmark. `fp8_kv` picks how an
    fp8 pool's tiles become tensor-core operands (default `_FP8_LAUNCH`; see `_kv_operand`; all but "cvt"
    round a bf16 query to fp16): "asm", "perm" or "bits" (integer bit moves to fp16: four values per PTX
    sequence of ten or of seven instructions, or one per Triton op), "cvt16" or "cvtpx" (the hardware
    e4m3 -> fp16 conversion, in Triton or in PTX), "perm_k" / "cvtpx_k" (K converted in its load layout
    too), or "cvt" (Triton's e4m3 upcast to the query's dtype, the kernel before 2026-12-04).
    `fused_merge`: with several splits, the last split program of each (sequence, KV head) merges the
    partials (one launch) instead of a second kernel (`_merge_group`); default: FLOTILLA_DECODE_FUSED_MERGE,
    else the small-grid launch's choice (`_SMALL_LAUNCH`), else off (session 7's version, one L2 round trip
    per query head, was slower on the H200: 13.8 us at batch 1 x 4,096 against 11.6 with the merge kernel).
    `split_tokens`: keys per split, the split count being the table's width over it (at most `_MAX_SPLITS`;
    `num_splits` wins). `merge_chunk`: splits a fused merge reads per tile (a power of two; `_merge_chunk`).
    `early_start`: the split kernel launched by programmatic dependent launch, reading the sequence's length and
    pages (and prefetching) while the kernel ahead finishes, the query and K/V only after it (Hopper).
    `prefetch`: each split program asks L2 for all of its keys and values once its pages are known
    (`_prefetch_split`; Hopper). `dependents` (with the fused merge): the kernel lets the next kernel, when that
    is launched by programmatic dependent launch (o_proj's GEMV, kernels/pdl.py), start at once; it waits for this
    one's completion before it reads the output (Hopper; early_start implies it). The three default to the small
    launch's flags ("fused+early+prefetch+dep"). `dynamic_splits` (with the fused merge and `split_tokens`; flag
    "dyn"): each sequence's keys are cut in the kernel into floor(length / split_tokens) equal ranges (whole
    pages), not into ranges of split_tokens, so that a length just past a multiple adds no short split.
    `pdl_merge`: the merge
    kernel launched by programmatic dependent launch (Hopper; off elsewhere and under the interpreter),
    started while the split programs run and waiting for them, to save the launch gap between the two
    kernels (batch 1, issue 19). `key_streams` > 0: the loop as a batched dot over that many interleaved streams
    of keys (`_attend_streams`; num_warps: one stream a warp). `form` (with key streams): "t" the products as
    `K @ Q^T` and `V^T @ P^T` (`_attend_streams_t`: the group's heads padded to 8 mma columns, not 16 rows), "h"
    the same with the streams over `key_streams` neighbouring KV heads on the same keys (`_attend_heads_t`: one
    program reads a key's heads side by side; no fused merge), "h<N>" over N neighbouring KV heads with
    key_streams / N interleaved key streams a head (so a 4-warp program covers 2 heads at one split: "h2" with
    key_streams 4), "" the row form; default: the pool's launch (its form where a caller's `key_streams` can carry
    the form's heads, else the row form).
    `lean` (the "h" forms): the loop's full tiles without key masks and a stream's pages found a page at a time
    (`_attend_heads_t`'s LEAN; the same numbers); default: FLOTILLA_DECODE_FP8_LEAN on an fp8 pool, else off.
    `early_query` (not with `early_start`, nor over heads): each program reads its query at the row of its
    sequence's index (a decode batch's layout) in the first round trip, with the pages and the length, and again at
    the real row only when that differs (a padded or mixed batch); the compiled kernel otherwise waits for the row's
    offset, then for the query, before the loop's first K/V request. Default FLOTILLA_DECODE_EARLY_QUERY at small
    grids, else off.
    `pages_ahead` (the row form without key streams, static splits of at most `_PAGES_TOKENS` keys; flag "pages"):
    each program reads all of its split's page numbers in its first round trip and picks a tile's from registers in
    the key loop, which then holds no table read (main's loop reads the next tile's pages in each iteration, and the
    copy of a later tile waits for that round trip). Default: the small launch's flag, else off.
    `v_scale` (an fp8 pool's V scale) multiplies the output inside the kernel.
    """
    num_tokens, num_heads, head_dim, page, num_kv_heads = paged_attention_shapes(query, k_cache, v_cache)
    batch, group = seq_lens.shape[0], num_heads // num_kv_heads
    out = torch.empty_like(query) if out is None else out
    if batch == 0 or num_tokens == 0:
        return out
    max_context = block_tables.shape[1] * page
    fp8 = k_cache.dtype == FP8_DTYPE
    card = device_card(query)  # None off CUDA: DEFAULT's launch
    tile = _launch_defaults(fp8, card)
    small = None if fp8 or batch * num_kv_heads > _SMALL_GRID else _small_launch(max_context)
    if small is not None:
        tile = (*small[:3], tile[3], 0, "")
        split_tokens = split_tokens or small[3]
        merge_chunk = merge_chunk or small[5] or None
    block_n, num_warps, num_stages = block_n or tile[0], num_warps or tile[1], num_stages or tile[2]
    fp8_kv = fp8_kv or tile[3]
    # keys a stream in a tile: block_n // key_streams; over heads ("h<N>") block_n // (key_streams / N)
    if key_streams is None:  # the default's streams, unless a caller's smaller tile leaves them < 16 keys each
        sub = tile[4] // _form_heads(tile[5], tile[4]) if tile[4] else 1
        key_streams = tile[4] if tile[4] and block_n // sub >= 16 else 0
    if form is None:  # the pool's form, where a caller's own stream count can carry its heads (else the row form)
        heads = _form_heads(tile[5], key_streams or 1)
        form = tile[5] if key_streams and key_streams % heads == 0 and num_kv_heads % heads == 0 else ""
    form = form if key_streams else ""
    assert re.fullmatch(r"t?|h\d*", form), f"form {form!r}"
    head_streams = form.startswith("h")
    prog_heads = _form_heads(form, key_streams)
    if head_streams and (prog_heads < 1 or key_streams % prog_heads or num_kv_heads % prog_heads):
        raise ValueError(f"head streams: {prog_heads} heads a program must divide {key_streams} streams and "
                         f"{num_kv_heads} KV heads")  # fmt: skip
    key_sub = key_streams // prog_heads if head_streams else key_streams  # key streams a head
    if key_streams and block_n // key_sub < 16:
        raise ValueError(f"key_streams {key_streams} leaves < 16 keys a stream in a {block_n}-key tile")
    programs_kv = num_kv_heads // prog_heads
    if lean is None:
        lean = fp8 and _fp8_lean_env()
    if num_splits is None and split_tokens:
        num_splits = max(1, min(triton.cdiv(max_context, split_tokens), _MAX_SPLITS))
    if num_splits is None:
        wave = _fp8_wave(card) if fp8 and not os.environ.get("FLOTILLA_DECODE_WAVE") else None
        num_splits = default_num_splits(batch, programs_kv, max_context, device_sms(query), block_n, wave)
    merge, *flags = (small[4] if small is not None else "").split("+")
    if fused_merge is None:
        env = _fused_merge_env()
        fused_merge = (env if env is not None else merge == "fused") and not head_streams
    if head_streams and fused_merge and num_splits > 1:
        raise ValueError("head streams: no fused merge (its ticket and merge are per KV head)")
    if pdl_merge is None:
        pdl_merge = _PDL_MERGE or merge == "pdl"
    # Programmatic dependent launch and inline PTX: compiled, on Hopper (never under the interpreter).
    # (FLOTILLA_PDL=0 turns off both of the chain's PDL flags, as it does the rest of the chain's)
    early_start = (early_start if early_start is not None else "early" in flags) and _pdl_capable(query)
    early_start = early_start and PDL_ENABLED
    prefetch = (prefetch if prefetch is not None else "prefetch" in flags) and _pdl_capable(query)
    dependents = (dependents if dependents is not None else "dep" in flags) and _pdl_capable(query) and PDL_ENABLED
    # only where the split kernel merges: the merge kernel's ACTIVE_ONLY reads the static cut's splits
    dynamic_splits = bool(dynamic_splits if dynamic_splits is not None else "dyn" in flags)
    dynamic_splits = dynamic_splits and bool(fused_merge and split_tokens) and num_splits > 1
    early_query = (_early_query_env() and small is not None) if early_query is None else early_query
    early_query = early_query and not early_start and not head_streams
    split_len = split_length(max_context, num_splits, block_n)
    pages_ahead = pages_ahead if pages_ahead is not None else "pages" in flags
    row_form = not key_streams and not dynamic_splits and split_len <= _PAGES_TOKENS
    split_tiles = triton.next_power_of_2(triton.cdiv(split_len, block_n)) if pages_ahead and row_form else 0
    block_d, splits_pad = triton.next_power_of_2(head_dim), triton.next_power_of_2(num_splits)
    part_out, part_lse = split_buffers(out, batch, num_splits)
    kv_fp8, k_load_layout = _fp8_mode(k_cache, fp8_kv)
    if kv_fp8 in (*_BIT_MOVES, 5):  # the asm and the bit moves read raw bytes
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    if kv_fp8 in _BIT_MOVES:
        scale *= 256.0
    assert k_cache.stride() == v_cache.stride(), "the kernel reads K and V at the same offsets"
    pdl = pdl_merge and num_splits > 1 and not fused_merge and _pdl_capable(query)
    line_elems = 128 // k_cache.element_size()
    _decode_split_kernel[(batch, programs_kv, num_splits)](
        query,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        part_out,
        part_lse,
        _tickets(query.device, batch * num_kv_heads) if fused_merge and num_splits > 1 else part_lse,
        scale * _LOG2E,
        v_scale * (256.0 if kv_fp8 in _BIT_MOVES else 1.0),
        query.stride(0),
        query.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        split_tokens if dynamic_splits else split_len,
        max_context,
        num_tokens,
        NUM_HEADS=num_heads,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=splits_pad,
        GROUP=group,
        # the row form's tl.dot pads the heads to >= 16 mma rows; the transposed forms to one n-tile of 8 columns
        GROUP_PAD=max(8 if form else 16, triton.next_power_of_2(group)),
        GROUP_P2=triton.next_power_of_2(group),  # the fused merge's rows
        MERGE_CHUNK=min(merge_chunk or _merge_chunk(num_splits, group, block_d, num_warps), splits_pad),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE=page,
        BLOCK_N=block_n,
        DOT_DTYPE=dot_dtype(torch.float16 if kv_fp8 and query.dtype != torch.float32 else query.dtype),
        DOT_PRECISION=dot_precision(query.dtype),
        KV_FP8=kv_fp8,
        K_LOAD_LAYOUT=k_load_layout,
        FUSED_MERGE=fused_merge,
        KEY_STREAMS=key_streams,
        EARLY_DEPENDENTS=pdl or ((early_start or dependents) and fused_merge and num_splits > 1),
        EARLY_START=early_start,
        PREFETCH_TOKENS=min(triton.next_power_of_2(split_len), 512) if prefetch else 0,
        LINE_ELEMS=min(line_elems, block_d),
        DYN_SPLIT=dynamic_splits,
        TRANSPOSED=form == "t",
        HEAD_STREAMS=head_streams,
        KEY_SUB=key_sub if head_streams else 1,
        LEAN=bool(lean) and head_streams,
        EARLY_QUERY=early_query,
        SPLIT_TILES=split_tiles,
        num_warps=num_warps,
        num_stages=num_stages,
        **({"launch_pdl": True} if early_start else {}),
    )
    if num_splits > 1 and not fused_merge:
        merge_splits(part_out, part_lse, query_start_loc, out, batch, num_splits, rows_are_seqs=True, pdl=pdl,
                     seq_lens=seq_lens, split_len=split_len, early_dependents=early_start)  # fmt: skip
    return out


__all__ = ["default_num_splits", "paged_decode_attention"]
