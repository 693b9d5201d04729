"""The wide int4 GEMV's one-row fused forms: the gated MLP projection and the qkv projection with rotary + K/V write.

At batch 1 an int4 (W4A16) Llama layer ran `int4_gemv_wide` four times plus two small kernels: SiLU-and-mul after
the merged gate/up projection and `rotary_and_write_kv` after the qkv projection, 64 launches a step (each ~2 us
plus its gap in the PDL chain). Here the GEMV's programs do that work themselves, as the bf16 (`triton_gated_gemv.py`,
`triton_gemv_rope.py`) and fp8 (`triton_fp8_row_gemv.py`) one-row GEMVs do:

- `int4_gemv_wide_gated`: `silu(x @ gate^T) * (x @ up^T)` from the merged `[2N, K]` weight. A program takes
  BLOCK_N / 2 gate rows and the same features' up rows (`N` further on), so it holds both factors of each output.
- `int4_gemv_wide_rope`: the qkv projection whose programs take `triton_rope_epilogue.rope_rows` (whole rotation
  pairs of one head); their sums go through the shared `rope_kv_store` (q rotated into a new `[1, H, D]` tensor, the
  rotated key and the value into the paged caches at `slot_mapping[0]`).

The K loop is `triton_int4_gemv_wide.tile_sums` (the plain kernel's, rows given as a vector), at the plain kernel's
configuration for the weight's shape (`wide_config`: the tile table, the PDL launch and its peeled first step, split-K
ranges), so every row's sum is the plain kernel's, in the same order: the fused outputs equal the plain GEMV followed
by the SiLU kernel (or the rotary/KV-write kernel) bit for bit. Split-K: the last-arriving range of a program (an
arrival counter per program, this module's own table) sums the partials in a fixed order and runs the epilogue; where
no counters can be had (the first use inside a CUDA-graph capture), one range.

Rounding (the pair's): each projection output rounded to the activation dtype; SiLU in fp32 rounded; the product
rounded (`triton_activation.py`). Switches: FLOTILLA_INT4_GATED and FLOTILLA_INT4_QKV_ROPE (`kernels/dispatch.py`).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from flotilla.kernels.card_tables import device_card
from flotilla.kernels.split_k_counters import arrival_counters
from flotilla.kernels.triton_activation import silu_mul
from flotilla.kernels.triton_int4_gemv import _split_k_fixup, split_ranges
from flotilla.kernels.triton_int4_gemv_wide import (
    _X_KINDS,
    WideConfig,
    launch_constexprs,
    pdl_mode,
    tile_sums,
    wide_config,
    wide_supported,
)
from flotilla.kernels.triton_rope_epilogue import (
    check_rope_operands,
    fits_rope,
    rope_constexprs,
    rope_kv_store,
    rope_launch_args,
    rope_rows,
)
from flotilla.kernels.triton_utils import device_sms

_COUNTERS: dict[torch.device, torch.Tensor] = {}  # this module's arrival counters (`split_k_counters.py` says why)
_COUNTER_SLOTS = 1 << 14


@triton.jit
def _k_total(res, cols, col_ok, part_ptr, counter_ptr, N, pid, split, SPLIT_K: tl.constexpr):
    """A program's fp32 sums over all K ranges and whether it finishes the rows: one range, its own `res`; else the
    plain kernel's arrival fix-up (`_split_k_fixup`: partials `[SPLIT_K, N]`, a counter per program, summed in range
    order by the last range to arrive)."""
    total = res
    last = pid >= 0  # one range: always
    if SPLIT_K > 1:
        total, last = _split_k_fixup(res, col_ok, part_ptr, counter_ptr, pid, split, None, cols, None, N, SPLIT_K)
        if last:
            tl.atomic_xchg(counter_ptr + pid, 0)  # ready for the next launch on this stream
    return total, last


@triton.jit
def _silu_mul_store(total, out_ptr, pid, NH, HALF: tl.constexpr):
    """The gated program's outputs from its fp32 sums (`[2 HALF]`: gate rows, then up rows; bias added) at the pair's
    rounding points: each projection rounded, SiLU in fp32 rounded, the product rounded (`triton_activation.py`)."""
    out_ty = out_ptr.dtype.element_ty
    gate, up = tl.split(tl.trans(tl.reshape(total, [2, HALF])))
    res = silu_mul(gate, up, out_ty)
    o = pid * HALF + tl.arange(0, HALF)
    tl.store(out_ptr + o, res.to(out_ty), mask=o < NH)


@triton.jit
def _int4_gated_kernel(
    x_ptr,
    packed_ptr,
    scales_ptr,
    zeros_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    counter_ptr,
    N,  # the weight's rows: gate and up halves, N / 2 each
    KW,
    stride_pn,
    stride_sn,
    stride_zn,
    words_per_split,
    GROUP: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,  # weight rows a program: BLOCK_N / 2 gate rows and their up rows
    BLOCK_W: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    X_KIND: tl.constexpr,
    USE_ASM: tl.constexpr,
    EVEN: tl.constexpr = False,
    PDL: tl.constexpr = False,
    PDL_GDC: tl.constexpr = True,
    TRIGGER_LATE: tl.constexpr = 0,
    LAYOUT: tl.constexpr = 0,
    MMA: tl.constexpr = False,
):
    HALF: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    split = tl.program_id(1)
    NH = N // 2
    r = tl.arange(0, BLOCK_N)
    feat = pid * HALF + (r % HALF)  # each row's output feature
    cols = feat + (r // HALF) * NH  # rows [0, HALF): the gate rows; [HALF, BLOCK_N): the same features' up rows
    col_ok = feat < NH
    w_start = split * words_per_split
    w_end = tl.minimum(w_start + words_per_split, KW)
    acc, _, _, _ = tile_sums(x_ptr, packed_ptr, scales_ptr, zeros_ptr, cols, col_ok, N, 0, stride_pn, stride_sn,
                             stride_zn, w_start, w_end, GROUP, HAS_ZEROS, 1, BLOCK_N, BLOCK_W, NUM_STAGES, X_KIND,
                             USE_ASM, EVEN, PDL, PDL_GDC, TRIGGER_LATE, LAYOUT, MMA)  # fmt: skip
    total, last = _k_total(tl.sum(acc, 1) * 16.0, cols, col_ok, part_ptr, counter_ptr, N, pid, split, SPLIT_K)
    if last:
        if HAS_BIAS:
            total += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        _silu_mul_store(total, out_ptr, pid, NH, HALF)


@triton.jit
def _int4_rope_kernel(
    x_ptr,
    packed_ptr,
    scales_ptr,
    zeros_ptr,
    bias_ptr,
    part_ptr,
    counter_ptr,
    N,
    KW,
    stride_pn,
    stride_sn,
    stride_zn,
    words_per_split,
    rope,  # the epilogue's operands (`rope_launch_args`)
    GROUP: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    X_KIND: tl.constexpr,
    USE_ASM: tl.constexpr,
    EVEN: tl.constexpr = False,
    PDL: tl.constexpr = False,
    PDL_GDC: tl.constexpr = True,
    TRIGGER_LATE: tl.constexpr = 0,
    LAYOUT: tl.constexpr = 0,
    MMA: tl.constexpr = False,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    head, first, cols = rope_rows(pid, BLOCK_N, HEAD_DIM)
    col_ok = cols < N  # always (whole heads); the loop's masks
    w_start = split * words_per_split
    w_end = tl.minimum(w_start + words_per_split, KW)
    acc, _, _, _ = tile_sums(x_ptr, packed_ptr, scales_ptr, zeros_ptr, cols, col_ok, N, 0, stride_pn, stride_sn,
                             stride_zn, w_start, w_end, GROUP, HAS_ZEROS, 1, BLOCK_N, BLOCK_W, NUM_STAGES, X_KIND,
                             USE_ASM, EVEN, PDL, PDL_GDC, TRIGGER_LATE, LAYOUT, MMA)  # fmt: skip
    total, last = _k_total(tl.sum(acc, 1) * 16.0, cols, col_ok, part_ptr, counter_ptr, N, pid, split, SPLIT_K)
    if last:
        if HAS_BIAS:  # before the rounding, as the plain GEMV (Qwen2's qkv bias: before the rotation)
            total += tl.load(bias_ptr + cols).to(tl.float32)
        rope_kv_store(total, head, first, rope, HEAD_DIM, PAGE, FP8_CACHE, BLOCK_N)


@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
    """One fused launch's configuration, K ranges and buffers."""

    cfg: WideConfig
    pdl: str  # "", "top", "late" (`int4_gemv_wide`'s `pdl`)
    words_per_split: int
    splits: int
    part: torch.Tensor  # fp32 partials [splits, N] (a stand-in pointer with one range)
    counters: torch.Tensor  # arrival counters (a stand-in with one range)

    @classmethod
    def plan(cls, x: torch.Tensor, n: int, k: int, pdl: str | None, knobs: dict) -> _Launch:
        """The plain kernel's launch for an `[n, k]` weight at one row (`wide_config`), split-K kept where counters
        are to be had."""
        pdl = pdl_mode(x, pdl)
        cfg = wide_config(1, n, k, device_sms(x), pdl=bool(pdl), card=device_card(x), **knobs)
        words = k // 8
        wps, splits = split_ranges(words, cfg.split_k, cfg.block_w)
        counters = None
        if splits > 1:
            counters = arrival_counters(_COUNTERS, x.device, triton.cdiv(n, cfg.block_n), _COUNTER_SLOTS)
            if counters is None:  # one range (the plain kernel would reduce in a second launch)
                wps, splits = split_ranges(words, 1, cfg.block_w)
        part = torch.empty(splits, n, dtype=torch.float32, device=x.device) if splits > 1 else x
        return cls(cfg, pdl, wps, splits, part, counters if counters is not None else x)

    def constexprs(self, x: torch.Tensor, n: int, zeros: torch.Tensor | None, bias: torch.Tensor | None, group: int,
                   pdl_gdc: bool, use_asm: bool | None, mma: bool | None = None) -> dict:  # fmt: skip
        """The kernels' compile-time arguments and launch options (the plain kernel's, `launch_constexprs`)."""
        return launch_constexprs(self.cfg, x, n, self.words_per_split, zeros, bias, group, self.pdl, pdl_gdc,
                                 use_asm, mma) | {"SPLIT_K": self.splits}  # fmt: skip


def _operands_ok(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                 group_size: int, bias: torch.Tensor | None) -> bool:  # fmt: skip
    """One contiguous, 8-byte aligned activation row of a kind the wide GEMV reads, and int4 operands it takes."""
    k = x.shape[-1]
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype in _X_KINDS and x.is_contiguous() and x.data_ptr() % 8 == 0
            and packed.dim() == 2 and packed.shape[1] * 8 == k and packed.stride(-1) == 1
            and scales.shape == (packed.shape[0], k // group_size) and scales.stride(-1) == 1
            and (zeros is None or (zeros.shape == scales.shape and zeros.stride(-1) == 1))
            and (bias is None or (bias.shape == (packed.shape[0],) and bias.is_contiguous()))
            and wide_supported(1, k, group_size))  # fmt: skip


def fuses_gated(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                group_size: int, bias: torch.Tensor | None) -> bool:  # fmt: skip
    """Whether `int4_gemv_wide_gated` takes this merged gate/up projection: operands the wide GEMV takes at one row,
    an even number of weight rows, and a configuration of at least 2 rows a program (gate and up)."""
    if not (_operands_ok(x, packed, scales, zeros, group_size, bias) and packed.shape[0] % 2 == 0):
        return False
    n, k = packed.shape[0], x.shape[-1]
    return wide_config(1, n, k, device_sms(x), card=device_card(x)).block_n >= 2


def fuses_rope(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
               group_size: int, bias: torch.Tensor | None, head_dim: int) -> bool:  # fmt: skip
    """Whether `int4_gemv_wide_rope` takes this qkv projection: operands the wide GEMV takes at one row, whole
    `head_dim`-wide heads, and the plain kernel's tile for this shape (plain and PDL tables) holding whole rotation
    pairs of one head."""
    if not (_operands_ok(x, packed, scales, zeros, group_size, bias) and head_dim % 2 == 0
            and packed.shape[0] % head_dim == 0):  # fmt: skip
        return False
    n, k = packed.shape[0], x.shape[-1]
    card = device_card(x)
    return all(fits_rope(wide_config(1, n, k, device_sms(x), pdl=pdl, card=card).block_n, head_dim)
               for pdl in (False, True))


def int4_gemv_wide_gated(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
    bias: torch.Tensor | None = None,
    *,
    pdl: str | None = None,
    pdl_gdc: bool = True,
    use_asm: bool | None = None,
    mma: bool | None = None,
    **knobs: int,
) -> torch.Tensor:
    """`silu_and_mul(int4_gemv_wide(x, packed, ...))` `[1, N / 2]` in one launch for one row `x` `[1, K]` (where
    `fuses_gated`). `pdl`, `pdl_gdc`, `use_asm`, `mma` and the tile `knobs` as `int4_gemv_wide`."""
    assert fuses_gated(x, packed, scales, zeros, group_size, bias), "int4_gemv_wide_gated needs fuses_gated()"
    n, k = packed.shape[0], x.shape[-1]
    out = torch.empty(1, n // 2, dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    launch = _Launch.plan(x, n, k, pdl, knobs)
    cfg = launch.cfg
    _int4_gated_kernel[(triton.cdiv(n // 2, cfg.block_n // 2), launch.splits)](
        x.view(torch.int64), packed, scales, zeros if zeros is not None else packed,
        bias if bias is not None else out, out, launch.part, launch.counters, n, k // 8, packed.stride(0),
        scales.stride(0), zeros.stride(0) if zeros is not None else 0, launch.words_per_split,
        **launch.constexprs(x, n, zeros, bias, group_size, pdl_gdc, use_asm, mma),
    )  # fmt: skip
    return out


def int4_gemv_wide_rope(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
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
    pdl: str | None = None,
    pdl_gdc: bool = True,
    use_asm: bool | None = None,
    mma: bool | None = None,
    **knobs: int,
) -> torch.Tensor:
    """The int4 qkv projection of one row `x` `[1, K]` with rotary and the K/V cache write in its epilogue (where
    `fuses_rope`): returns the rotated query `[1, H, D]` (new); the rotated key and the value land in the
    `[blocks, page, Hkv, D]` caches at `slot_mapping[0]`. Equal to `int4_gemv_wide` then `rotary_and_write_kv`."""
    head_dim = cos_sin_cache.shape[-1]
    n, k = packed.shape[0], x.shape[-1]
    assert fuses_rope(x, packed, scales, zeros, group_size, bias, head_dim), "int4_gemv_wide_rope needs fuses_rope()"
    check_rope_operands(n, cos_sin_cache, k_cache, v_cache, num_heads, num_kv_heads)
    q_out = torch.empty(1, num_heads, head_dim, dtype=x.dtype, device=x.device)
    launch = _Launch.plan(x, n, k, pdl, knobs)
    assert fits_rope(launch.cfg.block_n, head_dim), f"tile {launch.cfg.block_n} vs heads of {head_dim}"
    _int4_rope_kernel[(n // launch.cfg.block_n, launch.splits)](
        x.view(torch.int64), packed, scales, zeros if zeros is not None else packed,
        bias if bias is not None else q_out, launch.part, launch.counters, n, k // 8, packed.stride(0),
        scales.stride(0), zeros.stride(0) if zeros is not None else 0, launch.words_per_split,
        rope_launch_args(positions, cos_sin_cache, slot_mapping, q_out, k_cache, v_cache, num_heads, num_kv_heads,
                         k_scale, v_scale),
        **rope_constexprs(cos_sin_cache, k_cache),
        **launch.constexprs(x, n, zeros, bias, group_size, pdl_gdc, use_asm, mma),
    )  # fmt: skip
    return q_out


__all__ = ["fuses_gated", "fuses_rope", "int4_gemv_wide_gated", "int4_gemv_wide_rope"]
