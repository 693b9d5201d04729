"""Batched LoRA shrink and expand in Triton, each token reading its own adapter's slot.

One program per (token, block of output features): a GEMV against the token's adapter, so a step may
mix any number of resident adapters (and base-model tokens, slot -1, which read nothing and write
nothing). Nothing depends on host values, so both kernels can be captured in a CUDA graph.
References: `lora.py` (`lora_shrink_ref`, `lora_expand_ref`); fp32 accumulation, one rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, slots_ptr, out_ptr, stride_x, stride_as, stride_ar, stride_o, K, R,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    rs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    # A base-model token (slot -1) masks every load: its row comes out zero.
    k_end = tl.where(slot >= 0, K, 0)
    slot = tl.maximum(slot, 0)
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_end
        x = tl.load(x_ptr + t * stride_x + ks, mask=k_ok, other=0.0).to(tl.float32)
        a_ptrs = a_ptr + slot * stride_as + rs[:, None] * stride_ar + ks[None, :]
        a = tl.load(a_ptrs, mask=(rs[:, None] < R) & k_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(out_ptr + t * stride_o + rs, acc.to(out_ptr.dtype.element_ty), mask=rs < R)


@triton.jit
def _expand_kernel(y_ptr, buf_ptr, b_ptr, slots_ptr, stride_y, stride_buf, stride_bs, stride_bn, N, R,
                   BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rs = tl.arange(0, BLOCK_R)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    # A base-model token (slot -1) masks every load and the store: its row is left as it is.
    n_end = tl.where(slot >= 0, N, 0)
    slot = tl.maximum(slot, 0)
    n_ok = ns < n_end
    r_ok = rs < R
    buf = tl.load(buf_ptr + t * stride_buf + rs, mask=r_ok, other=0.0).to(tl.float32)
    b_ptrs = b_ptr + slot * stride_bs + ns[:, None] * stride_bn + rs[None, :]
    b = tl.load(b_ptrs, mask=n_ok[:, None] & r_ok[None, :], other=0.0).to(tl.float32)
    delta = tl.sum(b * buf[None, :], axis=1)
    y = tl.load(y_ptr + t * stride_y + ns, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * stride_y + ns, (y + delta).to(y_ptr.dtype.element_ty), mask=n_ok)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, token_slots: torch.Tensor, *, block_r: int = 16,
                block_k: int = 128) -> torch.Tensor:
    """`[T, in]` x, `[S, R, in]` A, `[T]` slots -> `[T, R]` (zero rows for slot -1)."""
    t, k = x.shape
    r = a.shape[1]
    assert x.stride(1) == 1 and a.stride(2) == 1
    out = torch.empty(t, r, dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    block_r = min(block_r, triton.next_power_of_2(r))
    block_k = min(block_k, triton.next_power_of_2(k))
    _shrink_kernel[(t, triton.cdiv(r, block_r))](
        x, a, token_slots, out, x.stride(0), a.stride(0), a.stride(1), out.stride(0), k, r,
        BLOCK_R=block_r, BLOCK_K=block_k,
    )
    return out


def lora_expand(y: torch.Tensor, buf: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor, *,
                block_n: int = 64) -> None:
    """`y[t] += B[slot(t)] @ buf[t]` in place; `y` may be a column slice (unit column stride)."""
    t, n = y.shape
    r = b.shape[2]
    assert y.stride(1) == 1 and buf.stride(1) == 1 and b.stride(2) == 1
    if t == 0:
        return
    block_n = min(block_n, triton.next_power_of_2(n))
    _expand_kernel[(t, triton.cdiv(n, block_n))](
        y, buf, b, token_slots, y.stride(0), buf.stride(0), b.stride(0), b.stride(1), n, r,
        BLOCK_N=block_n, BLOCK_R=triton.next_power_of_2(r),
    )


__all__ = ["lora_expand", "lora_shrink"]
