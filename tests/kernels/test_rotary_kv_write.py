"""Rotary fused with the KV-cache write (Triton) against `apply_rotary_ref` + `write_kv_cache_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err
from test_rotary import _cos_sin_cache

from flotilla.kernels.paged_attention import write_kv_cache_ref
from flotilla.kernels.rotary import apply_rotary_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotated_query_and_cached_key_value_match_the_unfused_path(dtype):
    """Strided q/k/v views of one fused QKV row, GQA 3:1, shuffled slots with padding (-1)."""
    from flotilla.kernels.triton_rotary_kv_write import rotary_and_write_kv

    g = torch.Generator().manual_seed(0)
    tokens, heads, kv_heads, dim, blocks, page = 9, 6, 2, 32, 5, 8
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    q_size, kv_size = heads * dim, kv_heads * dim

    def views(t: torch.Tensor):
        q, k, v = t.split([q_size, kv_size, kv_size], dim=-1)
        return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim), v.view(tokens, kv_heads, dim)

    positions = torch.tensor([0, 1, 2, 40, 41, 99, 7, 3, 5])
    slots = torch.randperm(blocks * page, generator=g)[:tokens]
    slots[[2, 6]] = -1
    cache = _cos_sin_cache(128, dim)
    pool = torch.randn(2, blocks, page, kv_heads, dim, generator=g).to(dtype)
    ref_k_cache, ref_v_cache = pool[0].clone(), pool[1].clone()
    q, k, v = views(qkv)
    ref_q, ref_k = apply_rotary_ref(positions, q, k, cache)
    write_kv_cache_ref(ref_k, v, ref_k_cache, ref_v_cache, slots)

    k_cache, v_cache = pool[0].clone().to(DEVICE), pool[1].clone().to(DEVICE)
    out = rotary_and_write_kv(
        positions.to(DEVICE), *views(qkv.to(DEVICE)), cache.to(DEVICE), k_cache, v_cache, slots.to(DEVICE)
    )
    bound = 1e-6 if dtype == torch.float32 else 1e-2
    assert out.dtype == dtype and rel_err(out.cpu(), ref_q) < bound
    assert rel_err(k_cache.cpu(), ref_k_cache) < bound
    assert torch.equal(v_cache.cpu(), ref_v_cache)  # values are copied, not computed
    untouched = torch.ones(blocks * page, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert torch.equal(k_cache.cpu().view(blocks * page, -1)[untouched], pool[0].view(blocks * page, -1)[untouched])
