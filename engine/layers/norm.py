"""RMSNorm as a module, fused with the residual add through the kernel dispatch."""

from __future__ import annotations

import torch
from torch import nn

from flotilla.kernels.dispatch import rms_norm


class RMSNorm(nn.Module):
    """`weight * x / rms(x)`; called with a residual it also adds it first and returns the sum."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalised `x`, or `(normalised x + residual, x + residual)` when a residual is given."""
        out, new_residual = rms_norm(x, self.weight, self.eps, residual)
        return out if new_residual is None else (out, new_residual)
