"""The qkv GEMV's rotary + K/V-cache-write epilogue, one `@triton.jit` for every one-row GEMV that fuses it.

At batch 1 a Llama layer's qkv projection is followed by `rotary_and_write_kv` (`triton_rotary_kv_write.py`), a ~2 us
kernel plus a launch gap. A GEMV whose programs each hold whole rotation pairs can finish the job itself: the NeoX
rotation pairs element d of a head with element d + D/2, so such a program takes BLOCK_N / 2 consecutive features of
one head's first half and the BLOCK_N / 2 features D/2 further on (`rope_rows`), with no other program's values.
Its fp32 sums (bias added) then go through `rope_kv_store`: each output rounded to the activation dtype (the plain
GEMV's store), a query or key pair rotated by the cos/sin row of the token's position (rounded to the activation
dtype, as `apply_rotary_ref`), the query stored into a new `[1, H, D]` tensor and the key and value into their caches
at `slot_mapping[0]` (-1: nothing written; an fp8 cache stores K / k_scale and V / v_scale, as
`triton_rotary_kv_write`): the same values as the unfused pair, bit for bit, when the sums are the plain GEMV's.

Used by the bf16/fp16 GEMV (`triton_gemv_rope.gemv_rope`), the fp8 row GEMV (`triton_fp8_row_gemv.fp8_row_gemv_rope`)
and the wide int4 GEMV (`triton_int4_gemv_fused.int4_gemv_wide_rope`). `rope_launch_args` builds the epilogue's
run-time operands, which each kernel takes as one tuple argument `rope` and hands on to `rope_kv_store` whole (Triton
passes a tuple's members as separate kernel parameters: the machine code is that of seventeen named ones);
`rope_constexprs` its compile-time ones; `qkv_rope_ref` is the PyTorch reference of the part after the projection.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flotilla.kernels.paged_attention import write_kv_cache_ref
from flotilla.kernels.rotary import apply_rotary_ref
from flotilla.kernels.triton_kv_write import is_fp8, to_cache


def fits_rope(block_n: int, head_dim: int) -> bool:
    """Whether a tile of `block_n` weight rows holds whole rotation pairs of one `head_dim`-wide head."""
    return head_dim % 2 == 0 and 2 <= block_n <= head_dim and (head_dim // 2) % (block_n // 2) == 0


@triton.jit
def rope_rows(pid, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Program `pid`'s head, its first pair index within the head's half, and its `[BLOCK_N]` weight rows: features
    first..first+BLOCK_N/2-1 of the head, then the same D/2 further on (all < N where N is whole heads)."""
    PAIRS: tl.constexpr = BLOCK_N // 2
    HALF: tl.constexpr = HEAD_DIM // 2
    head = pid // (HALF // PAIRS)
    first = (pid % (HALF // PAIRS)) * PAIRS
    r = tl.arange(0, BLOCK_N)
    rows = head * HEAD_DIM + first + (r % PAIRS) + (r // PAIRS) * HALF
    return head, first, rows


@triton.jit
def rope_kv_store(res, head, first, rope, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, FP8_CACHE: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    """Store a program's qkv outputs `res` (fp32, BLOCK_N values in `rope_rows` order, `[BLOCK_N]` or `[1, BLOCK_N]`,
    bias added) for `head`: rounded to the activation dtype (`q_out`'s), rotated (q, k) and stored (module
    docstring). `rope`: the epilogue's run-time operands as one kernel argument (`rope_launch_args`, in its order)."""
    (positions_ptr, cos_sin_ptr, slot_mapping_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, stride_cs, stride_kcb,
     stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, num_q_heads, num_kv_heads, inv_k_scale,
     inv_v_scale) = rope  # fmt: skip
    HALF: tl.constexpr = HEAD_DIM // 2
    PAIRS: tl.constexpr = BLOCK_N // 2
    act = q_out_ptr.dtype.element_ty
    y = res.to(act).to(tl.float32)  # what the plain GEMV stores and the rotary kernel loads
    y1, y2 = tl.split(tl.trans(tl.reshape(y, [2, PAIRS])))  # the pairs' first and second halves, [PAIRS] each
    i = first + tl.arange(0, PAIRS)  # the pairs' index within the head's half
    pos = tl.load(positions_ptr).to(tl.int64)
    cs_row = cos_sin_ptr + pos * stride_cs + i
    cos = tl.load(cs_row).to(act).to(tl.float32)
    sin = tl.load(cs_row + HALF).to(act).to(tl.float32)
    if head < num_q_heads:
        q_dst = q_out_ptr + head * HEAD_DIM + i
        tl.store(q_dst, (y1 * cos - y2 * sin).to(act))
        tl.store(q_dst + HALF, (y2 * cos + y1 * sin).to(act))
    else:
        slot = tl.load(slot_mapping_ptr).to(tl.int64)
        if slot >= 0:
            block, offset = slot // PAGE, slot % PAGE
            kv_head = head - num_q_heads
            # (no tl.dtype locals inside the branches: the compiler yields a branch's locals out of it)
            if kv_head < num_kv_heads:  # a key head: rotated, rounded to the activation dtype, then stored
                k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + kv_head * stride_kch + i
                tl.store(k_dst, to_cache((y1 * cos - y2 * sin).to(act), inv_k_scale, k_cache_ptr.dtype.element_ty,
                                         FP8_CACHE))  # fmt: skip
                tl.store(k_dst + HALF, to_cache((y2 * cos + y1 * sin).to(act), inv_k_scale,
                                                k_cache_ptr.dtype.element_ty, FP8_CACHE))  # fmt: skip
            else:  # a value head: stored as the GEMV rounded it
                v_head = kv_head - num_kv_heads
                v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + v_head * stride_vch + i
                tl.store(v_dst, to_cache(y1.to(act), inv_v_scale, v_cache_ptr.dtype.element_ty, FP8_CACHE))
                tl.store(v_dst + HALF, to_cache(y2.to(act), inv_v_scale, v_cache_ptr.dtype.element_ty, FP8_CACHE))


def check_rope_operands(n: int, cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        num_heads: int, num_kv_heads: int) -> None:  # fmt: skip
    """Assert what `rope_kv_store` reads: `n` = whole q/k/v heads, contiguous last dimensions, `[blocks, page, Hkv, D]`
    caches."""
    head_dim = cos_sin_cache.shape[-1]
    assert n == (num_heads + 2 * num_kv_heads) * head_dim, (n, num_heads, num_kv_heads, head_dim)
    assert cos_sin_cache.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert k_cache.shape[2:] == (num_kv_heads, head_dim) and v_cache.shape[2:] == (num_kv_heads, head_dim)


def rope_launch_args(positions: torch.Tensor, cos_sin_cache: torch.Tensor, slot_mapping: torch.Tensor,
                     q_out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int,
                     num_kv_heads: int, k_scale: float, v_scale: float) -> tuple:  # fmt: skip
    """`rope_kv_store`'s run-time operands, the one tuple argument `rope` of every kernel that fuses the epilogue (a
    kernel passes it through; Triton hands a tuple's members to the kernel as separate parameters, in this order)."""
    return (positions, cos_sin_cache, slot_mapping, q_out, k_cache, v_cache, cos_sin_cache.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), num_heads, num_kv_heads, 1.0 / k_scale, 1.0 / v_scale)  # fmt: skip


def rope_constexprs(cos_sin_cache: torch.Tensor, k_cache: torch.Tensor) -> dict[str, int | bool]:
    """`rope_kv_store`'s compile-time arguments, by the names the bf16, fp8 and int4 rope kernels give them."""
    return {"HEAD_DIM": cos_sin_cache.shape[-1], "PAGE": k_cache.shape[1], "FP8_CACHE": is_fp8(k_cache)}


def qkv_rope_ref(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int,
                 k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:  # fmt: skip
    """The unfused pair's second half in PyTorch: the projection `qkv` `[T, (H + 2 Hkv) D]` (rounded as the GEMV
    stores it) split into q/k/v heads, q and k rotated, k and v stored at `slot_mapping`; the rotated query
    `[T, H, D]`."""
    head_dim = cos_sin_cache.shape[-1]
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q, k = apply_rotary_ref(positions, q.reshape(-1, num_heads, head_dim), k.reshape(-1, num_kv_heads, head_dim),
                            cos_sin_cache)  # fmt: skip
    write_kv_cache_ref(k, v.reshape(-1, num_kv_heads, head_dim), k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q


__all__ = ["check_rope_operands", "fits_rope", "qkv_rope_ref", "rope_constexprs", "rope_kv_store", "rope_launch_args",
           "rope_rows"]
