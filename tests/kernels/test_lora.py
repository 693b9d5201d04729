"""Batched LoRA shrink/expand (Triton) against the PyTorch reference, and the reference against a
per-token loop of plain matrix products."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err, tolerance

from flotilla.kernels.lora import lora_apply_ref, lora_expand_ref, lora_shrink_ref, lora_stacked_expand_ref


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


def _projection(dtype: torch.dtype, slice_sizes: tuple[int, ...], tokens: int, k: int = 80, max_rank: int = 16,
                slots: int = 3):
    """A merged projection's stacks (the last slice's adapter of rank 8 < max_rank: zero rows, as
    `LoRALinear.set_slot` leaves them) and a step mixing every slot with base-model tokens."""
    g = torch.Generator().manual_seed(2)
    n = sum(slice_sizes)
    x = torch.randn(tokens, k, generator=g).to(dtype)
    a = torch.randn(slots, len(slice_sizes) * max_rank, k, generator=g)
    b = torch.randn(slots, n, max_rank, generator=g)
    a[:, -max_rank + 8 :] = 0
    b[:, n - slice_sizes[-1] :, 8:] = 0
    y = torch.randn(tokens, n, generator=g).to(dtype)
    token_slots = torch.tensor([(i % (slots + 1)) - 1 for i in range(tokens)], dtype=torch.long)
    return y, x, a.to(dtype), b.to(dtype), token_slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slice_sizes, tokens, block_k, target", [
    ((48,), 1, 32, 256),  # batch 1: K split over 3 programs (80 = 32 + 32 + a masked 16)
    ((32, 16, 16), 8, 32, 256),  # QKV-like, a slice boundary inside a column block; 3 splits
    ((40, 40), 8, 128, 1),  # gate/up-like, one split, unaligned slice boundary
])
def test_apply_matches_reference(dtype, slice_sizes, tokens, block_k, target):
    """One shrink and one expand for the whole merged projection: every slice's columns get their own
    slice's delta, base-model rows stay bit-identical."""
    from flotilla.kernels.triton_lora import lora_apply

    y, x, a, b, slots = _projection(dtype, slice_sizes, tokens)
    ref = y.clone()
    lora_apply_ref(ref, x, a, b, slots, slice_sizes, 16)
    out = y.clone().to(DEVICE)
    lora_apply(out, x.to(DEVICE), a.to(DEVICE), b.to(DEVICE), slots.to(DEVICE), slice_sizes, 16,
               block_k=block_k, block_n=32, target_programs=target)
    out = out.cpu()
    assert rel_err(out - y.float(), ref.float() - y.float()) < tolerance(dtype) * 2
    assert torch.equal(out[slots < 0], y[slots < 0])


def test_shrink_splits_fill_the_gpu_at_batch_1_and_vanish_at_batch_64():
    from flotilla.kernels.triton_lora import shrink_splits

    assert shrink_splits(1, 3, 4096, 256) == (16, 256)  # QKV at batch 1: 48 programs over K
    assert shrink_splits(1, 1, 14336, 256) == (56, 256)  # down: 56 programs
    assert shrink_splits(64, 3, 4096, 256) == (3, 1536)
    assert shrink_splits(512, 3, 4096, 256) == (1, 4096)
    splits, per = shrink_splits(1, 1, 80, 32)
    assert splits * per >= 80 and (splits - 1) * per < 80


def _mixed_slots(tokens: int, slots: int, unused: int = 0) -> torch.Tensor:
    """A step's slots: the base model (-1) and slots `0 .. slots - unused - 1` interleaved unevenly."""
    used = slots - unused
    return torch.tensor([((i * 5 + i // 3) % (used + 1)) - 1 for i in range(tokens)], dtype=torch.long)


@pytest.mark.parametrize("tokens, slots, unused", [(20, 3, 0), (70, 6, 2), (300, 4, 1)])
def test_segments_group_tokens_by_slot(tokens, slots, unused):
    """`order` lists each slot's tokens in token order, slot after slot, base-model tokens last;
    `starts` bounds each slot's run (empty runs for unused slots)."""
    from flotilla.kernels.triton_lora_segments import lora_segments

    token_slots = _mixed_slots(tokens, slots, unused)
    order, starts = lora_segments(token_slots.to(DEVICE), slots)
    key = torch.where(token_slots < 0, slots, token_slots)
    expected = torch.sort(key, stable=True).indices
    assert order.cpu().long().tolist() == expected.tolist()
    counts = torch.bincount(key, minlength=slots + 1)
    assert starts.cpu().long().tolist() == (torch.cumsum(counts, 0) - counts).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slice_sizes, tokens, slots, unused, block_n", [
    ((48,), 20, 3, 0, 32),  # one slice; 16-token segment blocks, a slot's second block partly full
    ((32, 16, 16), 40, 4, 1, 16),  # QKV-like: column blocks laid out slice by slice, an unused slot
    ((40, 24), 70, 6, 2, 32),  # gate/up-like: unaligned slice ends inside a column block
    ((48, 16), 300, 4, 1, 32),  # a prefill-sized step: 64-token segment blocks
])
def test_segment_apply_matches_reference(dtype, slice_sizes, tokens, slots, unused, block_n):
    """The segment pair (tokens grouped by adapter, tl.dot per segment block) computes the reference's
    deltas; base-model rows stay bit-identical."""
    from flotilla.kernels.triton_lora_segments import lora_apply_segments, lora_segments

    y, x, a, b, _ = _projection(dtype, slice_sizes, tokens, k=48, slots=slots)
    token_slots = _mixed_slots(tokens, slots, unused)
    ref = y.clone()
    lora_apply_ref(ref, x, a, b, token_slots, slice_sizes, 16)
    out = y.clone().to(DEVICE)
    segments = lora_segments(token_slots.to(DEVICE), slots)
    lora_apply_segments(out, x.to(DEVICE), a.to(DEVICE), b.to(DEVICE), segments, slice_sizes, 16,
                        block_k=16, block_n=block_n)
    out = out.cpu()
    assert rel_err(out - y.float(), ref.float() - y.float()) < tolerance(dtype) * 2
    assert torch.equal(out[token_slots < 0], y[token_slots < 0])


def test_segment_splits_fill_the_gpu_at_batch_64():
    from flotilla.kernels.triton_lora_segments import segment_block_m, segment_splits

    assert segment_block_m(64) == 16 and segment_block_m(512) == 64
    assert segment_splits(8, 3, 4096, 256) == (8, 512)  # QKV, 8 adapters x 8 tokens: 192 programs
    assert segment_splits(8, 1, 14336, 256, 4096) == (14, 1024)  # down: at most 16 splits
    assert segment_splits(8, 2, 4096, 256, 28672) == (8, 512)  # gate/up: at most 8 (224 column blocks)
    assert segment_splits(64, 3, 4096, 256) == (1, 4096)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slice_sizes, rows", [((48,), 1), ((32, 16, 16), 3), ((40, 24), 2)])
def test_gemv_lora_epilogue_matches_reference(dtype, slice_sizes, rows):
    """The expand folded into the GEMV's epilogue (`dispatch.lora_linear`'s path): the base product,
    rounded, plus each row's delta from the shrink's split partials, as `lora_apply_ref` adds it to the
    same GEMV's output; base-model rows are that output unchanged."""
    from flotilla.kernels.triton_gemv import LoRAEpilogue, fuses_lora, gemv
    from flotilla.kernels.triton_lora import lora_shrink

    n = sum(slice_sizes)
    _, x, a, b, _ = _projection(dtype, slice_sizes, rows)
    w = torch.randn(n, x.shape[1], generator=torch.Generator().manual_seed(5)).to(dtype)
    token_slots = torch.tensor([1, -1, 0][:rows] if rows > 1 else [2], dtype=torch.long)
    assert fuses_lora(rows, n, x.shape[1], 132)
    xd, wd, sd = x.to(DEVICE), w.to(DEVICE), token_slots.to(DEVICE)
    base = gemv(xd, wd).cpu()
    ref = base.clone()
    lora_apply_ref(ref, x, a, b, token_slots, slice_sizes, 16)
    part = lora_shrink(xd, a.to(DEVICE), sd, block_k=32)
    assert part.shape[0] == 3  # K split over three programs: the epilogue sums the partials
    out = gemv(xd, wd, lora=LoRAEpilogue(part, b.to(DEVICE), sd, slice_sizes, 16)).cpu()
    assert rel_err(out - base.float(), ref.float() - base.float()) < tolerance(dtype) * 2
    assert torch.equal(out[token_slots < 0], base[token_slots < 0])


def _stacked_output(x: torch.Tensor, a: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A base weight `[n, in]` and the stacked GEMM's output `x @ [W; A[0]; ...; A[S-1]]^T`, rounded once
    to x's dtype (as cuBLAS and `F.linear` round it)."""
    w = torch.randn(n, x.shape[1], generator=torch.Generator().manual_seed(7)).to(x.dtype)
    stacked = torch.cat([w, a.reshape(-1, a.shape[2])]).float()
    return w, (x.float() @ stacked.T).to(x.dtype)


def test_stacked_reference_is_base_plus_the_projections_delta():
    """The stacked GEMM + `lora_stacked_expand_ref` computes `x @ W^T` plus `lora_apply_ref`'s deltas."""
    slice_sizes = (32, 16, 16)
    _, x, a, b, token_slots = _projection(torch.float32, slice_sizes, 10)
    w, y_ext = _stacked_output(x, a, sum(slice_sizes))
    y = lora_stacked_expand_ref(y_ext, b, token_slots, slice_sizes, 16)
    expected = x @ w.T
    lora_apply_ref(expected, x, a, b, token_slots, slice_sizes, 16)
    assert y.is_contiguous() and y.shape == expected.shape
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slice_sizes, tokens, slots, unused, block_n", [
    ((48,), 2, 3, 1, 32),  # two tokens (the smallest stacked step): one adapter token, one base token
    ((32, 16, 16), 40, 4, 1, 16),  # QKV-like: column blocks slice by slice, an unused slot
    ((40, 24), 70, 6, 2, 32),  # gate/up-like: unaligned slice ends inside a column block
    ((48, 16), 300, 4, 1, 32),  # 64-token segment blocks
])
def test_stacked_expand_matches_reference(dtype, slice_sizes, tokens, slots, unused, block_n):
    """The stacked expand (tokens grouped by adapter, base-model tokens as one more group) returns the
    reference's `y`: base columns plus each adapter token's delta; base-model rows are copied exactly."""
    from flotilla.kernels.triton_lora_segments import lora_segments
    from flotilla.kernels.triton_lora_stacked import lora_stacked_expand

    _, x, a, b, _ = _projection(dtype, slice_sizes, tokens, k=48, slots=slots)
    token_slots = _mixed_slots(tokens, slots, unused)
    n = sum(slice_sizes)
    _, y_ext = _stacked_output(x, a, n)
    ref = lora_stacked_expand_ref(y_ext, b, token_slots, slice_sizes, 16)
    segments = lora_segments(token_slots.to(DEVICE), slots)
    out = lora_stacked_expand(y_ext.to(DEVICE), b.to(DEVICE), segments, slice_sizes, 16, block_n=block_n).cpu()
    base = y_ext[:, :n]
    assert out.dtype == dtype and out.is_contiguous()
    assert rel_err(out - base.float(), ref.float() - base.float()) < tolerance(dtype) * 2
    assert torch.equal(out[token_slots < 0], base[token_slots < 0])
