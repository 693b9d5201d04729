"""RMSNorm, optionally fused with the residual add: the PyTorch reference."""

from __future__ import annotations

from dataclasses import dataclass

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


def prologue_fits(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether a GEMV prologue computes `rms_norm_ref(x, weight, eps, residual)` as the standalone kernel does: one
    contiguous row `x` `[1, K]`, gamma `[K]` and the residual `[1, K]` contiguous and of x's dtype (so the output
    has it too)."""
    return (x.dim() == 2 and x.shape[0] == 1 and x.is_contiguous() and weight.shape == (x.shape[1],)
            and weight.dtype == x.dtype and weight.is_contiguous()
            and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                      and residual.is_contiguous())))  # fmt: skip


@dataclass(frozen=True, slots=True)
class RMSNormPrologue:
    """An RMSNorm (+ residual add) left to the one-row GEMV that consumes its output (its prologue).

    The GEMV reads the un-normalised row `x` (and `residual`), computes `rms_norm_ref(x, weight, eps, residual)`'s
    output itself and, given a residual, stores `x + residual` (the layer's next residual) into `residual_out`.
    Made by `of`, which allocates `residual_out`; `next_residual(x)` is what the layer carries on."""

    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None
    residual_out: torch.Tensor | None

    @classmethod
    def of(cls, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None) -> RMSNormPrologue:
        """The prologue of `rms_norm(x, weight, eps, residual)` with a new `residual_out` (given a residual)."""
        return cls(weight, eps, residual, None if residual is None else torch.empty_like(x))

    def fits(self, x: torch.Tensor) -> bool:
        """`prologue_fits` of this norm's operands (and a `residual_out` exactly where there is a residual)."""
        return prologue_fits(x, self.weight, self.residual) and (self.residual is None) == (self.residual_out is None)

    def next_residual(self, x: torch.Tensor) -> torch.Tensor:
        """The residual stream after the norm: `x + residual` (stored by the GEMV), or `x` itself without one."""
        return x if self.residual_out is None else self.residual_out

    def apply_ref(self, x: torch.Tensor) -> torch.Tensor:
        """The norm done by the reference: returns the normalised `x` and stores `residual_out` as the GEMV does."""
        out, summed = rms_norm_ref(x, self.weight, self.eps, self.residual)
        if self.residual_out is not None and summed is not None:
            self.residual_out.copy_(summed)
        return out
