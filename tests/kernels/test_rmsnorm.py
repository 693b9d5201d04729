"""Fused RMSNorm (Triton) against `rms_norm_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err

from flotilla.kernels.layernorm import rms_norm_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(dtype, with_residual):
    """Non-power-of-two hidden size; the residual sum is returned as the next residual."""
    from flotilla.kernels.triton_rmsnorm import rms_norm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=g).to(dtype)
    weight = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype)
    residual = torch.randn(5, 96, generator=g).to(dtype) if with_residual else None
    ref, ref_res = rms_norm_ref(x, weight, 1e-6, residual)
    out, res = rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-6, residual.to(DEVICE) if with_residual else None)
    bound = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: one rounding step apart at most
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert rel_err(out.cpu(), ref) < bound
    if with_residual:
        assert rel_err(res.cpu(), ref_res) < bound
    else:
        assert res is None


def test_rms_norm_keeps_leading_dims_and_fp32_weight_promotion():
    """`[B, T, hidden]` input; an fp32 weight on bf16 activations gives fp32, as the reference."""
    from flotilla.kernels.triton_rmsnorm import rms_norm

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 64, generator=g).to(torch.bfloat16)
    weight = torch.randn(64, generator=g)
    ref, _ = rms_norm_ref(x, weight, 1e-5)
    out, _ = rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-5)
    assert out.dtype == torch.float32 and out.shape == (2, 3, 64)
    assert rel_err(out.cpu(), ref) < 1e-2
