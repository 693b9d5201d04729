"""The mixture-of-experts reference (kernels/moe.py): routing as HF transformers' routers pick, and the experts'
sum equal to every expert computed densely and weighted by a dense routing matrix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flotilla.kernels import dispatch
from flotilla.kernels.moe import fused_experts_ref, sort_by_expert, topk_routing_ref


def _hf_router(kind: str, num_experts: int, top_k: int, hidden: int, renormalize: bool) -> torch.nn.Module:
    from transformers import MixtralConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    if kind == "mixtral":
        return MixtralTopKRouter(MixtralConfig(hidden_size=hidden, num_local_experts=num_experts,
                                               num_experts_per_tok=top_k))
    return Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=hidden, num_experts=num_experts, num_experts_per_tok=top_k,
                                             norm_topk_prob=renormalize))


@pytest.mark.parametrize(("kind", "renormalize"), [("mixtral", True), ("qwen3", True), ("qwen3", False)])
def test_routing_picks_hf_routers_experts_and_weights(kind, renormalize):
    torch.manual_seed(0)
    router = _hf_router(kind, 8, 2, 16, renormalize)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(33, 16)
    _, hf_weights, hf_ids = router(x)
    weights, ids = topk_routing_ref(F.linear(x, router.weight), 2, renormalize)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights.float(), rtol=0, atol=0)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(33))


def test_sort_groups_pairs_by_expert_in_token_order():
    ids = torch.tensor([[2, 0], [0, 1], [2, 1]])
    order, counts = sort_by_expert(ids, 4)
    assert counts.tolist() == [2, 2, 2, 0]
    assert order.tolist() == [1, 2, 3, 5, 0, 4]  # expert 0: pairs 1 (token 0), 2 (token 1); expert 1: 3, 5; ...


def _dense(x, w13, w2, weights, ids):
    """Every expert on every token, weighted by the dense [T, E] routing matrix (zero off the top-k)."""
    route = torch.zeros(x.shape[0], w13.shape[0], dtype=torch.float64).scatter(1, ids, weights.double())
    gate, up = torch.einsum("th,eih->tei", x.double(), w13.double()).chunk(2, dim=-1)
    per_expert = torch.einsum("tei,ehi->teh", F.silu(gate) * up, w2.double())
    return (per_expert * route.unsqueeze(-1)).sum(1)


@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(1, 4, 2), (17, 8, 2), (40, 6, 3), (5, 16, 4)])
def test_fused_experts_equal_the_dense_computation(tokens, experts, top_k):
    torch.manual_seed(tokens)
    hidden, inter = 32, 24
    x = torch.randn(tokens, hidden)
    w13, w2 = torch.randn(experts, 2 * inter, hidden) / 6, torch.randn(experts, hidden, inter) / 5
    weights, ids = topk_routing_ref(torch.randn(tokens, experts), top_k, renormalize=True)
    out = fused_experts_ref(x, w13, w2, weights, ids)
    torch.testing.assert_close(out.double(), _dense(x, w13, w2, weights, ids), rtol=1e-4, atol=1e-4)
    # the dispatch seam gives the reference's values on this device
    assert torch.equal(dispatch.fused_experts(x, w13, w2, weights, ids), out)
    assert all(torch.equal(a, b) for a, b in zip(dispatch.moe_routing(x @ w13[:, 0].T, top_k, True),
                                                 topk_routing_ref(x @ w13[:, 0].T, top_k, True), strict=True))


def test_an_expert_no_token_chose_is_never_computed():
    # expert 1 holds NaN weights: picked by nobody, so they never reach the output
    x = torch.randn(3, 8)
    w13, w2 = torch.randn(3, 12, 8), torch.randn(3, 8, 6)
    w13[1] = float("nan")
    weights, ids = topk_routing_ref(torch.tensor([[5.0, -9.0, 1.0]] * 3), 2, renormalize=True)
    assert not torch.isnan(fused_experts_ref(x, w13, w2, weights, ids)).any()


def test_fp8_experts_reference_equals_the_dequantized_weights():
    # W8A16: the fp8 codes upcast, the fp32 sum scaled per row, equal (up to fp32 summation order) to the unquantized
    # reference over the dequantized weights `codes * scale`
    from flotilla.kernels.fp8_linear import quantize_fp8_rows

    g = torch.Generator().manual_seed(5)
    x, w13 = torch.randn(9, 32, generator=g), torch.randn(4, 48, 32, generator=g)
    w2 = torch.randn(4, 32, 24, generator=g)
    w13_8, s13 = quantize_fp8_rows(w13.reshape(-1, 32))
    w2_8, s2 = quantize_fp8_rows(w2.reshape(-1, 24))
    weights, ids = topk_routing_ref(torch.randn(9, 4, generator=g), 2, renormalize=True)
    out = fused_experts_ref(x, w13_8.reshape(4, 48, 32), w2_8.reshape(4, 32, 24), weights, ids, s13.reshape(4, 48),
                            s2.reshape(4, 32))
    dequantized = fused_experts_ref(x, (w13_8.float() * s13).reshape(4, 48, 32), (w2_8.float() * s2).reshape(4, 32, 24),
                                    weights, ids)
    torch.testing.assert_close(out, dequantized, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, fused_experts_ref(x, w13, w2, weights, ids), rtol=1e-3, atol=1e-3)  # rounded
