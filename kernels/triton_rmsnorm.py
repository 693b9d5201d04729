"""Fused RMSNorm (+ residual add) in Triton.

Same contract and rounding points as `rms_norm_ref`: with a residual, `x + residual` is rounded to
the input dtype and returned as the next residual; the normalised row is rounded to the input dtype
before the weight multiply (HF transformers' order). One program normalises one row in one pass:
each input is read once and each output written once, the sum of squares in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.pdl import pdl_launch_options


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:  # launched by PDL (kernels/pdl.py): let the next GEMV start loading weights, wait for our inputs
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
        summed = (x + r).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_ro + cols, summed, mask=ok)
        x = summed.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / hidden + eps)
    h = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * h).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm over the last dimension of `x` `[..., hidden]`; returns `(out, new_residual or None)`.

    The output dtype follows `weight * x` (as the reference); the new residual has `x`'s dtype.
    """
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    assert x2.stride(-1) == 1 and weight.is_contiguous()
    rows = x2.shape[0]
    out = torch.empty(x.shape, dtype=torch.result_type(weight, x), device=x.device)
    res_out = None
    if residual is not None:
        residual2 = residual.reshape(-1, hidden)
        assert residual2.stride(-1) == 1
        res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        residual2 = x2  # unused
    if rows == 0:
        return out, res_out
    block = triton.next_power_of_2(hidden)
    if num_warps is None:  # 8-16 elements per thread: wide loads, the row held in registers
        num_warps = max(1, min(16, block // 512))
    out2 = out.view(-1, hidden)
    res_out2 = res_out.view(-1, hidden) if res_out is not None else out2
    _rms_norm_kernel[(rows,)](
        x2,
        residual2,
        weight,
        out2,
        res_out2,
        x2.stride(0),
        residual2.stride(0),
        out2.stride(0),
        res_out2.stride(0),
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=num_warps,
        **pdl_launch_options(x),
    )
    return out, res_out


__all__ = ["rms_norm"]
