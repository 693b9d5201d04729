"""Rotary position embedding, including Llama-3's and YaRN's frequency scaling."""

from __future__ import annotations

import json
import math
import weakref
from typing import Any

import torch
from torch import nn

from flotilla.rope_scaling import ROPE_TYPES


def inverse_frequencies(head_dim: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """The D/2 rotary frequencies, computed exactly as HF transformers does (fp32)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    scaling = scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_scale(inv_freq, scaling)
    if rope_type == "yarn":
        return _yarn_inverse_frequencies(head_dim, base, scaling)
    raise ValueError(f"rope scaling type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")


def attention_scaling(scaling: dict[str, Any] | None) -> float:
    """The factor HF multiplies cos and sin by: YaRN's attention factor (from `factor` and mscale when not
    given), 1 for the other types."""
    scaling = scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
    return get_mscale(factor)


def _yarn_inverse_frequencies(dim: int, base: float, s: dict[str, Any]) -> torch.Tensor:
    """YaRN: high frequencies kept, low ones interpolated by `factor`, a linear ramp between the dimensions
    that turn `beta_fast` and `beta_slow` times over the original length (transformers' computation)."""
    factor, original = s["factor"], s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no singular ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def _llama3_scale(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


# The tables of live models, held weakly: every layer of a model (and every model of one shape) shares one table, and
# a table goes with the last model that holds it, so a process that builds engines of different shapes one after
# another keeps only the live ones' tables.
_TABLES: weakref.WeakValueDictionary[tuple[int, int, float, str, torch.device], torch.Tensor] = \
    weakref.WeakValueDictionary()


def _cos_sin_table(head_dim: int, max_position: int, base: float, scaling: str, device: torch.device) -> torch.Tensor:
    """`[max_position, D]` fp32 cos|sin rows, one tensor shared by every layer (Llama 3.1: 64 MiB, not 2 GiB)."""
    key = (head_dim, max_position, base, scaling, device)
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = _compute_table(head_dim, max_position, base, scaling, device)
    return table


def _compute_table(head_dim: int, max_position: int, base: float, scaling: str, device: torch.device) -> torch.Tensor:
    with torch.device("cpu"):  # frequencies on the CPU, as HF computes them at init
        inv_freq = inverse_frequencies(head_dim, base, json.loads(scaling)).to(device)
    freqs = torch.arange(max_position, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    table = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    mscale = attention_scaling(json.loads(scaling))
    return table if mscale == 1.0 else table * mscale


class RotaryEmbedding(nn.Module):
    """The precomputed cos/sin table of a rotary embedding. Attention applies it (fused with the
    KV-cache write, `flotilla.kernels.dispatch.rotary_and_write_kv`)."""

    def __init__(self, head_dim: int, max_position: int, base: float, scaling: dict[str, Any] | None) -> None:
        super().__init__()
        scaling_key = json.dumps(scaling, sort_keys=True)
        table = _cos_sin_table(head_dim, max_position, base, scaling_key, torch.get_default_device())
        self.register_buffer("cos_sin_cache", table, persistent=False)
        self.max_position = max_position  # the table's rows: positions 0 .. max_position - 1
