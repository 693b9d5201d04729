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
def test_cuda_decode_merge_by_dependent_launch_replays_in_a_graph():
    """Batch 1 x 4,000 tokens at Llama-3-8B heads (32 splits): the merge kernel launched by programmatic
    dependent launch, captured in a CUDA graph, gives the reference output on every replay (it must wait
    for the split programs' partials, though the split kernel lets it start at once)."""
    from kernel_cases import batch_meta, paged_pool

    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    g = torch.Generator().manual_seed(5)
    k, v, tables = paged_pool([4000], 8, 128, torch.bfloat16, generator=g)
    query = torch.randn(1, 32, 128, generator=g).bfloat16().cuda()
    qsl, lens = batch_meta([1], [4000])
    run = lambda: paged_decode_attention(query, k, v, tables, qsl, lens, 0.088, pdl_merge=True)  # noqa: E731
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
