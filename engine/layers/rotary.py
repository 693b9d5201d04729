"""Rotary position embedding, including Llama-3's frequency scaling."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import torch
from torch import nn


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
    raise ValueError(f"rope scaling type {rope_type!r} is not supported (supported: default, linear, llama3)")


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


@functools.cache
def _cos_sin_table(head_dim: int, max_position: int, base: float, scaling: str, device: torch.device) -> torch.Tensor:
    """`[max_position, D]` fp32 cos|sin rows, one tensor shared by every layer (Llama 3.1: 64 MiB, not 2 GiB)."""
    with torch.device("cpu"):  # frequencies on the CPU, as HF computes them at init
        inv_freq = inverse_frequencies(head_dim, base, json.loads(scaling)).to(device)
    freqs = torch.arange(max_position, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class RotaryEmbedding(nn.Module):
    """The precomputed cos/sin table of a rotary embedding. Attention applies it (fused with the
    KV-cache write, `flotilla.kernels.dispatch.rotary_and_write_kv`)."""

    def __init__(self, head_dim: int, max_position: int, base: float, scaling: dict[str, Any] | None) -> None:
        super().__init__()
        scaling_key = json.dumps(scaling, sort_keys=True)
        table = _cos_sin_table(head_dim, max_position, base, scaling_key, torch.get_default_device())
        self.register_buffer("cos_sin_cache", table, persistent=False)
