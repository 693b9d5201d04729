"""Mixture-of-experts: top-k routing and the experts' gated MLPs, the PyTorch reference.

The experts' weights are stacked, one tensor a projection kind: `w13` `[E, 2I, H]` (each expert's gate rows then
its up rows, as a dense layer's merged gate/up) and `w2` `[E, H, I]` (down). The computation is the one a fused
MoE kernel does (vLLM's fused_moe: a grouped GEMM over token blocks sorted by expert): the (token, slot) pairs
sorted by expert, each expert's gated MLP over its own tokens, the outputs weighted by the router and summed per
token. A Triton kernel takes the same arguments behind `dispatch.fused_experts`.

fp8 experts (`--quantization fp8`, fp8 checkpoints) hold `w13` and `w2` as float8_e4m3fn with one fp32 scale per
output row of each expert (`w13_scale` `[E, 2I]`, `w2_scale` `[E, H]`) and compute W8A16: the weight upcast, the
product summed in fp32, the row's scale multiplied on that sum, then one rounding to the activations' dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flotilla.kernels.activation import silu_and_mul_ref


def topk_routing_ref(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's `top_k` experts and their weights: the softmax over all experts (in fp32), its `top_k` largest
    (highest first, lower index on ties), scaled to sum to one when `renormalize`. Returns (`[T, top_k]` fp32
    weights, `[T, top_k]` int64 expert ids)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (token, slot) pairs grouped by expert: the flat pair indices in expert order (stable: a token's pairs
    keep their order within an expert) and each expert's pair count `[E]`."""
    flat = topk_ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts


def expert_linear_ref(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """`x @ w.T` for one expert's projection `w` `[N, K]`; an fp8 `w` with its per-row `scale` `[N]` is upcast, the
    product summed in fp32 and scaled per output row, then rounded once to `x`'s dtype (the fused kernel's order)."""
    if scale is None:
        return F.linear(x, w)
    return (F.linear(x.float(), w.float()) * scale.float()).to(x.dtype)


def fused_experts_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, w13_scale: torch.Tensor | None = None,
                      w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`sum over a token's slots of weight * down(silu(gate(x)) * up(x))` of the slot's expert, for `x` `[T, H]`.

    Each expert's product is weighted (in the weights' dtype, then rounded to `x`'s) and added into its tokens'
    rows in expert order, as HF transformers' experts loop adds them: the same sums in the same order. fp8 `w13` /
    `w2` come with their per-row scales `w13_scale` `[E, 2I]` / `w2_scale` `[E, H]` (`expert_linear_ref`)."""
    top_k = topk_ids.shape[1]
    order, counts = sort_by_expert(topk_ids, w13.shape[0])
    tokens = order // top_k
    flat_weights = topk_weights.flatten()
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count == 0:
            continue
        pairs = order[start:start + count]
        rows = tokens[start:start + count]
        start += count
        hidden = silu_and_mul_ref(expert_linear_ref(x[rows], w13[expert], _row(w13_scale, expert)))
        y = expert_linear_ref(hidden, w2[expert], _row(w2_scale, expert)) * flat_weights[pairs].unsqueeze(-1)
        out.index_add_(0, rows, y.to(out.dtype))
    return out


def _row(scale: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    """Expert `expert`'s per-row scales, or None for unquantized experts."""
    return None if scale is None else scale[expert]
