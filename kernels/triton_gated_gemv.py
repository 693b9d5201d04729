"""Gated GEMV for one-row decode in Triton: `silu(x @ gate.T) * (x @ up.T)` from the merged gate/up weight.

Same contract as `gated_gemv_ref` (`silu_and_mul_ref(F.linear(x, weight, bias))`). At batch 1 the MLP's
gate_up projection is a 235 MB weight stream (Llama-3.1-8B: `[2 * 14,336, 4,096]` bf16) that cuBLAS runs at
~4.1 TB/s, followed by a separate SiLU-and-mul kernel (47 us a step in 32 launches on the H200) reading back the
`[1, 28,672]` product it wrote. Here one program owns BLOCK_N output columns j and streams both weight rows j
(gate) and N + j (up) in the same K loop, then writes `silu(gate) * up` for its columns: the SiLU launch and the
intermediate disappear, and the kernel can be launched by programmatic dependent launch (`kernels/pdl.py`), which
cuBLAS cannot: its first gate and up weight tiles are loaded before `griddepcontrol.wait`, while the RMSNorm
ahead of it still runs, and the down projection's GEMV may start its own weight stream while this one drains.

The K loop is `triton_gemv.py`'s FMA path (`_fma_sums`, shared with `triton_gemv_rope.py`): `[BLOCK_M, BLOCK_N,
BLOCK_K]` fp32 accumulators of element-wise products (two of them here, gate and up), summed over K once after the
loop; at one row the default tiles are the H200 sweep's winner, 4 + 4 weight rows x 512 K, 4 warps, 3 stages
(`default_config`). No split-K: 14,336 columns are 3,584 programs at one row.

Rounding: as `F.linear` followed by the SiLU kernel (`triton_activation.py`), so the engine's arithmetic keeps its
rounding points: each fp32 sum (bias added) is rounded to the output dtype, SiLU is computed in fp32 on the rounded
gate and rounded, and the product of the rounded values is rounded once more (as `triton_skinny_gemm.py`'s gated
epilogue does). The sums themselves are in this kernel's order, not cuBLAS's.

Every choice is made from shapes alone (a call never syncs with the host and can be captured in a CUDA graph).
`FLOTILLA_GATED_GEMV_CONFIG` (`bn=4,bk=512,w=4,s=3`, any subset) replaces `default_config`'s knobs for every
call (read at import: bench/results/gated12-gpu.sh passed its sweep's winner to the engine this way; that winner
is now the one-row default).
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from flotilla.kernels.activation import silu_and_mul_ref
from flotilla.kernels.card_tables import DEFAULT, H100, H200, device_card, for_card
from flotilla.kernels.launch_knobs import KnobSyntax
from flotilla.kernels.pdl import pdl_active, peeled_pdl_options
from flotilla.kernels.triton_activation import silu_mul
from flotilla.kernels.triton_gemv import _fma_sums
from flotilla.kernels.triton_utils import device_sms

# accumulator elements a thread may hold, gate and up together (triton_gemv's FMA budget)
_ACC_PER_THREAD = 64
_MAX_K = 512  # the widest K step (bf16: 1 KB a weight row, triton_gemv's measured step)
# FLOTILLA_GATED_GEMV_CONFIG's syntax (`launch_knobs.py`): one knob list, any of `bn=,bk=,w=,s=`, for every call.
KNOBS = KnobSyntax("FLOTILLA_GATED_GEMV_CONFIG", {"bn": "block_n", "bk": "block_k", "w": "num_warps",
                                                  "s": "num_stages"})  # fmt: skip
# one row: the H200 sweep's winner (`default_config`'s docstring)
_ONE_ROW_BLOCK_N = 4
_ONE_ROW_STAGES = 3


@dataclasses.dataclass(frozen=True, slots=True)
class GatedGemvConfig:
    """Tile and launch knobs of one gated-GEMV launch (BLOCK_M follows from M)."""

    block_n: int  # output columns per program (BLOCK_N gate rows + BLOCK_N up rows of the weight)
    block_k: int  # K elements per loop step
    num_warps: int
    num_stages: int  # software-pipeline depth of the K loop

    def spec(self) -> str:
        """The `bn=..,bk=..,w=..,s=..` form `parse_config` reads."""
        return KNOBS.spec(dataclasses.asdict(self))


def parse_config(knobs: str) -> dict[str, int]:
    """`"bn=8,bk=512,w=4,s=2"` (any subset) as `default_config` keywords; a ValueError for unknown knobs."""
    return KNOBS.knobs(knobs)


ENV_KNOBS = parse_config(os.environ.get("FLOTILLA_GATED_GEMV_CONFIG", ""))
# One-row knobs per card (`card_tables.py`; `parse_config` syntax), under FLOTILLA_GATED_GEMV_CONFIG's: empty, the
# lead (`default_config`: session 14's H200 sweep winner) on every card until bench/tile_sweep.py --family bf16
# (bench/results/sweep25-gpu.sh) prints an in-engine winner for a card.
# H100: session 25 call 5 (bench/results/gpu-2026-12-06-s25/call5/sweep25.log, `OUT=... bash
# bench/results/sweep25-gpu.sh`), with triton_gemv.ONE_ROW_TILES' entry.
# H200: session 29 call 1 (bench/results/gpu-2026-12-06-s29/call1/sweep25.log), with triton_gemv.ONE_ROW_TILES' entry.
ONE_ROW_CONFIGS: dict[str, str] = {DEFAULT: "", H100: "bn=4,bk=1024,w=4,s=3", H200: "bn=4,bk=1024,w=4,s=3"}
_ONE_ROW = {card: parse_config(spec) for card, spec in ONE_ROW_CONFIGS.items()}


def one_row_knobs(m: int, card: str | None) -> dict[str, int]:
    """The card's one-row knobs (`{}` at other row counts)."""
    return dict(for_card(_ONE_ROW, card)) if m == 1 else {}


def default_config(
    m: int,
    n: int,
    k: int,
    num_sms: int,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> GatedGemvConfig:
    """The configuration for `m` rows, `n` gated outputs (a `[2n, k]` weight); given knobs are kept.

    One row (the only case the engine sends, `dispatch.GATED_GEMV_MAX_ROWS`): the H200 sweep's winner at
    Llama-3.1-8B's gate/up (bench/gated_gemv.py, session 14 call 3): 4 + 4 rows x 512 K, 4 warps, 3 stages,
    55.9 us = 4.2 TB/s (the earlier lead 8 x 512 x 2 stages: 59.6 us; cuBLAS + SiLU kernel: 57.3 us). More rows
    (tests, unswept): BLOCK_K as wide as 512 within the two accumulators' register budget, BLOCK_N filling it
    (at least 4), then fewer columns per program while there are fewer than 2 programs per SM."""
    block_m = triton.next_power_of_2(max(m, 1))
    num_warps = num_warps or 4
    num_stages = num_stages or (_ONE_ROW_STAGES if block_m == 1 else 2)
    budget = _ACC_PER_THREAD * 32 * num_warps // 2  # per accumulator
    block_k = block_k or min(_MAX_K, max(16, triton.next_power_of_2(k)), max(16, budget // (block_m * 8)))
    if block_n is None and block_m == 1:
        block_n = _ONE_ROW_BLOCK_N
    if block_n is None:
        block_n = min(max(4, budget // (block_m * block_k)), max(4, triton.next_power_of_2(n)))
        while triton.cdiv(n, block_n) < 2 * num_sms and block_n > 4:
            block_n //= 2
    return GatedGemvConfig(block_n, block_k, num_warps, num_stages)


@triton.jit
def _gated_gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr = False,
    PDL_GDC: tl.constexpr = True,
):
    """One program: outputs `cols` (of N) for every row, from weight rows `cols` (gate) and `N + cols` (up)."""
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    g_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + ks[None, :]
    u_ptrs = w_ptr + (cols + N).to(tl.int64)[:, None] * stride_wn + ks[None, :]
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :]
    # launched by PDL (kernels/pdl.py): the first gate and up tiles (weights: never a predecessor's output) loaded
    # before the wait, `x` (the RMSNorm's output) after it
    acc_g, acc_u = _fma_sums(x_ptrs, g_ptrs, u_ptrs, row_ok, col_ok, K, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, PDL,
                             PDL_GDC, True)  # fmt: skip
    gate = tl.sum(acc_g, 2)  # [BLOCK_M, BLOCK_N]
    up = tl.sum(acc_u, 2)
    if HAS_BIAS:
        gate += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        up += tl.load(bias_ptr + N + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    # main's rounding points (`silu_mul`): each projection stored (rounded), SiLU in fp32 rounded, the product rounded
    out_ty = out_ptr.dtype.element_ty
    res = silu_mul(gate, up, out_ty)
    o_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(o_ptrs, res.to(out_ty), mask=row_ok[:, None] & col_ok[None, :])


def gated_gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The PyTorch reference: `F.linear` on the merged `[2N, K]` weight, then `silu_and_mul_ref`."""
    return silu_and_mul_ref(F.linear(x, weight, bias))


def supported(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether `gated_gemv` takes these operands: 2-D, one dtype (fp16/bf16; fp32 too, for tests), rows of both
    contiguous along K, an even number of weight rows, a contiguous bias of that length."""
    return (x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1] and weight.shape[0] % 2 == 0
            and x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and x.stride(-1) == 1 and weight.stride(-1) == 1
            and (bias is None or (bias.shape == (weight.shape[0],) and bias.is_contiguous())))  # fmt: skip


def gated_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    pdl: bool | None = None,
    pdl_gdc: bool = True,
    **knobs: int,
) -> torch.Tensor:
    """`silu(x @ weight[:N].T + bias[:N]) * (x @ weight[N:].T + bias[N:])` `[M, N]` for `x` `[M, K]` (few rows)
    and the merged gate/up weight `[2N, K]`; fp32 sums, rounded as `gated_gemv_ref` on the GPU rounds.

    `knobs` (block_n, block_k, num_warps, num_stages) override FLOTILLA_GATED_GEMV_CONFIG's, which override the
    card's one-row knobs (`ONE_ROW_CONFIGS`), which override `default_config`. `pdl`: launched by programmatic
    dependent launch (default: `pdl_active`, the one-row chain on sm_90+); `pdl_gdc=False` (tests only) keeps the
    peeled first step without the griddepcontrol instructions."""
    assert supported(x, weight, bias), f"unsupported operands {tuple(x.shape)} x {tuple(weight.shape)}"
    m, k = x.shape
    n = weight.shape[0] // 2
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if k == 0:  # no K loop: the sums are the bias or zero
        return gated_gemv_ref(x, weight, bias)
    if m == 0 or n == 0:
        return out
    cfg = default_config(m, n, k, device_sms(x), **(one_row_knobs(m, device_card(x)) | ENV_KNOBS | knobs))
    extra = peeled_pdl_options(pdl_gdc) if (pdl_active(x) if pdl is None else pdl) else {}
    _gated_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, weight, bias if bias is not None else out, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra,
    )  # fmt: skip
    return out


__all__ = ["ENV_KNOBS", "ONE_ROW_CONFIGS", "GatedGemvConfig", "default_config", "gated_gemv", "gated_gemv_ref",
           "one_row_knobs", "parse_config", "supported"]  # fmt: skip
