"""The CPU attention path computes the reference's function: decode, prefill and extend, all GQA ratios."""

from __future__ import annotations

import pytest
import torch

from flotilla.kernels.cpu_attention import paged_attention_cpu
from flotilla.kernels.paged_attention import paged_attention_ref


def _case(q_lens, seq_lens, heads, kv_heads, dtype, block_size=8, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-s // block_size) for s in seq_lens) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    ids = torch.randperm(num_blocks, generator=g).tolist()  # shuffled blocks
    width = max(-(-s // block_size) for s in seq_lens)
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for i, s in enumerate(seq_lens):
        n = -(-s // block_size)
        tables[i, :n] = torch.tensor([ids.pop() for _ in range(n)])
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(sum(q_lens), heads, dim, generator=g).to(dtype)
    return query, k_cache, v_cache, tables, starts, torch.tensor(seq_lens, dtype=torch.int32)


@pytest.mark.parametrize("ratio", [1, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("q_lens", "seq_lens"),
    [([1, 1, 1], [5, 17, 33]), ([9, 20], [9, 20]), ([4, 1, 12], [20, 7, 12]), ([3], [40])],
    ids=["decode", "prefill", "mixed-with-prefix", "extend"],
)
def test_cpu_path_equals_reference(q_lens, seq_lens, ratio, dtype):
    args = _case(q_lens, seq_lens, heads=2 * ratio, kv_heads=2, dtype=dtype)
    max_q = max(q_lens)
    got = paged_attention_cpu(*args, 0.2, max_query_len=max_q)
    want = paged_attention_ref(*args, 0.2)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
