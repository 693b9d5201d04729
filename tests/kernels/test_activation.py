"""SiLU-and-mul (Triton) against `silu_and_mul_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err

from flotilla.kernels.activation import silu_and_mul_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_matches_reference(dtype):
    """`d` not a multiple of the block: the last block of each row is masked."""
    from flotilla.kernels.triton_activation import silu_and_mul

    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(3, 4, 2 * 80, generator=g)).to(dtype)
    ref = silu_and_mul_ref(x)
    out = silu_and_mul(x.to(DEVICE), block=64)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel_err(out.cpu(), ref) < (1e-6 if dtype == torch.float32 else 1e-2)
