"""GEMV for decode at very small batch in Triton: `out = x @ weight.T (+ bias)` with `x` `[M, K]`, M ~1..8.

Same contract as `gemv_ref`. At M = 1..8 a linear layer is a pure weight stream: every weight byte is
read once and used for M multiply-adds, so the only figure of merit is the weight's read bandwidth.
cuBLAS's small-M kernels reach 76 % and 59 % of copy bandwidth on an H200 for Llama-3.1-8B's qkv and o_proj
shapes (and add a split-K reduce kernel). Measured at the default configs (bench/results/kernels-gemv-s2.json),
this kernel streams 77 / 68 / 93 / 85 % at M = 1 on qkv / o_proj / gate_up / down, and falls behind
cuBLAS at M = 4; `kernels.dispatch.linear` uses it only where it was not slower.

Layout: `weight` is `[N, K]` row-major (nn.Linear's), so a weight row is contiguous along K. One
program owns BLOCK_N output features (weight rows) and walks its K range in BLOCK_K chunks: each
chunk is a `[BLOCK_N, BLOCK_K]` tile loaded along K (coalesced, 16-byte vector loads), and the few
rows of `x` are reloaded per chunk (they stay in L1/L2). Two ways to do the arithmetic (`use_dot`):

- FMA (default for M <= 4): a `[BLOCK_M, BLOCK_N, BLOCK_K]` fp32 accumulator of element-wise
  products, summed over K once after the loop. Reducing per chunk instead would cost warp shuffles
  for every chunk, which at M = 4 compete with the loads; the price is registers, so the default
  tiles keep the accumulator at 64 fp32 registers a thread.
- Dot (default for M > 4): `tl.dot(w_tile, x_tile.T)` with the weight tile as the MMA's M side and
  the batch padded to 16 as its N side ("swap AB", as cuBLAS's 64x8 small-M tiles do); the tile goes
  through shared memory, which the software pipeline (`num_stages`) keeps several tiles deep.

Split-K: when `N / BLOCK_N` programs are too few to keep every SM streaming, a second grid axis cuts
K into `split_k` ranges (whole BLOCK_K tiles each). Each range writes fp32 partials `[split, M, N]`
and a small kernel sums them, adds the bias and casts. Partials, not `tl.atomic_add` into an fp32
buffer: atomics need the buffer zeroed (a memset launch) and a cast pass anyway, so they save no
launch, and their summation order varies run to run, so the output would not be bit-reproducible
(greedy decoding compares outputs token for token). The partials are tiny next to the weight
(split * M * N * 4 bytes, e.g. 128 KB against o_proj's 32 MB).

Every choice is made from shapes alone (M, N, K, the SM count), never from tensor values: a call
never syncs with the host and can be captured in a CUDA graph. `default_config` is a lead to be
tuned on the H200 with `bench/kernels.py --sections gemv --sweep gemv`.

fp8 weights (W8A16, `fp8_gemv`): the same kernel streams a float8_e4m3fn weight with one fp32 scale
per output feature. The activations stay in their dtype (no per-token quantization); each weight
tile is converted in registers (to fp32 for the FMA path, to the activation dtype for `tl.dot`),
and the scale multiplies the finished fp32 sum once per output, since it factors out of the sum
over K. Half the bytes of a bf16 weight per output, so the FMA tiles are twice as wide along K to
keep the bytes per loop step; the oracle is `fp8_linear.fp8_weight_only_linear_ref`. Block-scaled fp8
(`fp8_gemv_block`, one scale a `[block_n, block_k]` block): the same kernel with SCALE_BK > 0, the tile's rows in
one n-block and the scales applied inside the K loop (`_scaled_step`); the oracle is
`fp8_block_linear.fp8_block_linear_ref`.

Programmatic dependent launch (`kernels/pdl.py`, FLOTILLA_PDL=1, batch-1 decode): the GEMV may start while the
small kernel ahead of it (RMSNorm, SiLU-and-mul, the attention merge) still runs. The first K step is then peeled:
its weight tile is loaded before `griddepcontrol.wait` and only `x` after it, so the weight stream starts early and
the sums are the loop's own, in its order (bit-equal to the plain launch). FLOTILLA_PDL_L2_MB adds an L2 bulk
prefetch of the first part of the program's rows before the wait.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from flotilla.kernels.card_tables import DEFAULT, H100, H200, device_card, for_card, parsed
from flotilla.kernels.launch_knobs import POSITIVE, KnobSyntax, Table
from flotilla.kernels.pdl import L2_PREFETCH_MB, pdl_active, peeled_pdl_options
from flotilla.kernels.triton_l2_prefetch import prefetch_l2
from flotilla.kernels.triton_utils import INTERPRETING, device_sms, dot_dtype, dot_precision

# FMA path: accumulator elements a thread may hold (64 fp32 registers) before it spills or drops to
# one program per SM; the default tiles are sized to this budget.
_ACC_PER_THREAD = 64
_REDUCE_BLOCK = 1024
# FMA path: the widest K step, in weight bytes per row (512 bf16 or 1,024 fp8 elements): measured for
# bf16; fp8 keeps the same bytes per step.
_MAX_K_STEP_BYTES = 1024
# fp8 weights (H200 grid, bench/results/gpu-2026-12-03-s5/fp8-gemv-grid.json): FMA tiles of 512 K elements with
# a 3-deep pipeline beat 1,024 x 2 at M = 1 on all four Llama-3.1-8B projections (qkv 11.7 -> 9.9 us), and from
# M = 4 on `tl.dot` with 64-row tiles and split-K beats FMA (qkv 24.9 -> 15.1 us) and the 16-row dot tiles
# (M = 16, qkv 35.7 -> 14.9 us).
_FP8_MAX_K = 512
# FLOTILLA_GEMV_CONFIG's syntax (`launch_knobs.py`): `;`-separated `NxK:knobs` entries, knobs any of `bn=,bk=,sk=,w=,s=`
# (`"4096x4096:bn=8,bk=512,w=4,s=2;4096x14336:bn=16"`), each at least 1; no every-shape entry.
KNOBS = KnobSyntax("FLOTILLA_GEMV_CONFIG", {"bn": "block_n", "bk": "block_k", "sk": "split_k", "w": "num_warps",
                                            "s": "num_stages"}, values=POSITIVE)  # fmt: skip


def parse_tiles(spec: str) -> Table:
    """A FLOTILLA_GEMV_CONFIG string (`KNOBS`) as a table; a ValueError naming the variable for anything else."""
    return KNOBS.table(spec)


def tiles_spec(table: Table) -> str:
    """`table` in `parse_tiles`' syntax."""
    return KNOBS.table_spec(table)


# One-row bf16/fp16 tiles per card (`card_tables.py`): `{(N, K): default_config knobs}` for a one-row call of the
# plain GEMV and of its rope form (`triton_gemv_rope.py`, the qkv projection); a shape without an entry takes
# `default_config`'s lead (which every card did before session 25). In-engine tile descent: bench/tile_sweep.py
# --family bf16 (bench/results/sweep25-gpu.sh) prints the entry to put here for the card it ran on.
# H100: session 25 call 5 (bench/results/gpu-2026-12-06-s25/call5/sweep25.log, from `OUT=... bash
# bench/results/sweep25-gpu.sh`): with the gated entry below, the bf16 bs1 ctx 512 step A B B A 5.534 -> 5.404 ms
# (greedy tokens of the random model differ: another K order sums each output differently).
# H200: session 29 call 1 (bench/results/gpu-2026-12-06-s29/call1/sweep25.log, from `OUT=... bash
# bench/results/gpu-2026-12-06-s25/try-h200-sweep.sh`):
# with the gated and lm_head entries, the bf16 bs1 ctx 512 step A B B A 4.423 -> 4.170 ms (greedy tokens
# differ, as above).
ONE_ROW_TILES: dict[str, str] = {
    DEFAULT: "",
    H100: "6144x4096:bn=16,bk=512,sk=1,w=2,s=2;4096x4096:bn=8,bk=512,sk=1,w=4,s=3;4096x14336:bn=8,bk=1024,sk=1,w=4,s=2",
    H200: "6144x4096:bn=16,bk=512,sk=1,w=4,s=2;4096x4096:bn=8,bk=512,sk=1,w=4,s=3;4096x14336:bn=8,bk=1024,sk=1,w=4,s=2",
}
# FLOTILLA_GEMV_CONFIG (`parse_tiles`; read at import) replaces the table on every card.
_ENV_TILES = os.environ.get("FLOTILLA_GEMV_CONFIG", "")
_ONE_ROW: dict[str, Table] = parsed({DEFAULT: _ENV_TILES} if _ENV_TILES else ONE_ROW_TILES, parse_tiles)


def set_one_row_tiles(entries: Mapping[tuple[int, int], Mapping[str, int]]) -> dict[str, Table]:
    """Replace the one-row table's entries of the given `(n, k)` shapes on every card, in-process (benchmarks:
    bench/tile_sweep.py, which captures the decode graphs again after each change); returns the previous tables for
    `restore_one_row_tiles`."""
    global _ONE_ROW
    previous = {card: dict(t) for card, t in _ONE_ROW.items()}
    _ONE_ROW = {card: {**t, **{s: dict(v) for s, v in entries.items()}} for card, t in _ONE_ROW.items()}
    return previous


def restore_one_row_tiles(previous: dict[str, Table]) -> None:
    """Put back the tables `set_one_row_tiles` returned."""
    global _ONE_ROW
    _ONE_ROW = {card: dict(t) for card, t in previous.items()}


def one_row_knobs(m: int, n: int, k: int, card: str | None, weight_bytes: int = 2) -> dict[str, int]:
    """The card's one-row table entry for an `[n, k]` bf16/fp16 weight (`{}` at other row counts, for fp8 weights and
    for shapes without one)."""
    if m != 1 or weight_bytes != 2:
        return {}
    return dict(for_card(_ONE_ROW, card).get((n, k), {}))


@dataclasses.dataclass(frozen=True, slots=True)
class GemvConfig:
    """Tile and launch knobs of one GEMV launch."""

    block_n: int  # output features (weight rows) per program
    block_k: int  # K elements per loop step
    split_k: int  # K ranges (second grid axis); 1 = no partials, no reduce kernel
    num_warps: int
    num_stages: int  # software-pipeline depth of the K loop
    use_dot: bool  # tl.dot (batch padded to 16) instead of FMA + one final reduction


def default_config(
    m: int,
    n: int,
    k: int,
    num_sms: int,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    use_dot: bool | None = None,
    weight_bytes: int = 2,
    card: str | None = None,
) -> GemvConfig:
    """The launch configuration for an `[m, k] x [n, k]^T` GEMV; given knobs are kept, then the card's one-row table's
    (`one_row_knobs`), the rest chosen. `weight_bytes` is the weight's element size (2 for bf16/fp16, 1 for fp8).

    A lead from first principles, measured only at these defaults (kernels-gemv-s2.json), not swept:
    - FMA up to M = 4, dot above, where the FMA accumulator would not fit the register budget.
    - FMA tiles: BLOCK_K as wide as 512 (each thread then issues several 16-byte loads per step,
      enough bytes in flight without pipelining), BLOCK_N filling the 64-register accumulator
      budget, at least 8 rows; M = 1 gives 16 x 512, M = 2 8 x 512, M = 4 8 x 256. fp8 weights are
      the exception, set by a measured grid (`_FP8_MAX_K`): FMA 512 wide, 3 stages, up to M = 2; dot
      with 64-row tiles from M = 4.
    - Then fewer rows per program (down to 8) while there are fewer than 2 programs per SM: more,
      smaller programs balance the SMs better and need no second kernel.
    - Split-K (powers of two) only while there are still fewer than 2 programs per SM, and only as
      far as each K range keeps >= 4 tiles: the reduce kernel is a second launch (~1-2 us, like
      cuBLAS's), a large share of an ~8-12 us call. For Llama-3.1-8B on 132 SMs this leaves
      split_k = 1 for all four projections; smaller N (tensor-parallel shards, small models) split.
    """
    table = one_row_knobs(m, n, k, card, weight_bytes)
    block_n, block_k, split_k = block_n or table.get("block_n"), block_k or table.get("block_k"), \
        split_k or table.get("split_k")
    num_warps, num_stages = num_warps or table.get("num_warps"), num_stages or table.get("num_stages")
    block_m = triton.next_power_of_2(max(m, 1))
    k_pow2 = max(16, triton.next_power_of_2(k))
    fp8 = weight_bytes == 1
    if use_dot is None:
        use_dot = block_m >= 4 if fp8 else block_m > 4
    tiles_given = block_n is not None
    if use_dot:
        num_warps = num_warps or 4
        num_stages = num_stages or 4
        block_k = block_k or min(128, k_pow2)
        block_n = block_n or 64
    else:
        num_warps = num_warps or 4
        num_stages = num_stages or (3 if fp8 else 2)
        budget = _ACC_PER_THREAD * 32 * num_warps
        max_k = _FP8_MAX_K if fp8 else _MAX_K_STEP_BYTES // weight_bytes
        block_k = block_k or min(max_k, k_pow2, max(16, budget // (block_m * 8)))
        block_n = block_n or max(8, budget // (block_m * block_k))
    if not tiles_given:
        block_n = min(block_n, max(8, triton.next_power_of_2(n)))
        # fp8 dot tiles keep 64 rows (a 16-row fp8 tile moves too few bytes a step) and split K instead
        min_block_n = (64 if fp8 else 16) if use_dot else 8
        while triton.cdiv(n, block_n) < 2 * num_sms and block_n > min_block_n:
            block_n //= 2
    if split_k is None:
        tiles = triton.cdiv(n, block_n)
        split_k = 1
        while tiles * split_k < 2 * num_sms and k >= 2 * split_k * 4 * block_k and split_k < 16:
            split_k *= 2
    return GemvConfig(block_n, block_k, split_k, num_warps, num_stages, use_dot)


@dataclasses.dataclass(frozen=True, slots=True)
class LoRAEpilogue:
    """A LoRA expand folded into the GEMV's epilogue (`triton_lora.py`'s expand, one launch fewer per
    projection): each output `(m, n)` of the base product, rounded as stored, gets
    `B[slot(m), n] @ buf[m, slice(n)]` added, `buf` being the shrink's split partials summed and rounded."""

    part: torch.Tensor  # [splits, M, n_slices * max_rank] fp32: `triton_lora.lora_shrink`'s partials
    b: torch.Tensor  # [slots, N, max_rank]: every slot's stacked B
    token_slots: torch.Tensor  # [M] int64; -1: a base-model row, left as the base product
    slice_sizes: tuple[int, ...]  # 1 to 3 slices of the N outputs
    max_rank: int

    def launch_args(self, n: int) -> tuple[Any, ...]:
        """The GEMV kernel's LoRA arguments, after its base ones: the tensors, their strides, the rank, the shrink's
        split count and where the second and third slices start (`n`, past the end, for slices that are absent)."""
        part, b, sizes = self.part, self.b, self.slice_sizes
        return (part, b, self.token_slots, part.stride(0), part.stride(1), b.stride(0), b.stride(1), self.max_rank,
                part.shape[0], sizes[0] if len(sizes) > 1 else n, sizes[0] + sizes[1] if len(sizes) > 2 else n)

    def launch_constants(self) -> dict[str, int]:
        """The GEMV kernel's LoRA constexprs: the slice count and the tile sizes of the rank and the splits."""
        return {"LORA_SLICES": len(self.slice_sizes), "LORA_BLOCK_R": triton.next_power_of_2(self.max_rank),
                "LORA_BLOCK_S": max(2, triton.next_power_of_2(self.part.shape[0]))}


def fuses_lora(m: int, n: int, k: int, num_sms: int, card: str | None = None) -> bool:
    """True when a GEMV of these shapes can take a `LoRAEpilogue`: the FMA path (few rows; the
    epilogue gathers `[rows, BLOCK_N, rank]` of B per program) without a split-K reduce."""
    cfg = default_config(m, n, k, num_sms, card=card)
    return not cfg.use_dot and cfg.split_k == 1


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    k_per_split,
    stride_sn,
    lora_part_ptr,
    lora_b_ptr,
    lora_slots_ptr,
    stride_lps,
    stride_lpt,
    stride_lbs,
    stride_lbn,
    lora_r,
    lora_splits,
    lora_off1,
    lora_off2,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    LORA_SLICES: tl.constexpr = 0,
    LORA_BLOCK_R: tl.constexpr = 16,
    LORA_BLOCK_S: tl.constexpr = 2,
    PDL: tl.constexpr = False,
    PDL_GDC: tl.constexpr = True,
    PREFETCH_K: tl.constexpr = 0,
    PREFETCH_SEGS: tl.constexpr = 1,
    SCALE_BN: tl.constexpr = 1,
    SCALE_BK: tl.constexpr = 0,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + ks[None, :]
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M] if USE_DOT else [BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    s_row = scale_ptr + ((pid_n * BLOCK_N) // SCALE_BN) * stride_sn  # block scales (SCALE_BK > 0): the n-block's
    if LORA_SLICES > 0:
        lora_b, lora_p0, lora_p1, lora_p2 = _lora_tiles(
            lora_part_ptr, lora_b_ptr, lora_slots_ptr, rows, row_ok, cols, col_ok, stride_lps, stride_lpt, stride_lbs,
            stride_lbn, lora_r, lora_splits, LORA_SLICES, LORA_BLOCK_R, LORA_BLOCK_S)
    # A range ends either at the next range's start (a whole number of tiles away) or at K, so
    # `< K` is the only K mask needed; K's divisibility by 16 (Triton specialises on it) keeps the
    # masked loads vectorised.
    if PDL:
        # Launched by programmatic dependent launch (kernels/pdl.py): the first K step is peeled so that its
        # weight tile (never a predecessor's output) is loaded before the wait, while the kernel ahead (whose
        # output is `x`) still runs; the same steps in the same order as the loop: bit-equal results.
        k_ok = (k_start + ks) < K
        w = tl.load(w_ptrs + k_start, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if PREFETCH_K > 0:  # and the next part of this program's rows into L2 (one range, no split)
            _prefetch_rows_l2(w_ptr, cols, N, stride_wn, BLOCK_N, PREFETCH_K, PREFETCH_SEGS)
        if PDL_GDC:  # False only in the interpreter's test of the peeled step (no griddepcontrol there)
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        x = tl.load(x_ptrs + k_start, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _scaled_step(acc, w, x, s_row, k_start, ks, k_ok, USE_DOT, DOT_DTYPE, DOT_PRECISION, SCALE_BK)
        k_loop = k_start + BLOCK_K
    else:
        k_loop = k_start
    for k0 in tl.range(k_loop, k_end, BLOCK_K, num_stages=NUM_STAGES):
        k_ok = (k0 + ks) < K
        w = tl.load(w_ptrs + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _scaled_step(acc, w, x, s_row, k0, ks, k_ok, USE_DOT, DOT_DTYPE, DOT_PRECISION, SCALE_BK)
    res = tl.trans(acc) if USE_DOT else tl.sum(acc, 2)  # [BLOCK_M, BLOCK_N]
    if HAS_SCALE:  # one scale per output feature factors out of the sum over K (and over K ranges)
        res *= tl.load(scale_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    ok = row_ok[:, None] & col_ok[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            res += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if LORA_SLICES > 0:  # the base output rounded as it would be stored, then each row's LoRA delta
            res = res.to(out_ptr.dtype.element_ty).to(tl.float32)
            res += _lora_delta(lora_b, lora_p0, lora_p1, lora_p2, cols, lora_off1, lora_off2, out_ptr.dtype.element_ty,
                               LORA_SLICES)
        o_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(o_ptrs, res.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        p_rows = (split * M + rows).to(tl.int64)  # partials [SPLIT_K, M, N]
        tl.store(part_ptr + p_rows[:, None] * N + cols[None, :], res, mask=ok)


@triton.jit
def _gemv_step(acc, w, x, USE_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One K step: the `[BLOCK_N, BLOCK_K]` weight tile times the `[BLOCK_M, BLOCK_K]` rows of x into `acc`."""
    if USE_DOT:
        acc = tl.dot(w.to(DOT_DTYPE), tl.trans(x.to(DOT_DTYPE)), acc, input_precision=DOT_PRECISION)
    else:  # fp32 right after the load: the interpreter's bf16 arithmetic is wrong, the GPU's is lossy
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _scaled_step(acc, w, x, s_row, k0, ks, k_ok, USE_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, SCALE_BK: tl.constexpr):  # fmt: skip
    """`_gemv_step` at K offset `k0`, with block scales where SCALE_BK > 0 (the tile's rows in one n-block, whose
    scales `s_row` points at): the dot's step (BLOCK_K within one k-block) adds its product times the block's one
    scale; the FMA's step scales x's columns by their k-block's scale first (a `[BLOCK_K]` vector from L1, the
    multiplies shared by the tile's rows) and keeps its one accumulator."""
    if SCALE_BK == 0:
        acc = _gemv_step(acc, w, x, USE_DOT, DOT_DTYPE, DOT_PRECISION)
    elif USE_DOT:
        part = tl.dot(w.to(DOT_DTYPE), tl.trans(x.to(DOT_DTYPE)), input_precision=DOT_PRECISION)
        acc += part * tl.load(s_row + k0 // SCALE_BK)
    else:
        sx = tl.load(s_row + (k0 + ks) // SCALE_BK, mask=k_ok, other=0.0)
        acc = _gemv_step(acc, w, x.to(tl.float32) * sx[None, :], False, DOT_DTYPE, DOT_PRECISION)
    return acc


@triton.jit
def _fma_sums(x_ptrs, w_ptrs, u_ptrs, row_ok, col_ok, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr, PDL_GDC: tl.constexpr,
              GATED: tl.constexpr):  # fmt: skip
    """`_gemv_kernel`'s FMA loop over the whole of K (one range), for the one-row GEMVs that fuse an epilogue
    (`triton_gated_gemv.py`, `triton_gemv_rope.py`): `[BLOCK_M, BLOCK_N, BLOCK_K]` fp32 accumulators of the
    element-wise products of x's rows (`x_ptrs`, `[BLOCK_M, BLOCK_K]` pointers at K = 0, masked by `row_ok`) with
    the weight rows at `w_ptrs` (`[BLOCK_N, BLOCK_K]`, masked by `col_ok`) and, with GATED, with a second set of
    rows at `u_ptrs` in the same steps (else `u_ptrs` is never read and the second accumulator stays zero).
    Returns both. By PDL (`_gemv_kernel`'s peel): the first step's weight tiles are loaded before the wait, x after
    it; the same steps in the same order."""
    ks = tl.arange(0, BLOCK_K)
    acc_w = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    if PDL:
        k_ok = ks < K
        w = tl.load(w_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if GATED:
            u = tl.load(u_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if PDL_GDC:  # False only in the interpreter's test of the peeled step (no griddepcontrol there)
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        x = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc_w = _gemv_step(acc_w, w, x, False, tl.float32, "ieee")
        if GATED:
            acc_u = _gemv_step(acc_u, u, x, False, tl.float32, "ieee")
        k_loop = BLOCK_K
    else:
        k_loop = 0
    for k0 in tl.range(k_loop, K, BLOCK_K, num_stages=NUM_STAGES):
        k_ok = (k0 + ks) < K
        w = tl.load(w_ptrs + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if GATED:
            u = tl.load(u_ptrs + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc_w = _gemv_step(acc_w, w, x, False, tl.float32, "ieee")
        if GATED:
            acc_u = _gemv_step(acc_u, u, x, False, tl.float32, "ieee")
    return acc_w, acc_u


@triton.jit
def _prefetch_rows_l2(w_ptr, cols, N, stride_wn, BLOCK_N: tl.constexpr, PREFETCH_K: tl.constexpr, SEGS: tl.constexpr):
    """Ask L2 for the first `PREFETCH_K` weights of each of this program's rows, in `SEGS` bulk prefetches a
    row (about one a thread; Hopper's `cp.async.bulk.prefetch.L2`, sizes and addresses 16-byte aligned: the
    launcher checks). Rows past N prefetch row N - 1 again (no address outside the weight)."""
    seg_k: tl.constexpr = PREFETCH_K // SEGS
    seg_bytes: tl.constexpr = seg_k * w_ptr.dtype.element_ty.primitive_bitwidth // 8
    rows = tl.minimum(cols, N - 1).to(tl.int64)
    ptrs = w_ptr + rows[:, None] * stride_wn + (tl.arange(0, SEGS) * seg_k)[None, :]
    prefetch_l2(ptrs, tl.full([BLOCK_N, SEGS], seg_bytes, tl.int32))


@triton.jit
def _lora_part_tile(part_ptr, rows, row_ok, index, stride_ps, stride_pt, R, splits, BLOCK_R: tl.constexpr,
                    BLOCK_S: tl.constexpr):
    """`[BLOCK_M, BLOCK_S, BLOCK_R]`: the split partials of slice `index` of each row's LoRA shrink
    (zero for base-model rows: the shrink writes zeros there)."""
    ss = tl.arange(0, BLOCK_S)
    rs = tl.arange(0, BLOCK_R)
    ptrs = part_ptr + ss[None, :, None] * stride_ps + rows.to(tl.int64)[:, None, None] * stride_pt + index * R \
        + rs[None, None, :]
    mask = row_ok[:, None, None] & (ss[None, :, None] < splits) & (rs[None, None, :] < R)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _lora_tiles(part_ptr, b_ptr, slots_ptr, rows, row_ok, cols, col_ok, stride_ps, stride_pt, stride_bs, stride_bn, R,
                splits, SLICES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    """The epilogue's loads, issued before the K loop so that they arrive while the weight streams:
    `B[slot(m)]` at the program's columns `[BLOCK_M, BLOCK_N, BLOCK_R]` (zero for base-model rows) and
    up to three slices' partial tiles (slices past `SLICES` repeat the first, unloaded)."""
    slot = tl.load(slots_ptr + rows, mask=row_ok, other=-1)
    has = row_ok & (slot >= 0)
    slot = tl.maximum(slot, 0).to(tl.int64)
    rs = tl.arange(0, BLOCK_R)
    b_ptrs = b_ptr + slot[:, None, None] * stride_bs + cols.to(tl.int64)[None, :, None] * stride_bn + rs[None, None, :]
    b = tl.load(b_ptrs, mask=has[:, None, None] & col_ok[None, :, None] & (rs[None, None, :] < R), other=0.0)
    p0 = _lora_part_tile(part_ptr, rows, row_ok, 0, stride_ps, stride_pt, R, splits, BLOCK_R, BLOCK_S)
    p1 = p0
    p2 = p0
    if SLICES > 1:
        p1 = _lora_part_tile(part_ptr, rows, row_ok, 1, stride_ps, stride_pt, R, splits, BLOCK_R, BLOCK_S)
    if SLICES > 2:
        p2 = _lora_part_tile(part_ptr, rows, row_ok, 2, stride_ps, stride_pt, R, splits, BLOCK_R, BLOCK_S)
    return b, p0, p1, p2


@triton.jit
def _lora_slice_delta(b, part, OUT_DTYPE: tl.constexpr):
    """`[BLOCK_M, BLOCK_N]`: `B @ buf`, `buf` the slice's partials summed and rounded to the activation
    dtype (as `triton_lora`'s expand and the reference round the shrink)."""
    buf = tl.sum(part, axis=1).to(OUT_DTYPE).to(tl.float32)
    return tl.sum(b.to(tl.float32) * buf[:, None, :], axis=2)


@triton.jit
def _lora_delta(b, p0, p1, p2, cols, off1, off2, OUT_DTYPE: tl.constexpr, SLICES: tl.constexpr):
    """`[BLOCK_M, BLOCK_N]`: each column's delta from the slice it belongs to (the expand of
    `triton_lora.py`, folded into the GEMV's epilogue); zero for base-model rows."""
    delta = _lora_slice_delta(b, p0, OUT_DTYPE)
    if SLICES > 1:
        delta = tl.where(cols[None, :] >= off1, _lora_slice_delta(b, p1, OUT_DTYPE), delta)
    if SLICES > 2:
        delta = tl.where(cols[None, :] >= off2, _lora_slice_delta(b, p2, OUT_DTYPE), delta)
    return delta


@triton.jit
def _split_k_reduce_kernel(
    part_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    stride_om,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):  # a fixed order: the sum is the same every run
        acc += tl.load(part_ptr + (s * M + row).to(tl.int64) * N + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    use_dot: bool | None = None,
    weight_scale: torch.Tensor | None = None,
    lora: LoRAEpilogue | None = None,
    pdl: bool | None = None,
    pdl_gdc: bool = True,
    scale_block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """`x @ weight.T (+ bias)` for `x` `[..., K]` (few rows) and `weight` `[N, K]`; fp32 accumulation.

    The output has `x`'s dtype and shape `[..., N]`. The knobs default to `default_config` (shapes
    only, so the call is CUDA-graph capturable); they are exposed for tests and the benchmark.
    `weight_scale` (`N` fp32 values, any shape) multiplies output feature n's sum: `fp8_gemv`.
    `lora`: each row's LoRA delta added in the epilogue (only where `fuses_lora` holds).
    `pdl`: launched by programmatic dependent launch, the first weight tile loaded before the wait
    (`kernels/pdl.py`; default: FLOTILLA_PDL where capable; never with `lora`, whose epilogue reads the
    shrink's partials early). `pdl_gdc=False` (tests only) keeps the peeled first step without the
    griddepcontrol instructions, so that the interpreter can run it.
    `scale_block` (`fp8_gemv_block`): `weight_scale` holds one scale a `[block_n, block_k]` block of the weight
    (`[ceil(N / block_n), ceil(K / block_k)]`, powers of two), applied in the K loop; the tiles are cut to fit in
    one block each way where they are larger (no LoRA).
    """
    k = x.shape[-1]
    n = weight.shape[0]
    assert weight.shape[1] == k, f"weight {tuple(weight.shape)} does not match x's K = {k}"
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    assert weight.stride(-1) == 1, "weight rows must be contiguous along K"
    assert bias is None or (bias.shape == (n,) and bias.is_contiguous())
    if scale_block is None:
        assert weight_scale is None or (weight_scale.numel() == n and weight_scale.is_contiguous())
    else:
        assert weight_scale is not None and lora is None and weight_scale.stride(-1) == 1
        assert tuple(weight_scale.shape) == (triton.cdiv(n, scale_block[0]), triton.cdiv(k, scale_block[1]))
    m = x2.shape[0]
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand_as(out))
    # fp8 weights take 1,024-wide FMA steps; fp32 weights keep the bf16 tiles they always had
    cfg = default_config(
        m, n, k, device_sms(x), block_n=block_n, block_k=block_k, split_k=split_k, num_warps=num_warps,
        num_stages=num_stages, use_dot=use_dot, weight_bytes=min(weight.element_size(), 2),
        card=device_card(x) if weight_scale is None else None,
    )  # fmt: skip
    if scale_block is not None:  # a tile's rows in one n-block; a dot step in one k-block (one scalar scale)
        cfg = dataclasses.replace(cfg, block_n=min(cfg.block_n, scale_block[0]),
                                  block_k=min(cfg.block_k, scale_block[1]) if cfg.use_dot else cfg.block_k)
    block_m = triton.next_power_of_2(m)
    if cfg.use_dot:
        assert cfg.block_n >= 16 and cfg.block_k >= 16, "tl.dot needs tiles of at least 16"
        block_m = max(16, block_m)
    # Whole tiles per K range, so only the last range is ragged; ranges that would be empty are
    # not launched (the count follows from the shapes alone).
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per_split)
    out2 = out.view(-1, n)
    part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device) if splits > 1 else out2
    bias_arg = bias if bias is not None else out2  # unused without a bias
    lora_args: tuple[Any, ...] = (out2, out2, out2, 0, 0, 0, 0, 0, 0, 0, 0)  # unused without LoRA
    lora_consts: dict[str, int] = {}
    if lora is not None:
        assert splits == 1 and not cfg.use_dot and lora.part.shape[1] == m, "the LoRA epilogue needs fuses_lora()"
        lora_args, lora_consts = lora.launch_args(n), lora.launch_constants()
    pdl_consts: dict[str, Any] = {}
    # fp8 weights (a scale) launch plainly: the fp8 GEMV's PDL variant measured slower (3.263 vs 3.099 ms at bs1)
    if lora is None and ((pdl_active(x) and weight_scale is None) if pdl is None else pdl):
        pdl_consts = peeled_pdl_options(pdl_gdc)
        if pdl_gdc and splits == 1 and not INTERPRETING:
            pdl_consts |= _l2_prefetch_options(weight, n, k, cfg)
    _gemv_kernel[(triton.cdiv(n, cfg.block_n), splits)](
        x2,
        weight,
        weight_scale if weight_scale is not None else out2,  # unused without a scale
        bias_arg,
        out2,
        part,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        out2.stride(0),
        k_per_split,
        weight_scale.stride(0) if scale_block is not None and weight_scale is not None else 0,
        *lora_args,
        HAS_SCALE=weight_scale is not None and scale_block is None,
        HAS_BIAS=bias is not None,
        SPLIT_K=splits,
        USE_DOT=cfg.use_dot,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        NUM_STAGES=cfg.num_stages,
        DOT_DTYPE=dot_dtype(x.dtype),
        DOT_PRECISION=dot_precision(x.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **lora_consts,
        **pdl_consts,
        **({"SCALE_BN": scale_block[0], "SCALE_BK": scale_block[1]} if scale_block is not None else {}),
    )
    if splits > 1:
        block = min(_REDUCE_BLOCK, triton.next_power_of_2(n))
        _split_k_reduce_kernel[(m, triton.cdiv(n, block))](
            part, bias_arg, out2, m, n, out2.stride(0), HAS_BIAS=bias is not None, SPLIT_K=splits, BLOCK=block
        )
    return out


def _l2_prefetch_options(weight: torch.Tensor, n: int, k: int, cfg: GemvConfig) -> dict[str, int]:
    """PREFETCH_K and PREFETCH_SEGS of a PDL GEMV that asks L2 for its weight before its wait (FLOTILLA_PDL_L2_MB,
    `_prefetch_rows_l2`): a row's prefetch cut into about one bulk prefetch a thread; none without a budget or an
    aligned weight (`l2_prefetch_k`)."""
    segs = max(1, 32 * cfg.num_warps // cfg.block_n)
    prefetch_k = l2_prefetch_k(n, k, weight, segs, L2_PREFETCH_MB)
    return {"PREFETCH_K": prefetch_k, "PREFETCH_SEGS": segs} if prefetch_k else {}


def l2_prefetch_k(n: int, k: int, weight: torch.Tensor, segs: int, budget_mb: float) -> int:
    """Weights per row (from K's start) that a PDL GEMV asks L2 for before its wait: all of K, or what keeps the
    `[N, K]` weight's prefetched part within `budget_mb`, rounded down so that each of a row's `segs` bulk
    prefetches is a multiple of 16 bytes; 0 (none) without a budget or where the weight's rows are not 16-byte
    aligned (the bulk prefetch needs it)."""
    elt = weight.element_size()
    if budget_mb <= 0 or weight.data_ptr() % 16 or (weight.stride(0) * elt) % 16:
        return 0
    per_row = min(k, int(budget_mb * (1 << 20)) // (n * elt))
    quantum = segs * max(1, 16 // elt)  # elements: segs prefetches of whole 16-byte units
    return per_row // quantum * quantum


def fp8_gemv(
    x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None, **knobs: Any
) -> torch.Tensor:
    """W8A16: `x @ (w_fp8 * w_scale)^T (+ bias)` for a float8_e4m3fn weight `[N, K]` and its fp32
    per-output-channel scales (`[N, 1]` or `[N]`), `x` read in its own dtype; `gemv`'s knobs."""
    assert w_fp8.dtype == torch.float8_e4m3fn and w_scale.dtype == torch.float32
    return gemv(x, w_fp8, bias, weight_scale=w_scale, **knobs)


def fp8_gemv_block(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                   bias: torch.Tensor | None = None, **knobs: Any) -> torch.Tensor:  # fmt: skip
    """W8A16 `x @ (w_fp8 * scale)^T (+ bias)` with one fp32 scale a `block` (`[block_n, block_k]`, powers of two of
    at least 16) of the float8_e4m3fn weight (`fp8_block_linear.fp8_block_linear_ref`'s contract): `fp8_gemv`'s
    kernel and tiles, the scales applied in the K loop (`gemv`'s `scale_block`); `gemv`'s knobs."""
    assert w_fp8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    return gemv(x, w_fp8, bias, weight_scale=scale, scale_block=block, **knobs)


def int8_gemv(
    x: torch.Tensor, w_int8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None, **knobs: Any
) -> torch.Tensor:
    """W8A16: `x @ (w_int8 * w_scale)^T (+ bias)` for an int8 weight `[N, K]` (compressed-tensors' W8A8 at decode)
    and its fp32 per-row scales: the fp8 GEMV's kernel and tiles (one byte a weight), the codes converted exactly
    (bf16 holds every int8)."""
    assert w_int8.dtype == torch.int8 and w_scale.dtype == torch.float32
    return gemv(x, w_int8, bias, weight_scale=w_scale, **knobs)


__all__ = ["ONE_ROW_TILES", "GemvConfig", "LoRAEpilogue", "default_config", "fp8_gemv", "fp8_gemv_block",
           "fuses_lora", "gemv", "int8_gemv", "l2_prefetch_k", "one_row_knobs", "parse_tiles", "restore_one_row_tiles",
           "set_one_row_tiles", "tiles_spec"]
