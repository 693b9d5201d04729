"""compressed-tensors checkpoints (what llm-compressor writes), read from `quantization_config`.

Supported: one config group over the linear layers (`targets: ["Linear"]`; `ignore` may list the LM
head, and anything else that names none of the decoder's linear layers), with
- `float-quantized` / `naive-quantized` 8-bit float weights scaled per tensor or per channel (FP8 W8A8 with
  dynamic per-token or static per-tensor activations, or FP8 weight-only when `input_activations` is null),
  or in blocks (FP8_BLOCK: `block_structure` [128, 128], W8A16, `fp8_block.py`),
- `pack-quantized` 4- or 8-bit integer weights with no activation quantization (W4A16, W8A16), per
  channel or in groups, symmetric or asymmetric; GPTQ's `actorder` null, `static` or `weight`
  (contiguous groups) or `group` (groups of permuted inputs, each input's group in `weight_g_idx`: sorted at load,
  `packed_int.py`),
- `int-quantized` int8 weights per channel (or tensor) with int8 activations per token or static per tensor,
  all symmetric (W8A8 int8, `int8.py`; its zero points, all zero, are dropped).
The checkpoint's packed codes are stored signed-plus-offset (`code + 2^(bits-1)`), the engine's
unsigned layout already; asymmetric zero points are packed the same way along the output dimension
and are unpacked here; `weight_shape` is implied by the layer and dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from flotilla.engine.quantization.fp8 import Fp8CheckpointMethod
from flotilla.engine.quantization.fp8_block import Fp8BlockMethod
from flotilla.engine.quantization.int8 import Int8W8A8Method
from flotilla.engine.quantization.method import LinearMethod
from flotilla.engine.quantization.packed_int import PackedIntMethod
from flotilla.kernels.packed_int_linear import unpack_codes
from flotilla.quantization_config import (
    act_order,
    check_layout,
    compressed_tensors_group_size,
    compressed_tensors_int8_w8a8,
    compressed_tensors_scheme,
    fp8_block_size,
    weight_bits,
)


def linear_method(qcfg: dict[str, Any]) -> LinearMethod:
    """The linear method of a compressed-tensors `quantization_config`, or ValueError naming what is not supported
    (flotilla/quantization_config.py `check_layout`, which the webhook runs too)."""
    check_layout(qcfg)
    weights, activations, _ = compressed_tensors_scheme(qcfg)
    if compressed_tensors_int8_w8a8(qcfg):
        return Int8W8A8Method(static_input=not activations.get("dynamic", False))
    if weights.get("type") == "float":  # fp8, per tensor, per channel or in blocks
        block = fp8_block_size(qcfg)
        if block is not None:
            return Fp8BlockMethod(block)
        if activations is None:
            return Fp8CheckpointMethod(static_input=False, weight_only=True)
        return Fp8CheckpointMethod(static_input=not activations.get("dynamic", False))
    bits = weight_bits(qcfg)
    assert bits is not None, "compressed-tensors weights have num_bits"  # check_layout refuses them otherwise
    return PackedIntMethod(bits, compressed_tensors_group_size(weights), bool(weights.get("symmetric", True)),
                           act_order=act_order(qcfg))


def convert_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], qcfg: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors in the engine's layout (`packed_int.py`): zero points unpacked to
    unsigned codes `[out, groups]`; `weight_shape` dropped."""
    weights, _, _ = compressed_tensors_scheme(qcfg)
    bits = weight_bits(qcfg)
    assert bits is not None, "compressed-tensors weights have num_bits"  # weight_bits refuses them otherwise
    int8_w8a8 = compressed_tensors_int8_w8a8(qcfg)
    for name, tensor in tensors:
        if name.endswith(".weight_shape") or (int8_w8a8 and name.endswith(".input_zero_point")):
            continue
        if name.endswith(".weight_zero_point"):
            if weights.get("type") == "float" or int8_w8a8:
                continue  # symmetric fp8 / int8 W8A8: zero everywhere
            # `[out * bits / 32, groups]` packed along the output rows, codes offset by 2^(bits-1).
            tensor = unpack_codes(tensor.t().contiguous(), bits).t().to(torch.uint8).contiguous()
        yield name, tensor
