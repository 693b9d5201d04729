"""Rotary embedding fused with the KV-cache write for CPU tensors: the reference's values, in fewer torch ops.

On the CPU a one-row decode step is a chain of small torch ops (30 layers of the embedded model, each a few
microseconds of dispatch), so the op count is the cost. The reference (`apply_rotary_ref` then
`write_kv_cache_ref`) builds cos/sin from the cache, rotates q and k apart, filters padding slots and copies, in
~25 ops a layer. Here what every layer derives alike (cos and a sign-folded sin in the activations' dtype, the
slots as int64) is made once a step and kept in the step's memo (`AttentionMetadata.derived`), and when q and k
are neighbouring views of one fused QKV output (the Llama layer's split) both rotate in one pass over that
buffer: 4 ops for the rotation, 2 for the write. Every product and sum is rounded as in the reference
(`x * cos` and `rotate_half(x) * sin` each in the activations' dtype, then their sum; `-a * b == a * -b`
exactly), so the result is bit-identical; tests check it against the reference.
"""

from __future__ import annotations

import torch

from flotilla.kernels.paged_attention import write_kv_cache_ref
from flotilla.kernels.rotary import apply_rotary_ref


def rotary_and_write_kv_cpu(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    memo: dict,
) -> torch.Tensor:
    """Rotate `query` `[T, H, D]` and `key` `[T, Hkv, D]`, store the rotated key and `value` at their slots (a
    cache of the activations' dtype, scale 1: the caller keeps fp8 pools on the reference); returns the rotated
    query. `memo`: the step's dict, shared by every layer."""
    cos, sin = cos_sin(memo, positions, cos_sin_cache, query.dtype)
    heads = query.shape[1]
    both = _adjacent(query, key)
    if both is None:
        q, k = rotate(query, cos, sin), rotate(key, cos, sin)
    else:
        qk = rotate(both, cos, sin)
        q, k = qk[:, :heads], qk[:, heads:]
    write_kv(k, value, k_cache, v_cache, slot_mapping, memo)
    return q


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    memo: dict,
    flat: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Store `key` and `value` `[T, Hkv, D]` at their slots: one `index_copy_` a pool with the slots as int64
    (made once a step, in `memo`), or the reference where some slots are padding (-1), which it filters. `flat`:
    the pools' `[slots, Hkv, D]` views when the caller keeps them."""
    if "cpu_slots" not in memo:
        memo["cpu_slots"] = slot_mapping.long() if bool((slot_mapping >= 0).all()) else None
    slots: torch.Tensor | None = memo["cpu_slots"]
    if slots is None:
        write_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping)
        return
    k_flat, v_flat = flat or (k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:]))
    k_flat.index_copy_(0, slots, key)
    v_flat.index_copy_(0, slots, value)


def cos_sin(memo: dict, positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """`[T, 1, D]` cos (both halves) and sin with its first half negated, in `dtype`, made once a step."""
    key = ("cpu_cos_sin", cos_sin_cache.data_ptr(), dtype)
    found = memo.get(key)
    if found is None:
        half = cos_sin_cache.shape[-1] // 2
        cs = cos_sin_cache[positions.long()]
        cos = torch.cat((cs[:, :half], cs[:, :half]), dim=-1).to(dtype)[:, None, :]
        sin = cs[:, half:].to(dtype)
        found = memo[key] = (cos, torch.cat((-sin, sin), dim=-1)[:, None, :])
    return found


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`x * cos + rotate_half(x) * sin`: `rotate_half(x) = [-x2, x1]` is `roll(x) = [x2, x1]` times the signs
    folded into `signed_sin`."""
    out = x * cos
    return out.add_(x.roll(x.shape[-1] // 2, dims=-1).mul_(signed_sin))  # roll's output is fresh: in place


def _adjacent(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    """`[T, H + Hkv, D]` over both when `key`'s heads directly follow `query`'s in memory (the views a fused QKV
    output splits into), else None."""
    if query.dtype != key.dtype or query.stride(-1) != 1 or key.stride(-1) != 1:
        return None
    t, heads, dim = query.shape
    # one row: the row stride means nothing (a reshape of a [1, H * D] view may report H * D for q and Hkv * D
    # for k, so session 11's one-row decode step rotated q and k apart)
    if query.stride(1) != dim or key.stride(1) != dim or t != key.shape[0] or (
            t > 1 and query.stride(0) != key.stride(0)):
        return None
    if key.data_ptr() != query.data_ptr() + heads * dim * query.element_size():
        return None
    return query.as_strided((t, heads + key.shape[1], dim), (query.stride(0), dim, 1))


def rotary_and_write_kv_cpu_ref(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """The reference this module matches: `apply_rotary_ref`, then `write_kv_cache_ref`."""
    query, key = apply_rotary_ref(positions, query, key, cos_sin_cache)
    write_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping)
    return query
