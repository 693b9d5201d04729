"""The CPU rotary + KV write (`cpu_rotary_kv.py`) and the memoised decode gather (`cpu_attention.py`) against the
references: bit-identical outputs and caches."""

from __future__ import annotations

import pytest
import torch

from flotilla.engine.layers.rotary import RotaryEmbedding
from flotilla.kernels.cpu_attention import paged_attention_cpu
from flotilla.kernels.cpu_rotary_kv import _adjacent, rotary_and_write_kv_cpu, rotary_and_write_kv_cpu_ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("padding", [False, True])
def test_rotary_and_kv_write_match_the_reference_bit_for_bit(dtype, fused, padding):
    gen = torch.Generator().manual_seed(1)
    tokens, heads, kv_heads, dim, blocks, block_size = 5, 6, 2, 16, 4, 8
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.reshape(tokens, heads, dim), k.reshape(tokens, kv_heads, dim), v.reshape(tokens, kv_heads, dim)
    if not fused:
        q, k = q.clone(), k.clone()
    positions = torch.tensor([0, 3, 7, 20, 31])
    slots = torch.tensor([1, 9, -1, 17, 30]) if padding else torch.tensor([1, 9, 12, 17, 30])
    cos_sin = RotaryEmbedding(dim, 64, 10000.0, None).cos_sin_cache
    caches = [torch.zeros(blocks, block_size, kv_heads, dim, dtype=dtype) for _ in range(4)]
    memo: dict = {}
    want = rotary_and_write_kv_cpu_ref(positions, q, k, v, cos_sin, caches[0], caches[1], slots)
    for _ in range(2):  # the second call (the next layer) reads the memo
        got = rotary_and_write_kv_cpu(positions, q, k, v, cos_sin, caches[2], caches[3], slots, memo)
        assert torch.equal(got, want)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])


@pytest.mark.parametrize("tokens", [1, 3])
def test_q_and_k_of_a_fused_qkv_rotate_in_one_pass_at_any_row_count(tokens):
    # the model's split: [T, 960] -> q/k/v views, reshaped to heads (at one row the reshape's row strides differ)
    heads, kv_heads, dim = 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(torch.bfloat16)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.reshape(-1, heads, dim), k.reshape(-1, kv_heads, dim), v.reshape(-1, kv_heads, dim)
    both = _adjacent(q, k)
    assert both is not None and both.data_ptr() == qkv.data_ptr()
    assert torch.equal(both[:, :heads], q) and torch.equal(both[:, heads:], k)
    positions = torch.arange(tokens) + 5
    cos_sin = RotaryEmbedding(dim, 64, 10000.0, None).cos_sin_cache
    caches = [torch.zeros(2, 8, kv_heads, dim, dtype=torch.bfloat16) for _ in range(4)]
    slots = torch.arange(tokens) + 3
    want = rotary_and_write_kv_cpu_ref(positions, q, k, v, cos_sin, caches[0], caches[1], slots)
    got = rotary_and_write_kv_cpu(positions, q, k, v, cos_sin, caches[2], caches[3], slots, {})
    assert torch.equal(got, want) and torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])


@pytest.mark.parametrize("lens", [[13], [13, 5, 24], [20]])
def test_memoised_decode_gather_matches_the_plain_decode(lens):
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, blocks, block_size = 6, 2, 16, 12, 8
    k_cache = torch.randn(blocks, block_size, kv_heads, dim, generator=gen).bfloat16()
    v_cache = torch.randn(blocks, block_size, kv_heads, dim, generator=gen).bfloat16()
    tables = torch.tensor([[3, 7, 1, 0], [5, 0, 0, 0], [2, 9, 11, 4]], dtype=torch.int32)[: len(lens)]
    if lens == [20]:  # one row in consecutive blocks: a slice of the pool instead of a gather
        tables = torch.tensor([[4, 5, 6, 0]], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    start = torch.arange(len(lens) + 1, dtype=torch.int32)
    q = torch.randn(len(lens), heads, dim, generator=gen).bfloat16()
    want = paged_attention_cpu(q, k_cache, v_cache, tables, start, seq_lens, 0.25, max_query_len=1)
    memo: dict = {}
    for _ in range(2):
        got = paged_attention_cpu(q, k_cache, v_cache, tables, start, seq_lens, 0.25, max_query_len=1, step_memo=memo)
        assert torch.equal(got, want)
