"""The Triton fused MoE (two grouped GEMMs over expert-sorted token blocks) against `fused_experts_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err

from flotilla.kernels.moe import fused_experts_ref, topk_routing_ref


def test_alignment_pads_each_experts_pairs_to_whole_blocks():
    from flotilla.kernels.triton_fused_moe import align_by_expert

    ids = torch.tensor([[2, 0], [0, 2], [2, 3]])  # pairs 0..5; expert 0: 1, 2; expert 2: 0, 3, 4; expert 3: 5
    sorted_pairs, block_experts = align_by_expert(ids, 4, block_m=2)
    sentinel = 6
    assert sorted_pairs.tolist()[:8] == [1, 2, 0, 3, 4, sentinel, 5, sentinel]
    assert all(p == sentinel for p in sorted_pairs.tolist()[8:])
    # 6 pairs + 4 x (2 - 1) padding = 10 rows, 5 blocks: experts 0, 2, 2, 3, then one past the last (4)
    assert block_experts.tolist() == [0, 2, 2, 3, 4]


@pytest.mark.parametrize(("tokens", "experts", "top_k", "hidden", "inter"), [
    (1, 4, 2, 32, 24),     # one decode row
    (13, 8, 2, 48, 40),    # widths not multiples of the tiles: masked edges
    (37, 6, 3, 32, 16),    # several blocks an expert
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_experts_match_the_reference(tokens, experts, top_k, hidden, inter, dtype):
    from flotilla.kernels.triton_fused_moe import fused_experts

    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) / 6).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / 5).to(dtype)
    weights, ids = topk_routing_ref(torch.randn(tokens, experts, generator=g), top_k, renormalize=True)
    ref = fused_experts_ref(x, w13, w2, weights, ids)
    out = fused_experts(x.to(DEVICE), w13.to(DEVICE), w2.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE),
                        block_m=16, block_n=32, block_k=16)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel_err(out.cpu(), ref) < (1e-5 if dtype == torch.float32 else 2e-2)


def _fp8_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked expert weights `[E, N, K]` -> fp8 values and fp32 per-row scales `[E, N]` (the engine's quantizer)."""
    from flotilla.kernels.fp8_linear import quantize_fp8_rows

    w8, scale = quantize_fp8_rows(w.reshape(-1, w.shape[-1]))
    return w8.reshape(w.shape), scale.reshape(w.shape[:2]).contiguous()


@pytest.mark.parametrize(("tokens", "experts", "top_k", "hidden", "inter"), [
    (1, 4, 2, 32, 24),     # one decode row
    (13, 8, 2, 48, 40),    # masked edges: the scales' load is masked with the columns
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_experts_match_the_reference(tokens, experts, top_k, hidden, inter, dtype):
    from flotilla.kernels.triton_fused_moe import fused_experts

    g = torch.Generator().manual_seed(tokens + 100)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    # rows of different magnitudes: a scale applied to the wrong row or expert shows
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * torch.rand(experts, 2 * inter, 1, generator=g) / 3
    w2 = torch.randn(experts, hidden, inter, generator=g) * torch.rand(experts, hidden, 1, generator=g) / 3
    (w13_8, s13), (w2_8, s2) = _fp8_experts(w13), _fp8_experts(w2)
    weights, ids = topk_routing_ref(torch.randn(tokens, experts, generator=g), top_k, renormalize=True)
    ref = fused_experts_ref(x, w13_8, w2_8, weights, ids, s13, s2)
    out = fused_experts(*(t.to(DEVICE) for t in (x, w13_8, w2_8, weights, ids, s13, s2)),
                        block_m=16, block_n=32, block_k=16)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel_err(out.cpu(), ref) < (1e-5 if dtype == torch.float32 else 2e-2)
    # the scales are there: the unscaled fp8 codes give another result
    assert rel_err(fused_experts_ref(x, w13_8.to(dtype), w2_8.to(dtype), weights, ids), ref) > 0.5
