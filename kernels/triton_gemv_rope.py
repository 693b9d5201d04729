"""The one-row qkv GEMV with rotary embedding and the K/V cache write in its epilogue, in Triton.

At batch 1 each Llama layer runs the qkv GEMV (`triton_gemv.py`) and then `_rotary_kv_write_kernel`
(`triton_rotary_kv_write.py`), a ~2 us kernel plus a launch gap: ~70-74 us a step over 32 layers on the H200.
Here the GEMV's programs finish the job themselves, with the epilogue the fp8 and int4 one-row GEMVs share
(`triton_rope_epilogue.py`): a program takes the rows of `rope_rows` (BLOCK_N / 2 consecutive features of one head's
first half and the BLOCK_N / 2 features D/2 further on, not BLOCK_N consecutive output features as the plain GEMV
does), so it holds both halves of every pair it rotates, with no split-K, no arrival counter and no other program's
values. The weight is read as before (a program's rows are still whole rows, each contiguous along K) and the grid
is as large (N / BLOCK_N programs: 384 for Llama-3.1-8B's 6,144 x 4,096 at 16 rows a program).

Its sums then go through `rope_kv_store`: each output rounded to the activation dtype (the plain GEMV's store), a
query or key pair rotated, the query stored into a new `[1, H, D]` tensor and the key and value into their caches at
`slot_mapping[0]`. The tiles, the K loop and the PDL peel are the plain GEMV's at the same `default_config`, so the
sums are the same sums in the same order: `q` and the cache rows equal the unfused pair's bit for bit (the PyTorch
oracle is `gemv_rope_ref`: `gemv_ref`, then the shared `qkv_rope_ref`). `fuses_rope` says where this applies (one
row, bf16/fp16, the plain GEMV's config one K range of FMA tiles holding whole rotation pairs of one head).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from flotilla.kernels.card_tables import device_card
from flotilla.kernels.linear import gemv_ref
from flotilla.kernels.pdl import pdl_active, peeled_pdl_options
from flotilla.kernels.triton_gemv import _fma_sums, default_config
from flotilla.kernels.triton_rope_epilogue import (
    check_rope_operands,
    fits_rope,
    qkv_rope_ref,
    rope_constexprs,
    rope_kv_store,
    rope_launch_args,
    rope_rows,
)
from flotilla.kernels.triton_utils import device_sms


def gemv_rope_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """The unfused pair in PyTorch: `x @ weight.T (+ bias)` rounded to x's dtype, split into q/k/v heads, q and
    k rotated, k and v stored at `slot_mapping`; returns the rotated query `[T, H, D]`."""
    return qkv_rope_ref(gemv_ref(x, weight, bias), positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads,
                        num_kv_heads, k_scale, v_scale)  # fmt: skip


def fuses_rope(x: torch.Tensor, weight: torch.Tensor, head_dim: int) -> bool:
    """Whether `gemv_rope` takes `x @ weight.T` with `head_dim`-wide heads: one row of bf16/fp16 activations, a
    weight of the same dtype, and the plain GEMV's configuration one K range of FMA tiles holding whole rotation
    pairs of one head (`fits_rope`; so that the fused kernel runs the plain GEMV's own sums)."""
    if not (x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16)
            and x.stride(-1) == 1 and weight.dtype == x.dtype and weight.dim() == 2 and weight.stride(-1) == 1
            and weight.shape[1] > 0 and head_dim % 2 == 0 and weight.shape[0] % head_dim == 0):  # fmt: skip
        return False
    n, k = weight.shape
    cfg = default_config(1, n, k, device_sms(x), card=device_card(x))
    return not cfg.use_dot and cfg.split_k == 1 and fits_rope(cfg.block_n, head_dim)


@triton.jit
def _gemv_rope_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    N,
    K,
    stride_wn,
    rope,  # the epilogue's operands (`rope_launch_args`)
    HAS_BIAS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr = False,
    PDL_GDC: tl.constexpr = True,
):
    pid = tl.program_id(0)
    head, first, cols = rope_rows(pid, BLOCK_N, HEAD_DIM)  # whole rotation pairs of one head
    col_ok = cols < N  # always true (N is a whole number of heads); the plain GEMV's masks, for its code
    rows = tl.arange(0, 1)
    row_ok = rows < 1
    ks = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + ks[None, :]
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * 0 + ks[None, :]
    # The plain GEMV's loop (`_gemv_kernel`, one row, one K range, FMA; by PDL the first weight tile before the wait):
    # the same tiles in the same order.
    acc, _ = _fma_sums(x_ptrs, w_ptrs, w_ptrs, row_ok, col_ok, K, 1, BLOCK_N, BLOCK_K, NUM_STAGES, PDL, PDL_GDC,
                       False)  # fmt: skip
    res = tl.sum(acc, 2)  # [1, BLOCK_N]
    if HAS_BIAS:  # added before the rounding, as the plain GEMV (Qwen2's qkv bias: before the rotation)
        res += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
    rope_kv_store(res, head, first, rope, HEAD_DIM, PAGE, FP8_CACHE, BLOCK_N)


def gemv_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    *,
    pdl: bool | None = None,
    pdl_gdc: bool = True,
    **knobs: Any,
) -> torch.Tensor:
    """`gemv_rope_ref` in one launch for one row `x` `[1, K]` (where `fuses_rope`): returns the rotated query
    `[1, H, D]` (new); the rotated key and the value land in the `[blocks, page, Hkv, D]` caches.
    `pdl`: launched by programmatic dependent launch, as the plain GEMV (default: FLOTILLA_PDL where capable);
    `pdl_gdc=False` (tests only) keeps the peeled first step without griddepcontrol (the interpreter has none).
    `knobs` (block_n, block_k, num_warps, num_stages; benchmarks) override the plain GEMV's configuration, which
    `fuses_rope` checked: a tile that splits a rotation pair fails the launch."""
    head_dim = cos_sin_cache.shape[-1]
    n, k = weight.shape
    assert fuses_rope(x, weight, head_dim), "gemv_rope needs fuses_rope()"
    assert x.shape[1] == k and x.stride(-1) == 1
    assert bias is None or (bias.shape == (n,) and bias.is_contiguous())
    check_rope_operands(n, cos_sin_cache, k_cache, v_cache, num_heads, num_kv_heads)
    q_out = torch.empty(1, num_heads, head_dim, dtype=x.dtype, device=x.device)
    cfg = default_config(1, n, k, device_sms(x), card=device_card(x), **knobs)
    assert not cfg.use_dot and cfg.split_k == 1 and fits_rope(cfg.block_n, head_dim), f"tile {cfg} vs heads"
    consts = peeled_pdl_options(pdl_gdc) if (pdl_active(x) if pdl is None else pdl) else {}
    _gemv_rope_kernel[(n // cfg.block_n,)](
        x, weight, bias if bias is not None else x, n, k, weight.stride(0),  # (no bias: an unused stand-in)
        rope_launch_args(positions, cos_sin_cache, slot_mapping, q_out, k_cache, v_cache, num_heads, num_kv_heads,
                         k_scale, v_scale),
        HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, NUM_STAGES=cfg.num_stages,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **rope_constexprs(cos_sin_cache, k_cache), **consts,
    )  # fmt: skip
    return q_out


__all__ = ["fuses_rope", "gemv_rope", "gemv_rope_ref"]
