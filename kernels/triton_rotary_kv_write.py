"""Rotary embedding fused with the KV-cache write, in Triton.

The rotated key is only ever read back from the cache (the paged attention kernels read K/V from
the pages), so rotating it into a temporary and copying that into the cache costs a kernel launch
and a round trip per layer. Here one program per token rotates the token's query heads into a new
tensor and its key heads straight into their cache slot, and copies its value heads beside them.
A decode step at batch 1 has 32 layers of ~1.5 us kernels like these, so a launch saved per layer
is time saved. Contracts: `apply_rotary_ref` (NeoX layout, cos/sin rounded to the activation dtype
first) and `write_kv_cache_ref` (slot -1 is padding: nothing written; an fp8 cache stores K / k_scale
and V / v_scale, the rotated key rounded to the activation dtype first, as the reference does).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.pdl import pdl_launch_options
from flotilla.kernels.triton_kv_write import is_fp8, to_cache
from flotilla.kernels.triton_rotary import _cos_sin, _load_halves, _store_rotated


@triton.jit
def _store_rotated_kv(row, stride_h, num_heads, x1, x2, cos, sin, act_dtype: tl.constexpr, inv_scale,
                      HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                      FP8: tl.constexpr):  # fmt: skip
    """The rotated key heads into a cache row, through the activation dtype (as the reference)."""
    h = tl.arange(0, HEADS_PAD)[:, None]
    i = tl.arange(0, HALF_PAD)[None, :]
    mask = (h < num_heads) & (i < HALF)
    dst = row + h * stride_h + i
    dtype = row.dtype.element_ty
    tl.store(dst, to_cache((x1 * cos - x2 * sin).to(act_dtype), inv_scale, dtype, FP8), mask=mask)
    tl.store(dst + HALF, to_cache((x2 * cos + x1 * sin).to(act_dtype), inv_scale, dtype, FP8), mask=mask)


@triton.jit
def _rotary_kv_write_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    cos_sin_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_qot,
    stride_qoh,
    stride_cs,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    num_q_heads,
    num_kv_heads,
    inv_k_scale,
    inv_v_scale,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    FP8: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:  # launched by PDL (kernels/pdl.py) after the qkv GEMV: its output is every input read here
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    q1, q2 = _load_halves(q_ptr, t, stride_qt, stride_qh, num_q_heads, Q_HEADS_PAD, HALF, HALF_PAD)
    k1, k2 = _load_halves(k_ptr, t, stride_kt, stride_kh, num_kv_heads, K_HEADS_PAD, HALF, HALF_PAD)
    cos, sin = _cos_sin(cos_sin_ptr, pos, stride_cs, q_ptr.dtype.element_ty, HALF, HALF_PAD)
    _store_rotated(q_out_ptr, t, stride_qot, stride_qoh, num_q_heads, q1, q2, cos, sin, Q_HEADS_PAD, HALF, HALF_PAD)
    if slot >= 0:
        block, offset = slot // PAGE, slot % PAGE
        k_row = k_cache_ptr + block * stride_kcb + offset * stride_kcs
        if FP8:
            _store_rotated_kv(k_row, stride_kch, num_kv_heads, k1, k2, cos, sin, q_ptr.dtype.element_ty,
                              inv_k_scale, K_HEADS_PAD, HALF, HALF_PAD, FP8)
        else:
            _store_rotated(k_row, 0, 0, stride_kch, num_kv_heads, k1, k2, cos, sin, K_HEADS_PAD, HALF, HALF_PAD)
        v1, v2 = _load_halves(v_ptr, t, stride_vt, stride_vh, num_kv_heads, K_HEADS_PAD, HALF, HALF_PAD)
        h = tl.arange(0, K_HEADS_PAD)[:, None]
        i = tl.arange(0, HALF_PAD)[None, :]
        mask = (h < num_kv_heads) & (i < HALF)
        v_row = v_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + i
        v_dtype = v_cache_ptr.dtype.element_ty
        tl.store(v_row, to_cache(v1, inv_v_scale, v_dtype, FP8), mask=mask)
        tl.store(v_row + HALF, to_cache(v2, inv_v_scale, v_dtype, FP8), mask=mask)


def rotary_and_write_kv(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    *,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Rotate `query` `[T, H, D]` (returned, new) and `key` `[T, Hkv, D]`; store the rotated key and
    `value` at `slot_mapping` in the `[blocks, page, Hkv, D]` caches."""
    num_tokens, num_q_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    assert query.stride(-1) == 1 and key.stride(-1) == 1 and value.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    assert key.dtype == query.dtype and cos_sin_cache.shape[-1] == head_dim
    q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_tokens == 0:
        return q_out
    half = head_dim // 2
    if num_warps is None:  # as the rotary kernel: ~16 elements per thread
        num_warps = max(1, min(16, triton.next_power_of_2((num_q_heads + 2 * num_kv_heads) * head_dim) // 512))
    _rotary_kv_write_kernel[(num_tokens,)](
        positions,
        query,
        key,
        value,
        cos_sin_cache,
        q_out,
        k_cache,
        v_cache,
        slot_mapping,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        q_out.stride(0),
        q_out.stride(1),
        cos_sin_cache.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        num_q_heads,
        num_kv_heads,
        1.0 / k_scale,
        1.0 / v_scale,
        Q_HEADS_PAD=triton.next_power_of_2(num_q_heads),
        K_HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        PAGE=k_cache.shape[1],
        FP8=is_fp8(k_cache),
        num_warps=num_warps,
        **pdl_launch_options(query),
    )
    return q_out


__all__ = ["rotary_and_write_kv"]
