"""LoRA around a model's projections, put in place after the base weights are loaded.

`LoRALinear` wraps a linear layer (plain, or merged like QKV and gate/up) and owns the stacked
adapter matrices of every device slot: A `[slots, n_slices * max_rank, in]` and B
`[slots, out, max_rank]`. The stacks are allocated once and slots are overwritten in place, so a
captured CUDA graph reads whatever adapters are resident when it replays. A step whose tokens use
adapters adds their deltas with one shrink and one expand per projection, merged or not (by adapter
segments when the step has them, see `slots.py`); a step without adapters runs the base layer alone
(the model code never knows).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from flotilla.engine.layers.linear import _Linear
from flotilla.engine.lora.adapter import SUPPORTED_TARGETS, ModuleLayout
from flotilla.engine.lora.slots import current_lora_segments, current_lora_slots
from flotilla.engine.parallel_state import tp_size
from flotilla.kernels.dispatch import (
    linear,
    lora_apply,
    lora_linear,
    lora_stacked_expand,
    lora_stacked_step,
    lora_stacks_a,
)


class LoRALinear(nn.Module):
    """A projection plus the LoRA deltas of the adapters in the device slots."""

    def __init__(self, base: nn.Module, layout: ModuleLayout, max_loras: int, max_rank: int) -> None:
        super().__init__()
        self.base = base
        self.layout = layout
        self.max_rank = max_rank
        # The stacks take the model dtype and the layer's device, not the weight's: a quantized layer
        # (rtn, awq, gptq, packed compressed-tensors, gguf int4) holds packed codes in its place, and its
        # own product (`base(x)`) is all the delta needs.
        dtype: torch.dtype = base.params_dtype  # type: ignore[assignment]  # every wrapped layer is a _Linear
        device = next(base.parameters()).device
        n = len(layout.slice_sizes)
        out = sum(layout.slice_sizes)
        # The base product and the expand may be one GEMV launch (`lora_linear`) when the base layer is
        # a plain unquantized, bias-free product on one rank (a row-parallel layer's all-reduce and
        # bias come after its product, so the delta could not join it on several ranks).
        plain = isinstance(base, _Linear) and base.quant_method is None and base.bias is None and tp_size() == 1
        self._plain_base = base if plain else None
        # Plain attributes, not buffers: they are runtime state (never in a state dict), and the model
        # runner's memory profile sees them all the same.
        self.lora_b = torch.zeros(max_loras, out, max_rank, dtype=dtype, device=device)
        a_shape = (max_loras, n * max_rank, layout.in_features)
        # A plain layer may keep the A stack as extra rows of its own weight (`stacked`, kernels/dispatch.py):
        # one GEMM then computes the base product and every slot's shrink; the base layer's weight becomes
        # the first `out` rows of that tensor (a contiguous view, loaded values copied over).
        self._stacked: torch.Tensor | None = None
        if plain and lora_stacks_a(math.prod(a_shape) * dtype.itemsize):
            weight: torch.Tensor = base.weight  # type: ignore[assignment]  # a plain layer keeps its weight
            stacked = torch.empty(out + a_shape[0] * a_shape[1], layout.in_features, dtype=dtype, device=device)
            stacked[:out].copy_(weight)
            stacked[out:].zero_()
            weight.data = stacked[:out]
            self.lora_a = stacked[out:].view(a_shape)
            self._stacked = stacked
        else:
            self.lora_a = torch.zeros(a_shape, dtype=dtype, device=device)

    def set_slot(self, slot: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        """Put one adapter's matrices for this projection into `slot` (zeros where it has none)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        for index, (a, b) in (weights or {}).items():
            rank = a.shape[0]
            row = index * self.max_rank
            offset, size = sum(self.layout.slice_sizes[:index]), self.layout.slice_sizes[index]
            self.lora_a[slot, row : row + rank].copy_(a, non_blocking=True)
            self.lora_b[slot, offset : offset + size, :rank].copy_(b, non_blocking=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The base projection, plus each token's adapter delta when the step uses adapters."""
        slots = current_lora_slots()
        if slots is None:
            return self.base(x)
        segments = current_lora_segments(slots)
        plain = self._plain_base
        if self._stacked is not None and isinstance(plain, _Linear) and lora_stacked_step(x, segments):
            y_ext = linear(x, self._stacked, None, plain.gemv_max_rows)
            return lora_stacked_expand(y_ext, self.lora_b, slots, segments, self.layout.slice_sizes, self.max_rank)
        if segments is None and isinstance(plain, _Linear):
            fused = lora_linear(x, plain.weight, plain.gemv_max_rows, self.lora_a, self.lora_b, slots,
                                self.layout.slice_sizes, self.max_rank)
            if fused is not None:
                return fused
        y = self.base(x)
        lora_apply(y, x, self.lora_a, self.lora_b, slots, self.layout.slice_sizes, self.max_rank,
                   segments)
        return y


def _layout(base: nn.Module, shards: list[str | int | None]) -> ModuleLayout:
    """A projection's slices: QKV by heads, merged layers by `out_sizes`, anything else whole."""
    layer: Any = base  # QKVParallelLinear, MergedColumnParallelLinear or a plain linear layer
    out, in_features = layer.out_features, layer.in_features  # not the weight's shape: it may be packed codes
    if shards == ["q", "k", "v"]:
        q = layer.num_heads * layer.head_dim
        kv = layer.num_kv_heads * layer.head_dim
        sizes: tuple[int, ...] = (int(q), int(kv), int(kv))
    elif len(shards) > 1:
        sizes = tuple(int(s) for s in layer.out_sizes)
    else:
        sizes = (int(out),)
    return ModuleLayout(int(in_features), {s: i for i, s in enumerate(shards)}, sizes)


def wrap_projections(model: nn.Module, max_loras: int, max_rank: int) -> dict[str, LoRALinear]:
    """Replace every q/k/v/o/gate/up/down projection of `model` (after its weights are loaded) by a
    LoRALinear; returns them by module name (`layers.0.self_attn.qkv_proj`)."""
    packed: dict[str, tuple[str, str | int]] = getattr(model, "packed_modules", {})
    shards_of: dict[str, list[str | int | None]] = {}
    for target in SUPPORTED_TARGETS:
        merged, shard = packed.get(target, (target, None))
        shards_of.setdefault(merged, []).append(shard)
    wrapped: dict[str, LoRALinear] = {}
    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in shards_of or isinstance(module, LoRALinear):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        layer = LoRALinear(module, _layout(module, shards_of[leaf]), max_loras, max_rank)
        setattr(parent, attr, layer)
        wrapped[name] = layer
    return wrapped


def module_name_for(model: nn.Module, hf_module: str) -> tuple[str, str | int | None]:
    """Our wrapped module and shard id for an HF module name (`model.layers.0.self_attn.q_proj` ->
    `("layers.0.self_attn.qkv_proj", "q")`)."""
    name = model.checkpoint_name(hf_module)  # type: ignore[operator]  # every CausalLM has it
    parent, _, leaf = name.rpartition(".")
    packed: dict[str, tuple[str, str | int]] = getattr(model, "packed_modules", {})
    if leaf in packed:
        merged, shard = packed[leaf]
        return f"{parent}.{merged}", shard
    return name, None
