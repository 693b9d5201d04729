"""int8 W8A8's int32 products scaled into the output dtype in one Triton kernel (after `torch._int_mm` on CUDA).

Same contract as the scaling in `int8_linear.int8_matmul`: `acc` int32 `[M, N]` -> `acc * x_scale * w_scale^T
(+ bias)` in fp32, in that order, rounded once to the output dtype, so the values equal the reference's bit for
bit. In torch that is five launches (the int32 -> fp32 copy, two products, the bias, the cast) with fp32
temporaries of `[M, N]` each: at a prefill of 16,384 rows and Llama-3.1-8B's gate/up width (28,672) that is
1.9 GB apiece, which the start-up memory profile would count against the KV cache. Here one pass reads the int32
product once and writes the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_N = 1024


@triton.jit
def _scale_rows_kernel(
    acc_ptr,
    x_scale_ptr,
    w_scale_ptr,
    bias_ptr,
    out_ptr,
    N,
    stride_am,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    acc = tl.load(acc_ptr + row * stride_am + cols, mask=ok, other=0).to(tl.float32)
    out = acc * tl.load(x_scale_ptr + row) * tl.load(w_scale_ptr + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


def scale_int32_rows(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                     out_dtype: torch.dtype) -> torch.Tensor:
    """`acc` int32 `[M, N]` times the fp32 row scales `x_scale` `[M, 1]` and column scales `w_scale` (`N` values),
    plus `bias` `[N]`, in `out_dtype`."""
    m, n = acc.shape
    out = torch.empty(m, n, dtype=out_dtype, device=acc.device)
    if m and n:
        x_scale = x_scale.float().reshape(m).contiguous()
        w_scale = w_scale.float().reshape(n).contiguous()
        _scale_rows_kernel[(m, triton.cdiv(n, _BLOCK_N))](
            acc, x_scale, w_scale, bias if bias is not None else w_scale, out, n, acc.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, BLOCK_N=_BLOCK_N,
        )  # fmt: skip
    return out


__all__ = ["scale_int32_rows"]
