"""Weight-only integer linear layers (W4A16, W8A16): packing, unpacking and the PyTorch reference.

The layout (the engine's, close to compressed-tensors' `pack-quantized`, so most checkpoints load
with a copy): `packed` int32 `[out, in / (32 / bits)]`, where word `j` of a row holds input columns
`j * per_word + i` in bits `i * bits .. i * bits + bits - 1` (lowest first), each an *unsigned* code
in `0 .. 2^bits - 1`; `scales` `[out, in / group]` in the activation dtype; `zeros` uint8
`[out, in / group]`, the unsigned code of zero (2^(bits-1) for symmetric schemes). A weight is
`(code - zero) * scale` of its group. A channel-wise scheme is one group as wide as the input.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class PackedInt4(NamedTuple):
    """A 4-bit weight as the int4 kernels take it (a layer's, handed to the fused one-row forms of
    `kernels/dispatch.py`): the packed codes, the group scales, the zero points (None: symmetric, every zero
    point the middle code 8) and the group size."""

    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes `[rows, cols]` (cols a multiple of 32/bits) -> int32 words `[rows, cols*bits/32]`."""
    per_word = 32 // bits
    rows, cols = codes.shape
    grouped = codes.to(torch.int64).reshape(rows, cols // per_word, per_word)
    shifts = torch.arange(per_word, dtype=torch.int64, device=codes.device) * bits
    words = (grouped << shifts).sum(dim=-1)
    # Words with the top bit set are negative as int32: wrap into int32's range bit-for-bit.
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of `pack_codes`: int32 words `[rows, w]` -> codes `[rows, w * 32/bits]` (int32)."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, dtype=torch.int32, device=packed.device) * bits
    codes = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(packed.shape[0], -1)


def dequantize_packed(
    packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, group_size: int
) -> torch.Tensor:
    """The weight `[out, in]` in the scales' dtype: `(code - zero) * scale`, group by group."""
    codes = unpack_codes(packed, bits).float()
    zero = zeros.float().repeat_interleave(group_size, dim=1)
    scale = scales.float().repeat_interleave(group_size, dim=1)
    return ((codes - zero) * scale).to(scales.dtype)


def packed_int_linear_ref(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W^T + b` with W dequantized to the activation dtype first (the reference of the kernels)."""
    weight = dequantize_packed(packed, scales, zeros, bits, group_size).to(x.dtype)
    return F.linear(x, weight, bias)
