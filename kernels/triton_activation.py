"""SiLU-and-mul in Triton: `silu(gate) * up` on the merged gate/up projection `[..., 2 * d]`.

Same rounding points as `silu_and_mul_ref`: silu(gate) is computed in fp32 and rounded to the
input dtype before the multiply, as torch does for half-precision inputs. Each element of the input
is read once and each of the output written once.

`silu_mul` is that arithmetic as a `@triton.jit` helper: this kernel's, and the epilogue of the GEMVs and the GEMM
that take its place (`triton_gated_gemv.py`, the fp8 row GEMV's gated form, the int4 fused gated form, the skinny
GEMM's gated form), so that the fused forms keep the unfused pair's rounding points by construction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.pdl import pdl_launch_options


@triton.jit
def silu_mul(gate, up, DTYPE: tl.constexpr):
    """`silu(gate) * up` at `silu_and_mul_ref`'s rounding points, from fp32 `gate` and `up` (a projection's sums, or
    values loaded from it): each rounded to `DTYPE` (as the projection is stored; exact where they already are
    `DTYPE` values), silu(gate) computed in fp32 and rounded to `DTYPE`, their product returned in fp32 (the caller
    rounds it as it stores it)."""
    gate = gate.to(DTYPE).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(DTYPE).to(tl.float32)
    return act * up.to(DTYPE).to(tl.float32)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, d, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # launched by PDL (kernels/pdl.py): let the down GEMV start loading weights, wait for our inputs
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=ok, other=0.0).to(tl.float32)
    res = silu_mul(gate, up, x_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + cols, res.to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(x: torch.Tensor, *, block: int = 1024, num_warps: int = 4) -> torch.Tensor:
    """`silu(x[..., :d]) * x[..., d:]` for `x` `[..., 2 * d]` (last dimension contiguous)."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    assert x2.stride(-1) == 1
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0 or d == 0:
        return out
    block = min(block, triton.next_power_of_2(d))
    out2 = out.view(-1, d)
    _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](
        x2, out2, x2.stride(0), out2.stride(0), d, BLOCK=block, num_warps=num_warps, **pdl_launch_options(x)
    )
    return out


__all__ = ["silu_and_mul", "silu_mul"]
