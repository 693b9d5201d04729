"""ggml's block layouts for the GGUF types served dense or re-laid as 4-bit codes: Q5_0, Q5_1 (32 inputs a block)
and the k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (super-blocks of 256 inputs), decoded with torch.

Every decoder takes a tensor's bytes `[rows, blocks * block bytes]` (as `GGUFReader` gives them) and returns float32
`[rows, cols]` equal, bit for bit, to `gguf.quants.dequantize` (tests/engine/test_gguf_blocks.py): every product of
a fp16 scale, a small integer scale and a code is exact in float32 (at most 23 significant bits), so the one
subtraction or addition of an offset is the only rounding, as in ggml's own C and gguf-py's numpy.

Layouts (ggml-common.h), `d`/`dmin` fp16, bytes in the order listed:
- Q5_0: `d`, `qh` (4 bytes, little-endian: bit j is input j's fifth bit), `qs` 16 bytes (byte j: input j low
  nibble, input j + 16 high nibble); weight `d * (q - 16)`. Q5_1: `d`, `m`, `qh`, `qs`; weight `d * q + m`.
- Q4_K: `d`, `dmin`, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32 (`_scale_min`), `qs` 128 bytes
  (bytes 32c..32c+31 hold sub-block 2c in their low nibbles, 2c + 1 in their high ones); weight
  `d * sc * q - dmin * m` a sub-block: Q4_1's form (a scale and an offset per 32 inputs).
- Q5_K: as Q4_K with `qh` 32 bytes before `qs` (bit i of byte l: input l of sub-block i's fifth bit).
- Q6_K: `ql` 128 bytes, `qh` 64, 16 int8 scales (one per 16 inputs), `d` last; each half of 128 inputs takes 64
  bytes of `ql` (low nibbles: inputs 0-63, high: 64-127) and 32 of `qh` (bits 2s, 2s + 1 of byte l: input
  32s + l's top two bits); weight `d * scale * (q - 32)`.
- Q2_K: 16 bytes of 4-bit scale (low) and min (high) per 16 inputs, `qs` 64 bytes, `d`, `dmin`; each half of 128
  inputs takes 32 bytes of `qs`, bits 2s..2s+1 of byte l holding input 32s + l; weight `d * sc * q - dmin * m`.
- Q3_K: `hmask` 32 bytes (bit s of byte l: input 32s + l's high bit, set meaning no -4), `qs` 64 bytes (2 low
  bits, as Q2_K), 12 bytes of 16 signed 6-bit scales (`_q3_k_scales`), `d`; weight `d * (sc - 32) * q`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

QK_K = 256  # inputs per k-quant super-block
SUB = 32  # inputs per Q4_K / Q5_K sub-block (one scale and one offset)
BLOCK_BYTES = {"Q5_0": 22, "Q5_1": 24, "Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
_SLICE_WEIGHTS = 1 << 22  # weights decoded at once by `dequantize_blocks`
BLOCK_INPUTS = {"Q5_0": 32, "Q5_1": 32, "Q2_K": QK_K, "Q3_K": QK_K, "Q4_K": QK_K, "Q5_K": QK_K, "Q6_K": QK_K}


def _blocks(raw: np.ndarray, type_name: str) -> torch.Tensor:
    """The bytes as uint8 `[rows, blocks, block bytes]`."""
    data = torch.from_numpy(np.array(raw, dtype=np.uint8))
    return data.reshape(data.shape[0], -1, BLOCK_BYTES[type_name])


def _f16(two_bytes: torch.Tensor) -> torch.Tensor:
    """A fp16 field `[..., 2]` as float32 `[..., 1]` (broadcasts over a block's inputs)."""
    return two_bytes.contiguous().view(torch.float16).float()


def _bits(data: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """`(data >> s) & mask` for each shift, stacked before the last axis: `[..., n]` -> `[..., len(shifts), n]`."""
    shift = torch.tensor(shifts, dtype=torch.uint8).reshape(-1, 1)
    return (data.unsqueeze(-2) >> shift) & mask


def _rows(weight: torch.Tensor) -> torch.Tensor:
    """`[rows, blocks, ...]` -> `[rows, cols]`."""
    return weight.reshape(weight.shape[0], -1)


def _scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes -> 8 scales and 8 mins (6 bits each) `[..., 8]`: sub-blocks 0-3 in the low 6 bits of
    bytes 0-3 (scale) and 4-7 (min); sub-blocks 4-7 in the nibbles of bytes 8-11 (scale low, min high) with their top
    two bits in the top two bits of bytes 0-3 (scale) and 4-7 (min)."""
    low, mid, high = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat([low & 0x3F, (high & 0x0F) | ((low >> 6) << 4)], dim=-1)
    mn = torch.cat([mid & 0x3F, (high >> 4) | ((mid >> 6) << 4)], dim=-1)
    return sc, mn


def _q4_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's shared head: `d * sc`, `dmin * m` `[rows, blocks, 8, 1]` (float32, exact) and the low nibbles
    `[rows, blocks, 8, 32]` of the `qs` that ends the block."""
    d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    sc, mn = _scale_min(blocks[..., 4:16])
    qs = blocks[..., -128:].reshape(*blocks.shape[:-1], 4, 32)
    low = _bits(qs, [0, 4], 0x0F).reshape(*blocks.shape[:-1], 8, SUB)
    return (d * sc.float()).unsqueeze(-1), (dmin * mn.float()).unsqueeze(-1), low


def unpack_q4_k(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_K tensor -> unsigned codes `[rows, cols]` (uint8), scales `d * sc` and offsets `-dmin * m`
    `[rows, cols / 32]` (float32, exact: an fp16 times a 6-bit integer): the weight is `scale * code + offset` a
    sub-block of 32, Q4_1's form."""
    blocks = _blocks(raw, "Q4_K")
    scale, offset, codes = _q4_k_parts(blocks)
    return _rows(codes), _rows(scale), _rows(-offset)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    scale, offset, codes = _q4_k_parts(blocks)
    return scale * codes.float() - offset


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    scale, offset, low = _q4_k_parts(blocks)
    high = _bits(blocks[..., 16:48], list(range(8)), 0x01)  # [rows, blocks, 8, 32]
    return scale * (low | (high << 4)).float() - offset


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    lead = blocks.shape[:-1]
    ql = blocks[..., 0:128].reshape(*lead, 2, 64)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=-1).reshape(*lead, 2, 4, 32)
    high = _bits(blocks[..., 128:192].reshape(*lead, 2, 32), [0, 2, 4, 6], 0x03)
    q = (low | (high << 4)).to(torch.int16) - 32
    scale = blocks[..., 192:208].contiguous().view(torch.int8).float()
    d = _f16(blocks[..., 208:210])
    return (d * scale).unsqueeze(-1) * q.reshape(*lead, 16, 16).float()


def _q2_k(blocks: torch.Tensor) -> torch.Tensor:
    lead = blocks.shape[:-1]
    scales = blocks[..., 0:16]
    q = _bits(blocks[..., 16:80].reshape(*lead, 2, 32), [0, 2, 4, 6], 0x03).reshape(*lead, 16, 16)
    d, dmin = _f16(blocks[..., 80:82]), _f16(blocks[..., 82:84])
    scale = (d * (scales & 0x0F).float()).unsqueeze(-1)
    offset = (dmin * (scales >> 4).float()).unsqueeze(-1)
    return scale * q.float() - offset


def _q3_k_scales(packed: torch.Tensor) -> torch.Tensor:
    """Q3_K's 12 bytes -> 16 signed scales `[..., 16]`: low nibbles from the nibbles of bytes 0-7 (scales 0-7 low,
    8-15 high), the top two bits of scale i from bits 2(i // 4)..+1 of byte 8 + i % 4; minus 32."""
    low = torch.cat([packed[..., 0:8] & 0x0F, packed[..., 0:8] >> 4], dim=-1)
    high = _bits(packed[..., 8:12], [0, 2, 4, 6], 0x03).reshape(*packed.shape[:-1], 16)
    return (low | (high << 4)).to(torch.int16) - 32


def _q3_k(blocks: torch.Tensor) -> torch.Tensor:
    lead = blocks.shape[:-1]
    hmask = _bits(blocks[..., 0:32], list(range(8)), 0x01).reshape(*lead, 16, 16)
    low = _bits(blocks[..., 32:96].reshape(*lead, 2, 32), [0, 2, 4, 6], 0x03).reshape(*lead, 16, 16)
    q = low.to(torch.int16) - 4 * (1 - hmask.to(torch.int16))  # a clear mask bit subtracts 4
    d = _f16(blocks[..., 108:110])
    return (d * _q3_k_scales(blocks[..., 96:108]).float()).unsqueeze(-1) * q.float()


def _q5_low_high(blocks: torch.Tensor, qh_at: int) -> torch.Tensor:
    """Q5_0 / Q5_1's unsigned 5-bit codes `[rows, blocks, 32]` from `qh` (at byte `qh_at`) and the 16 `qs` after it."""
    qs = blocks[..., qh_at + 4:qh_at + 20]
    low = torch.cat([qs & 0x0F, qs >> 4], dim=-1)
    high = _bits(blocks[..., qh_at:qh_at + 4], list(range(8)), 0x01).transpose(-1, -2).reshape(low.shape)
    return low | (high << 4)


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    return _f16(blocks[..., 0:2]) * (_q5_low_high(blocks, 2).to(torch.int16) - 16).float()


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    return _f16(blocks[..., 0:2]) * _q5_low_high(blocks, 4).float() + _f16(blocks[..., 2:4])


_DECODERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q5_0": _q5_0, "Q5_1": _q5_1, "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
DECODED_TYPES = tuple(_DECODERS)


def dequantize_blocks(raw: np.ndarray, type_name: str) -> torch.Tensor:
    """A tensor of one of `DECODED_TYPES`, `[rows, bytes]`, as float32 `[rows, cols]`, decoded a slice of rows at a
    time (the intermediates of a whole 8B model's embedding would be several GB)."""
    decode = _DECODERS[type_name]
    rows = raw.shape[0]
    cols = raw.shape[1] // BLOCK_BYTES[type_name] * BLOCK_INPUTS[type_name]
    out = torch.empty(rows, cols, dtype=torch.float32)
    step = max(1, _SLICE_WEIGHTS // max(cols, 1))
    for start in range(0, rows, step):
        out[start:start + step] = _rows(decode(_blocks(raw[start:start + step], type_name)))
    return out
