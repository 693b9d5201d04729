"""FP8 (e4m3) weights: quantized at load (`--quantization fp8`) or read from an fp8 checkpoint.

`--quantization fp8` follows vLLM's online scheme: the bf16/fp16 checkpoint loads as usual, then each
linear weight is rounded to float8_e4m3fn with one fp32 scale per output channel (its absolute maximum
over 448); activations are quantized per token at run time. Half the weight bytes of bf16, and on
Hopper/Ada the matmul runs on fp8 tensor cores (`kernels.dispatch.fp8_linear`). Decode steps of at
most 16 rows run W8A16 instead (the activations unquantized, the weight upcast in a Triton GEMV):
there the per-token quantization and the fp8 GEMM's wide tiles cost more than the weight bytes saved.

Checkpoints that already hold fp8 weights (compressed-tensors' `float-quantized`, llm-compressor's
FP8 / FP8_DYNAMIC schemes) load their `weight` and `weight_scale` (per channel, or one per tensor,
spread over the rows it covers) and, for static activation schemes, `input_scale` (one per tensor;
q, k and v of a merged layer share the largest, as vLLM does). Block-scaled fp8 checkpoints (`weight_block_size`,
compressed-tensors FP8_BLOCK) are `fp8_block.py`'s.

A mixture-of-experts model's stacked experts (engine/layers/moe.py) take `Fp8ExpertsMethod`: the same per-row
quantizer at load, or the checkpoint's fp8 experts and their scales (per row, or per tensor spread over its rows),
computed W8A16 by the fused MoE kernel; the router is left unquantized, as vLLM leaves it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from flotilla.engine.parallel_state import max_over_tp
from flotilla.engine.quantization.method import LinearMethod, out_features, replace_parameter
from flotilla.kernels.dispatch import fp8_linear, fp8_weight_only_linear
from flotilla.kernels.fp8_linear import FP8_DTYPE, FP8_MAX, FP8_MIN_SCALE, quantize_fp8_static


class Fp8OnlineMethod(LinearMethod):
    """Dense weights loaded in the model dtype, quantized to fp8 per output channel once loaded."""

    def process_weights(self, layer: Any) -> None:
        """Replace the dense weight by its fp8 rounding and per-row scales (a row-parallel layer's row
        spans ranks: its scale is the whole row's, as at one rank)."""
        weight = layer.weight.data
        amax = layer.row_amax(weight.abs().amax(dim=-1, keepdim=True).float())
        scale = (amax / FP8_MAX).clamp(min=FP8_MIN_SCALE)
        w_fp8 = quantize_fp8_static(weight, scale)
        replace_parameter(layer, "weight", w_fp8)
        replace_parameter(layer, "weight_scale", scale)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """W8A8 with dynamic per-token activation scales."""
        return fp8_linear(x, layer.weight, layer.weight_scale, bias)


class Fp8CheckpointMethod(Fp8OnlineMethod):
    """fp8 weights and scales from the checkpoint; `static_input` reads a per-tensor activation scale."""

    def __init__(self, static_input: bool, weight_only: bool = False) -> None:
        self.static_input = static_input
        self.weight_only = weight_only

    def create_weights(self, layer: Any) -> None:
        """An fp8 weight, `[out, 1]` scales and, for static schemes, one input scale."""
        rows = out_features(layer)
        replace_parameter(layer, "weight", torch.empty(layer.weight.shape, dtype=FP8_DTYPE))
        replace_parameter(layer, "weight_scale", torch.ones(rows, 1, dtype=torch.float32),
                          loader=_scale_loader(layer))
        if self.static_input:
            # Starts at 0 so that the largest of the merged layer's loaded scales wins.
            replace_parameter(layer, "input_scale", torch.zeros(1, dtype=torch.float32), loader=_max_loader)

    def process_weights(self, layer: Any) -> None:
        """Nothing to convert: the checkpoint's fp8 values are used as they are."""

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """W8A8 with static or dynamic activation scales; weight-only schemes upcast the weight."""
        if self.weight_only:
            return fp8_weight_only_linear(x, layer.weight, layer.weight_scale, bias)
        return fp8_linear(x, layer.weight, layer.weight_scale, bias, getattr(layer, "input_scale", None))


def _scale_loader(layer: Any) -> Callable[..., None]:
    """A weight-scale loader: per-channel (or one per-tensor) scales go through the layer's scale
    loader, which splits them as the weight's rows are split (row-parallel layers keep them whole)."""

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        layer.scale_loader(param, loaded.float().reshape(-1, 1), shard_id)

    return load


def _max_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
    param.data.copy_(torch.maximum(param.data, loaded.float().reshape(1)))


class Fp8ExpertsMethod:
    """fp8 stacked experts (`FusedMoE`): `w13_weight` / `w2_weight` float8_e4m3fn with fp32 scales per output row of
    each expert, `w13_weight_scale` `[E, 2I/tp]` and `w2_weight_scale` `[E, H]`. `checkpoint`: read them (else the
    dense experts load in the model dtype and are quantized once loaded)."""

    def __init__(self, checkpoint: bool) -> None:
        self.checkpoint = checkpoint

    def create_weights(self, experts: Any) -> None:
        """An fp8 checkpoint's parameters: fp8 weights and per-row scales with the experts' scale loader."""
        if not self.checkpoint:
            return
        for name in ("w13_weight", "w2_weight"):
            weight = getattr(experts, name)
            replace_parameter(experts, name, torch.empty(weight.shape, dtype=FP8_DTYPE))
            replace_parameter(experts, f"{name}_scale", torch.ones(weight.shape[:2], dtype=torch.float32),
                              loader=experts.scale_loader)

    def process_weights(self, experts: Any) -> None:
        """Quantized at load: each expert's rows rounded to fp8 over their absolute maximum / 448 (`w2`'s rows span
        the tensor-parallel ranks: their maximum is the largest over ranks, as a row-parallel linear's)."""
        if self.checkpoint:
            return
        for name, whole_rows in (("w13_weight", True), ("w2_weight", False)):
            weight = getattr(experts, name).data
            amax = weight.abs().amax(dim=-1, keepdim=True).float()
            scale = ((amax if whole_rows else max_over_tp(amax)) / FP8_MAX).clamp(min=FP8_MIN_SCALE)
            replace_parameter(experts, name, quantize_fp8_static(weight, scale))
            replace_parameter(experts, f"{name}_scale", scale.squeeze(-1).contiguous())


def experts_method(method: LinearMethod) -> Fp8ExpertsMethod | None:
    """The experts' method beside the linear layers' `method`: fp8 per row for the fp8 schemes a mixture-of-experts
    model runs (flotilla/engine_rules.py `moe_quantization_runs`), None for any other."""
    if isinstance(method, Fp8CheckpointMethod):
        return Fp8ExpertsMethod(checkpoint=True)
    if type(method) is Fp8OnlineMethod:
        return Fp8ExpertsMethod(checkpoint=False)
    return None
