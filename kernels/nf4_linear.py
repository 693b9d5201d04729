"""bitsandbytes 4-bit linear layers (nf4 / fp4): the PyTorch reference of W4A16 through a 16-value table.

The engine's layout (`engine/quantization/bnb.py` converts a checkpoint into it, or quantizes a dense weight
into it at load): `weight_packed` uint8 `[N, K / 2]`, two 4-bit codes a byte, the even input in the high nibble
and the odd one in the low nibble (bitsandbytes' order over the row-major weight), and `weight_absmax` float32
`[N, K / BLOCK]`, one scale a block of BLOCK (64) consecutive inputs of a row. A weight is
`table[code] * absmax[block]`, the table being NormalFloat4's or bitsandbytes' FP4's 16 values.

Numerics (every device): the weight is dequantized in fp32 (the table value times the block's absmax, as
bitsandbytes does), rounded to the activation's dtype, and multiplied with fp32 accumulation.
"""

from __future__ import annotations

import torch

# Inputs a block of one absmax: bitsandbytes' default, the only size the engine loads.
BLOCK = 64

# bitsandbytes' 4-bit tables, code -> value, as float32 (the quant_map a checkpoint stores beside each weight).
NF4_TABLE = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
             -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
             0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023,
             1.0)
FP4_TABLE = (0.0, 0.0052083334885537624, 0.6666666865348816, 1.0, 0.3333333432674408, 0.5, 0.1666666716337204,
             0.25, 0.0, -0.0052083334885537624, -0.6666666865348816, -1.0, -0.3333333432674408, -0.5,
             -0.1666666716337204, -0.25)
TABLES = {"nf4": NF4_TABLE, "fp4": FP4_TABLE}


def table(quant_type: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 float32 values of `quant_type` (nf4 or fp4)."""
    return torch.tensor(TABLES[quant_type], dtype=torch.float32, device=device)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Codes `[..., 2 * C]` (uint8) of packed bytes `[..., C]`: each byte's high nibble first."""
    codes = torch.stack((packed >> 4, packed & 0xF), dim=-1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Bytes `[..., C / 2]` of codes `[..., C]` (values 0..15): the even one in the high nibble."""
    pairs = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] << 4) | pairs[..., 1]


def quantize_4bit_blocks(weight: torch.Tensor, quant_type: str = "nf4") -> tuple[torch.Tensor, torch.Tensor]:
    """`weight_packed` `[N, K / 2]` and fp32 `weight_absmax` `[N, K / BLOCK]` of a dense `[N, K]` weight (K a multiple
    of BLOCK): each block's largest magnitude, and each value times its reciprocal, clamped to [-1, 1], given the code
    of the nearest table value (a value on a midpoint takes the lower one), as bitsandbytes rounds."""
    rows, cols = weight.shape
    blocks = weight.float().reshape(rows, cols // BLOCK, BLOCK)
    absmax = blocks.abs().amax(dim=-1)
    scaled = (blocks * (1.0 / absmax.clamp(min=1e-38))[..., None]).clamp(-1, 1)
    values = table(quant_type, weight.device)
    order = torch.argsort(values)
    ordered = values[order]
    midpoints = (ordered[:-1] + ordered[1:]) / 2
    codes = order[torch.bucketize(scaled, midpoints)]
    return pack_nibbles(codes.reshape(rows, cols)), absmax


def dequantize_4bit_blocks(packed: torch.Tensor, absmax: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The fp32 weight `[N, K]`: each code's table value (`values`, 16 floats) times its block's absmax."""
    rows = packed.shape[0]
    codes = unpack_nibbles(packed).long()
    weight = values.float()[codes].reshape(rows, absmax.shape[1], -1) * absmax.float()[..., None]
    return weight.reshape(rows, -1)


def nf4_linear_ref(
    x: torch.Tensor,
    packed: torch.Tensor,
    absmax: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W^T + bias` with W dequantized in fp32 and rounded to `x`'s dtype (module docstring)."""
    weight = dequantize_4bit_blocks(packed, absmax, values).to(x.dtype)
    return torch.nn.functional.linear(x, weight, bias)
