"""ggml's block layouts (engine/quantization/gguf_blocks.py) against `gguf.quants.dequantize` (gguf-py, the format's
own tool): random blocks of every type bit for bit, one block a type written by hand with its values worked out from
ggml-common.h's layout, and the test-side k-quant encoder (tests/engine/gguf_kquants.py) round-tripped.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from flotilla.engine.quantization import gguf as gguf_q
from flotilla.engine.quantization import gguf_blocks

from .gguf_kquants import K_TYPES, quantize_k

# Where each type's fp16 fields sit in its block (random bytes there could be NaN or inf).
_HALVES = {"Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2],
           "Q6_K": [208]}


def _gguf(raw: np.ndarray, kind: str) -> torch.Tensor:
    return torch.from_numpy(np.asarray(dequantize(raw, GGMLQuantizationType[kind]), dtype=np.float32))


def _half(value: float) -> list[int]:
    return list(np.array([value], dtype=np.float16).view(np.uint8))


@pytest.mark.parametrize("kind", gguf_blocks.DECODED_TYPES)
def test_random_blocks_decode_as_gguf_does(kind, monkeypatch):
    rng = np.random.default_rng(7)
    rows, blocks, size = 5, 3, gguf_blocks.BLOCK_BYTES[kind]
    raw = rng.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    for at in _HALVES[kind]:
        raw[..., at:at + 2] = rng.normal(0, 0.02, (rows, blocks, 1)).astype(np.float16).view(np.uint8)
    raw = raw.reshape(rows, -1)
    cols = blocks * gguf_blocks.BLOCK_INPUTS[kind]
    monkeypatch.setattr(gguf_blocks, "_SLICE_WEIGHTS", 2 * cols)  # decoded 2 rows at a time: 3 slices
    ours = gguf_blocks.dequantize_blocks(raw, kind)
    assert ours.shape == (rows, cols)
    assert torch.equal(ours, _gguf(raw, kind))
    assert torch.equal(gguf_q.dequantize_tensor(raw, kind), ours)


def test_q4_k_codes_scales_and_offsets_give_gguf_values_exactly():
    """Q4_K as the int4 method holds it: `scale * code + offset` a sub-block of 32, in float32, equals gguf's."""
    rng = np.random.default_rng(3)
    raw = quantize_k(rng.normal(0, 0.1, (6, 512)).astype(np.float32), "Q4_K")
    codes, scale, offset = gguf_blocks.unpack_q4_k(raw)
    assert codes.shape == (6, 512) and scale.shape == offset.shape == (6, 16) and int(codes.max()) <= 15
    ours = gguf_q.dequantize_affine(gguf_q.pack_codes(codes, 4), scale, offset, torch.float32)
    assert torch.equal(ours, _gguf(raw, "Q4_K"))


def _check(raw: list[int], kind: str, expected: list[float]) -> torch.Tensor:
    block = np.array(raw, dtype=np.uint8)[None, :]
    assert block.shape[1] == gguf_blocks.BLOCK_BYTES[kind]
    ours = gguf_blocks.dequantize_blocks(block, kind)[0]
    assert ours.tolist() == expected
    assert torch.equal(ours, _gguf(block, kind)[0])
    return ours


def _q5_codes() -> list[int]:
    # qs byte j = j | (15 - j) << 4: input j's low nibble j, input j + 16's 15 - j; qh 0x80000001: inputs 0 and 31
    # carry the fifth bit.
    low = list(range(16)) + [15 - j for j in range(16)]
    return [c + (16 if i in (0, 31) else 0) for i, c in enumerate(low)]


def test_q5_0_and_q5_1_by_hand():
    qh, qs = [0x01, 0, 0, 0x80], [j | ((15 - j) << 4) for j in range(16)]
    q = _q5_codes()
    ours = _check(_half(0.5) + qh + qs, "Q5_0", [0.5 * (c - 16) for c in q])
    assert ours[[0, 1, 16, 30]].tolist() == [0.0, -7.5, -0.5, -7.5]
    ours = _check(_half(0.5) + _half(-1.0) + qh + qs, "Q5_1", [0.5 * c - 1.0 for c in q])
    assert ours[[0, 1, 31]].tolist() == [7.0, -0.5, 7.0]


# Q4_K / Q5_K scales: 8 sub-blocks' 6-bit scale and min; 4-7 take values >= 16 to use the split top bits.
_SC = [1, 2, 3, 4, 17, 33, 49, 63]
_MIN = [0, 1, 2, 3, 20, 36, 52, 60]
_SCALE_BYTES = ([_SC[j] | (_SC[j + 4] >> 4) << 6 for j in range(4)]
                + [_MIN[j] | (_MIN[j + 4] >> 4) << 6 for j in range(4)]
                + [(_SC[j + 4] & 15) | (_MIN[j + 4] & 15) << 4 for j in range(4)])
# qs byte 32c + l = (l % 16) | (15 - l % 16) << 4: sub-block 2c input l has code l % 16, sub-block 2c + 1 15 - l % 16.
_QS = [(l % 16) | (15 - l % 16) << 4 for _ in range(4) for l in range(32)]


def _q4_k_code(sub: int, l: int) -> int:
    return l % 16 if sub % 2 == 0 else 15 - l % 16


def test_q4_k_by_hand():
    assert _SCALE_BYTES == [65, 130, 195, 196, 64, 129, 194, 195, 65, 65, 65, 207]
    raw = _half(0.5) + _half(0.25) + _SCALE_BYTES + _QS
    expected = [0.5 * _SC[s] * _q4_k_code(s, l) - 0.25 * _MIN[s] for s in range(8) for l in range(32)]
    ours = _check(raw, "Q4_K", expected)
    assert ours[5 * 32 + 3].item() == 0.5 * 33 * 12 - 0.25 * 36 == 189.0
    codes, scale, offset = gguf_blocks.unpack_q4_k(np.array(raw, dtype=np.uint8)[None, :])
    assert scale[0].tolist() == [0.5 * s for s in _SC] and offset[0].tolist() == [-0.25 * m for m in _MIN]
    assert codes[0].tolist() == [_q4_k_code(s, l) for s in range(8) for l in range(32)]


def test_q5_k_by_hand():
    qh = [1 << (l % 8) for l in range(32)]  # sub-block i's input l has the fifth bit when l % 8 == i
    raw = _half(0.5) + _half(0.25) + _SCALE_BYTES + qh + _QS
    expected = [0.5 * _SC[s] * (_q4_k_code(s, l) + (16 if l % 8 == s else 0)) - 0.25 * _MIN[s]
                for s in range(8) for l in range(32)]
    ours = _check(raw, "Q5_K", expected)
    assert ours[5 * 32 + 5].item() == 0.5 * 33 * (10 + 16) - 0.25 * 36 == 420.0
    assert ours[5 * 32 + 3].item() == 189.0


def test_q6_k_by_hand():
    # ql all 0x21 (low nibble 1, high 2), qh all 0b11100100 (input 32s + l of a half: top bits s), scales i - 8.
    raw = [0x21] * 128 + [0b11100100] * 64 + list(np.arange(-8, 8, dtype=np.int8).view(np.uint8)) + _half(0.5)
    q_of = {0: 1 - 32, 1: 1 + 16 - 32, 2: 2 + 32 - 32, 3: 2 + 48 - 32}  # by s = (input % 128) // 32
    expected = [0.5 * (i // 16 - 8) * q_of[(i % 128) // 32] for i in range(256)]
    ours = _check(raw, "Q6_K", expected)
    assert ours[[0, 200]].tolist() == [124.0, 4.0]


def test_q2_k_by_hand():
    # scale byte i: scale i (low nibble), min 15 - i (high); qs all 0b11100100: input 32s + l of a half has code s.
    raw = [i | (15 - i) << 4 for i in range(16)] + [0b11100100] * 64 + _half(0.5) + _half(0.25)
    expected = [0.5 * (i // 16) * ((i % 128) // 32) - 0.25 * (15 - i // 16) for i in range(256)]
    ours = _check(raw, "Q2_K", expected)
    assert ours[[0, 100]].tolist() == [-3.75, 6.75]


def test_q3_k_by_hand():
    # hmask bytes 0b01010101: inputs 32s + l with s even have the high bit (no -4); qs as Q2_K's example;
    # 6-bit scale i stored as 4 i (signed 4 i - 32): nibbles in bytes 0-7, top two bits in bytes 8-11.
    stored = [4 * i for i in range(16)]
    nibbles = [(stored[i] & 15) | (stored[i + 8] & 15) << 4 for i in range(8)]
    tops = [sum((stored[4 * s + b] >> 4) << (2 * s) for s in range(4)) for b in range(4)]
    raw = [0b01010101] * 32 + [0b11100100] * 64 + nibbles + tops + _half(0.5)
    expected = [0.5 * (4 * (i // 16) - 32) * ((i % 128) // 32 - (0 if (i // 32) % 2 == 0 else 4)) for i in range(256)]
    ours = _check(raw, "Q3_K", expected)
    assert ours[[40, 255]].tolist() == [36.0, -14.0]


@pytest.mark.parametrize("kind", K_TYPES)
def test_the_test_encoder_round_trips_through_gguf(kind):
    """The encoder behind the k-quant test files writes blocks gguf decodes to the input within its precision."""
    rng = np.random.default_rng(5)
    data = rng.normal(0, 0.1, (4, 512)).astype(np.float32)
    decoded = _gguf(quantize_k(data, kind), kind).numpy()
    error = np.sqrt(np.mean((decoded - data) ** 2)) / data.std()
    assert error < {"Q2_K": 0.4, "Q3_K": 0.25, "Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.03}[kind]
