"""A test-side encoder of ggml's k-quant blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), which gguf-py 0.19 only decodes.

Plain min/max rounding, not llama.cpp's search for the best scales: the tests need valid blocks of these layouts
whose decoded values (by `gguf.quants.dequantize`, the format's own tool) are close to the input, not the best
ones. Written from ggml-common.h's block structs, apart from the engine's decoder (engine/quantization/gguf_blocks.py)
which the tests check against gguf's.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values rounded to fp16: (as float32, as 2 bytes each)."""
    half = values.astype(np.float16)
    return half.astype(np.float32), half.view(np.uint8).reshape(*values.shape, 2)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), 0)


def _affine(x: np.ndarray, levels: int, code_max: int) -> tuple[np.ndarray, ...]:
    """Sub-blocks `x [n, subs, len]` as `d * sc * q - dmin * m` (q in 0..levels, sc and m in 0..code_max):
    d and dmin (fp16 bytes), sc, m `[n, subs]`, q `[n, subs, len]`."""
    low = np.minimum(x.min(-1), 0)
    step = (x.max(-1) - low) / levels
    d, d_bytes = _f16(step.max(-1) / code_max)
    dmin, dmin_bytes = _f16((-low).max(-1) / code_max)
    sc = np.clip(np.rint(_ratio(step, d[:, None])), 0, code_max)
    mins = np.clip(np.rint(_ratio(-low, dmin[:, None])), 0, code_max)
    scale, offset = d[:, None] * sc, dmin[:, None] * mins
    q = np.clip(np.rint(_ratio(x + offset[..., None], scale[..., None])), 0, levels)
    return d_bytes, dmin_bytes, sc.astype(np.uint8), mins.astype(np.uint8), q.astype(np.uint8)


def _symmetric(x: np.ndarray, q_min: int, q_max: int, code_max: int) -> tuple[np.ndarray, ...]:
    """Sub-blocks as `d * sc * q` (q in q_min..q_max, |sc| <= code_max): d (fp16 bytes), sc, q."""
    step = np.abs(x).max(-1) / -q_min
    d, d_bytes = _f16(step.max(-1) / code_max)
    sc = np.clip(np.rint(_ratio(step, d[:, None])), 0, code_max)
    q = np.clip(np.rint(_ratio(x, (d[:, None] * sc)[..., None])), q_min, q_max)
    return d_bytes, sc.astype(np.int16), q.astype(np.int16)


def _scale_min_bytes(sc: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> Q4_K's 12 bytes (sub-blocks 4-7 split into nibbles and top two bits)."""
    low = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    mid = (mins[:, :4] & 0x3F) | ((mins[:, 4:] >> 4) << 6)
    high = (sc[:, 4:] & 0x0F) | ((mins[:, 4:] & 0x0F) << 4)
    return np.concatenate([low, mid, high], axis=-1).astype(np.uint8)


def _two_bit_planes(q: np.ndarray) -> np.ndarray:
    """2-bit values `[n, 256]` -> 64 bytes: each half of 128 in 32 bytes, input 32s + l in bits 2s.. of byte l."""
    parts = (q & 3).reshape(-1, 2, 4, 32).astype(np.uint8) << np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    return np.bitwise_or.reduce(parts, axis=2).reshape(-1, 64)


def _bit_planes(bits: np.ndarray) -> np.ndarray:
    """One bit per input `[n, 8 * 32]` -> 32 bytes: input 32s + l in bit s of byte l."""
    return np.bitwise_or.reduce(bits.reshape(-1, 8, 32).astype(np.uint8) << np.arange(8, dtype=np.uint8)[:, None],
                                axis=1)


def _nibble_pairs(q: np.ndarray) -> np.ndarray:
    """4-bit values `[n, 8, 32]` -> 128 bytes: sub-block 2c in the low nibbles of bytes 32c.., 2c + 1 in the high."""
    pairs = q.reshape(-1, 4, 2, 32)
    return ((pairs[:, :, 0] & 0x0F) | ((pairs[:, :, 1] & 0x0F) << 4)).reshape(-1, 128)


def _q2_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, mins, q = _affine(x.reshape(-1, 16, 16), 3, 15)
    return np.concatenate([sc | (mins << 4), _two_bit_planes(q.reshape(-1, QK_K)), d, dmin], axis=-1)


def _q3_k(x: np.ndarray) -> np.ndarray:
    d, sc, q = _symmetric(x.reshape(-1, 16, 16), -4, 3, 31)
    u = (q + 4).reshape(-1, QK_K)  # 0..7: the high bit set means no -4
    scale = (sc + 32).astype(np.uint8)
    nibbles = (scale[:, :8] & 0x0F) | ((scale[:, 8:] & 0x0F) << 4)
    tops = np.bitwise_or.reduce((scale >> 4).reshape(-1, 4, 4) << np.array([0, 2, 4, 6], dtype=np.uint8)[:, None],
                                axis=1)
    return np.concatenate([_bit_planes(u >> 2), _two_bit_planes(u), nibbles, tops, d], axis=-1)


def _q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, mins, q = _affine(x.reshape(-1, 8, 32), 15, 63)
    return np.concatenate([d, dmin, _scale_min_bytes(sc, mins), _nibble_pairs(q)], axis=-1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, mins, q = _affine(x.reshape(-1, 8, 32), 31, 63)
    high = _bit_planes(q >> 4)  # bit i of byte l: sub-block i's input l
    return np.concatenate([d, dmin, _scale_min_bytes(sc, mins), high, _nibble_pairs(q)], axis=-1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    d, sc, q = _symmetric(x.reshape(-1, 16, 16), -32, 31, 127)
    u = (q + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [half, s, l]: input 128 half + 32 s + l
    ql = (u[:, :, 0:2] & 0x0F).reshape(-1, 2, 64) | ((u[:, :, 2:4] & 0x0F).reshape(-1, 2, 64) << 4)
    qh = np.bitwise_or.reduce((u >> 4) << np.array([0, 2, 4, 6], dtype=np.uint8)[:, None], axis=2)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8), d], axis=-1)


_ENCODERS = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
K_TYPES = tuple(_ENCODERS)


def quantize_k(data: np.ndarray, type_name: str) -> np.ndarray:
    """A float32 matrix `[rows, cols]` (cols a multiple of 256) as k-quant bytes `[rows, bytes]`."""
    rows = data.shape[0]
    blocks = _ENCODERS[type_name](data.astype(np.float32).reshape(-1, QK_K))
    return np.ascontiguousarray(blocks.astype(np.uint8).reshape(rows, -1))
