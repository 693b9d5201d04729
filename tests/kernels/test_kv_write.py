"""KV-cache write (Triton) against `write_kv_cache_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

from flotilla.kernels.paged_attention import write_kv_cache_ref


@pytest.mark.parametrize(
    "src_dtype,cache_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)],
)
def test_kv_write_scatters_to_slots_and_skips_padding(src_dtype, cache_dtype):
    """Shuffled slots across blocks, -1 padding left untouched, values cast to the cache dtype."""
    from flotilla.kernels.triton_kv_write import write_kv_cache

    g = torch.Generator().manual_seed(0)
    num_blocks, page, heads, dim, tokens = 6, 16, 2, 32, 20
    slots = torch.randperm(num_blocks * page, generator=g)[:tokens].to(torch.int64)
    slots[[3, 11]] = -1
    key = torch.randn(tokens, heads, dim, generator=g).to(src_dtype)
    value = torch.randn(tokens, heads, dim, generator=g).to(src_dtype)
    pool = torch.randn(2, num_blocks, page, heads, dim, generator=g).to(cache_dtype)
    ref_k, ref_v = pool[0].clone(), pool[1].clone()
    write_kv_cache_ref(key, value, ref_k, ref_v, slots)
    k_cache, v_cache = pool[0].clone().to(DEVICE), pool[1].clone().to(DEVICE)
    write_kv_cache(key.to(DEVICE), value.to(DEVICE), k_cache, v_cache, slots.to(DEVICE))
    if src_dtype == cache_dtype:  # a pure copy: bit-exact
        assert torch.equal(k_cache.cpu(), ref_k) and torch.equal(v_cache.cpu(), ref_v)
    else:  # a rounding cast: the interpreter truncates where torch rounds to nearest, one ulp apart
        torch.testing.assert_close(k_cache.cpu(), ref_k, rtol=1e-2, atol=0)
        torch.testing.assert_close(v_cache.cpu(), ref_v, rtol=1e-2, atol=0)


def test_kv_write_reads_strided_views_of_a_fused_projection():
    """K and V as slices of one QKV row (the layout the attention layer produces)."""
    from flotilla.kernels.triton_kv_write import write_kv_cache

    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(8, (4 + 2 + 2) * 16, generator=g).to(DEVICE)
    key = qkv[:, 64:96].view(8, 2, 16)
    value = qkv[:, 96:].view(8, 2, 16)
    slots = torch.tensor([5, 0, 17, 31, 16, 2, -1, 9], device=DEVICE)
    k_cache = torch.zeros(2, 16, 2, 16, device=DEVICE)
    v_cache = torch.zeros(2, 16, 2, 16, device=DEVICE)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    write_kv_cache_ref(key, value, ref_k, ref_v, slots)
    write_kv_cache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
