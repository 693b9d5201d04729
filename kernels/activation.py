"""Gated activations: the PyTorch reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` where `x = [gate, up]` along the last dimension (the merged gate_up projection)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
