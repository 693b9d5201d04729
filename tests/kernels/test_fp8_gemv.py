"""fp8-weight GEMV (W8A16, Triton) against `fp8_weight_only_linear_ref`, and its dispatch at decode."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, INTERPRETING, rel_err, tolerance

from flotilla.kernels import dispatch
from flotilla.kernels.fp8_linear import fp8_linear_ref, fp8_weight_only_linear_ref, quantize_fp8_rows


def _case(m: int, n: int, k: int, dtype: torch.dtype, *, bias: bool = True, seed: int = 0):
    """Rows of `x` in `dtype`; a weight rounded to e4m3 per output row with fp32 scales `[n, 1]`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w8, scale = quantize_fp8_rows(torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) / k**0.5)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w8, scale, b


def _on_device(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [t.to(DEVICE) if t is not None else None for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,split_k", [(1, 1), (3, 3)])
def test_fma_path_scales_each_output_and_matches_reference(dtype, m, split_k):
    """N = 40, K = 200 end mid-tile; with split-K each K range is scaled before the partials meet."""
    from flotilla.kernels.triton_gemv import fp8_gemv

    x, w8, scale, bias = _case(m, 40, 200, dtype)
    out = fp8_gemv(*_on_device(x, w8, scale, bias), block_n=16, block_k=64, split_k=split_k, use_dot=False)
    assert out.dtype == dtype and out.shape == (m, 40)
    assert rel_err(out.cpu(), fp8_weight_only_linear_ref(x, w8, scale, bias)) < tolerance(dtype)


@pytest.mark.parametrize("m,split_k", [(5, 1), (16, 2)])
def test_dot_path_matches_reference_up_to_sixteen_rows(m, split_k):
    """The swap-AB `tl.dot` path the dispatch takes for 5..16 decode rows; a scale of shape `[N]`."""
    from flotilla.kernels.triton_gemv import fp8_gemv

    x, w8, scale, bias = _case(m, 48, 160, torch.bfloat16, seed=1)
    out = fp8_gemv(*_on_device(x, w8, scale.reshape(-1), bias), block_n=16, block_k=32, split_k=split_k,
                   use_dot=True)  # fmt: skip
    assert rel_err(out.cpu(), fp8_weight_only_linear_ref(x, w8, scale, bias)) < tolerance(torch.bfloat16)


def test_default_config_for_one_byte_weights_follows_the_measured_grid():
    """fp8 tiles as the H200 grid chose them (FMA 512 x 3 stages at M = 1, dot with 64-row tiles and
    split-K from M = 4); bf16's tiles are unchanged."""
    from flotilla.kernels.triton_gemv import default_config, fp8_gemv

    fp8, bf16 = default_config(1, 4096, 4096, 132, weight_bytes=1), default_config(1, 4096, 4096, 132)
    assert (fp8.block_k, fp8.num_stages, bf16.block_k, bf16.num_stages) == (512, 3, 512, 2) and not fp8.use_dot
    assert 1 * fp8.block_n * fp8.block_k <= 64 * 32 * fp8.num_warps
    fp8_4, bf16_4 = default_config(4, 6144, 4096, 132, weight_bytes=1), default_config(4, 6144, 4096, 132)
    assert fp8_4.use_dot and (fp8_4.block_n, fp8_4.split_k) == (64, 4) and not bf16_4.use_dot
    assert default_config(16, 6144, 4096, 132).block_n == 16  # bf16 dot tiles still shrink to fill the SMs
    x, w8, scale, _ = _case(2, 24, 1100, torch.float32, bias=False, seed=2)  # default knobs, K ragged
    out = fp8_gemv(*_on_device(x, w8, scale))
    assert rel_err(out.cpu(), fp8_weight_only_linear_ref(x, w8, scale)) < 1e-5


def test_dispatch_runs_w8a16_up_to_the_threshold_and_w8a8_above(monkeypatch):
    """CPU dispatch computes what the GPU does: decode rows skip the activation rounding, a prefill of
    more than FP8_GEMV_MAX_ROWS rows keeps W8A8; FLOTILLA_FP8_GEMV=0 (the flag read at import) keeps
    W8A8 everywhere. Weight-only checkpoints above the threshold dequantize and multiply densely."""
    limit = dispatch.FP8_GEMV_MAX_ROWS
    x, w8, scale, bias = _case(limit + 1, 32, 64, torch.float32, seed=3)
    small = x[:limit].reshape(2, limit // 2, 64)  # leading dims count as rows
    assert torch.equal(dispatch.fp8_linear(small, w8, scale, bias),
                       fp8_weight_only_linear_ref(small, w8, scale, bias))  # fmt: skip
    assert torch.equal(dispatch.fp8_linear(x, w8, scale, bias), fp8_linear_ref(x, w8, scale, bias))
    dense = torch.nn.functional.linear(x, w8.float() * scale, bias)
    assert torch.equal(dispatch.fp8_weight_only_linear(x, w8, scale, bias), dense)
    # W8A16 is closer to the unrounded activations than W8A8 is
    exact = x[:1] @ (w8.float() * scale).t() + bias
    assert rel_err(dispatch.fp8_linear(x[:1], w8, scale, bias), exact) < 1e-6
    monkeypatch.setattr(dispatch, "FP8_GEMV_ENABLED", False)
    assert torch.equal(dispatch.fp8_linear(x[:1], w8, scale, bias), fp8_linear_ref(x[:1], w8, scale, bias))


@pytest.mark.gpu
def test_cuda_dispatch_takes_the_fp8_gemv_at_decode_and_scaled_mm_above():
    """Llama-3.1-8B's o_proj shape on the GPU: one row and 16 rows through the Triton GEMV (equal to
    it bit for bit), 17 rows through `_scaled_mm` with the fused activation quantization."""
    from flotilla.kernels.fp8_scaled_mm import fp8_linear_scaled_mm
    from flotilla.kernels.triton_gemv import fp8_gemv

    g = torch.Generator(device="cuda").manual_seed(4)
    w8, scale = quantize_fp8_rows(torch.randn(4096, 4096, device="cuda", generator=g) * 0.02)
    for m in (1, 16):
        x = torch.randn(m, 4096, device="cuda", generator=g).bfloat16()
        out = dispatch.fp8_linear(x, w8, scale)
        assert torch.equal(out, fp8_gemv(x, w8, scale))
        assert rel_err(out, fp8_weight_only_linear_ref(x, w8, scale)) < 1e-2
    x = torch.randn(17, 4096, device="cuda", generator=g).bfloat16()
    if dispatch.fp8_tensor_cores(x.device):
        out = dispatch.fp8_linear(x, w8, scale)
        assert torch.equal(out, fp8_linear_scaled_mm(x, w8, scale))
        # The fused activation quantization equals the reference's on the CPU bit for bit (true divisions,
        # rounded to nearest). Not torch's own ops on CUDA: they divide by the scalar 448 through its
        # reciprocal, a scale one ulp off at times, and a value at a rounding tie then takes the other
        # code (685 of 7.3 M codes differed on the H200, 2026-12-03).
        from flotilla.kernels.triton_fp8_quant import quantize_fp8_rows_triton

        xs = torch.randn(512, 14336, device="cuda", generator=g).bfloat16()
        q, s = quantize_fp8_rows_triton(xs)
        q_ref, s_ref = quantize_fp8_rows(xs.cpu())
        assert torch.equal(s.cpu(), s_ref) and torch.equal(q.cpu().float(), q_ref.float())


@pytest.mark.parametrize("static", [False, True])
def test_fused_activation_quantization_matches_reference(static):
    """One Triton kernel for W8A8's per-token (or static) activation quantization: the same scales and,
    to one e4m3 step, the same values (the interpreter truncates where the GPU rounds to nearest, and
    loses the carry when rounding up crosses a power of two: such elements, at most 2 %, are left out
    under the interpreter only, as in test_fp8_kv_cache.py); K = 3,000 spans two 2,048 blocks; a zero
    row keeps the minimum scale; a static scale saturates."""
    from flotilla.kernels.fp8_linear import quantize_fp8_activations
    from flotilla.kernels.triton_fp8_quant import quantize_fp8_rows_triton

    g = torch.Generator().manual_seed(5)
    rows = (torch.randn(4, 3000, generator=g) * torch.tensor([[1.0], [30.0], [0.0], [1e-3]])).bfloat16()
    input_scale = torch.tensor([0.01]) if static else None
    ref_q, ref_s = quantize_fp8_activations(rows, input_scale)
    q, s = quantize_fp8_rows_triton(rows.to(DEVICE), input_scale.to(DEVICE) if static else None)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (4, 1) and s.is_contiguous()
    torch.testing.assert_close(s.cpu(), ref_s, rtol=0, atol=0)
    q, ref_q = q.cpu().float(), ref_q.float()
    if INTERPRETING:
        carry_lost = (ref_q != 0) & (q * 2 == ref_q) & (ref_q.abs().log2() == ref_q.abs().log2().round())
        assert carry_lost.float().mean() < 0.02
        q = torch.where(carry_lost, ref_q, q)
    step = ref_q.abs().clamp(min=2**-6) * 2**-3 + 2**-9  # one e4m3 step around each value
    assert ((q - ref_q).abs() <= step).all() and q.abs().max() <= 448
