"""Paged prefill/extend attention (Triton) against `paged_attention_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import attention_case, rel_err, tolerance

from flotilla.kernels.paged_attention import paged_attention_ref

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 1), (8, 1)])  # GQA ratio 1, 4, 8
def test_prefill_without_cached_prefix(dtype, num_heads, num_kv_heads):
    """Fresh prompts: every context token is a new token; tiles end mid-page and mid-tile. 64-row
    tiles pack up to 4 query heads of a KV head (ratio 8: two tiles per KV head)."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case([21, 40], [21, 40], num_heads, num_kv_heads, dtype)
    out = paged_prefill_attention(*args, 0.2, block_m=64, block_n=16)
    assert out.dtype == dtype
    assert rel_err(out, paged_attention_ref(*args, 0.2)) < tolerance(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_over_cached_prefix_with_shared_blocks(dtype):
    """New tokens after a cached prefix (prefix-cache hit / chunked prefill); two sequences share
    their first two pages; the unmasked prefix loop and the diagonal tiles both run."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case([19, 9], [83, 45], 4, 1, dtype, share=2, seed=3)
    out = paged_prefill_attention(*args, 0.2, block_m=64, block_n=16)
    assert rel_err(out, paged_attention_ref(*args, 0.2)) < tolerance(dtype)


def test_mixed_batch_of_decode_extend_and_empty_sequences():
    """One flattened batch: a decode token, an empty (padding) sequence, an extend chunk."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case([1, 0, 17], [50, 0, 30], 4, 2, torch.float32, seed=4)
    ref = paged_attention_ref(*args, 0.3)
    for pack_heads in (True, False):  # one head per tile, or both heads of a KV head
        out = paged_prefill_attention(*args, 0.3, block_m=32, block_n=32, pack_heads=pack_heads)
        assert rel_err(out, ref) < 1e-5


def test_head_packing_keeps_tiles_within_one_kv_head():
    """Packed heads divide the GQA group (a power of two) and leave >= 16 tokens per tile."""
    from flotilla.kernels.triton_paged_prefill import heads_per_tile

    assert [heads_per_tile(g, 128) for g in (1, 2, 4, 6, 7, 8, 16)] == [1, 2, 4, 2, 1, 8, 8]
    assert heads_per_tile(8, 64) == 4


@pytest.mark.parametrize("head_dim", [48, 128])
def test_extend_head_dims_padded_and_full(head_dim):
    """A head size below its power-of-two tile (masked lanes) and Llama's 128, GQA 4, bf16."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case([20, 7], [52, 7], 8, 2, torch.bfloat16, head_dim=head_dim, seed=6)
    out = paged_prefill_attention(*args, head_dim**-0.5, block_m=64, block_n=32)
    assert rel_err(out, paged_attention_ref(*args, head_dim**-0.5)) < tolerance(torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [2, 5])
def test_few_new_tokens_over_a_long_context_with_split_keys(dtype, num_splits):
    """An extend after a long cached prefix, keys cut into ranges (the shorter sequence leaves some
    ranges empty) and merged; a padding sequence in between has no tokens."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case([3, 0, 5], [150, 0, 77], 4, 1, dtype, seed=7)
    out = paged_prefill_attention(*args, 0.2, block_m=32, block_n=16, num_splits=num_splits)
    assert rel_err(out, paged_attention_ref(*args, 0.2)) < tolerance(dtype)


def test_splits_only_when_the_query_tiles_leave_the_gpu_idle():
    """A 20-token extend over 2,064 keys (one tile per KV head) splits; a 2,048-token prompt does not."""
    from flotilla.kernels.triton_paged_prefill import default_num_splits

    assert default_num_splits(32, 8, 32, 2064, 132, 32) == 16
    assert default_num_splits(2048, 8, 32, 2064, 132, 32) == 1
    assert default_num_splits(32, 8, 32, 64, 132, 32) == 1  # a short context: nothing to split


def test_the_step_memo_keeps_one_tile_map_for_every_layer():
    """Layers of one step share the tile map through the step's memo (`AttentionMetadata.derived`): the
    second layer's call finds it, outputs equal the memo-less call's, and another step's metadata (a new
    `query_start_loc`) gets its own."""
    from flotilla.kernels import triton_paged_prefill as prefill

    args = attention_case([20, 0, 3], [150, 0, 40], 4, 1, torch.float32, seed=8)
    memo: dict = {}
    first = prefill.paged_prefill_attention(*args, 0.2, block_m=32, block_n=16, step_memo=memo, dead_last=False)
    assert len(memo) == 1
    (tile_seq, tile_start), = memo.values()
    # 2 heads x 16 tokens a tile: 2 tiles, none, 1; the grid's 4 tile slots (`tile_slots`), the last past the end
    assert tile_start.tolist() == [0, 2, 2] and tile_seq.tolist() == [0, 0, 2, 3]
    listed = prefill.paged_prefill_attention(*args, 0.2, block_m=32, block_n=16, step_memo=memo, dead_last=True)
    assert len(memo) == 2 and torch.equal(first, listed)
    (tile_seq, tile), = (v for k, v in memo.items() if k[-1])
    # the old launch ran the map backwards (its program i took tile slot 3 - i): dead, (2, 0), (0, 1), (0, 0);
    # listed, the live tiles come first in that order
    assert tile_seq.tolist() == [2, 0, 0, 3] and tile.tolist()[:3] == [0, 1, 0]
    memo.clear()
    first = prefill.paged_prefill_attention(*args, 0.2, block_m=32, block_n=16, step_memo=memo)
    assert len(memo) == 1
    second = prefill.paged_prefill_attention(*args, 0.2, block_m=32, block_n=16, step_memo=memo)
    assert len(memo) == 1 and torch.equal(first, second)
    assert torch.equal(first, prefill.paged_prefill_attention(*args, 0.2, block_m=32, block_n=16))
    assert rel_err(first, paged_attention_ref(*args, 0.2)) < tolerance(torch.float32)
    query, k_cache, v_cache, tables, qsl, lens = args
    prefill.paged_prefill_attention(query, k_cache, v_cache, tables, qsl.clone(), lens, 0.2, block_m=32, block_n=16,
                                    step_memo=memo)
    assert len(memo) == 2


@pytest.mark.parametrize("num_splits", [4, 16])
def test_split_keys_that_start_after_a_query_position_stay_finite(num_splits):
    """A short extend whose new positions straddle a split boundary: rows before the boundary see no key
    in the splits after it (every score masked). Such a split must end empty (no weight in the merge),
    not NaN (exp2(-inf - -inf)): 20 new tokens at positions 80..99 over 32-key splits at 96."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case([20], [100], 4, 1, torch.float32, seed=1)
    out = paged_prefill_attention(*args, 0.2, block_m=128, block_n=32, num_splits=num_splits)
    assert not torch.isnan(out).any()
    assert rel_err(out, paged_attention_ref(*args, 0.2)) < tolerance(torch.float32)


def test_half_partials_stay_within_bf16_tolerance():
    """Split partials kept in bf16 (`half_partials`, FLOTILLA_EXTEND_ATTN's fifth field): merged in fp32,
    within bf16's bound of the reference; an fp32 query keeps fp32 partials (exact as before)."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    for dtype in DTYPES:
        args = attention_case([20], [150], 4, 1, dtype, seed=9)
        out = paged_prefill_attention(*args, 0.2, block_m=128, block_n=32, num_splits=4, half_partials=True)
        assert rel_err(out, paged_attention_ref(*args, 0.2)) < tolerance(dtype)


@pytest.mark.parametrize("launch", ["default", (32, 1, 4, 2, True), None])
def test_the_split_launch_keeps_the_reference(monkeypatch, launch):
    """`SPLIT_LAUNCH` (the launch of calls that split keys: the measured default, one 32-key tile a split
    with bf16 partials, or none: the general defaults) changes how the keys are cut, not the result; calls
    that do not split keep their own launch."""
    from flotilla.kernels import triton_paged_prefill as prefill

    if launch != "default":
        monkeypatch.setattr(prefill, "SPLIT_LAUNCH", launch)
    for q_lens, seq_lens in (([20], [300]), ([21, 40], [21, 40])):
        args = attention_case(q_lens, seq_lens, 4, 1, torch.bfloat16, seed=10)
        out = prefill.paged_prefill_attention(*args, 0.2)
        assert rel_err(out, paged_attention_ref(*args, 0.2)) < tolerance(torch.bfloat16)


def test_the_split_launch_default_gives_the_measured_launch_at_the_benchmark_shape():
    """20 new tokens in the 32-row graph over a 2,064-token table, Llama-3.1-8B heads on 132 SMs: 16 splits of
    64-key tiles (the launch bench/extend_attention.py timed at 16.1 us against 20.7)."""
    from flotilla.kernels.triton_paged_prefill import SPLIT_LAUNCH, default_num_splits

    assert SPLIT_LAUNCH is not None
    block_n, min_tiles, warps, stages, half = SPLIT_LAUNCH
    assert (block_n, warps, stages, half) == (64, 8, 3, False)
    assert default_num_splits(32, 8, 32, 2064, 132, block_n, min_tiles) == 16


# (q_lens, seq_lens, heads, kv_heads, share, splits): fresh prompts ending mid-page and mid-tile; an extend over a
# cached prefix with shared pages (chunked prefill); decode rows, a padding sequence and an extend in one batch;
# a short extend whose keys are split (splits that start after some rows' positions)
LOOP_CASES = [
    ([21, 40, 7], [21, 40, 7], 8, 2, 0, 1),
    ([19, 9], [83, 45], 4, 1, 2, 1),
    ([1, 0, 17, 1, 33], [50, 0, 30, 9, 70], 4, 2, 0, 1),
    ([20, 3], [100, 150], 4, 1, 0, 4),
]


@pytest.mark.parametrize("case", LOOP_CASES)
def test_the_lean_loop_equals_the_old_one(case):
    """FLOTILLA_PREFILL_LEAN's loop (32-bit indices, the scale on each row's max, shared K/V offsets) does the
    old loop's arithmetic: the same output bit for bit under the interpreter (compiled, the fused multiply-add
    may round the exponent's argument once where the old loop rounded it twice), both the reference's."""
    from kernel_cases import INTERPRETING

    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    q_lens, seq_lens, heads, kv_heads, share, splits = case
    args = attention_case(q_lens, seq_lens, heads, kv_heads, torch.float32, share=share, seed=21)
    knobs = {"block_m": 32, "block_n": 16, "num_splits": splits}
    old = paged_prefill_attention(*args, 0.2, lean=False, rescale_tau=0.0, **knobs)
    lean = paged_prefill_attention(*args, 0.2, lean=True, rescale_tau=0.0, **knobs)
    ref = paged_attention_ref(*args, 0.2)
    assert rel_err(old, ref) < 1e-5 and rel_err(lean, ref) < 1e-5
    if INTERPRETING:
        assert torch.equal(lean, old)


@pytest.mark.parametrize("case", LOOP_CASES)
@pytest.mark.parametrize("tau", [0.5, 8.0])
def test_lazy_rescaling_keeps_the_reference(case, tau):
    """FLOTILLA_PREFILL_LAZY_RESCALE: a tile rescales only when a row's max grew by more than tau. Scores
    spread wide (scale 2: maxima grow by more than 8 across tiles, and by less) take both branches; rows that
    see no key in a split stay empty, not NaN; the output is the reference's, lean loop or old. At tau 8 some
    tile kept its old max (else the output would equal the eager rescale's bit for bit)."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    q_lens, seq_lens, heads, kv_heads, share, splits = case
    args = attention_case(q_lens, seq_lens, heads, kv_heads, torch.float32, share=share, seed=22)
    ref = paged_attention_ref(*args, 2.0)
    knobs = {"block_m": 32, "block_n": 16, "num_splits": splits}
    for lean in (True, False):
        out = paged_prefill_attention(*args, 2.0, lean=lean, rescale_tau=tau, **knobs)
        assert rel_err(out, ref) < 1e-5
    if tau == 8.0:
        assert not torch.equal(out, paged_prefill_attention(*args, 2.0, lean=False, rescale_tau=0.0, **knobs))


@pytest.mark.parametrize("case", LOOP_CASES)
def test_the_listed_tile_map_computes_the_same_tiles(case):
    """FLOTILLA_PREFILL_DEAD_LAST: programs read their (sequence, tile) from the listed map, dead programs
    last; every tile is computed as before (bit for bit, compiled too), the mixed step's decode rows skipped
    or not, keys split or not."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    q_lens, seq_lens, heads, kv_heads, share, splits = case
    args = attention_case(q_lens, seq_lens, heads, kv_heads, torch.float32, share=share, seed=25)
    knobs = {"block_m": 32, "block_n": 16, "num_splits": splits}
    for skip in (False, True):
        old = torch.zeros_like(args[0])
        paged_prefill_attention(*args, 0.2, dead_last=False, skip_decode_rows=skip, out=old, **knobs)
        listed = torch.zeros_like(args[0])
        paged_prefill_attention(*args, 0.2, dead_last=True, skip_decode_rows=skip, out=listed, **knobs)
        assert torch.equal(listed, old)


@pytest.mark.parametrize("case", LOOP_CASES)
def test_the_reciprocal_normalisation_keeps_the_division(case):
    """FLOTILLA_PREFILL_RECIPROCAL: the output times one reciprocal a row, an fp32 rounding from the division an
    element (split partials included), with the lean loop and the old; empty rows (padding) stay zero."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    q_lens, seq_lens, heads, kv_heads, share, splits = case
    args = attention_case(q_lens, seq_lens, heads, kv_heads, torch.float32, share=share, seed=24)
    knobs = {"block_m": 32, "block_n": 16, "num_splits": splits}
    divided = paged_prefill_attention(*args, 0.2, lean=False, reciprocal=False, **knobs)
    for lean in (True, False):
        out = paged_prefill_attention(*args, 0.2, lean=lean, reciprocal=True, **knobs)
        assert rel_err(out, divided) < 1e-6 and not torch.isnan(out).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_lazy_rescaling_at_the_default_launch(dtype):
    """The default 128-row, 32-key launch with lazy rescaling at FlashAttention-4's threshold (alone and with the
    reciprocal normalisation): prompts of lengths off the tiles, a chunk over a cached prefix and a decode row,
    within the dtype's bound of the reference."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case([45, 70, 1], [45, 130, 60], 8, 2, dtype, seed=23)
    ref = paged_attention_ref(*args, 0.3)
    for reciprocal in (False, True):  # and with the reciprocal normalisation: every new form at once
        out = paged_prefill_attention(*args, 0.3, rescale_tau=8.0, reciprocal=reciprocal)
        assert rel_err(out, ref) < tolerance(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_256_row_tiles_keep_the_reference(dtype):
    """The launch bench/prefill_attention.py tries for whole prompts, 256-row tiles (GQA 4: 64 tokens x 4 heads,
    two diagonal key tiles of 32) with 8 warps, the lean loop: prompts off the tiles, a chunk over a cached prefix,
    a decode row."""
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case([100, 45, 1], [100, 170, 60], 8, 2, dtype, seed=26)
    out = paged_prefill_attention(*args, 0.3, block_m=256, block_n=32, num_warps=8, num_stages=3, lean=True)
    assert rel_err(out, paged_attention_ref(*args, 0.3)) < tolerance(dtype)


def test_the_lazy_rescale_switch_reads_a_threshold():
    """FLOTILLA_PREFILL_LAZY_RESCALE: empty is off (0), a threshold in [0, 16] is taken, anything else raises
    naming the variable (a typo must not benchmark the wrong loop)."""
    from flotilla.kernels.triton_paged_prefill import lazy_rescale_tau

    assert lazy_rescale_tau("") == 0.0 and lazy_rescale_tau(" 8 ") == 8.0
    for bad in ("-1", "32", "on"):
        with pytest.raises(ValueError, match="FLOTILLA_PREFILL_LAZY_RESCALE"):
            lazy_rescale_tau(bad)


# (q_lens, seq_lens, table width in pages, splits): a 20-token extend in a table padded past its context (the graph's
# width); an extend and a short prompt whose keys run out before the last splits; a padding sequence between two
LIVE_CASES = [([20], [150], 16, 4), ([5, 12], [300, 12], 20, 8), ([3, 0, 9], [77, 0, 140], 10, 5)]


@pytest.mark.parametrize("case", LIVE_CASES)
def test_live_splits_keep_the_reference_and_weigh_no_empty_partial(monkeypatch, case):
    """`live_splits` (FLOTILLA_EXTEND_LIVE_SPLITS): the keys each tile sees cut evenly, no partial stored for a row
    that saw no key and none weighed by the merge, nor the graph's padding rows merged: with the partial buffers
    filled with NaN (as torch.empty may leave them), the output still equals the reference and the padding rows keep
    what they held, where the old form (every split of a token row stored) merges the padding rows' NaN over them."""
    from flotilla.kernels import triton_paged_prefill as prefill
    from flotilla.kernels import triton_split_merge

    q_lens, seq_lens, width, splits = case
    query, k_cache, v_cache, tables, qsl, lens = attention_case(q_lens, seq_lens, 4, 1, torch.float32, seed=11)
    padded = torch.cat([query, torch.randn(6, *query.shape[1:])])  # 6 padding rows: no sequence's
    tables = torch.cat([tables, torch.zeros(tables.shape[0], width - tables.shape[1], dtype=tables.dtype)], 1)
    want = paged_attention_ref(query, k_cache, v_cache, tables, qsl, lens, 0.2)

    def nan_buffers(out, rows, num_splits):
        return tuple(b.fill_(float("nan")) for b in triton_split_merge.split_buffers(out, rows, num_splits))

    monkeypatch.setattr(prefill, "split_buffers", nan_buffers)
    for live in (True, False):
        out = torch.full_like(padded, 7.0)
        # pdl_merge: a launch attribute on Hopper (tests/kernels/test_hopper_compile.py); the interpreter ignores it
        prefill.paged_prefill_attention(padded, k_cache, v_cache, tables, qsl, lens, 0.2, block_m=32, block_n=16,
                                        num_splits=splits, out=out, live_splits=live, pdl_merge=live)  # fmt: skip
        assert rel_err(out[: query.shape[0]], want) < tolerance(torch.float32)
        assert (out[query.shape[0] :] == 7.0).all() if live else torch.isnan(out[query.shape[0] :]).all()


def test_live_splits_in_a_mixed_step_keep_the_reference(monkeypatch):
    """A mixed step's two launches (`mixed_split_attention`: prompts through the prefill kernel, whose merge writes
    the decode rows first, then the decode kernel) with the live splits on give the reference."""
    from flotilla.kernels import triton_paged_prefill as prefill
    from flotilla.kernels.mixed_attention import mixed_split_attention

    monkeypatch.setattr(prefill, "LIVE_SPLITS", True)
    args = attention_case([1, 20, 1], [90, 200, 40], 4, 1, torch.bfloat16, seed=12)
    out = mixed_split_attention(*args, 0.2, block_m=32, block_n=16, num_splits=4)
    assert rel_err(out, paged_attention_ref(*args, 0.2)) < tolerance(torch.bfloat16)


def test_the_tile_slots_bound_every_batch_and_leave_a_lone_extend_no_dead_slot():
    """`tile_slots` (the grid's tile axis) is never below the tiles of a batch (random q_lens, graph padding rows
    that belong to no sequence included) and is exact for a lone extend: 20 tokens padded to 32 rows, one tile."""
    from flotilla.kernels.triton_paged_prefill import tile_slots

    g = torch.Generator().manual_seed(13)
    for _ in range(500):
        batch, m = int(torch.randint(1, 9, (1,), generator=g)), int(2 ** torch.randint(3, 8, (1,), generator=g))
        q_lens = torch.randint(0, 3 * m, (batch,), generator=g)
        rows = int(q_lens.sum()) + int(torch.randint(0, m, (1,), generator=g))
        assert tile_slots(rows, m, batch) >= int(((q_lens + m - 1) // m).sum())
    assert tile_slots(32, 32, 1) == 1 and tile_slots(20, 32, 1) == 1
