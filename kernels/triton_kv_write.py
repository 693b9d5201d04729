"""KV-cache write by slot mapping, in Triton.

Same contract as `write_kv_cache_ref`: token `t`'s K/V (`[num_kv_heads, head_dim]`) go to slot
`slot_mapping[t]` of the pool (block `slot // block_size`, offset `slot % block_size`); slot -1 is a
padding token and writes nothing. Values are cast to the cache's dtype on store; an fp8 cache stores
`value / scale` saturated at +-448 (`to_cache`). One program copies one token's K and V rows, so a
token's bytes move once, in wide contiguous accesses.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# A Triton global must be a constexpr object: a plain float compiles under the interpreter only.
FP8_MAX = tl.constexpr(448.0)


@triton.jit
def to_cache(x, inv_scale, dtype: tl.constexpr, FP8: tl.constexpr):
    """`x` in the cache's `dtype`: for fp8, scaled by `1 / scale` and saturated first."""
    if FP8:
        x = tl.clamp(x.to(tl.float32) * inv_scale, -FP8_MAX, FP8_MAX)
    return x.to(dtype)


def is_fp8(cache: torch.Tensor) -> bool:
    """True for an fp8 (e4m3) KV cache."""
    return cache.dtype == torch.float8_e4m3fn


@triton.jit
def _kv_write_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    inv_k_scale,
    inv_v_scale,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    FP8: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block = slot // PAGE
    offset = slot % PAGE
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch + d
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + d
    tl.store(k_dst, to_cache(k, inv_k_scale, k_cache_ptr.dtype.element_ty, FP8), mask=mask)
    tl.store(v_dst, to_cache(v, inv_v_scale, v_cache_ptr.dtype.element_ty, FP8), mask=mask)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    *,
    num_warps: int | None = None,
) -> None:
    """Store `key`/`value` (`[num_tokens, num_kv_heads, head_dim]`, last dim contiguous) at their slots
    (divided by `k_scale` / `v_scale` into an fp8 cache)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert key.stride(-1) == 1 and value.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    heads_pad = triton.next_power_of_2(num_kv_heads)
    block_d = triton.next_power_of_2(head_dim)
    if num_warps is None:  # ~16 bytes per thread per row of K: wide loads, enough threads in flight
        num_warps = max(1, min(16, heads_pad * block_d * key.element_size() // (16 * 32)))
    _kv_write_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        1.0 / k_scale,
        1.0 / v_scale,
        NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=heads_pad,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE=k_cache.shape[1],
        FP8=is_fp8(k_cache),
        num_warps=num_warps,
    )


__all__ = ["write_kv_cache"]
