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

from flotilla.kernels.layernorm import RMSNormPrologue
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


# The prologue of a one-row GEMV that takes an RMSNorm's place (`layernorm.RMSNormPrologue`; the GEMVs of
# `triton_gemv_rope.py` and `triton_gated_gemv.py` with NORM): every program reads the whole un-normalised row
# (a few KB, L2-resident) for its sum of squares, then normalises each K tile of x as its loop loads it, with this
# kernel's rounding points. Sums of squares are in K-tile order, not `_rms_norm_kernel`'s one-block order, so the
# normalised row may differ from the standalone kernel's by one rounding step where the fp32 rstd differs. The row,
# the residual and gamma are loaded with `evict_last`: every program on an SM reads them again (the gated GEMV's
# 3,584 programs: ~40 KB each where the plain GEMV reads 8), while the weight tiles streaming beside them are read once.


@triton.jit
def _prologue_rstd(x_ptr, residual_ptr, residual_out_ptr, K, eps, pid, HAS_RESIDUAL: tl.constexpr,
                   BLOCK_K: tl.constexpr):  # fmt: skip
    """`rsqrt(mean((x + residual)^2) + eps)` of the row (the sum rounded to x's dtype first, as the norm kernel);
    program 0 (`pid`) also stores that sum (the next residual) into `residual_out`. `BLOCK_K`: `prologue_block`."""
    store_k = K - K * tl.minimum(pid, 1)  # K in program 0, 0 elsewhere (an integer bound: no scalar-bool mask)
    acc = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ok = ks < K
        x = tl.load(x_ptr + ks, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(residual_ptr + ks, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
            summed = (x + r).to(residual_out_ptr.dtype.element_ty)
            tl.store(residual_out_ptr + ks, summed, mask=ks < store_k)
            x = summed.to(tl.float32)
        acc += x * x
    return tl.rsqrt(tl.sum(acc, 0) / K + eps)


@triton.jit
def _prologue_tile(x_ptr, residual_ptr, gamma_ptr, offs, ok, rstd, HAS_RESIDUAL: tl.constexpr):
    """The normalised x at `offs` (masked by `ok`, any shape), rounded as `_rms_norm_kernel` rounds: the residual
    sum, the scaled row, and its product with gamma each to x's dtype."""
    act = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + offs, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + offs, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
        x = (x + r).to(act).to(tl.float32)
    h = (x * rstd).to(act).to(tl.float32)
    w = tl.load(gamma_ptr + offs, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    return (w * h).to(act)


@triton.jit
def _prologue_x(x_ptr, residual_ptr, gamma_ptr, x_ptrs, offs, ok, rstd, NORM: tl.constexpr,
                HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    """A one-row GEMV's x tile (masked by `ok`): with NORM the normalised row at `offs` (`_prologue_tile`), else x
    as it is, at `x_ptrs` (only one of the two addresses is used; the other is dead code)."""
    if NORM:
        x = _prologue_tile(x_ptr, residual_ptr, gamma_ptr, offs, ok, rstd, HAS_RESIDUAL)
    else:
        x = tl.load(x_ptrs, mask=ok, other=0.0)
    return x


def prologue_block(k: int) -> int:
    """The `BLOCK_K` of `_prologue_rstd` for a `k`-wide row: up to 1,024 a step (4 rounds of L2 loads at Llama's
    4,096). Wider steps cost registers the GEMV's occupancy needs (ptxas for sm_90, 4 warps, by PDL: the gated GEMV
    uses 64 registers a thread at 1,024, as without the prologue, 80 at 2,048 and 96 at 4,096; the qkv-rope GEMV
    124 at 1,024 or 2,048, 154 at 4,096, 119 without)."""
    return min(triton.next_power_of_2(max(k, 16)), 1024)


def prologue_launch_args(norm: RMSNormPrologue | None,
                         x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:  # fmt: skip
    """The prologue's run-time arguments of a GEMV kernel, in its order (`residual_ptr, gamma_ptr, residual_out_ptr,
    eps`): `norm`'s, with `x` standing in for the pointers it has not (never read)."""
    if norm is None:
        return x, x, x, 0.0
    residual = norm.residual if norm.residual is not None else x
    residual_out = norm.residual_out if norm.residual_out is not None else x
    return residual, norm.weight, residual_out, norm.eps


def prologue_constexprs(norm: RMSNormPrologue | None, k: int) -> dict[str, bool | int]:
    """The prologue's compile-time arguments of a GEMV kernel over a `k`-wide row (`NORM`, `NORM_RESIDUAL`,
    `NORM_BLOCK`)."""
    return {"NORM": norm is not None, "NORM_RESIDUAL": norm is not None and norm.residual is not None,
            "NORM_BLOCK": prologue_block(k)}  # fmt: skip


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


__all__ = ["prologue_block", "prologue_constexprs", "prologue_launch_args", "rms_norm"]
