"""Batched LoRA shrink/expand (Triton) against the PyTorch reference, and the reference against a
per-token loop of plain matrix products."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err, tolerance

from flotilla.kernels.lora import lora_expand_ref, lora_shrink_ref


def _case(dtype: torch.dtype, tokens: int = 24, k: int = 80, n: int = 48, rank: int = 16, slots: int = 3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, k, generator=g).to(dtype)
    a = torch.randn(slots, rank, k, generator=g).to(dtype)
    b = torch.randn(slots, n, rank, generator=g).to(dtype)
    # Every slot and the base model (-1), interleaved as a mixed step would have them.
    token_slots = torch.tensor([(i % (slots + 1)) - 1 for i in range(tokens)], dtype=torch.long)
    return x, a, b, token_slots


def test_reference_is_a_per_token_product():
    x, a, b, slots = _case(torch.float32)
    buf = lora_shrink_ref(x, a, slots)
    y = torch.randn(x.shape[0], b.shape[1])
    expected = y.clone()
    lora_expand_ref(y, buf, b, slots)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[t] += b[s] @ (a[s] @ x[t])
        else:
            assert not buf[t].any()
    assert torch.allclose(y, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrink_matches_reference(dtype):
    """K (80) is not a multiple of the K block: the last block is masked."""
    from flotilla.kernels.triton_lora import lora_shrink

    x, a, _, slots = _case(dtype)
    ref = lora_shrink_ref(x, a, slots)
    out = lora_shrink(x.to(DEVICE), a.to(DEVICE), slots.to(DEVICE), block_k=32)
    assert rel_err(out.cpu(), ref) < tolerance(dtype)
    assert not out.cpu()[slots < 0].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expand_adds_into_a_column_slice(dtype):
    """A merged projection's slice (columns 16..64 of 96): the other columns and base rows stay."""
    from flotilla.kernels.triton_lora import lora_expand

    x, a, b, slots = _case(dtype)
    buf = lora_shrink_ref(x, a, slots)
    g = torch.Generator().manual_seed(1)
    y_full = torch.randn(x.shape[0], 96, generator=g).to(dtype)
    ref = y_full.clone()
    lora_expand_ref(ref[:, 16:64], buf, b, slots)
    out = y_full.to(DEVICE)
    lora_expand(out[:, 16:64], buf.to(DEVICE), b.to(DEVICE), slots.to(DEVICE), block_n=32)
    out = out.cpu()
    assert rel_err(out, ref) < tolerance(dtype)
    assert torch.equal(out[:, :16], y_full[:, :16]) and torch.equal(out[:, 64:], y_full[:, 64:])
    assert torch.equal(out[slots < 0], y_full[slots < 0])
