"""Int8 W8A8 kernels (compressed-tensors' W8A8): the per-token activation quantization kernel against
`int8_linear.quantize_int8_activations`, the W8A16 GEMV with int8 weights against the reference, and the CUDA
dispatch (GPU only)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, INTERPRETING, rel_err, tolerance

from flotilla.kernels import dispatch
from flotilla.kernels.fp8_linear import fp8_weight_only_linear_ref
from flotilla.kernels.int8_linear import int8_linear_ref, quantize_int8_activations, scale_product


def _int8_weight(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) / k**0.5
    scale = w.abs().amax(-1, keepdim=True) / 127
    return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale


@pytest.mark.parametrize("static", [False, True])
def test_fused_activation_quantization_equals_the_reference(static):
    """One Triton program a row: the reference's scales and codes exactly (true divisions, ties to even; K = 3,000
    spans two 2,048 blocks; a zero row keeps the minimum scale; a static scale saturates)."""
    from flotilla.kernels.triton_int8_quant import quantize_int8_rows_triton

    g = torch.Generator().manual_seed(5)
    rows = (torch.randn(4, 3000, generator=g) * torch.tensor([[1.0], [30.0], [0.0], [1e-3]])).bfloat16()
    input_scale = torch.tensor([0.01]) if static else None
    ref_q, ref_s = quantize_int8_activations(rows, input_scale)
    q, s = quantize_int8_rows_triton(rows.to(DEVICE), input_scale.to(DEVICE) if static else None)
    assert q.dtype == torch.int8 and s.shape == (4, 1) and s.is_contiguous()
    assert torch.equal(s.cpu(), ref_s) and torch.equal(q.cpu(), ref_q)
    assert (ref_q == 127).any() and (ref_q == -128).any() if static else ref_q[2].abs().sum() == 0


def test_fused_activation_quantization_rounds_ties_to_even():
    """Exact ties (a static scale of 1) round to the even code, as torch.round does, and saturate at -128 / 127."""
    from flotilla.kernels.triton_int8_quant import quantize_int8_rows_triton

    rows = torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 200.0, -200.0, 3.25, 0.0, -0.75, 7.0, -128.5,
                          127.5, 4.5]])
    q, _ = quantize_int8_rows_triton(rows.to(DEVICE), torch.tensor([1.0], device=DEVICE))
    assert q.cpu().tolist() == [[0, 2, 2, 0, -2, -2, 126, 127, -128, 3, 0, -1, 7, -128, 127, 4]]
    assert torch.equal(q.cpu(), quantize_int8_activations(rows, torch.tensor([1.0]))[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_scaling_equals_the_reference_bit_for_bit(dtype, bias):
    """The int32 product scaled in one Triton pass: `acc * x_scale * w_scale + bias`, as `scale_product` orders and
    rounds it (N = 1,100 spans two 1,024-wide blocks; sums of K = 4,096 products, beyond fp32's exact 2^24). Under the
    interpreter a bf16 output is within one ulp (its cast truncates), compiled it is equal."""
    from flotilla.kernels.triton_int8_scale import scale_int32_rows

    g = torch.Generator().manual_seed(2)
    x8 = torch.randint(-128, 128, (20, 4096), generator=g, dtype=torch.int8)
    w8, w_scale = _int8_weight(1100, 4096, g)
    acc = torch._int_mm(x8, w8.t())
    x_scale = torch.rand(20, 1, generator=g) / 100
    b = torch.randn(1100, generator=g).to(dtype) if bias else None
    out = scale_int32_rows(acc.to(DEVICE), x_scale.to(DEVICE), w_scale.to(DEVICE), b.to(DEVICE) if bias else None,
                           dtype)  # fmt: skip
    ref = scale_product(acc, x_scale, w_scale, b, dtype)
    assert out.dtype == dtype
    if INTERPRETING and dtype == torch.bfloat16:  # the interpreter's fp32 -> bf16 cast truncates: one ulp at most
        assert ((out.float() - ref.float()).abs() <= ref.float().abs() * 2**-7).all()
    else:
        assert torch.equal(out.cpu(), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,use_dot", [(1, False), (5, True)])
def test_int8_gemv_matches_the_weight_only_reference(dtype, m, use_dot):
    """The fp8 GEMV's kernel streams int8 codes (FMA at one row, `tl.dot` with codes converted to bf16, exact);
    N = 40, K = 200 end mid-tile."""
    from flotilla.kernels.triton_gemv import int8_gemv

    g = torch.Generator().manual_seed(1)
    x = torch.randn(m, 200, generator=g).to(dtype)
    w8, scale = _int8_weight(40, 200, g)
    bias = torch.randn(40, generator=g).to(dtype)
    out = int8_gemv(x.to(DEVICE), w8.to(DEVICE), scale.to(DEVICE), bias.to(DEVICE), block_n=16, block_k=64,
                    use_dot=use_dot)  # fmt: skip
    assert out.dtype == dtype and out.shape == (m, 40)
    assert rel_err(out.cpu(), fp8_weight_only_linear_ref(x, w8, scale, bias)) < tolerance(dtype)


@pytest.mark.gpu
def test_cuda_dispatch_takes_the_int8_gemv_at_decode_and_int_mm_above():
    """Llama-3.1-8B's o_proj shape: 1 and 16 rows through the int8 GEMV (equal to it bit for bit), 17 rows W8A8
    through the Triton quantization, `torch._int_mm` and the Triton scaling, equal to the CPU reference (exact int32
    sums, the same fp32 scaling) bit for bit."""
    from flotilla.kernels.triton_gemv import int8_gemv

    g = torch.Generator().manual_seed(4)
    w8, scale = _int8_weight(4096, 4096, g)
    w8, scale = w8.cuda(), scale.cuda()
    for m in (1, 16):
        x = torch.randn(m, 4096, generator=g).bfloat16().cuda()
        out = dispatch.int8_linear(x, w8, scale)
        assert torch.equal(out, int8_gemv(x, w8, scale))
        assert rel_err(out, fp8_weight_only_linear_ref(x, w8, scale)) < 1e-2
    x = torch.randn(17, 4096, generator=g).bfloat16()
    out = dispatch.int8_linear(x.cuda(), w8, scale)
    assert torch.equal(out.cpu(), int8_linear_ref(x, w8.cpu(), scale.cpu()))
