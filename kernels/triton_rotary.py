"""Rotary position embedding in Triton (NeoX / HF "rotate half" layout).

Same contract as `apply_rotary_ref`: `cos_sin_cache[pos]` holds cos(θ) in its first half and sin(θ)
in its second; both are rounded to the activation dtype before use, as HF transformers does. Any
frequency scaling (Llama-3, linear, ...) lives in how the cache was built, not here. One program
rotates every query and key head of one token, reading that token's cos/sin row once; `query` and
`key` may be strided views (e.g. slices of a fused QKV projection); outputs are new tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _load_halves(ptr, t, stride_t, stride_h, num_heads, HEADS_PAD: tl.constexpr, HALF: tl.constexpr,
                 HALF_PAD: tl.constexpr):  # fmt: skip
    """Both halves `[x1, x2]` of `num_heads` heads of token `t`, in fp32."""
    h = tl.arange(0, HEADS_PAD)[:, None]
    i = tl.arange(0, HALF_PAD)[None, :]
    mask = (h < num_heads) & (i < HALF)
    src = ptr + t * stride_t + h * stride_h + i
    return tl.load(src, mask=mask, other=0.0).to(tl.float32), tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_rotated(ptr, t, stride_t, stride_h, num_heads, x1, x2, cos, sin, HEADS_PAD: tl.constexpr,
                   HALF: tl.constexpr, HALF_PAD: tl.constexpr):  # fmt: skip
    """`[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]`, stored in the output's dtype."""
    h = tl.arange(0, HEADS_PAD)[:, None]
    i = tl.arange(0, HALF_PAD)[None, :]
    mask = (h < num_heads) & (i < HALF)
    dst = ptr + t * stride_t + h * stride_h + i
    tl.store(dst, (x1 * cos - x2 * sin).to(ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _cos_sin(cos_sin_ptr, pos, stride_cs, dtype: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """Position `pos`'s cos and sin rows `[1, HALF_PAD]`, rounded to the activation `dtype` first
    (as the reference does), in fp32."""
    i = tl.arange(0, HALF_PAD)[None, :]
    row = cos_sin_ptr + pos * stride_cs + i
    cos = tl.load(row, mask=i < HALF, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(row + HALF, mask=i < HALF, other=0.0).to(dtype).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    cos_sin_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_cs,
    num_q_heads,
    num_k_heads,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    # Issue the activations' loads before the cos/sin row's, which waits on the position: the two
    # memory round trips then overlap instead of adding up.
    pos = tl.load(positions_ptr + t).to(tl.int64)
    q1, q2 = _load_halves(q_ptr, t, stride_qt, stride_qh, num_q_heads, Q_HEADS_PAD, HALF, HALF_PAD)
    k1, k2 = _load_halves(k_ptr, t, stride_kt, stride_kh, num_k_heads, K_HEADS_PAD, HALF, HALF_PAD)
    cos, sin = _cos_sin(cos_sin_ptr, pos, stride_cs, q_ptr.dtype.element_ty, HALF, HALF_PAD)
    _store_rotated(q_out_ptr, t, stride_qot, stride_qoh, num_q_heads, q1, q2, cos, sin, Q_HEADS_PAD, HALF, HALF_PAD)
    _store_rotated(k_out_ptr, t, stride_kot, stride_koh, num_k_heads, k1, k2, cos, sin, K_HEADS_PAD, HALF, HALF_PAD)


def apply_rotary(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate `query` `[T, H, D]` and `key` `[T, Hkv, D]` by position; returns new `(query, key)`."""
    num_tokens, num_q_heads, head_dim = query.shape
    num_k_heads = key.shape[1]
    assert query.stride(-1) == 1 and key.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    assert key.dtype == query.dtype and cos_sin_cache.shape[-1] == head_dim
    q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    if num_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    if num_warps is None:  # ~16 elements per thread (H200, 40 heads x 128: 16 warps 3.3 TB/s, 4 warps 2.9)
        num_warps = max(1, min(16, triton.next_power_of_2((num_q_heads + num_k_heads) * head_dim) // 512))
    _rotary_kernel[(num_tokens,)](
        positions,
        query,
        key,
        cos_sin_cache,
        q_out,
        k_out,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        q_out.stride(0),
        q_out.stride(1),
        k_out.stride(0),
        k_out.stride(1),
        cos_sin_cache.stride(0),
        num_q_heads,
        num_k_heads,
        Q_HEADS_PAD=triton.next_power_of_2(num_q_heads),
        K_HEADS_PAD=triton.next_power_of_2(num_k_heads),
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        num_warps=num_warps,
    )
    return q_out, k_out


__all__ = ["apply_rotary"]
