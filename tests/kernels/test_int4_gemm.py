"""Int4 dequantizing GEMM (Triton) against `packed_int_linear_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, rel_err, tolerance

from flotilla.kernels.packed_int_linear import pack_codes, packed_int_linear_ref


def _int4_weight(n: int, k: int, group: int, g: torch.Generator, dtype: torch.dtype):
    codes = torch.randint(0, 16, (n, k), generator=g)
    scales = (torch.rand(n, k // group, generator=g) * 0.02 + 0.001).to(dtype)
    zeros = torch.randint(0, 16, (n, k // group), generator=g).to(torch.uint8)
    return pack_codes(codes, 4), scales, zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,group", [(1, 128), (5, 64), (33, 256)])  # decode row, a few rows, a full tile + 1
def test_int4_gemm_matches_reference(dtype, m, group):
    """Groups of 64..256 (one or several K steps per group); N not a multiple of the tile; a bias."""
    from flotilla.kernels.triton_int4_gemm import int4_linear

    g = torch.Generator().manual_seed(m)
    n, k = 80, 256
    packed, scales, zeros = _int4_weight(n, k, group, g, dtype)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    ref = packed_int_linear_ref(x.float(), packed, scales.float(), zeros, 4, group, bias.float())
    out = int4_linear(*(t.to(DEVICE) for t in (x, packed, scales, zeros)), group, bias.to(DEVICE))
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out.cpu(), ref) < tolerance(dtype)
