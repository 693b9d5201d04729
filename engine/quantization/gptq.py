"""GPTQ checkpoints (AutoGPTQ / GPTQModel, `quant_method: gptq`), 4- or 8-bit, in group or activation order.

The published layout, per linear layer: `qweight` int32 `[in * bits / 32, out]`, packed along the
*input* dimension (word `j` of column `o` holds inputs `j * per_word + i`, lowest bits first);
`qzeros` int32 `[groups, out * bits / 32]`, packed along the *output* dimension; `scales`
`[groups, out]`; `g_idx` `[in]`, each input's group. The original ("v1", `checkpoint_format: gptq`)
format stores every zero point minus one; `gptq_v2` stores it as it is. With `desc_act: false` g_idx is
`i // group` (checked, then dropped). With `desc_act: true` (activation order) a group holds inputs spread over the
row, as g_idx says: it loads as `weight_g_idx`, and the inputs are sorted by group at load (`packed_int.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from flotilla.engine.quantization.method import LinearMethod
from flotilla.engine.quantization.packed_int import PackedIntMethod
from flotilla.kernels.packed_int_linear import unpack_codes
from flotilla.quantization_config import act_order, check_layout, packed_group_size, weight_bits


def linear_method(qcfg: dict[str, Any]) -> LinearMethod:
    """The method of a GPTQ `quantization_config`, or ValueError naming what is not supported (a quantized LM head,
    bits: flotilla/quantization_config.py `check_layout`, which the webhook runs too)."""
    check_layout(qcfg)
    # GPTQ always stores zero points; symmetric ones are all the middle code.
    return PackedIntMethod(_bits(qcfg), packed_group_size(qcfg), symmetric=False, act_order=act_order(qcfg))


def _bits(qcfg: dict[str, Any]) -> int:
    """4 or 8 (flotilla/quantization_config.py reads them as the webhook does; ValueError for others)."""
    bits = weight_bits(qcfg)
    assert bits is not None, "a gptq quantization_config has bits"  # weight_bits: 4 when absent
    return bits


def convert_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], qcfg: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """qweight / qzeros / scales / g_idx -> the engine's weight_packed / weight_zero_point / weight_scale (and
    weight_g_idx in activation order)."""
    bits = _bits(qcfg)
    permuted = act_order(qcfg)
    zero_offset = 0 if qcfg.get("checkpoint_format") == "gptq_v2" else 1
    group = packed_group_size(qcfg)
    for name, tensor in tensors:
        prefix, _, leaf = name.rpartition(".")
        if leaf == "qweight":
            # Transposed, a column of input-packed words is a row of our input-packed words.
            yield f"{prefix}.weight_packed", tensor.t().contiguous()
        elif leaf == "qzeros":
            zeros = unpack_codes(tensor, bits) + zero_offset  # [groups, out]
            yield f"{prefix}.weight_zero_point", zeros.t().to(torch.uint8).contiguous()
        elif leaf == "scales":
            yield f"{prefix}.weight_scale", tensor.t().contiguous()
        elif leaf == "g_idx" and permuted:
            yield f"{prefix}.weight_g_idx", tensor
        elif leaf == "g_idx":
            _check_group_order(name, tensor, group)
        else:
            yield name, tensor


def _check_group_order(name: str, g_idx: torch.Tensor, group: int | None) -> None:
    expected = torch.arange(g_idx.numel()) // (group or g_idx.numel())
    if not torch.equal(g_idx.long().cpu(), expected):
        raise ValueError(f"{name}: inputs are not in group order (an activation-order checkpoint) while "
                         "quantization_config says desc_act: false")
