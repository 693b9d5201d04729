"""Rotary position embedding (NeoX / HF "rotate half" layout): the PyTorch reference."""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """`[x1, x2] -> [-x2, x1]` over the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_ref(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate `query` `[T, H, D]` and `key` `[T, Hkv, D]` by their token positions.

    `cos_sin_cache` is `[max_position, D]` in fp32: the first half of each row holds cos(θ), the
    second sin(θ), for the D/2 frequencies. cos/sin are cast to the activation dtype before use, as
    HF transformers does.
    """
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache[positions.long()]
    cos = torch.cat((cs[:, :half], cs[:, :half]), dim=-1).to(query.dtype)[:, None, :]
    sin = torch.cat((cs[:, half:], cs[:, half:]), dim=-1).to(query.dtype)[:, None, :]
    q = query * cos + rotate_half(query) * sin
    k = key * cos.to(key.dtype) + rotate_half(key) * sin.to(key.dtype)
    return q, k
