"""torch's packed int4/int8 CPU kernels (`kernels/cpu_int_linear.py`) against the dequantizing reference."""

from __future__ import annotations

import pytest
import torch

from flotilla.kernels.cpu_int_linear import cpu_int_linear, cpu_int_weight
from flotilla.kernels.dispatch import packed_int_linear
from flotilla.kernels.packed_int_linear import pack_codes, packed_int_linear_ref


def _weight(bits: int, rows: int, cols: int, group: int, dtype: torch.dtype, symmetric: bool):
    g = torch.Generator().manual_seed(bits * 100 + group)
    codes = torch.randint(0, 2**bits, (rows, cols), generator=g)
    scales = (torch.rand(rows, cols // group, generator=g) * 0.02 + 0.005).to(dtype)
    zeros = torch.full((rows, cols // group), 2 ** (bits - 1), dtype=torch.uint8) if symmetric else \
        torch.randint(0, 2**bits, (rows, cols // group), generator=g).to(torch.uint8)
    return pack_codes(codes, bits), scales, zeros


@pytest.mark.parametrize(("bits", "group", "symmetric"), [(4, 32, False), (4, 64, True), (8, 192, True)])
@pytest.mark.parametrize("rows_in", [1, 5])
def test_packed_kernels_match_the_reference(bits, group, symmetric, rows_in):
    packed, scales, zeros = _weight(bits, 96, 192, group, torch.bfloat16, symmetric)
    weight = cpu_int_weight(packed, scales, zeros, bits, group)
    assert weight is not None
    x = torch.randn(rows_in, 192, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    bias = torch.randn(96).to(torch.bfloat16)
    ref = packed_int_linear_ref(x.float(), packed, scales.float(), zeros, bits, group, bias.float())
    out = cpu_int_linear(x, weight, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (rows_in, 96)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    # dispatch takes the prepared weight for bf16 inputs and the reference for fp32 ones
    torch.testing.assert_close(packed_int_linear(x, packed, scales, zeros, bits, group, bias, cpu_weight=weight), out)
    fp32 = packed_int_linear(x.float(), packed, scales.float(), zeros, bits, group, bias.float(), cpu_weight=weight)
    torch.testing.assert_close(fp32, ref)


def test_layouts_the_kernels_lack_stay_on_the_reference():
    packed, scales, zeros = _weight(4, 32, 96, 96, torch.bfloat16, True)  # a group of 96: not 32..256 by 2^k
    assert cpu_int_weight(packed, scales, zeros, 4, 96) is None
    packed, scales, zeros = _weight(8, 32, 128, 64, torch.bfloat16, True)  # 8-bit, two groups a row
    assert cpu_int_weight(packed, scales, zeros, 8, 64) is None
    packed, scales, zeros = _weight(4, 32, 128, 32, torch.float32, True)  # fp32: the reference is faster
    assert cpu_int_weight(packed, scales, zeros, 4, 32) is None


@pytest.mark.parametrize("rows_in", [1, 5])
def test_8bit_block_codes_as_two_4bit_planes_match_their_dense_weight(rows_in):
    """Q8_0-style codes (one scale a block of 32) through the int4 kernel as two planes: the weight `d * q` with d
    in bf16, exactly (the kernel's fp32 sums differ from a dense fp32 matmul by rounding only)."""
    from flotilla.kernels.cpu_int_linear import cpu_int8_blocks_weight

    gen = torch.Generator().manual_seed(0)
    out_f, in_f = 48, 96
    codes = torch.randint(-128, 128, (out_f, in_f), generator=gen, dtype=torch.int32).to(torch.int8)
    d = torch.rand(out_f, in_f // 32, generator=gen) * 0.01
    weight = cpu_int8_blocks_weight(codes, d, torch.bfloat16)
    assert weight is not None and weight.planes == 2
    dense = (codes.float().reshape(out_f, -1, 32) * d.bfloat16().float()[..., None]).reshape(out_f, in_f)
    x = torch.randn(rows_in, in_f, generator=gen).bfloat16()
    got = cpu_int_linear(x, weight).float()
    want = x.float() @ dense.t()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
