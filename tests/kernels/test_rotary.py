"""Rotary embedding (Triton) against `apply_rotary_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err

from flotilla.kernels.rotary import apply_rotary_ref


def _cos_sin_cache(max_pos: int, dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_on_strided_qkv_views_with_gqa(dtype):
    """Query and key are slices of one fused QKV row; 6 query heads over 2 KV heads; any positions."""
    from flotilla.kernels.triton_rotary import apply_rotary

    g = torch.Generator().manual_seed(0)
    tokens, heads, kv_heads, dim = 7, 6, 2, 32
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    query = qkv[:, : heads * dim].view(tokens, heads, dim)
    key = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    positions = torch.tensor([0, 1, 2, 40, 41, 99, 7])
    cache = _cos_sin_cache(128, dim)
    ref_q, ref_k = apply_rotary_ref(positions, query, key, cache)
    qkv_d = qkv.to(DEVICE)
    q, k = apply_rotary(
        positions.to(DEVICE),
        qkv_d[:, : heads * dim].view(tokens, heads, dim),
        qkv_d[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim),
        cache.to(DEVICE),
    )
    bound = 1e-6 if dtype == torch.float32 else 1e-2
    assert q.dtype == dtype and q.shape == ref_q.shape and k.shape == ref_k.shape
    assert rel_err(q.cpu(), ref_q) < bound
    assert rel_err(k.cpu(), ref_k) < bound
    assert torch.equal(qkv_d.cpu(), qkv)  # inputs untouched: outputs are new tensors
