"""Paged decode attention (Triton) against `paged_attention_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import attention_case, rel_err, tolerance

from flotilla.kernels.paged_attention import paged_attention_ref

DTYPES = [torch.float32, torch.bfloat16]


def _decode_case(seq_lens, num_heads, num_kv_heads, dtype, *, q_lens=None, **kwargs):
    """One new token per sequence unless `q_lens` says otherwise (0 for a padding sequence)."""
    return attention_case(q_lens or [1] * len(seq_lens), seq_lens, num_heads, num_kv_heads, dtype, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (8, 2), (8, 1)])  # GQA ratio 1, 4, 8
def test_decode_matches_reference_across_split_boundaries(dtype, num_heads, num_kv_heads):
    """Three splits of 48 tokens over contexts of 1..100: partial pages, splits empty and full."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    args = _decode_case([1, 37, 100], num_heads, num_kv_heads, dtype)
    out = paged_decode_attention(*args, 0.2, num_splits=3, block_n=16)
    ref = paged_attention_ref(*args, 0.2)
    assert out.dtype == dtype
    assert rel_err(out, ref) < tolerance(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_fused_merge_matches_reference(dtype):
    """The opt-in merge by the last split program (arrival tickets), padding sequence included; the
    tickets are zero again afterwards, so a second call gives the same result."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    args = _decode_case([1, 37, 0, 100], 8, 2, dtype, q_lens=[1, 1, 0, 1], seed=4)
    out = paged_decode_attention(*args, 0.2, num_splits=3, block_n=16, fused_merge=True)
    assert rel_err(out, paged_attention_ref(*args, 0.2)) < tolerance(dtype)
    again = paged_decode_attention(*args, 0.2, num_splits=3, block_n=16, fused_merge=True)
    assert torch.equal(out[[0, 1, 2]], again[[0, 1, 2]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_fused_merge_odd_group_and_uneven_splits(dtype):
    """The fused merge's `[group, splits, d]` tile with a group of 3 (padded to 4 rows) and 5 splits (padded
    to 8) of a context no split count divides, a padding sequence in the batch."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    args = _decode_case([77, 0, 131], 6, 2, dtype, q_lens=[1, 0, 1], seed=6)
    out = paged_decode_attention(*args, 0.2, num_splits=5, block_n=16, fused_merge=True)
    ref = paged_attention_ref(*args, 0.2)
    assert rel_err(out, ref) < tolerance(dtype)


@pytest.mark.parametrize("merge_chunk", [None, 32])
def test_decode_fused_merge_in_chunks_reads_only_active_splits(merge_chunk):
    """44 splits of 16 keys merged in chunks (8 by default: a 64-split tile over 128 values a thread at 2 warps;
    or 32), the first sequence's keys in fewer splits than the second's (its later splits are empty, never
    read)."""
    from flotilla.kernels.triton_paged_decode import _merge_chunk, paged_decode_attention

    assert _merge_chunk(44, 4, 64, 2) == 8 and _merge_chunk(32, 4, 128, 4) == 32 and _merge_chunk(8, 3, 128, 4) == 8
    args = _decode_case([300, 700], 8, 2, torch.float32, head_dim=64, seed=8)
    out = paged_decode_attention(*args, 0.15, num_splits=44, block_n=16, num_warps=2, fused_merge=True,
                                 merge_chunk=merge_chunk)  # fmt: skip
    assert rel_err(out, paged_attention_ref(*args, 0.15)) < tolerance(torch.float32)


@pytest.mark.parametrize("merge", ["fused", "kernel", "pdl"])
def test_small_launch_splits_by_tokens_in_a_wide_table(monkeypatch, merge):
    """FLOTILLA_DECODE_SMALL_LAUNCH at batch 1: the split count is the table's width over split_tokens (a table
    sized for 1,024 tokens, a context of 150: 32 splits of 32 keys, 5 of them with keys), each merge path;
    FLOTILLA_DECODE_FUSED_MERGE=0 overrides the launch's merge."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k, v, tables, qsl, lens = _decode_case([150], 8, 2, torch.bfloat16, seed=9)
    wide = torch.zeros(1, 1024 // 16, dtype=tables.dtype, device=tables.device)
    wide[:, : tables.shape[1]] = tables
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", f"32,4,2,32,{merge}" + (",4" if merge == "fused" else ""))
    out = paged_decode_attention(query, k, v, wide, qsl, lens, 0.2)
    assert rel_err(out, paged_attention_ref(query, k, v, tables, qsl, lens, 0.2)) < tolerance(torch.bfloat16)
    monkeypatch.setenv("FLOTILLA_DECODE_FUSED_MERGE", "0")  # the env wins over the launch's merge
    again = paged_decode_attention(query, k, v, wide, qsl, lens, 0.2)
    assert rel_err(again, out) < 1e-2


@pytest.mark.parametrize("launch", ["64,4,3,128,fused", "64,4,2,64,fused+dep", "128,4,2,128,fused",
                                    "64,4,3,256,fused+dyn"])
def test_small_launch_with_wide_tiles_equals_the_default_at_short_context(monkeypatch, launch):
    """At a context within one 64-key tile (the engine's greedy-token check: a 32-token prompt) a small launch of
    >= 64-key tiles at the default's 4 warps computes what the general launch does, bit for bit: one split holds
    every key in one tile, and the fused merge of one active split returns its partial as the merge kernel does.
    (Session 10's 32-key launch split such a context over two tiles: other roundings, other greedy tokens.)"""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k, v, tables, qsl, lens = _decode_case([45], 32, 8, torch.bfloat16, seed=11)
    wide = torch.zeros(1, 1024 // 16, dtype=tables.dtype, device=tables.device)
    wide[:, : tables.shape[1]] = tables
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "0")
    default = paged_decode_attention(query, k, v, wide, qsl, lens, 0.2)
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", launch)
    assert torch.equal(paged_decode_attention(query, k, v, wide, qsl, lens, 0.2), default)


@pytest.mark.parametrize("seq_len", [45, 300, 333, 700])
def test_dynamic_splits_cut_each_length_into_equal_page_ranges(seq_len):
    """"dyn": the kernel cuts a length into floor(length / split_tokens) ranges of whole pages (300 / 64 keys: 4
    ranges of 80, so 300 = 4 x 64 + 44 adds no fifth split; 45: one range), each tile straddling range ends,
    against the reference, in a table wider than the context; at 45 keys (one 64-key tile) bit-equal to the
    default launch."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k, v, tables, qsl, lens = _decode_case([seq_len], 8, 2, torch.bfloat16, seed=12)
    wide = torch.zeros(1, 1024 // 16, dtype=tables.dtype, device=tables.device)
    wide[:, : tables.shape[1]] = tables
    out = paged_decode_attention(query, k, v, wide, qsl, lens, 0.2, block_n=64, num_warps=4, split_tokens=64,
                                 fused_merge=True, dynamic_splits=True)  # fmt: skip
    assert rel_err(out, paged_attention_ref(query, k, v, tables, qsl, lens, 0.2)) < tolerance(torch.bfloat16)
    if seq_len <= 64:
        assert torch.equal(out, paged_decode_attention(query, k, v, wide, qsl, lens, 0.2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("launch", [{"num_splits": 3, "block_n": 16}, {"num_splits": 1, "block_n": 32},
                                    {"num_splits": 5, "block_n": 16, "fused_merge": True},
                                    {"split_tokens": 64, "block_n": 32, "fused_merge": True}])  # fmt: skip
def test_early_query_equals_the_plain_loop(dtype, launch):
    """`early_query` (the query read at the sequence's index first, again at its row where that differs) bit for bit
    the plain loop, and against the reference: ragged lengths (a split of one partial tile, empty splits, a 1-key
    context), a padding sequence (so the later sequences' rows are not their indices, and the last index is past
    the query's rows), a GQA group of 4, the merge kernel and the fused merge, in a table wider than every context
    (whose padding pages hold NaN), twice in a row (the fused merge's tickets are zero again)."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k, v, tables, qsl, lens = _decode_case([1, 37, 0, 100, 150], 8, 2, dtype, q_lens=[1, 1, 0, 1, 1], seed=21)
    spare = sorted(set(range(k.shape[0])) - set(tables.flatten().tolist()))[0]  # a block no sequence owns
    k[spare], v[spare] = float("nan"), float("nan")  # NaN in the output if a padding key or value counted
    wide = torch.full((tables.shape[0], 320 // 16), spare, dtype=tables.dtype, device=tables.device)
    wide[:, : tables.shape[1]] = tables
    wide[0::2][wide[0::2] < 0] = spare  # the unused entries of even rows NaN too, of odd rows -1
    args = (query, k, v, wide, qsl, lens, 0.2)
    plain = paged_decode_attention(*args, **launch)
    out = paged_decode_attention(*args, early_query=True, **launch)
    again = paged_decode_attention(*args, early_query=True, **launch)
    assert out.shape[0] == 4 and not out.isnan().any()  # one row a query token (the padding sequence has none)
    assert rel_err(out, paged_attention_ref(query, k, v, tables, qsl, lens, 0.2)) < tolerance(dtype)
    assert torch.equal(out, plain) and torch.equal(out, again)


def test_early_query_in_a_mixed_step():
    """A mixed step's decode rows (`out` given: the prompt's rows are the prefill kernel's and stay as they are)
    with `early_query`: every sequence after the prompt has its query at another row than its index."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k, v, tables, qsl, lens = _decode_case([40, 70, 90, 33], 8, 2, torch.float32, q_lens=[1, 3, 1, 1], seed=24)
    plain = torch.full_like(query, 7.0)
    early = torch.full_like(query, 7.0)
    paged_decode_attention(query, k, v, tables, qsl, lens, 0.2, num_splits=2, block_n=16, out=plain)
    paged_decode_attention(query, k, v, tables, qsl, lens, 0.2, num_splits=2, block_n=16, out=early, early_query=True)
    assert torch.equal(early, plain)
    assert torch.equal(early[1:4], torch.full_like(early[1:4], 7.0))  # the prompt's rows untouched
    ref = paged_attention_ref(query, k, v, tables, qsl, lens, 0.2)
    assert rel_err(early[[0, 4, 5]], ref[[0, 4, 5]]) < tolerance(torch.float32)


def test_early_query_env(monkeypatch):
    """FLOTILLA_DECODE_EARLY_QUERY is off by default, "1" turns it on, and a value it does not know is refused."""
    from flotilla.kernels.triton_paged_decode import _early_query_env

    monkeypatch.delenv("FLOTILLA_DECODE_EARLY_QUERY", raising=False)
    assert _early_query_env() is False
    monkeypatch.setenv("FLOTILLA_DECODE_EARLY_QUERY", "1")
    assert _early_query_env() is True
    monkeypatch.setenv("FLOTILLA_DECODE_EARLY_QUERY", "2")
    with pytest.raises(ValueError, match="FLOTILLA_DECODE_EARLY_QUERY"):
        _early_query_env()


def test_small_launch_env_is_checked(monkeypatch):
    """A malformed FLOTILLA_DECODE_SMALL_LAUNCH is refused; "0" is the general launch."""
    from flotilla.kernels.triton_paged_decode import _SMALL_LAUNCH, _small_launch

    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "32,4,2,32,merge")
    with pytest.raises(ValueError):
        _small_launch()
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "32,4,2,fused")
    with pytest.raises(ValueError):
        _small_launch()
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "0")
    assert _small_launch() is None
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "64,4,3,128,pdl")
    assert _small_launch() == (64, 4, 3, 128, "pdl", 0)
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "32,4,2,128,fused,8")
    assert _small_launch() == (32, 4, 2, 128, "fused", 8)
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "32,4,2,128,pdl+early+prefetch")
    assert _small_launch() == (32, 4, 2, 128, "pdl+early+prefetch", 0)
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "64,4,3,128,fused+early+dep+dyn")
    assert _small_launch() == (64, 4, 3, 128, "fused+early+dep+dyn", 0)
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "32,4,2,128,pdl+late")
    with pytest.raises(ValueError):
        _small_launch()
    monkeypatch.delenv("FLOTILLA_DECODE_SMALL_LAUNCH")
    assert _small_launch() == _SMALL_LAUNCH


def test_short_launch_env_is_checked(monkeypatch):
    """FLOTILLA_DECODE_SHORT_LAUNCH: taken by small grids whose block table holds at most `_SHORT_TABLE` tokens, in
    FLOTILLA_DECODE_SMALL_LAUNCH's syntax; unset, the committed `_SHORT_LAUNCH` (None: the small launch everywhere,
    main's behaviour); "0": none; FLOTILLA_DECODE_SMALL_LAUNCH=0 (the general launch) wins over it."""
    from flotilla.kernels.triton_paged_decode import _SHORT_LAUNCH, _SHORT_TABLE, _SMALL_LAUNCH, _small_launch

    monkeypatch.delenv("FLOTILLA_DECODE_SMALL_LAUNCH", raising=False)
    monkeypatch.delenv("FLOTILLA_DECODE_SHORT_LAUNCH", raising=False)
    assert _small_launch(704) == (_SHORT_LAUNCH or _SMALL_LAUNCH)
    monkeypatch.setenv("FLOTILLA_DECODE_SHORT_LAUNCH", "64,4,3,64,fused+dep")
    assert _small_launch(704) == _small_launch(_SHORT_TABLE) == (64, 4, 3, 64, "fused+dep", 0)
    assert _small_launch(_SHORT_TABLE + 16) == _small_launch() == _SMALL_LAUNCH
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", "0")
    assert _small_launch(704) is None
    monkeypatch.delenv("FLOTILLA_DECODE_SMALL_LAUNCH")
    monkeypatch.setenv("FLOTILLA_DECODE_SHORT_LAUNCH", "0")
    assert _small_launch(704) == _SMALL_LAUNCH
    for bad in ("64,4,3,64", "64,4,3,64,fused+late", "64,4,3,x,fused"):
        monkeypatch.setenv("FLOTILLA_DECODE_SHORT_LAUNCH", bad)
        with pytest.raises(ValueError, match="FLOTILLA_DECODE_SHORT_LAUNCH"):
            _small_launch(704)


# bench/results/gpu-2026-12-07-s34/short.sh's candidates (`SHORT_CANDIDATES` in bench/early_query_ab.py)
@pytest.mark.parametrize("launch", ["64,4,3,64,fused+dep", "64,4,2,64,fused+dep", "32,4,3,32,fused+dep",
                                    "32,4,3,64,fused+dep", "128,8,2,128,fused+dep", "64,4,3,128,fused+dep",
                                    "32,2,3,32,fused+dep"])
def test_short_launch_matches_reference_in_the_engines_short_table(monkeypatch, launch):
    """Each short-table candidate at the engine's context-512 conditions scaled down: Llama's group of 4 query heads
    a KV head, a context of 300 in a 704-token table (bench/latency.py's width at context 512: 44 pages), so that most
    splits are empty and the live ones end mid-tile; one padding sequence would make the grid too large, so batch 1.
    Equal to the reference within bf16's tolerance, and to the small launch (other split points: other roundings)."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k, v, tables, qsl, lens = _decode_case([300], 8, 2, torch.bfloat16, seed=21)
    wide = torch.zeros(1, 704 // 16, dtype=tables.dtype, device=tables.device)
    wide[:, : tables.shape[1]] = tables
    ref = paged_attention_ref(query, k, v, tables, qsl, lens, 0.2)
    monkeypatch.delenv("FLOTILLA_DECODE_SMALL_LAUNCH", raising=False)
    monkeypatch.setenv("FLOTILLA_DECODE_SHORT_LAUNCH", "0")
    small = paged_decode_attention(query, k, v, wide, qsl, lens, 0.2)
    monkeypatch.setenv("FLOTILLA_DECODE_SHORT_LAUNCH", launch)
    out = paged_decode_attention(query, k, v, wide, qsl, lens, 0.2)
    assert rel_err(out, ref) < tolerance(torch.bfloat16)
    assert rel_err(out, small) < tolerance(torch.bfloat16)


@pytest.mark.parametrize("launch", ["64,4,3,256,fused+dep", "32,4,3,128,fused", "64,4,2,192,kernel",
                                    "64,4,3,64,fused+dep"])
@pytest.mark.parametrize("table_tokens", [704, 1088])
def test_pages_ahead_equals_the_loop_that_reads_them(monkeypatch, launch, table_tokens):
    """Flag "pages" (`SPLIT_TILES`): each program's split pages read up front and picked from registers in the key
    loop give the same numbers, bit for bit, as the loop that reads the next tile's pages in each iteration (same
    tiles, same order): at Llama's group of 4, a context of 300 (mid-tile, most splits empty) and of 700, in a
    704-token table (bench/latency.py's at context 512) and a wider one; 4, 3 (padded to 4) and 1 tile a split."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    ctx = 300 if table_tokens == 704 else 700
    query, k, v, tables, qsl, lens = _decode_case([ctx], 8, 2, torch.bfloat16, seed=23)
    wide = torch.zeros(1, table_tokens // 16, dtype=tables.dtype, device=tables.device)
    wide[:, : tables.shape[1]] = tables
    monkeypatch.delenv("FLOTILLA_DECODE_SHORT_LAUNCH", raising=False)
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", launch)
    plain = paged_decode_attention(query, k, v, wide, qsl, lens, 0.2)
    fields = launch.split(",")
    monkeypatch.setenv("FLOTILLA_DECODE_SMALL_LAUNCH", ",".join([*fields[:4], fields[4] + "+pages"]))
    assert torch.equal(paged_decode_attention(query, k, v, wide, qsl, lens, 0.2), plain)
    assert rel_err(plain, paged_attention_ref(query, k, v, tables, qsl, lens, 0.2)) < tolerance(torch.bfloat16)


def test_pages_ahead_by_keyword_equals_without():
    """`pages_ahead=True` outside the small launch: ignored with key streams (the plain loop), taken by one split of the
    whole 208-token table (4 tiles); the same output as without it either way."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    query, k, v, tables, qsl, lens = _decode_case([200], 8, 2, torch.bfloat16, seed=29)
    for kwargs in ({"key_streams": 2, "block_n": 32}, {"num_splits": 1}):
        want = paged_decode_attention(query, k, v, tables, qsl, lens, 0.2, **kwargs)
        got = paged_decode_attention(query, k, v, tables, qsl, lens, 0.2, pages_ahead=True, **kwargs)
        assert torch.equal(got, want)


def test_decode_single_split_writes_output_directly():
    """With one split the merge kernel is skipped; shared prefix blocks read the same pages."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    args = _decode_case([40, 70], 4, 1, torch.float32, share=2, seed=1)
    out = paged_decode_attention(*args, 0.3, num_splits=1, block_n=32)
    assert rel_err(out, paged_attention_ref(*args, 0.3)) < 1e-5


def test_decode_skips_sequences_without_a_query_token():
    """A padding sequence (q_len 0, seq_len 0) writes nothing and does not shift others' rows."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    args = _decode_case([33, 0, 17], 4, 2, torch.float32, q_lens=[1, 0, 1], seed=2)
    out = paged_decode_attention(*args, 0.25, num_splits=2, block_n=16)
    assert rel_err(out, paged_attention_ref(*args, 0.25)) < 1e-5


def test_default_split_choice_fills_the_gpu_and_stays_in_bounds():
    """Shapes alone pick the splits: many for one long sequence, one for a large batch."""
    from flotilla.kernels.triton_paged_decode import default_num_splits

    assert default_num_splits(1, 8, 4096, 132, 64) == 32
    assert default_num_splits(256, 8, 4096, 132, 64) == 1
    assert default_num_splits(1, 8, 16, 132, 64) == 1
    # a denser wave (the fp8 pool's transposed streams, `_FP8_WAVE`): 2 / 4 splits at batch 64 on 132 SMs
    assert default_num_splits(64, 8, 4288, 132, 32) == 1
    assert default_num_splits(64, 8, 4288, 132, 32, wave=8) == 2
    assert default_num_splits(64, 8, 4288, 132, 16, wave=16) == 4


@pytest.mark.parametrize("head_dim", [48, 128])
def test_decode_head_dims_padded_and_full(head_dim):
    """A head size below its power-of-two tile (masked lanes) and Llama's 128, GQA 4, bf16."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    args = _decode_case([70, 129], 8, 2, torch.bfloat16, head_dim=head_dim, seed=5)
    out = paged_decode_attention(*args, head_dim**-0.5, num_splits=2, block_n=32)
    assert rel_err(out, paged_attention_ref(*args, head_dim**-0.5)) < tolerance(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("launch", [{"pdl_merge": True}, {"fused_merge": True},
                                    {"fused_merge": True, "num_splits": 128, "block_n": 32},
                                    {"fused_merge": True, "num_splits": 16, "merge_chunk": 8},
                                    {"fused_merge": True, "early_start": True, "prefetch": True},
                                    {"pdl_merge": True, "early_start": True, "prefetch": True, "num_splits": 128,
                                     "block_n": 32},
                                    {"fused_merge": True, "split_tokens": 256, "dynamic_splits": True,
                                     "dependents": True, "num_stages": 5},
                                    {"fused_merge": True, "split_tokens": 64, "dynamic_splits": True,
                                     "early_start": True, "num_stages": 2},
                                    {"fused_merge": True, "split_tokens": 256, "block_n": 64, "num_stages": 3,
                                     "dependents": True, "early_query": True},
                                    {"fused_merge": True, "split_tokens": 128, "block_n": 32, "num_stages": 3,
                                     "early_query": True},
                                    {"fused_merge": True, "split_tokens": 256, "block_n": 64, "num_stages": 3,
                                     "dependents": True, "pages_ahead": True},
                                    {"fused_merge": True, "split_tokens": 256, "block_n": 32, "num_stages": 5,
                                     "dependents": True, "pages_ahead": True}])  # fmt: skip
def test_cuda_decode_merge_by_dependent_launch_replays_in_a_graph(launch):
    """Batch 1 x 4,000 tokens at Llama-3-8B heads (32 splits unless given): the merge kernel launched by
    programmatic dependent launch, or the fused merge (the last split program of each KV head, by arrival
    tickets), captured in a CUDA graph, gives the reference output on every replay (the merge kernel must wait
    for the split programs' partials, though the split kernel lets it start at once; the tickets are zero
    again after every call); also with the split kernel itself started early by PDL and its keys and values
    prefetched into L2, and with each length cut in the kernel (`dynamic_splits`: 4,000 keys into 15 ranges of
    272; 62 ranges of 65 keys rounded to 80, 50 of which hold keys), and with the early query (`early_query`: the
    engine's small launch, and at 32-key tiles), and with each split's pages read up front (`pages_ahead`)."""
    from kernel_cases import batch_meta, paged_pool

    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    g = torch.Generator().manual_seed(5)
    k, v, tables = paged_pool([4000], 8, 128, torch.bfloat16, generator=g)
    query = torch.randn(1, 32, 128, generator=g).bfloat16().cuda()
    qsl, lens = batch_meta([1], [4000])
    run = lambda: paged_decode_attention(query, k, v, tables, qsl, lens, 0.088, **launch)  # noqa: E731
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    ref = paged_attention_ref(query, k.float(), v.float(), tables, qsl, lens, 0.088)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, ref) < 1e-2


def test_bf16_launch_and_wave_overrides(monkeypatch):
    """FLOTILLA_DECODE_BF16_LAUNCH (tiles, key streams) and FLOTILLA_DECODE_WAVE (more splits) change only the
    launch: the result still matches the reference, and the wave sets the split count the shapes give."""
    from flotilla.kernels.triton_paged_decode import default_num_splits, paged_decode_attention

    args = _decode_case([1, 37, 100], 8, 2, torch.bfloat16, seed=5)
    monkeypatch.setenv("FLOTILLA_DECODE_BF16_LAUNCH", "32,2,3,2")
    monkeypatch.setenv("FLOTILLA_DECODE_WAVE", "8")
    out = paged_decode_attention(*args, 0.2)
    assert rel_err(out, paged_attention_ref(*args, 0.2)) < tolerance(torch.bfloat16)
    assert default_num_splits(64, 8, 4096, 132, 64) == 2
    monkeypatch.delenv("FLOTILLA_DECODE_WAVE")
    assert default_num_splits(64, 8, 4096, 132, 64) == 1
