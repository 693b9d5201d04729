"""Block-scaled fp8 linear layers: the PyTorch reference of W8A16 with one scale a weight block.

The layout of vLLM's own fp8 checkpoints with `weight_block_size` (Qwen3-*-FP8, DeepSeek) and of
llm-compressor's FP8_BLOCK: the weight `[N, K]` is float8_e4m3fn and a float32 scale covers each
`block_n x block_k` block of it, `scale[N / block_n, K / block_k]` (both rounded up: the last row or
column of blocks may be partial). The weight is `w_fp8 * scale`, block by block.

Numerics (the engine's, on every device): W8A16. The activation is used as it is; the product is
`sum over k-blocks of (x @ w_fp8[:, block]^T) * scale[n-block, k-block]` accumulated in fp32 and rounded
once to `x`'s dtype, which is `x @ (w_fp8 * scale)^T` up to fp32 rounding order. (vLLM quantizes the
activation too on Hopper, in groups of 128 along K; W8A16 skips that rounding.)
"""

from __future__ import annotations

import math

import torch


def block_scale_shape(n: int, k: int, block: tuple[int, int]) -> tuple[int, int]:
    """The scale tensor's shape of an `[n, k]` weight in `block` (`[block_n, block_k]`) blocks."""
    return math.ceil(n / block[0]), math.ceil(k / block[1])


def expand_block_scales(scale: torch.Tensor, n: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    """`scale` `[N / block_n, K / block_k]` as one fp32 value a weight element, `[n, k]` (partial blocks cropped)."""
    rows = scale.float().repeat_interleave(block[0], dim=0)[:n]
    return rows.repeat_interleave(block[1], dim=1)[:, :k]


def dequantize_fp8_blocks(w_fp8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The fp32 weight `w_fp8 * scale`, block by block."""
    n, k = w_fp8.shape
    nb, kb = block_scale_shape(n, k, block)
    if tuple(scale.shape) != (nb, kb):
        raise ValueError(f"block scales {tuple(scale.shape)} do not cover an [{n}, {k}] weight in {list(block)} "
                         f"blocks ({[nb, kb]})")
    if n % block[0] == 0 and k % block[1] == 0:  # whole blocks: the scales broadcast over a view, no expanded copy
        grid = w_fp8.float().reshape(nb, block[0], kb, block[1])
        return (grid * scale.float()[:, None, :, None]).reshape(n, k)
    return w_fp8.float() * expand_block_scales(scale, n, k, block)


def fp8_block_linear_ref(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A16 `x @ (w_fp8 * scale)^T + b` in fp32, rounded once to `x`'s dtype (module docstring)."""
    rows = x.reshape(-1, x.shape[-1]).float()
    out = rows @ dequantize_fp8_blocks(w_fp8, scale, block).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], w_fp8.shape[0])
