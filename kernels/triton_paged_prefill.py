"""Paged prefill/extend attention in Triton: any number of new tokens per sequence, causal.

Same contract as `paged_attention_ref` in general (layout in `paged_attention.py`): the new tokens
of a sequence sit at positions `seq_len - q_len ..`, their K/V already written to the pool, and they
attend to the cached prefix and causally to each other, all read straight from the pages (no
gather into a contiguous copy). This covers a fresh prompt, a prompt with a prefix-cache hit, a
chunk of a long prompt, and decode (q_len == 1, though `triton_paged_decode` is faster there).

One program computes a tile of `BLOCK_M` rows, FlashAttention-2 style: new tokens of one sequence
times the query heads that share one KV head (GQA packing: each K/V tile is loaded once for the
whole group). The flattened batch is cut into tiles per sequence; a small
`searchsorted` on the device maps program ids to (sequence, tile), so the grid is an upper bound
computed from shapes and nothing syncs with the host. That map is the same for every layer of a step:
given the step's memo (`step_memo`), the first layer computes it and the others reuse it. Keys left
of the tile's first query are visible to every row and need no mask; only the tiles on the diagonal
pay for the causal mask.

A few new tokens over a long context (an extend after a prefix-cache hit: 20 tokens over 2,000) make
one tile per KV head, 8 programs for a GPU of 132 SMs, each walking the whole context. Such calls
split the keys as the decode kernel does: a third grid axis gives each program one key range, the
programs write partial outputs and log-sum-exps, and `triton_split_merge` combines them. The split
count comes from shapes alone, so the call stays capturable.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from flotilla.kernels.pdl import PDL_ENABLED, pdl_capable
from flotilla.kernels.switches import env_flag
from flotilla.kernels.triton_split_merge import merge_splits, split_buffers, split_length, store_attention_rows
from flotilla.kernels.triton_utils import device_sms, dot_dtype, dot_precision, paged_attention_shapes

_LOG2E = 1.4426950408889634
TILE_MEMO = env_flag("FLOTILLA_PREFILL_TILE_MEMO", True)


def extend_launch(value: str) -> tuple[int, int, int, int, bool] | None:
    """`FLOTILLA_EXTEND_ATTN="block_n,splits,warps,stages[,half]"`: the launch of calls that split their keys
    (a short extend over a long context, where the default's few query tiles leave the GPU idle), for the
    A/B of bench/extend_attention.py's sweep in the engine; `half` = 1 keeps the split partials in the
    query's 16-bit dtype. Empty: the defaults."""
    if not value.strip():
        return None
    fields = [int(x) for x in value.split(",")]
    block_n, splits, warps, stages = fields[:4]
    return block_n, splits, warps, stages, len(fields) > 4 and fields[4] == 1


EXTEND_LAUNCH = extend_launch(os.environ.get("FLOTILLA_EXTEND_ATTN", ""))


def prefill_launch(value: str) -> tuple[int, int, int, int] | None:
    """`FLOTILLA_PREFILL_LAUNCH="block_m,block_n,warps,stages"`: the launch of calls that do not split their keys
    (whole prompts, a mixed step's prompt tiles), for the sweep of bench/mixed_attention.py in the engine. Empty:
    the defaults (128-row tiles, 32-key tiles, 4 warps, 3 stages)."""
    if not value.strip():
        return None
    fields = [int(x) for x in value.split(",")]
    if len(fields) != 4:
        raise ValueError(f"FLOTILLA_PREFILL_LAUNCH={value!r}: expected block_m,block_n,warps,stages")
    block_m, block_n, warps, stages = fields
    return block_m, block_n, warps, stages


PREFILL_LAUNCH = prefill_launch(os.environ.get("FLOTILLA_PREFILL_LAUNCH", ""))

# The key loop's lean form (`paged_prefill_attention`'s `lean`): 32-bit token indices, the scale applied to each
# row's max instead of every score, one set of K/V offsets. The same arithmetic with fewer instructions (the same
# outputs bit for bit under the interpreter); FLOTILLA_PREFILL_LEAN=0 restores the old loop for the A/B.
LEAN = env_flag("FLOTILLA_PREFILL_LEAN", True)


def lazy_rescale_tau(value: str) -> float:
    """`FLOTILLA_PREFILL_LAZY_RESCALE=tau`: lazy rescaling's threshold in log2 units (`paged_prefill_attention`'s
    `rescale_tau`; 8 is FlashAttention-4's); empty or 0: rescale at every key tile (the default)."""
    if not value.strip():
        return 0.0
    try:
        tau = float(value)
    except ValueError:
        tau = -1.0
    if not 0.0 <= tau <= 16.0:  # weights up to 2**tau must stay far from fp32's and bf16's range
        raise ValueError(f"FLOTILLA_PREFILL_LAZY_RESCALE={value!r}: expected a threshold in [0, 16]")
    return tau


RESCALE_TAU = lazy_rescale_tau(os.environ.get("FLOTILLA_PREFILL_LAZY_RESCALE", ""))
# The output's normalisation by one reciprocal a row (`paged_prefill_attention`'s `reciprocal`; off by default: an
# fp32 ulp from the division, so not the old arithmetic bit for bit).
RECIPROCAL = env_flag("FLOTILLA_PREFILL_RECIPROCAL", False)
# The tile map as a list of (sequence, tile) a program, live tiles first (`tile_map`'s `dead_last`): the same tiles
# in the same order, without the dead programs ahead of them or a second, dependent load a program;
# FLOTILLA_PREFILL_DEAD_LAST=0 restores the old map for the A/B.
DEAD_LAST = env_flag("FLOTILLA_PREFILL_DEAD_LAST", True)
# Split keys cut from each tile's own context instead of the table's width, and no bytes for what is empty
# (`paged_prefill_attention`'s `live_splits`); off by default until the device A/B
# (bench/results/gpu-2026-12-07-s35/prefix.sh) shows it faster. FLOTILLA_EXTEND_LIVE_SPLITS=1 turns it on.
LIVE_SPLITS = env_flag("FLOTILLA_EXTEND_LIVE_SPLITS", False)
# The split merge by programmatic dependent launch (`paged_prefill_attention`'s `pdl_merge`; Hopper, FLOTILLA_PDL on):
# scheduled while the split programs run, it waits for them at its top, so the launch gap between the two goes.
# Off until measured (bench/results/gpu-2026-12-07-s35/prefix.sh); FLOTILLA_EXTEND_PDL_MERGE=1 turns it on.
PDL_MERGE = env_flag("FLOTILLA_EXTEND_PDL_MERGE", False)


@triton.jit
def _pages(table, n0, limit, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, LEAN: tl.constexpr):
    """Page numbers of tokens `n0 .. n0 + BLOCK_N` (0 past `limit`, where nothing is read)."""
    tok = n0 + tl.arange(0, BLOCK_N)
    if LEAN:  # token indices are >= 0: an unsigned division by a power-of-two page is one shift
        return tl.load(table + tok.to(tl.uint32) // PAGE, mask=tok < limit, other=0)
    return tl.load(table + tok // PAGE, mask=tok < limit, other=0)


@triton.jit
def _attend_tile(q, m, l, acc, n0, page, q_pos, seq_len, kv, qk_scale, d, d_ok, PAGE: tl.constexpr,
                 BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 LEAN: tl.constexpr, RESCALE_TAU: tl.constexpr, SHARED_KV: tl.constexpr):  # fmt: skip
    """One K/V tile (tokens `n0 ..`, on pages `page`) of the online softmax; `MASKED` tiles apply
    causality and the context end. `LEAN` (`paged_prefill_attention`'s `lean`) and `RESCALE_TAU` (its
    `rescale_tau`): see there; `SHARED_KV`: the K and V pages have the same strides (one set of offsets). `kv`: the
    program's K/V pages (`_prefill_kernel`'s tuple: the caches, the KV head, their strides)."""
    k_cache_ptr, v_cache_ptr, kv_head, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh = kv
    tok = n0 + tl.arange(0, BLOCK_N)
    if MASKED:
        tok_ok = tok < seq_len
        kv_mask = tok_ok[:, None] & d_ok[None, :]
    else:
        kv_mask = d_ok[None, :]
    in_page = (tok.to(tl.uint32) if LEAN else tok) % PAGE  # unsigned: `%` by a power-of-two page is a mask
    page = page.to(tl.int64)
    k_off = page * stride_kb + in_page * stride_ks + kv_head * stride_kh
    k = tl.load(k_cache_ptr + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)
    if LEAN:
        # The max of the raw scores times the (positive) scale is the max of the scaled scores, bit for bit
        # (rounding is monotonic): one multiply a row instead of one a score; the scale goes into the
        # exponent's fused multiply-add below.
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if MASKED:
            s = tl.where((tok[None, :] <= q_pos[:, None]) & tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
    else:
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # log2 domain
        if MASKED:
            s = tl.where((tok[None, :] <= q_pos[:, None]) & tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
    if RESCALE_TAU > 0:
        # Lazy rescaling: keep the old reference max (and skip the accumulator's rescale, a multiply per
        # element of the [rows, head_dim] accumulator) unless some row's max grew by more than RESCALE_TAU
        # (log2 units): the weights then stay <= 2**RESCALE_TAU, exact in fp32 and as relative in bf16.
        # A row that has seen no key keeps m = -inf, and its first key always grows it.
        if tl.max((m_new > m + RESCALE_TAU).to(tl.int32), 0) > 0:
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_ref)
            l = l * alpha
            acc = acc * alpha[:, None]
            m = m_new
        m_new = m
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        # A row that has seen no key yet (every key so far masked: a split that starts after the row's
        # position, in a short extend whose keys are split) keeps m = -inf; subtracting 0 instead keeps
        # alpha and p at 0 rather than exp2(-inf - -inf) = NaN, so its split ends empty (l = 0, no weight).
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_ref)
        l = l * alpha
        acc = acc * alpha[:, None]
    p = tl.exp2(s * qk_scale - m_ref[:, None] if LEAN else s - m_ref[:, None])
    l = l + tl.sum(p, 1)
    v_off = k_off if SHARED_KV else page * stride_vb + in_page * stride_vs + kv_head * stride_vh
    v = tl.load(v_cache_ptr + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)
    acc = acc + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
    return m_new, l, acc


@triton.jit
def _attend_range(q, m, l, acc, table, lo, hi, q_pos, seq_len, kv, qk_scale, d, d_ok, PAGE: tl.constexpr,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  LEAN: tl.constexpr, RESCALE_TAU: tl.constexpr, SHARED_KV: tl.constexpr):  # fmt: skip
    """Keys `lo .. hi` (`lo` on a tile boundary) through the online softmax, tile by tile. Each step
    fetches the next tile's page numbers before attending to the current tile, so the K/V addresses
    never wait on a table read."""
    page = _pages(table, lo, hi, PAGE, BLOCK_N, LEAN)
    for n0 in range(lo, hi, BLOCK_N):
        next_page = _pages(table, n0 + BLOCK_N, hi, PAGE, BLOCK_N, LEAN)
        m, l, acc = _attend_tile(q, m, l, acc, n0, page, q_pos, seq_len, kv, qk_scale, d, d_ok, PAGE, BLOCK_N, MASKED,
                                 DOT_DTYPE, DOT_PRECISION, LEAN, RESCALE_TAU, SHARED_KV)  # fmt: skip
        page = next_page
    return m, l, acc


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    tile_seq_ptr,
    tile_start_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    qk_scale,
    num_seqs,
    split_len,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr,
    TOKENS_PER_TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    LEAN: tl.constexpr = False,
    RESCALE_TAU: tl.constexpr = 0.0,
    SHARED_KV: tl.constexpr = False,
    RECIPROCAL: tl.constexpr = False,
    DEAD_LAST: tl.constexpr = False,
    LIVE_SPLITS: tl.constexpr = False,
    EARLY_DEPENDENTS: tl.constexpr = False,
):
    if EARLY_DEPENDENTS:  # the merge, launched with PDL, may be scheduled now; it waits for this grid at its top
        tl.extra.cuda.gdc_launch_dependents()
    head_block = tl.program_id(1)
    if DEAD_LAST:
        # `tile_map(dead_last=True)` lists each program's sequence and tile, live tiles first (in the order
        # below), the grid's dead programs after them: two independent loads, and no dead program ahead of
        # a live one (each held an SM slot for a load's latency before exiting).
        seq = tl.load(tile_seq_ptr + tl.program_id(0))
        tile = tl.load(tile_start_ptr + tl.program_id(0))
        if seq >= num_seqs:
            return
    else:
        # Reverse the launch order: the last tiles of a sequence see the most keys, so start them
        # first and let the short ones fill in behind (the dead, beyond-the-end programs go first
        # too, and exit at once).
        pid = tl.num_programs(0) - 1 - tl.program_id(0)
        seq = tl.load(tile_seq_ptr + pid)
        if seq >= num_seqs:
            return
        tile = pid - tl.load(tile_start_ptr + seq)
    if LEAN:  # the tile map is int64 (torch's cumsum); token and key indices fit 32 bits, and 64-bit index
        # arithmetic (two instructions an add, a sign-corrected division by the page) filled the key loop
        tile = tile.to(tl.int32)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)

    # Row r of the tile is token `r // HEADS_PER_TILE` and query head `r % HEADS_PER_TILE` of this
    # program's heads, which all share one KV head: each K/V tile loaded serves all of them (GQA).
    r = tl.arange(0, BLOCK_M)
    tokens = tile * TOKENS_PER_TILE + r // HEADS_PER_TILE
    heads = head_block * HEADS_PER_TILE + r % HEADS_PER_TILE
    kv_head = (head_block * HEADS_PER_TILE) // GROUP
    row_ok = tokens < q_len
    q_pos = seq_len - q_len + tokens
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_rows = (q_start + tokens).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(DOT_DTYPE)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    first_q = seq_len - q_len + tile * TOKENS_PER_TILE
    # This program's key range: all keys the tile sees, or one split of them (split_len is a
    # multiple of BLOCK_N, so both loops below start on tile boundaries).
    diag_end = tl.minimum(first_q + TOKENS_PER_TILE, seq_len)
    if LIVE_SPLITS:  # cut the keys this tile sees, not the table's width: every split holds keys, evenly
        split_len = tl.cdiv(tl.cdiv(diag_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
    key_lo = tl.program_id(2) * split_len
    key_hi = tl.minimum(key_lo + split_len, diag_end)
    visible_end = (first_q // BLOCK_N) * BLOCK_N  # keys every row of the tile sees
    kv = (k_cache_ptr, v_cache_ptr, kv_head, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh)
    m, l, acc = _attend_range(
        q, m, l, acc, table, key_lo, tl.minimum(visible_end, key_hi), q_pos, seq_len, kv, qk_scale, d, d_ok,
        PAGE, BLOCK_N, False, DOT_DTYPE, DOT_PRECISION, LEAN, RESCALE_TAU, SHARED_KV,
    )  # fmt: skip
    m, l, acc = _attend_range(
        q, m, l, acc, table, tl.maximum(visible_end, key_lo), key_hi, q_pos, seq_len, kv, qk_scale, d, d_ok,
        PAGE, BLOCK_N, True, DOT_DTYPE, DOT_PRECISION, LEAN, RESCALE_TAU, SHARED_KV,
    )  # fmt: skip
    # Partials are `[tokens, heads, splits]`.
    store_attention_rows(
        acc, m, l, out_ptr, q_rows * stride_ot + heads * stride_oh, part_out_ptr, part_lse_ptr,
        (q_rows * NUM_HEADS + heads) * NUM_SPLITS + tl.program_id(2), d, row_ok, d_ok, NUM_SPLITS, BLOCK_D, RECIPROCAL,
        LIVE_SPLITS,
    )  # fmt: skip


def heads_per_tile(group: int, block_m: int) -> int:
    """Query heads packed into one tile's rows: the largest power of two dividing the GQA group
    (so a tile never straddles two KV heads), leaving at least 16 tokens per tile."""
    heads = 1
    while group % (2 * heads) == 0 and block_m // (2 * heads) >= 16:
        heads *= 2
    return heads


def default_num_splits(
    num_tokens: int, head_blocks: int, tokens_per_tile: int, max_context: int, num_sms: int, block_n: int,
    min_tiles: int = 4,
) -> int:
    """Key splits per tile: only when the query tiles fill less than a quarter of the SMs (a short
    extend over a long context), then ~2 programs per SM, each split over >= `min_tiles` key tiles. A
    whole prompt's tiles fill the GPU alone, and partials would cost memory traffic: no split."""
    programs = triton.cdiv(num_tokens, tokens_per_tile) * head_blocks
    if 4 * programs > num_sms:
        return 1
    want = (2 * num_sms) // programs
    most = max(1, max_context // (min_tiles * block_n))
    return int(max(1, min(want, most, 32)))


# The launch of calls that split their keys, when not the call's own: (BLOCK_N, key tiles a split walks at least,
# warps, stages, bf16 partials); None keeps the general defaults (32-key tiles, >= 4 a split, 4 warps, 3 stages).
# Measured on the H200 (bench/extend_attention.py, session 7 call 4: 20 new tokens over 2,020, Llama-3.1-8B heads,
# prefill kernel + merge in a CUDA graph, K/V from HBM): 64-key tiles, >= 2 a split (16 splits), 8 warps, 3 stages
# 16.1 us a call against the general defaults' 20.7 (32,32,4,3: 19.8; 128-key tiles x 17 splits, 8 warps: 19.8;
# 64-key tiles with 4 warps: 24.8-28.3). At 128 query rows a tile, 8 warps hold the scores and the accumulator with
# half the registers a thread. FLOTILLA_EXTEND_ATTN overrides it (e.g. "32,16,4,3" restores the old launch here).
SPLIT_LAUNCH: tuple[int, int, int, int, bool] | None = (64, 2, 8, 3, False)


def tile_slots(num_tokens: int, tokens_per_tile: int, batch: int) -> int:
    """The grid's tile slots, a bound from shapes on the tiles of any batch of `batch` sequences holding at most
    `num_tokens` new tokens: sum(ceil(q / M)) <= ceil(T / M) + batch - 1, since every sequence whose length is not a
    multiple of M adds one partial tile while the partial tiles' tokens, if any, add at least one to ceil(T / M).
    (The old bound, `+ batch`, left a lone extend's grid half dead: its 20 tokens in one tile, two slots, and the
    dead programs dispatched between the live ones, taking SMs ahead of them.)"""
    return triton.cdiv(num_tokens, tokens_per_tile) + max(batch - 1, 0)


def tile_map(
    query_start_loc: torch.Tensor, tokens_per_tile: int, grid_tiles: int, skip_decode_rows: bool = False,
    dead_last: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each program's sequence (`num_seqs` past the last tile) and each sequence's first tile, on
    the device: tiles per sequence, their exclusive prefix sum, and a `searchsorted` of the program
    ids into it. About eight small kernels, the same for every layer of a step. `skip_decode_rows`: a
    sequence of one new token gets no tile (the decode kernel attends to it).

    `dead_last`: instead, each program's sequence and tile within it (int32), the live tiles first in the
    old launch order (the last sequence's last tile first: the tiles that see the most keys start first),
    the dead programs (sequence `num_seqs`) after them."""
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    tiles = (q_lens + tokens_per_tile - 1) // tokens_per_tile
    if skip_decode_rows:
        tiles = torch.where(q_lens == 1, 0, tiles)
    tile_start = torch.cumsum(tiles, 0) - tiles  # exclusive prefix sum
    tile_ids = torch.arange(grid_tiles, device=query_start_loc.device, dtype=tile_start.dtype)
    if not dead_last:
        tile_seq = torch.searchsorted(tile_start + tiles, tile_ids, right=True)
        return tile_seq, tile_start
    batch = q_lens.shape[0]
    live = tiles.sum() - 1 - tile_ids  # the live tile program i runs, counted from the first; < 0: dead
    seq = torch.searchsorted(tile_start + tiles, live.clamp(min=0), right=True).clamp(max=batch - 1)
    tile = live - tile_start[seq]
    return torch.where(live >= 0, seq, batch).to(torch.int32), tile.to(torch.int32)


def _memoized_tile_map(
    query_start_loc: torch.Tensor, tokens_per_tile: int, grid_tiles: int, step_memo: dict | None,
    skip_decode_rows: bool = False, dead_last: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`tile_map`, computed by the step's first attention layer and reused by the others: inside a
    mixed CUDA graph that is eight graph nodes a step instead of eight a layer (256 for a 32-layer
    model, each a kernel boundary on the critical path of a short extend). FLOTILLA_PREFILL_TILE_MEMO=0
    recomputes it in every layer (the before of the A/B)."""
    if step_memo is None or not TILE_MEMO:
        return tile_map(query_start_loc, tokens_per_tile, grid_tiles, skip_decode_rows, dead_last)
    key = ("prefill_tile_map", query_start_loc.data_ptr(), tokens_per_tile, grid_tiles, skip_decode_rows, dead_last)
    found = step_memo.get(key)
    if found is None:
        found = step_memo[key] = tile_map(query_start_loc, tokens_per_tile, grid_tiles, skip_decode_rows, dead_last)
    return found


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    pack_heads: bool = True,
    num_splits: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    step_memo: dict | None = None,
    half_partials: bool = False,
    skip_decode_rows: bool = False,
    out: torch.Tensor | None = None,
    lean: bool | None = None,
    rescale_tau: float | None = None,
    reciprocal: bool | None = None,
    dead_last: bool | None = None,
    live_splits: bool | None = None,
    pdl_merge: bool | None = None,
) -> torch.Tensor:
    """Causal attention of every sequence's new tokens over its paged context (any q_len >= 0).

    Arguments as `paged_attention_ref`. A tile holds `block_m` rows: with `pack_heads`, the query
    heads of one KV head times `block_m / heads` tokens, so each K/V tile loaded serves the whole
    group; without, one head's `block_m` tokens. `num_splits` defaults to a choice from shapes
    (`default_num_splits`). The tile and launch knobs are exposed for tests and the benchmark;
    defaults suit an H200 at head_dim 128. `step_memo`: a dict that lives for one step (the step's
    `AttentionMetadata.derived`), where the first layer leaves the tile map for the others.
    `half_partials`: split partial outputs in the query's 16-bit dtype (half the bytes written and merged).
    `skip_decode_rows`: sequences of one new token get no tile (a mixed step's decode rows, which the decode
    kernel attends to: `kernels/mixed_attention.py`); their rows of `out` are then undefined (left as they are,
    or, where the keys are split, the merge's values of no partials), for the decode kernel to write after.
    Launch knobs left None: 128-row tiles of 32 keys, 4 warps, 3 stages, or FLOTILLA_PREFILL_LAUNCH's
    (`PREFILL_LAUNCH`) where the keys are not split; `SPLIT_LAUNCH`'s where they are.
    `lean` (None: `LEAN`, FLOTILLA_PREFILL_LEAN, on): the key loop with 32-bit token indices (the tile map is
    int64, and 64-bit index arithmetic took a fifth of the loop's instructions), the row max taken over the raw
    scores and scaled once a row (equal bit for bit: rounding is monotonic), the scale folded into the
    exponent's multiply-add, and one set of offsets for K and V where their pages share strides.
    `rescale_tau` (None: `RESCALE_TAU`, FLOTILLA_PREFILL_LAZY_RESCALE, 0): above 0, a key tile rescales the
    accumulator only when some row's max grew by more than `rescale_tau` (log2 units; FlashAttention-4's lazy
    rescaling), else keeps the old max as the reference. Not bit-equal (the weights are rounded at another
    scale), within bf16's bound; it costs the tile a block-wide vote (a barrier).
    `reciprocal` (None: `RECIPROCAL`, FLOTILLA_PREFILL_RECIPROCAL, off): the output normalised by one reciprocal a
    row instead of a division an element (~400 of the epilogue's ~900 instructions at the default launch).
    `dead_last` (None: `DEAD_LAST`, FLOTILLA_PREFILL_DEAD_LAST, on): the tile map as a list of each program's
    sequence and tile, live tiles first (`tile_map`); the same tiles in the same order.
    `live_splits` (None: `LIVE_SPLITS`, FLOTILLA_EXTEND_LIVE_SPLITS, off; only where the keys are split): each
    tile cuts the keys it sees (not the table's width, which a graph pads: 11 of 16 splits held keys for 2,020 keys
    in the 2,064-token table) into `num_splits` whole key tiles, so every split works and the ranges are even; a row
    that saw no key stores no partial (the merge weighs it 0 whatever its bytes hold), and the merge skips the graph's
    padding rows (in the 32-row graph of a 20-token extend, 12 of 32; the old merge read 8.4 MB of fp32 partials).
    `pdl_merge` (None: `PDL_MERGE`, FLOTILLA_EXTEND_PDL_MERGE, off; only where the keys are split, on a device that
    launches by PDL, `kernels/pdl.py`): every split program lets the merge be scheduled at its start, and the merge,
    launched by PDL, waits for the whole grid before it reads a partial.
    """
    num_tokens, num_heads, head_dim, page, num_kv_heads = paged_attention_shapes(query, k_cache, v_cache)
    batch, group = seq_lens.shape[0], num_heads // num_kv_heads
    out = torch.empty_like(query) if out is None else out
    if batch == 0 or num_tokens == 0:
        return out
    launch = None if block_m or block_n or num_warps or num_stages else PREFILL_LAUNCH
    block_m, block_n = block_m or 128, block_n or 32
    num_warps, num_stages = num_warps or 4, num_stages or 3
    lean = (LEAN if lean is None else lean) and scale > 0  # the row max is scaled after: the scale must be > 0
    rescale_tau = RESCALE_TAU if rescale_tau is None else rescale_tau
    reciprocal = RECIPROCAL if reciprocal is None else reciprocal
    dead_last = DEAD_LAST if dead_last is None else dead_last
    live_splits = LIVE_SPLITS if live_splits is None else live_splits
    pdl_merge = (PDL_MERGE if pdl_merge is None else pdl_merge) and PDL_ENABLED and pdl_capable(query)
    packed = heads_per_tile(group, block_m) if pack_heads else 1
    tokens_per_tile = block_m // packed
    head_blocks = num_heads // packed
    max_context = block_tables.shape[1] * page
    if num_splits is None:
        num_splits = default_num_splits(
            num_tokens, head_blocks, tokens_per_tile, max_context, device_sms(query), block_n
        )
        if num_splits == 1 and launch is not None:
            block_m, block_n, num_warps, num_stages = launch
            packed = heads_per_tile(group, block_m) if pack_heads else 1
            tokens_per_tile, head_blocks = block_m // packed, num_heads // packed
        elif num_splits > 1 and EXTEND_LAUNCH is not None:
            block_n, num_splits, num_warps, num_stages, half_partials = EXTEND_LAUNCH
        elif num_splits > 1 and SPLIT_LAUNCH is not None:
            block_n, min_tiles, num_warps, num_stages, half_partials = SPLIT_LAUNCH
            num_splits = default_num_splits(
                num_tokens, head_blocks, tokens_per_tile, max_context, device_sms(query), block_n, min_tiles
            )
    grid_tiles = tile_slots(num_tokens, tokens_per_tile, batch)
    tile_seq, tile_start = _memoized_tile_map(query_start_loc, tokens_per_tile, grid_tiles, step_memo,
                                              skip_decode_rows, dead_last)  # fmt: skip
    split_len = split_length(max_context, num_splits, block_n)
    block_d = triton.next_power_of_2(head_dim)
    part_out, part_lse = split_buffers(out, num_tokens, num_splits)
    if half_partials and num_splits > 1 and query.element_size() == 2:
        part_out = torch.empty(part_out.shape, dtype=query.dtype, device=query.device)  # stored rounded, merged in fp32
    _prefill_kernel[(grid_tiles, head_blocks, num_splits)](
        query,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        tile_seq,
        tile_start,
        out,
        part_out,
        part_lse,
        scale * _LOG2E,
        batch,
        split_len,
        query.stride(0),
        query.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        HEADS_PER_TILE=packed,
        TOKENS_PER_TILE=tokens_per_tile,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE=page,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        NUM_HEADS=num_heads,
        NUM_SPLITS=num_splits,
        DOT_DTYPE=dot_dtype(query.dtype),
        DOT_PRECISION=dot_precision(query.dtype),
        LEAN=lean,
        RESCALE_TAU=float(rescale_tau),
        SHARED_KV=lean and k_cache.stride()[:3] == v_cache.stride()[:3],
        RECIPROCAL=reciprocal,
        DEAD_LAST=dead_last,
        LIVE_SPLITS=live_splits and num_splits > 1,
        EARLY_DEPENDENTS=pdl_merge and num_splits > 1,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if num_splits > 1:
        merge_splits(part_out, part_lse, query_start_loc, out, num_tokens, num_splits, rows_are_seqs=False,
                     live_only=live_splits, pdl=pdl_merge)  # fmt: skip
    return out


__all__ = ["default_num_splits", "heads_per_tile", "lazy_rescale_tau", "paged_prefill_attention", "prefill_launch",
           "tile_map", "tile_slots"]  # fmt: skip
