"""The gated MLP activation as a module."""

from __future__ import annotations

import torch
from torch import nn

from flotilla.kernels.dispatch import silu_and_mul


class SiluAndMul(nn.Module):
    """`silu(gate) * up` on the merged gate/up projection's output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Half the width of `x`."""
        return silu_and_mul(x)
