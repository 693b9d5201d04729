"""The sparse mixture-of-experts block that replaces a decoder layer's MLP (Mixtral, Qwen2-MoE, Qwen3-MoE).

A router (a linear layer, one logit an expert) picks each token's top-k experts; the experts are gated MLPs whose
weights are stacked at load into one tensor a projection kind (`w13_weight` `[E, 2I, H]`: gate rows then up rows;
`w2_weight` `[E, H, I]`), so the whole block is two calls behind `kernels.dispatch` (routing, fused experts)
that a fused Triton kernel can take over. Qwen2-MoE adds a shared expert (a dense MLP every token runs) scaled by
a sigmoid gate. With tensor parallelism every rank holds every expert's slice of the intermediate width (as a
dense MLP splits it) and the partial outputs are summed over the ranks.

fp8 experts (engine/quantization/fp8.py `Fp8ExpertsMethod`): the stacked weights are float8_e4m3fn with one fp32
scale per output row of each expert (`w13_weight_scale` `[E, 2I/tp]`, `w2_weight_scale` `[E, H]`), computed W8A16.
The router stays unquantized (vLLM's rule).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flotilla.engine.parallel_state import all_reduce, tp_rank, tp_size
from flotilla.engine_rules import moe_dense_layers, moe_num_experts
from flotilla.kernels.dispatch import fused_experts, moe_routing

# A checkpoint expert tensor's name (after the model's own renames): layer prefix, expert, projection, tensor (the
# weight, or an fp8 checkpoint's scales).
_EXPERT_NAME = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\."
                          r"(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)\.(?P<tensor>weight|weight_scale|input_scale)$")
# projection -> (our stacked parameter, part within an expert's slice): gate rows first, then up; down alone
_PROJECTIONS = {"w1": ("w13_weight", 0), "gate_proj": ("w13_weight", 0), "w3": ("w13_weight", 1),
                "up_proj": ("w13_weight", 1), "w2": ("w2_weight", 0), "down_proj": ("w2_weight", 0)}
_PART_NAMES = {"w13": ("gate_proj", "up_proj"), "w2": ("down_proj",)}


@dataclass(frozen=True)
class MoeArch:
    """The mixture-of-experts numbers of config.json."""

    num_experts: int
    top_k: int
    intermediate_size: int  # one expert's width
    renormalize: bool  # scale the top-k weights to sum to one (Mixtral always; Qwen: norm_topk_prob)
    round_router_weights: bool  # Qwen's router rounds its weights to the model dtype; Mixtral's keep fp32
    shared_expert_intermediate_size: int  # Qwen2-MoE's shared expert; 0: none
    dense_layers: frozenset[int]  # layers that keep a dense MLP (decoder_sparse_step, mlp_only_layers)

    @classmethod
    def from_hf(cls, c: dict[str, Any], *, renormalize: bool | None = None, expert_width: str = "moe_intermediate_size",
                round_router_weights: bool = True) -> MoeArch:
        """Read config.json: the expert count is `num_local_experts` (Mixtral; transformers 5 writes Qwen3-MoE's so
        too) or `num_experts` (Qwen); `renormalize` None reads `norm_topk_prob` (transformers' default false)."""
        num_experts = moe_num_experts(c)
        if not num_experts:
            raise ValueError("config.json names no experts (num_local_experts / num_experts)")
        return cls(
            num_experts=int(num_experts),
            top_k=int(c.get("num_experts_per_tok", 2)),
            intermediate_size=int(c[expert_width]),
            renormalize=bool(c.get("norm_topk_prob", False)) if renormalize is None else renormalize,
            round_router_weights=round_router_weights,
            shared_expert_intermediate_size=int(c.get("shared_expert_intermediate_size") or 0),
            dense_layers=frozenset(moe_dense_layers(int(c["num_hidden_layers"]), c.get("decoder_sparse_step"),
                                                    c.get("mlp_only_layers"))),
        )

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` holds the MoE block (else a dense MLP)."""
        return layer not in self.dense_layers


class FusedMoE(nn.Module):
    """Every expert's gated MLP, stacked: `w13_weight` `[E, 2I/tp, H]` and `w2_weight` `[E, H, I/tp]`; fp8 ones with
    per-row scales (`quant_method`, attached before the load)."""

    quant_method: Any = None  # engine/quantization/fp8.py's Fp8ExpertsMethod, or None: the model's dtype

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        n = tp_size()
        if intermediate_size % n:
            raise ValueError(f"expert width {intermediate_size} is not divisible by tensor parallel size {n}")
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size // n  # this rank's
        size = self.intermediate_size
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * size, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, size), requires_grad=False)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        """Put one expert's checkpoint projection (`shard_id` = (expert, part), `expert_target`) into its slice:
        this rank's rows of gate (part 0) or up (part 1), or its columns of down."""
        expert, part = shard_id
        size = self.intermediate_size
        full = size * tp_size()
        if param is self.w13_weight:
            if tuple(loaded.shape) != (full, param.shape[2]):
                raise ValueError(f"expert projection {tuple(loaded.shape)}, config.json gives ({full}, "
                                 f"{param.shape[2]})")
            param.data[expert].narrow(0, part * size, size).copy_(loaded.narrow(0, tp_rank() * size, size))
        else:
            if tuple(loaded.shape) != (param.shape[1], full):
                raise ValueError(f"expert projection {tuple(loaded.shape)}, config.json gives ({param.shape[1]}, "
                                 f"{full})")
            param.data[expert].copy_(loaded.narrow(1, tp_rank() * size, size))

    def scale_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        """Put one expert's checkpoint scales (`shard_id` = (expert, part)) into per-row `param` (`w13_weight_scale`
        `[E, 2I/tp]` or `w2_weight_scale` `[E, H]`): one per row, or one for the whole tensor spread over its rows."""
        expert, part = shard_id
        loaded = loaded.float().reshape(-1)
        if param is getattr(self, "w2_weight_scale", None):  # down's rows (the hidden size) are not split
            param.data[expert].copy_(loaded.expand(param.shape[1]) if loaded.numel() == 1 else loaded)
            return
        size = self.intermediate_size
        rows = loaded.expand(size * tp_size()) if loaded.numel() == 1 else loaded
        param.data[expert].narrow(0, part * size, size).copy_(rows.narrow(0, tp_rank() * size, size))

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """This rank's part of the routed experts' sum `[T, H]` (not yet summed over ranks)."""
        return fused_experts(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids,
                             getattr(self, "w13_weight_scale", None), getattr(self, "w2_weight_scale", None))


class SparseMoeBlock(nn.Module):
    """Router, experts and (Qwen2-MoE) a gated shared expert: `[T, hidden]` -> `[T, hidden]`."""

    def __init__(self, hidden_size: int, moe: MoeArch, shared_expert: nn.Module | None = None) -> None:
        super().__init__()
        self.moe = moe
        # the router is small and replicated on every rank (HF's name: `gate`)
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.gate.weight.requires_grad_(False)
        self.experts = FusedMoE(moe.num_experts, hidden_size, moe.intermediate_size)
        self.shared_expert = shared_expert
        self.shared_expert_gate: nn.Linear | None = None
        if shared_expert is not None:
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)
            self.shared_expert_gate.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The experts' weighted sum (plus the gated shared expert), summed over tensor-parallel ranks."""
        weights, ids = moe_routing(self.gate(x), self.moe.top_k, self.moe.renormalize)
        if self.moe.round_router_weights:
            weights = weights.to(x.dtype)
        out = all_reduce(self.experts(x, weights, ids))
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            # the shared expert's down projection sums over ranks itself (row-parallel)
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


def expert_target(name: str) -> tuple[str, tuple[int, int]] | None:
    """The stacked parameter and (expert, part) a checkpoint expert tensor loads into (e.g.
    `layers.0.mlp.experts.3.up_proj.weight` -> (`layers.0.mlp.experts.w13_weight`, (3, 1)); its `weight_scale` ->
    `w13_weight_scale`; an fp8 checkpoint's `input_scale` -> `w13_input_scale`, which no parameter takes: the
    loader drops it, the experts being W8A16), or None for any other tensor."""
    match = _EXPERT_NAME.match(name)
    if match is None:
        return None
    param, part = _PROJECTIONS[match["proj"]]
    kind = param.removesuffix("_weight")
    return f"{match['prefix']}.{kind}_{match['tensor']}", (int(match["expert"]), part)


def is_expert_input_scale(name: str) -> bool:
    """Whether parameter name `name` (an `expert_target`) is a static fp8 checkpoint's experts' activation scale:
    not used, the experts computing W8A16 (vLLM's fp8 MoE on GPUs without fp8 tensor cores does so too)."""
    return name.endswith(("w13_input_scale", "w2_input_scale")) and ".experts." in name


def missing_experts(name: str, got: set[Any], num_experts: int) -> set[str]:
    """The expert tensors (by a checkpoint's Qwen-style names) that stacked parameter `name` did not receive, given
    the (expert, part) shards it did: a missing one would leave its slice uninitialised."""
    prefix, param = name.rsplit(".", 1)
    kind, tensor = param.split("_", 1)
    parts = _PART_NAMES[kind]
    return {f"{prefix}.{e}.{proj}.{tensor}" for e in range(num_experts) for p, proj in enumerate(parts)
            if (e, p) not in got}
