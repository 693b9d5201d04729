"""AWQ checkpoints (AutoAWQ's GEMM layout, `quant_method: awq`, 4-bit).

The published layout, per linear layer: `qweight` int32 `[in, out / 8]`, packed along the *output*
dimension in AWQ's interleaved order: nibble `i` of word `k` holds output column `8k + ORDER[i]` with
ORDER = 0, 2, 4, 6, 1, 3, 5, 7; `qzeros` int32 `[groups, out / 8]` packed the same way (zero points as
they are); `scales` `[groups, out]`. A weight is `(code - zero) * scale`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from flotilla.engine.quantization.method import LinearMethod
from flotilla.engine.quantization.packed_int import PackedIntMethod
from flotilla.kernels.packed_int_linear import pack_codes, unpack_codes
from flotilla.quantization_config import check_layout, packed_group_size

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# Column c of a word sits in nibble UNDO[c].
_UNDO = tuple(AWQ_ORDER.index(c) for c in range(8))


def linear_method(qcfg: dict[str, Any]) -> LinearMethod:
    """The method of an AWQ `quantization_config`, or ValueError naming what is not supported (bits other than 4, a
    version other than gemm: flotilla/quantization_config.py `check_layout`, which the webhook runs too)."""
    check_layout(qcfg)
    return PackedIntMethod(4, packed_group_size(qcfg), symmetric=False)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """`[rows, cols / 8]` AWQ-ordered words -> codes `[rows, cols]` in column order."""
    nibbles = unpack_codes(packed, 4).reshape(packed.shape[0], -1, 8)
    return nibbles[:, :, list(_UNDO)].reshape(packed.shape[0], -1)


def convert_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], qcfg: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """qweight / qzeros / scales -> the engine's weight_packed / weight_zero_point / weight_scale."""
    for name, tensor in tensors:
        prefix, _, leaf = name.rpartition(".")
        if leaf == "qweight":
            yield f"{prefix}.weight_packed", pack_codes(unpack_awq(tensor).t().contiguous(), 4)
        elif leaf == "qzeros":
            yield f"{prefix}.weight_zero_point", unpack_awq(tensor).t().to(torch.uint8).contiguous()
        elif leaf == "scales":
            yield f"{prefix}.weight_scale", tensor.t().contiguous()
        else:
            yield name, tensor
