"""A mixed step's attention as two launches (`kernels/mixed_attention.py`): decode rows through the decode
kernel, the other sequences through the prefill kernel, into one output; against the one prefill launch and
`paged_attention_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, attention_case, rel_err, tolerance

from flotilla.kernels.paged_attention import paged_attention_ref

FP8 = torch.float8_e4m3fn
# decode rows between and after prompts, an extend over a cached prefix (shared pages), a padding sequence
MIXED_Q = [1, 21, 1, 0, 9, 1, 1]
MIXED_LENS = [40, 21, 33, 0, 45, 17, 64]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_equals_one_prefill_launch_and_the_reference(dtype):
    """Decode rows anywhere in the batch (not only first), prompts, a prefix-cache extend and a padding
    sequence: the two launches give the one prefill launch's output and the reference's."""
    from flotilla.kernels.mixed_attention import mixed_split_attention
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case(MIXED_Q, MIXED_LENS, 8, 2, dtype, share=2, seed=11)
    ref = paged_attention_ref(*args, 0.2)
    one = paged_prefill_attention(*args, 0.2, block_m=64, block_n=16)
    split = mixed_split_attention(*args, 0.2, block_m=64, block_n=16)
    assert rel_err(split, ref) < tolerance(dtype)
    assert rel_err(split, one) < tolerance(dtype)


def test_split_with_the_prompts_keys_split_keeps_the_decode_rows():
    """Where the prefill kernel splits its keys, its merge writes every token row, the skipped decode rows
    included; the decode kernel runs after and its rows are the ones that stay."""
    from flotilla.kernels.mixed_attention import mixed_split_attention

    args = attention_case([3, 1, 5, 1], [150, 90, 77, 120], 4, 1, torch.float32, seed=12)
    out = mixed_split_attention(*args, 0.2, block_m=32, block_n=16, num_splits=3)
    assert rel_err(out, paged_attention_ref(*args, 0.2)) < 1e-5


def test_split_reads_fp8_pages_with_the_scales_folded_in():
    """An fp8 pool: k_scale in the softmax scale, v_scale on the whole output (decode rows and prompt rows
    alike), equal to the reference on the dequantized pages."""
    from flotilla.kernels.mixed_attention import mixed_split_attention

    query, k, v, tables, qsl, lens = attention_case(MIXED_Q, MIXED_LENS, 8, 2, torch.float32, seed=13)
    k8, v8 = k.to(FP8), v.to(FP8)
    k_scale, v_scale = 0.5, 2.0
    out = mixed_split_attention(query, k8, v8, tables, qsl, lens, 0.2 * k_scale, v_scale, block_m=64, block_n=16)
    deq = (k8.float() * k_scale).to(DEVICE), (v8.float() * v_scale).to(DEVICE)
    assert rel_err(out, paged_attention_ref(query, *deq, tables, qsl, lens, 0.2)) < 1e-5


@pytest.mark.parametrize("fused_merge", [False, True])
def test_each_kernel_leaves_the_others_rows_alone(fused_merge):
    """Into a given output, the decode kernel (its splits merged by the merge kernel or in the kernel) writes
    only the rows of one-token sequences and the prefill
    kernel with `skip_decode_rows` only the others' (no split: the rows it skips keep their values)."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    args = attention_case(MIXED_Q, MIXED_LENS, 4, 2, torch.float32, seed=14)
    ref = paged_attention_ref(*args, 0.3)
    decode_rows = torch.tensor([q == 1 for q in MIXED_Q for _ in range(q)], device=DEVICE)
    sentinel = torch.full_like(args[0], 7.0)
    dec = paged_decode_attention(*args, 0.3, num_splits=2, block_n=16, fused_merge=fused_merge, out=sentinel.clone())
    assert rel_err(dec[decode_rows], ref[decode_rows]) < 1e-5
    assert torch.equal(dec[~decode_rows], sentinel[~decode_rows])
    pre = paged_prefill_attention(*args, 0.3, block_m=32, block_n=16, num_splits=1, skip_decode_rows=True,
                                  out=sentinel.clone())  # fmt: skip
    assert rel_err(pre[~decode_rows], ref[~decode_rows]) < 1e-5
    assert torch.equal(pre[decode_rows], sentinel[decode_rows])


def test_tile_map_gives_decode_rows_no_tile():
    """With `skip_decode_rows`, a one-token sequence has no tile: the programs map onto the others only."""
    from flotilla.kernels.triton_paged_prefill import tile_map

    qsl = torch.tensor([0, 1, 21, 22, 22, 31], dtype=torch.int32)  # q_lens 1, 20, 1, 0, 9
    seq, start = tile_map(qsl, 8, 10, skip_decode_rows=True)
    assert seq.tolist() == [1, 1, 1, 4, 4, 5, 5, 5, 5, 5]
    assert start.tolist() == [0, 0, 3, 3, 3]
    seq, _ = tile_map(qsl, 8, 10)
    assert seq.tolist() == [0, 1, 1, 1, 2, 4, 4, 5, 5, 5]
    # listed (FLOTILLA_PREFILL_DEAD_LAST): each program's (sequence, tile), the old launch order's live tiles
    # first (its program i ran the map's entry 9 - i), the dead programs after them
    seq, tile = tile_map(qsl, 8, 10, skip_decode_rows=True, dead_last=True)
    assert seq.tolist() == [4, 4, 1, 1, 1, 5, 5, 5, 5, 5] and tile.tolist()[:5] == [1, 0, 2, 1, 0]
    assert seq.dtype == tile.dtype == torch.int32


def test_the_split_takes_mixed_cuda_steps_of_several_sequences_when_switched_on():
    """Only a CUDA step with a sequence of several new tokens beside others, and only when switched on."""
    from flotilla.kernels import dispatch

    assert dispatch.mixed_split_takes(True, 5, 512, enabled=True)
    assert not dispatch.mixed_split_takes(True, 5, 512, enabled=False)
    assert not dispatch.mixed_split_takes(False, 5, 512, enabled=True)  # the CPU path has its own attention
    assert not dispatch.mixed_split_takes(True, 5, 1, enabled=True)  # pure decode: the decode kernel alone
    assert not dispatch.mixed_split_takes(True, 5, None, enabled=True)  # unknown: the one launch
    assert not dispatch.mixed_split_takes(True, 1, 512, enabled=True)  # one prompt alone
    assert dispatch.mixed_split_takes(True, 5, 512) is dispatch.MIXED_DECODE_SPLIT  # the switch (default on)


def test_prefill_launch_override_parses_four_fields():
    from flotilla.kernels.triton_paged_prefill import prefill_launch

    assert prefill_launch("") is None
    assert prefill_launch("64,64,8,2") == (64, 64, 8, 2)
    with pytest.raises(ValueError, match="FLOTILLA_PREFILL_LAUNCH"):
        prefill_launch("64,64,8")


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8])
def test_split_at_llama_heads_with_default_launches(kv_dtype):
    """Compiled, Llama-3.1-8B heads, the launches' defaults (as the engine calls them): 40 decode rows of
    contexts up to 600 beside three prompts (one over a cached prefix) equal the one prefill launch."""
    from flotilla.kernels.mixed_attention import mixed_split_attention
    from flotilla.kernels.triton_paged_prefill import paged_prefill_attention

    q_lens = [1] * 20 + [200, 37] + [1] * 20 + [128]
    lens = [100 + 25 * i for i in range(20)] + [200, 300] + [600 - 10 * i for i in range(20)] + [128]
    query, k, v, tables, qsl, seq_lens = attention_case(q_lens, lens, 32, 8, torch.bfloat16, head_dim=128, seed=15)
    k, v = k.to(kv_dtype), v.to(kv_dtype)
    args = (query, k, v, tables, qsl, seq_lens)
    one = 2.0 * paged_prefill_attention(*args, 0.1)
    split = mixed_split_attention(*args, 0.1, 2.0)
    assert rel_err(split, one) < tolerance(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8])
def test_dispatch_with_the_switch_on_equals_it_off(monkeypatch, kv_dtype):
    """`dispatch.paged_attention`, the engine's call (K/V scales, the step memo), with FLOTILLA_MIXED_DECODE_SPLIT
    on (set on the module) gives what it gives off."""
    from flotilla.kernels import dispatch

    args = attention_case(MIXED_Q, MIXED_LENS, 32, 8, torch.bfloat16, head_dim=128, seed=16)
    args = (args[0], args[1].to(kv_dtype), args[2].to(kv_dtype), *args[3:])
    scales = {"k_scale": 0.5, "v_scale": 2.0} if kv_dtype == FP8 else {}
    off = dispatch.paged_attention(*args, 0.1, max_query_len=21, step_memo={}, **scales)
    monkeypatch.setattr(dispatch, "MIXED_DECODE_SPLIT", True)
    on = dispatch.paged_attention(*args, 0.1, max_query_len=21, step_memo={}, **scales)
    assert rel_err(on, off) < tolerance(torch.bfloat16)
