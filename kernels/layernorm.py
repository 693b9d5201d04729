"""RMSNorm, optionally fused with the residual add: the PyTorch reference."""

from __future__ import annotations

import torch


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`weight * x / rms(x)` over the last dimension, computed in fp32.

    With `residual`, normalises `x + residual` and also returns that sum (the next residual), the
    fusion every decoder layer uses twice. The result is cast to the input dtype *before* the
    weight multiply, as HF transformers does, so outputs match it bit for bit in fp32.
    """
    dtype = x.dtype
    if residual is not None:
        x = (x.float() + residual.float()).to(dtype)
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype), residual
