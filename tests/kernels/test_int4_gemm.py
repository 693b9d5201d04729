"""Int4 dequantizing GEMM (Triton) against `packed_int_linear_ref`."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, int4_weight, rel_err, tolerance

from flotilla.kernels.packed_int_linear import packed_int_linear_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,group", [(1, 128), (5, 64), (33, 256)])  # decode row, a few rows, a full tile + 1
def test_int4_gemm_matches_reference(dtype, m, group):
    """Groups of 64..256 (one or several K steps per group); N not a multiple of the tile; a bias."""
    from flotilla.kernels.triton_int4_gemm import int4_linear

    g = torch.Generator().manual_seed(m)
    n, k = 80, 256
    packed, scales, zeros = int4_weight(n, k, group, g, dtype)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    ref = packed_int_linear_ref(x.float(), packed, scales.float(), zeros, 4, group, bias.float())
    out = int4_linear(*(t.to(DEVICE) for t in (x, packed, scales, zeros)), group, bias.to(DEVICE))
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out.cpu(), ref) < tolerance(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [32, 128])  # groups narrower than the tile's K step too
def test_int4_dequantize_matches_reference(dtype, group):
    """The one-pass dequantization cuBLAS multiplies at many rows: `dequantize_packed`, N and K ragged."""
    from flotilla.kernels.packed_int_linear import dequantize_packed
    from flotilla.kernels.triton_int4_gemm import int4_dequantize

    g = torch.Generator().manual_seed(group)
    packed, scales, zeros = int4_weight(40, 384, group, g, dtype)
    ref = dequantize_packed(packed, scales.float(), zeros, 4, group)
    out = int4_dequantize(*(t.to(DEVICE) for t in (packed, scales, zeros)), group, dtype)
    assert out.dtype == dtype and out.shape == (40, 384)
    assert rel_err(out.cpu(), ref) < tolerance(dtype)


def test_int4_gemm_wide_row_tiles():
    """64-row tiles (the default above 16 rows) over 70 rows: a full tile and a ragged one."""
    from flotilla.kernels.triton_int4_gemm import int4_linear

    g = torch.Generator().manual_seed(70)
    packed, scales, zeros = int4_weight(48, 128, 64, g, torch.float32)
    x = torch.randn(70, 128, generator=g)
    ref = packed_int_linear_ref(x, packed, scales, zeros, 4, 64)
    out = int4_linear(*(t.to(DEVICE) for t in (x, packed, scales, zeros)), 64)
    assert rel_err(out.cpu(), ref) < tolerance(torch.float32)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the int4 paths by row count are CUDA's")
@pytest.mark.parametrize("m", [1, 3, 16, 40, 600])  # GEMV FMA, GEMV dot, GEMV dot, GEMM 64-row tiles, dequant+cuBLAS
@pytest.mark.parametrize("symmetric", [True, False])
def test_dispatch_int4_paths(m, symmetric):
    from flotilla.kernels.dispatch import packed_int_linear

    g = torch.Generator().manual_seed(m)
    packed, scales, zeros = int4_weight(96, 512, 128, g, torch.bfloat16)
    if symmetric:
        zeros.fill_(8)
    x = torch.randn(m, 512, generator=g).bfloat16()
    ref = packed_int_linear_ref(x.float(), packed, scales.float(), zeros, 4, 128)
    out = packed_int_linear(*(t.to(DEVICE) for t in (x, packed, scales, zeros)), 4, 128, symmetric=symmetric)
    assert out.shape == (m, 96) and rel_err(out.cpu(), ref) < tolerance(torch.bfloat16)
