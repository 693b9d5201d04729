"""Weight-only integer schemes (W4A16, W8A16): packed codes with group scales and zero points.

Every 4- and 8-bit checkpoint format (compressed-tensors `pack-quantized`, GPTQ, AWQ) is converted at
load into one layout (`kernels/packed_int_linear.py`): `weight_packed` int32 `[out, in * bits / 32]`,
`weight_scale` `[out, in / group]` and `weight_zero_point` uint8 `[out, in / group]`, all with output
rows first, so the layers' sharding loaders place them as they place a dense weight. Symmetric schemes
have no zero points in the checkpoint: theirs is the middle code, 2^(bits - 1).
"""

from __future__ import annotations

from typing import Any

import torch

from flotilla.engine.quantization.method import LinearMethod, in_features, out_features, replace_parameter
from flotilla.kernels.cpu_int_linear import cpu_int_weight
from flotilla.kernels.dispatch import packed_int_linear
from flotilla.kernels.packed_int_linear import PackedInt4


class PackedIntMethod(LinearMethod):
    """Weight-only `bits`-bit integers in groups of `group_size` inputs (None: one group per row)."""

    def __init__(self, bits: int, group_size: int | None, symmetric: bool) -> None:
        if bits not in (4, 8):
            raise ValueError(f"{bits}-bit weights are not supported (4 or 8)")
        self.bits = bits
        self.group_size = group_size
        self.symmetric = symmetric

    def _group(self, layer: Any) -> int:
        return self.group_size or in_features(layer)

    def create_weights(self, layer: Any) -> None:
        """Packed codes, group scales and (asymmetric schemes) zero points in place of the weight."""
        rows, cols = out_features(layer), in_features(layer)
        group = self._group(layer)
        if cols % group or (cols * self.bits) % 32:
            raise ValueError(f"a layer of {cols} inputs does not split into groups of {group} "
                             f"and {32 // self.bits}-code words")
        dtype = layer.weight.dtype
        del layer.weight  # the packed codes take its place
        replace_parameter(layer, "weight_packed", torch.empty(rows, cols * self.bits // 32, dtype=torch.int32))
        replace_parameter(layer, "weight_scale", torch.empty(rows, cols // group, dtype=dtype))
        middle = torch.full((rows, cols // group), 1 << (self.bits - 1), dtype=torch.uint8)
        if self.symmetric:
            layer.register_buffer("weight_zero_point", middle)
        else:
            replace_parameter(layer, "weight_zero_point", middle)

    def process_weights(self, layer: Any) -> None:
        """On the CPU, also keep the weight in the layout of torch's int4/int8 kernels when they run it."""
        layer.cpu_int_weight = None
        if layer.weight_packed.device.type == "cpu":
            cols = layer.weight_packed.shape[1] * 32 // self.bits
            layer.cpu_int_weight = cpu_int_weight(layer.weight_packed, layer.weight_scale, layer.weight_zero_point,
                                                  self.bits, cols // layer.weight_scale.shape[1])

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Dequantize-and-multiply (Triton on CUDA for 4 bits, torch's packed kernels on the CPU where
        they apply, the reference elsewhere)."""
        cols = layer.weight_packed.shape[1] * 32 // self.bits
        group = cols // layer.weight_scale.shape[1]
        return packed_int_linear(x, layer.weight_packed, layer.weight_scale, layer.weight_zero_point,
                                 self.bits, group, bias, symmetric=self.symmetric,
                                 cpu_weight=getattr(layer, "cpu_int_weight", None))


def int4_weight(layer: Any) -> PackedInt4 | None:
    """A linear layer's weight as the int4 kernels' operands when it is a 4-bit packed weight (any checkpoint format:
    they all load into one layout), else None: what the model hands to the fused one-row forms of `kernels/dispatch.py`
    (`int4_gated_gemv_takes`, `int4_qkv_rope_takes`), as it hands an fp8 layer's weight and scales."""
    method = getattr(layer, "quant_method", None)
    if not (isinstance(method, PackedIntMethod) and method.bits == 4):
        return None
    group = layer.weight_packed.shape[1] * 8 // layer.weight_scale.shape[1]
    return PackedInt4(layer.weight_packed, layer.weight_scale, None if method.symmetric else layer.weight_zero_point,
                      group)
