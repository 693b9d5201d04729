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
