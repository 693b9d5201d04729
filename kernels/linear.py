"""Linear projections (`x @ weight.T + bias`, nn.Linear's layout): the PyTorch reference."""

from __future__ import annotations

import torch


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T (+ bias)` for `x` `[..., K]` and `weight` `[N, K]`, computed in fp32.

    The result is rounded once, to `x`'s dtype, as the Triton GEMV does (fp32 accumulation, bias
    added before the cast); the oracle for `triton_gemv.gemv`.
    """
    out = x.float() @ weight.float().T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
