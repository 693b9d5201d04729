"""The one-row W8A16 GEMV in Triton, register-pipelined: `x @ (w_fp8 * w_scale)^T (+ bias)` for one `x` row.

Same contract as `fp8_linear.fp8_weight_only_linear_ref` at one row (bf16/fp16 activations read as they are, a
float8_e4m3fn weight `[N, K]` with one fp32 scale per output feature, fp32 sums); optionally the gated form
(`silu(x @ gate^T) * (x @ up^T)` from the merged `[2N, K]` gate/up weight, as `triton_gated_gemv.py`), so that the
fp8 MLP needs no SiLU launch either; and the qkv form with the shared rotary/KV-write epilogue
(`triton_rope_epilogue.py`, `fp8_row_gemv_rope`: the rotary embedding and the K/V cache write done by the GEMV's
programs, no `rotary_and_write_kv` launch).

Why a second fp8 GEMV beside `triton_gemv.fp8_gemv` (which stays the path for 2..16 rows and the default): at
batch 1 on the H200 that kernel streams the fp8 weight at 2.2-3.4 TB/s where the bf16 GEMV of the same tiles
reaches ~4 TB/s, and its main loop explains it (Triton 3.6, sm_90, `bench/sass_loop.py`): the 3-D accumulator's
layout reads every weight byte back from the cp.async pipeline's shared memory by its own `LDS` (71 `LDS` and 36
`LEA` a step), so the qkv tile's step costs 318 instructions for 64 weight bytes a thread (~5 a byte) against the
bf16 loop's ~1.9. Here (`_row_sums`; 203 instructions for the same 64 bytes, 3.2 a byte, no spills, under 3.6):

- The weight is read as int32 words (4 e4m3 bytes, K positions 4j..4j+3) in 16-byte loads straight to registers
  (`num_stages=1`: no cp.async, no shared memory) and each word converted by inline PTX (two `cvt.rn.f16x2.e4m3x2`,
  four `cvt.f32.f16`; SASS `F2FP` on the register halves, `HADD2.F32`). A loop-carried e4m3 tile would be unpacked
  by Triton 3.6 one register a byte (207 registers, 248 `PRMT` a step). The activation row is read as int64 words
  (four bf16/fp16 each) and split by shifts.
- A 2-D fp32 accumulator `[BLOCK_N, BLOCK_K / 4]` in the load layout: each step adds the word's four products in
  K order; the lanes are summed once after the loop. The floor per weight byte is the conversion (1.5
  instructions) and one `FFMA`; what is left above it is the activation words' layout change (Triton lays the 1-D
  load out apart from the tile's slice: one shared-memory round trip and 2 barriers a step) and their split.
- Latency is hidden by software pipelining in registers: PREFETCH + 1 buffers of weight tiles (and of the
  activation words) with the loop unrolled by as many steps, so the next PREFETCH tiles are in flight while a
  step's FMAs run and no register is copied; the scales and bias are loaded before the loop.
- Programmatic dependent launch (`kernels/pdl.py`, the one-row chain): the first PREFETCH tiles (and the scales)
  are exactly the loads before the loop, so under PDL they are issued before `griddepcontrol.wait` without a
  peeled copy of the loop step (the PDL variant of `triton_gemv` adds ~360 instructions a program, 10 % of a qkv
  program, which a loop that close to its issue limit may pay for: session 10 measured the fp8 GEMV slower by PDL,
  3.099 -> 3.263 ms/step). `TRIGGER` places `griddepcontrol.launch_dependents`: 0 at the top (as every PDL kernel
  of main), 1 after the K loop (dependents launch during this kernel's epilogue, not while its last wave streams).

Block-scaled fp8 (`fp8_row_gemv_block`, `dispatch.fp8_block_linear` at one row): the plain kernel with SCALE_WORDS
> 0: the program's rows lie in one n-block, and each activation is multiplied by its K block's scale in the loop
(`_step`), the epilogue's row scale left out; not gated, no rope form (block layers run neither fused seam).

Rounding: each output's fp32 sum times its scale (plus the bias) is rounded once to the activation dtype, as
`fp8_gemv`; the gated form then rounds as `F.linear` + the SiLU kernel (`triton_gated_gemv.py`'s rounding points).
The sum over K is in this kernel's order (per K lane over the steps, then across lanes), not `fp8_gemv`'s: outputs
differ from it in the last bits, not from the reference beyond fp32 rounding.

Switch: FLOTILLA_FP8_ROW_GEMV (`kernels/dispatch.py`, on by default since session 16's measurement; 0 turns it off).
Launch knobs per call (`default_config`, then `MEASURED_CONFIGS`), overridden by FLOTILLA_FP8_ROW_GEMV_CONFIG (read
at import; `parse_configs`: knobs for every call, `bn=16,bk=512,w=4,p=2,t=0,d=1`, any subset, d=0 a plain launch
even in the PDL chain, and/or per weight shape, `6144x4096:bn=16;4096x4096:bn=8,w=2`); `bench/results/fp8g15-gpu.sh`
passes its sweep's per-shape winners to the engine this way.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

from flotilla.kernels.card_tables import DEFAULT, H100, H200, device_card, for_card, parsed
from flotilla.kernels.fp8_linear import fp8_weight_only_linear_ref
from flotilla.kernels.launch_knobs import KnobSyntax, Table
from flotilla.kernels.pdl import pdl_active, peeled_pdl_options
from flotilla.kernels.triton_activation import silu_mul
from flotilla.kernels.triton_rope_epilogue import (
    check_rope_operands,
    fits_rope,
    qkv_rope_ref,
    rope_constexprs,
    rope_kv_store,
    rope_launch_args,
    rope_rows,
)
from flotilla.kernels.triton_utils import INTERPRETING, device_sms

# weight bytes a thread loads a K step at the default rows (one 16-byte word load each of 4 rows at 16 x 512)
_STEP_BYTES = 64
# FLOTILLA_FP8_ROW_GEMV_CONFIG's syntax (`launch_knobs.py`): knobs for every call (a bare entry) and/or per weight
# shape, `;`-separated `ROWSxK:knobs` entries (ROWS counts the weight's rows: the gated form's gate and up halves
# together), knobs any of `bn=,bk=,w=,p=,t=,d=`.
KNOBS = KnobSyntax("FLOTILLA_FP8_ROW_GEMV_CONFIG", {"bn": "block_n", "bk": "block_k", "w": "num_warps",
                                                    "p": "prefetch", "t": "trigger", "d": "use_pdl"},
                   shapeless=True)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class RowGemvConfig:
    """Tile and launch knobs of one launch."""

    block_n: int  # output features per program (gated: gate rows, and as many up rows)
    block_k: int  # K elements (weight bytes of a row) per loop step
    num_warps: int
    prefetch: int  # weight tiles in flight ahead of the step that uses them (1..3)
    trigger: int  # PDL only: launch_dependents at the top (0) or after the K loop (1)
    use_pdl: int  # 1: launched by PDL where the one-row chain is (`pdl_active`); 0: a plain launch even there

    def spec(self) -> str:
        """The `bn=..,bk=..,w=..,p=..,t=..,d=..` form `parse_config` reads."""
        return KNOBS.spec(dataclasses.asdict(self))


def parse_config(knobs: str) -> dict[str, int]:
    """`"bn=16,bk=512,w=4,p=2,t=0,d=1"` (any subset) as `default_config` keywords; a ValueError for unknown
    knobs."""
    return KNOBS.knobs(knobs)


def parse_configs(text: str) -> Table:
    """FLOTILLA_FP8_ROW_GEMV_CONFIG (`KNOBS`): knobs for every call (`"bn=8,p=3"`, key None) or per weight shape
    (`"6144x4096:bn=16;28672x4096:bn=8,p=3"`), a shape's entry over the global one."""
    return KNOBS.table(text)


ENV_CONFIGS = parse_configs(os.environ.get("FLOTILLA_FP8_ROW_GEMV_CONFIG", ""))
# Per card (`card_tables.py`; `parse_configs` syntax). DEFAULT: the per-shape winners of the micro sweep
# (bench/fp8_row_gemv.py) at Llama-3.1-8B's shapes, session 16 call 2 (an H100; bench/results/gpu-2026-12-05-s16/
# call2/fp8g15): qkv 9.57 vs 10.46 us at the default, o_proj 7.45 vs 7.90, down 21.61 vs 23.23; the gated gate_up
# form's default was within 0.4 us of its best. bench/tile_sweep.py --family fp8 (bench/results/sweep25-gpu.sh) times
# tiles inside the engine and prints the entry for the card it ran on. The environment's entries win on every card.
# H100: session 25 call 5 (bench/results/gpu-2026-12-06-s25/call5/sweep25.log, from `OUT=... bash
# bench/results/sweep25-gpu.sh`):
# the fp8 bs1 ctx 512 step A B B A 3.398 -> 3.150 ms (-247.6 us), greedy tokens equal; 0.583x the same call's bf16
# step (5.404, its new tiles).
MEASURED_CONFIGS: dict[str, str] = {
    DEFAULT: "6144x4096:bn=8,p=3;4096x4096:bn=16,bk=1024;4096x14336:bn=16,bk=1024",
    H100: "6144x4096:bn=8,bk=512,w=2,p=3,t=0,d=1;4096x4096:bn=16,bk=1024,w=4,p=3,t=1,d=1;"
    "28672x4096:bn=4,bk=512,w=4,p=2,t=0,d=1;4096x14336:bn=8,bk=1024,w=4,p=2,t=0,d=1",
    # session 29 call 1 (bench/results/gpu-2026-12-06-s29/call1/sweep25.log): the H100's entry won on the H200 too,
    # fp8 bs1 ctx 512 A B B A 2.784 -> 2.496 ms, greedy tokens equal; 0.599x the same call's bf16 step (4.170)
    H200: "6144x4096:bn=8,bk=512,w=2,p=3,t=0,d=1;4096x4096:bn=16,bk=1024,w=4,p=3,t=1,d=1;"
    "28672x4096:bn=4,bk=512,w=4,p=2,t=0,d=1;4096x14336:bn=8,bk=1024,w=4,p=2,t=0,d=1",
}
_MEASURED = parsed(MEASURED_CONFIGS, parse_configs)


def env_knobs(rows: int, k: int, card: str | None = None) -> dict[str, int]:
    """The knobs for a `[rows, k]` weight on `card`: the card's measured table's (`DEFAULT`'s for a card without
    one), then FLOTILLA_FP8_ROW_GEMV_CONFIG's global knobs, then its shape's."""
    measured = for_card(_MEASURED, card).get((rows, k), {})
    return measured | ENV_CONFIGS.get(None, {}) | ENV_CONFIGS.get((rows, k), {})


def default_config(
    n: int,
    k: int,
    num_sms: int,
    *,
    gated: bool = False,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    prefetch: int | None = None,
    trigger: int | None = None,
    use_pdl: int | None = None,
) -> RowGemvConfig:
    """The configuration for `n` outputs (gated: from a `[2n, k]` weight) over `k`; given knobs are kept.

    A lead, unmeasured (bench/results/fp8g15-gpu.sh sweeps it): 512-wide K steps (one 16-byte load a row a thread
    across a warp); as many rows as give a thread 64 weight bytes a step (16 at 4 warps; 8 + 8 gated), then fewer
    (down to 4) while there are fewer than 2 programs per SM; tiles in flight for ~64-96 bytes a thread: 2 tiles
    of 64 bytes, 3 of 32 (Llama's o_proj and down at 8 rows: 512 programs, ~4 an SM; with 2 tiles only ~32 KB an SM
    would be in flight, under the ~30-40 KB the H200's bandwidth x latency asks for)."""
    num_warps = num_warps or 4
    block_k = block_k or min(512, max(16, triton.next_power_of_2(k)))
    trigger = 0 if trigger is None else trigger
    use_pdl = 1 if use_pdl is None else use_pdl
    halves = 2 if gated else 1
    if block_n is None:
        block_n = max(4, min(_STEP_BYTES * 32 * num_warps // (halves * block_k), triton.next_power_of_2(max(n, 1))))
        while triton.cdiv(n, block_n) < 2 * num_sms and block_n > 4:
            block_n //= 2
    if prefetch is None:
        prefetch = 3 if halves * block_n * block_k <= 32 * 32 * num_warps else 2
    assert 1 <= prefetch <= 3 and trigger in (0, 1) and use_pdl in (0, 1)
    return RowGemvConfig(block_n, block_k, num_warps, prefetch, trigger, use_pdl)


# Four e4m3 bytes (one 32-bit word: K positions 4j..4j+3, little-endian) to four fp32, exactly: the hardware's
# two-at-a-time conversion to f16x2 (`cvt.rn.f16x2.e4m3x2`: upper byte -> upper half), then f16 -> f32 per value.
_E4M3X4_TO_F32X4 = tl.constexpr("""{
.reg .b16 lo, hi, a0, a1, a2, a3;
.reg .b32 h01, h23;
mov.b32 {lo, hi}, $4;
cvt.rn.f16x2.e4m3x2 h01, lo;
cvt.rn.f16x2.e4m3x2 h23, hi;
mov.b32 {a0, a1}, h01;
mov.b32 {a2, a3}, h23;
cvt.f32.f16 $0, a0;
cvt.f32.f16 $1, a1;
cvt.f32.f16 $2, a2;
cvt.f32.f16 $3, a3;
}""")


@triton.jit
def _tile(ptrs, js, j0, KW, WORDS: tl.constexpr, EVEN_K: tl.constexpr):
    """One `[BLOCK_N, BLOCK_K / 4]` tile of weight words (4 e4m3 bytes each) at word offset `j0` (`js`: the tile's
    word lanes). EVEN_K (whole tiles): no mask; a tile past the row's KW words (the window running ahead of the
    last steps) re-reads the last tile instead (an L1/L2 hit, never used). Else masked: zero past KW."""
    if EVEN_K:
        return tl.load(ptrs + tl.minimum(j0, KW - WORDS))
    else:
        return tl.load(ptrs + j0, mask=((j0 + js) < KW)[None, :], other=0)


@triton.jit
def _tiles(g_ptrs, u_ptrs, js, j0, KW, WORDS: tl.constexpr, EVEN_K: tl.constexpr, GATED: tl.constexpr):
    """The gate tile at `j0` and, GATED, the up tile (else the gate tile again: a dead value, never loaded)."""
    g = _tile(g_ptrs, js, j0, KW, WORDS, EVEN_K)
    u = g
    if GATED:
        u = _tile(u_ptrs, js, j0, KW, WORDS, EVEN_K)
    return g, u


@triton.jit
def _e4m3_byte(word, SHIFT: tl.constexpr):
    """The e4m3 byte at bit SHIFT of each int32 `word` as its exact fp32 value, in integer and float ops (the
    interpreter's path; the compiled kernel uses `_E4M3X4_TO_F32X4`). Weights are finite (no NaN code)."""
    b = (word >> SHIFT) & 0xFF
    e = (b >> 3) & 0xF
    m = b & 0x7
    normal = ((e + 120) << 23 | (m << 20)).to(tl.float32, bitcast=True)  # 1.mmm x 2^(e - 7)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormals: m x 2^-9
    return tl.where((b & 0x80) != 0, -mag, mag)


@triton.jit
def _weights_f32(word, ASM: tl.constexpr):
    """The four fp32 weights of each weight word (K positions 4j, 4j+1, 4j+2, 4j+3)."""
    if ASM:
        w0, w1, w2, w3 = tl.inline_asm_elementwise(_E4M3X4_TO_F32X4, "=r,=r,=r,=r,r", [word],
                                                   dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                                                   is_pure=True, pack=1)  # fmt: skip
    else:
        w0 = _e4m3_byte(word, 0)
        w1 = _e4m3_byte(word, 8)
        w2 = _e4m3_byte(word, 16)
        w3 = _e4m3_byte(word, 24)
    return w0, w1, w2, w3


@triton.jit
def _act_f32(q, SHIFT: tl.constexpr, BF16: tl.constexpr):
    """The 16-bit activation at bit SHIFT of each int64 `q` (four activations, K positions 4j..4j+3) as fp32
    (bf16, else fp16)."""
    h = (q >> SHIFT).to(tl.int32) & 0xFFFF
    if BF16:  # bf16 -> fp32 is the 16 bits moved up
        return (h << 16).to(tl.float32, bitcast=True)
    else:
        return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _fma_words(acc, word, a0, a1, a2, a3, ASM: tl.constexpr):
    """`acc` plus the four products of each weight word with its four activations (K order within the word)."""
    w0, w1, w2, w3 = _weights_f32(word, ASM)
    acc += w0 * a0
    acc += w1 * a1
    acc += w2 * a2
    acc += w3 * a3
    return acc


@triton.jit
def _xs(x_ptr, s_row, js, j0, KW, WORDS: tl.constexpr, EVEN_K: tl.constexpr, SCALE_WORDS: tl.constexpr):
    """The activation words (int64, four activations each) of the step at word offset `j0`; clamped or masked past
    KW as `_tile` (a step past K is skipped, its words never used). With block scales (SCALE_WORDS > 0) also the
    scale of each word's K block (`s_row`: the program's row of block scales, SCALE_WORDS words a block), else the
    words again (a dead value, never loaded)."""
    if EVEN_K:
        q = tl.load(x_ptr + tl.minimum(j0, KW - WORDS) + js)
    else:
        q = tl.load(x_ptr + j0 + js, mask=(j0 + js) < KW, other=0)
    s = q
    if SCALE_WORDS > 0:  # a word's four K positions lie in one block; the row's few scales stay in L1
        if EVEN_K:
            s = tl.load(s_row + (tl.minimum(j0, KW - WORDS) + js) // SCALE_WORDS)
        else:
            s = tl.load(s_row + (j0 + js) // SCALE_WORDS, mask=(j0 + js) < KW, other=0.0)
    return q, s


@triton.jit
def _step(acc_g, acc_u, wg, wu, q, s, GATED: tl.constexpr, BF16: tl.constexpr, ASM: tl.constexpr,
          BLOCK_SCALED: tl.constexpr):  # fmt: skip
    """One K step: the weight tiles `wg` (and `wu`) times the step's activation words `q` (BLOCK_SCALED: each
    activation times its word's block scale `s` first: the tile's rows share one n-block, so the scale varies along
    K only and costs 4 multiplies a word lane, not one a weight)."""
    q = q[None, :]
    a0 = _act_f32(q, 0, BF16)
    a1 = _act_f32(q, 16, BF16)
    a2 = _act_f32(q, 32, BF16)
    a3 = _act_f32(q, 48, BF16)
    if BLOCK_SCALED:
        s = s[None, :]
        a0 *= s
        a1 *= s
        a2 *= s
        a3 *= s
    acc_g = _fma_words(acc_g, wg, a0, a1, a2, a3, ASM)
    if GATED:
        acc_u = _fma_words(acc_u, wu, a0, a1, a2, a3, ASM)
    return acc_g, acc_u


@triton.jit
def _row_sums(x_ptr, w_ptr, rows, N, KW, stride_wn, GATED: tl.constexpr, BF16: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr, EVEN_K: tl.constexpr, ASM: tl.constexpr,
              PDL: tl.constexpr, PDL_GDC: tl.constexpr, TRIGGER: tl.constexpr, s_row,
              SCALE_WORDS: tl.constexpr):  # fmt: skip
    """The fp32 sums over K of weight rows `rows` (`[BLOCK_N]` int64, all < N) with the activation row: `[BLOCK_N]`
    gate sums and (GATED) the up rows' `rows + N` sums (else the gate sums again). The PDL wait (and a trigger)
    happen inside, after the first tiles' loads; `_fp8_row_gemv_kernel`'s docstring says how the loop is built.
    SCALE_WORDS > 0: block scales, the rows all in one n-block whose scales `s_row` points at (a block of
    SCALE_WORDS weight words along K); each activation is multiplied by its block's scale (`_step`)."""
    WORDS: tl.constexpr = BLOCK_K // 4
    BLOCK_SCALED: tl.constexpr = SCALE_WORDS > 0
    js = tl.arange(0, WORDS)
    g_ptrs = w_ptr + rows[:, None] * stride_wn + js[None, :]
    u_ptrs = w_ptr + (rows + N)[:, None] * stride_wn + js[None, :]  # gated only
    acc_g = tl.zeros([BLOCK_N, WORDS], tl.float32)
    acc_u = tl.zeros([BLOCK_N, WORDS], tl.float32)
    # The first PREFETCH tiles, issued before anything reads an activation: under PDL, before the wait (weights are
    # never written by a kernel of the step), so the stream starts while the kernel ahead still runs.
    g0, u0 = _tiles(g_ptrs, u_ptrs, js, 0, KW, WORDS, EVEN_K, GATED)
    g1 = g0
    u1 = u0
    g2 = g0
    u2 = u0
    if PREFETCH > 1:
        g1, u1 = _tiles(g_ptrs, u_ptrs, js, WORDS, KW, WORDS, EVEN_K, GATED)
    if PREFETCH > 2:
        g2, u2 = _tiles(g_ptrs, u_ptrs, js, 2 * WORDS, KW, WORDS, EVEN_K, GATED)
    if PDL and PDL_GDC:  # PDL_GDC False only in the interpreter's test (no griddepcontrol there)
        if TRIGGER == 0:
            tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    # the activation words of the same steps (after the wait: x is the kernel ahead's output), carried alongside
    q0, s0 = _xs(x_ptr, s_row, js, 0, KW, WORDS, EVEN_K, SCALE_WORDS)
    q1 = q0
    q2 = q0
    s1 = s0
    s2 = s0
    if PREFETCH > 1:
        q1, s1 = _xs(x_ptr, s_row, js, WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
    if PREFETCH > 2:
        q2, s2 = _xs(x_ptr, s_row, js, 2 * WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
    # num_stages=1: the pipelining is the register buffers, not cp.async stages in shared memory
    if PREFETCH == 1:
        for j0 in tl.range(0, KW, 2 * WORDS, num_stages=1):
            g1, u1 = _tiles(g_ptrs, u_ptrs, js, j0 + WORDS, KW, WORDS, EVEN_K, GATED)
            q1, s1 = _xs(x_ptr, s_row, js, j0 + WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
            acc_g, acc_u = _step(acc_g, acc_u, g0, u0, q0, s0, GATED, BF16, ASM, BLOCK_SCALED)
            g0, u0 = _tiles(g_ptrs, u_ptrs, js, j0 + 2 * WORDS, KW, WORDS, EVEN_K, GATED)
            q0, s0 = _xs(x_ptr, s_row, js, j0 + 2 * WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
            if j0 + WORDS < KW:
                acc_g, acc_u = _step(acc_g, acc_u, g1, u1, q1, s1, GATED, BF16, ASM, BLOCK_SCALED)
    elif PREFETCH == 2:
        for j0 in tl.range(0, KW, 3 * WORDS, num_stages=1):
            g2, u2 = _tiles(g_ptrs, u_ptrs, js, j0 + 2 * WORDS, KW, WORDS, EVEN_K, GATED)
            q2, s2 = _xs(x_ptr, s_row, js, j0 + 2 * WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
            acc_g, acc_u = _step(acc_g, acc_u, g0, u0, q0, s0, GATED, BF16, ASM, BLOCK_SCALED)
            g0, u0 = _tiles(g_ptrs, u_ptrs, js, j0 + 3 * WORDS, KW, WORDS, EVEN_K, GATED)
            q0, s0 = _xs(x_ptr, s_row, js, j0 + 3 * WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
            if j0 + WORDS < KW:
                acc_g, acc_u = _step(acc_g, acc_u, g1, u1, q1, s1, GATED, BF16, ASM, BLOCK_SCALED)
            g1, u1 = _tiles(g_ptrs, u_ptrs, js, j0 + 4 * WORDS, KW, WORDS, EVEN_K, GATED)
            q1, s1 = _xs(x_ptr, s_row, js, j0 + 4 * WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
            if j0 + 2 * WORDS < KW:
                acc_g, acc_u = _step(acc_g, acc_u, g2, u2, q2, s2, GATED, BF16, ASM, BLOCK_SCALED)
    else:
        for j0 in tl.range(0, KW, 4 * WORDS, num_stages=1):
            g3, u3 = _tiles(g_ptrs, u_ptrs, js, j0 + 3 * WORDS, KW, WORDS, EVEN_K, GATED)
            q3, s3 = _xs(x_ptr, s_row, js, j0 + 3 * WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
            acc_g, acc_u = _step(acc_g, acc_u, g0, u0, q0, s0, GATED, BF16, ASM, BLOCK_SCALED)
            g0, u0 = _tiles(g_ptrs, u_ptrs, js, j0 + 4 * WORDS, KW, WORDS, EVEN_K, GATED)
            q0, s0 = _xs(x_ptr, s_row, js, j0 + 4 * WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
            if j0 + WORDS < KW:
                acc_g, acc_u = _step(acc_g, acc_u, g1, u1, q1, s1, GATED, BF16, ASM, BLOCK_SCALED)
            g1, u1 = _tiles(g_ptrs, u_ptrs, js, j0 + 5 * WORDS, KW, WORDS, EVEN_K, GATED)
            q1, s1 = _xs(x_ptr, s_row, js, j0 + 5 * WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
            if j0 + 2 * WORDS < KW:
                acc_g, acc_u = _step(acc_g, acc_u, g2, u2, q2, s2, GATED, BF16, ASM, BLOCK_SCALED)
            g2, u2 = _tiles(g_ptrs, u_ptrs, js, j0 + 6 * WORDS, KW, WORDS, EVEN_K, GATED)
            q2, s2 = _xs(x_ptr, s_row, js, j0 + 6 * WORDS, KW, WORDS, EVEN_K, SCALE_WORDS)
            if j0 + 3 * WORDS < KW:
                acc_g, acc_u = _step(acc_g, acc_u, g3, u3, q3, s3, GATED, BF16, ASM, BLOCK_SCALED)
    if PDL and PDL_GDC and TRIGGER == 1:
        tl.extra.cuda.gdc_launch_dependents()
    gate = tl.sum(acc_g, 1)
    up = gate
    if GATED:
        up = tl.sum(acc_u, 1)
    return gate, up


@triton.jit
def _row_params(scale_ptr, bias_ptr, rows, N, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                ROW_SCALES: tl.constexpr = True):  # fmt: skip
    """The rows' scales and biases (fp32; zero without a bias), and the up rows' (`rows + N`; GATED only, else the
    gate rows' again). ROW_SCALES False (block scales, applied in the loop): scales of 1."""
    scale_g = tl.load(scale_ptr + rows) if ROW_SCALES else tl.full(rows.shape, 1.0, tl.float32)
    bias_g = tl.zeros_like(scale_g)
    if HAS_BIAS:
        bias_g = tl.load(bias_ptr + rows).to(tl.float32)
    scale_u = scale_g
    bias_u = bias_g
    if GATED:
        scale_u = tl.load(scale_ptr + N + rows)
        if HAS_BIAS:
            bias_u = tl.load(bias_ptr + N + rows).to(tl.float32)
    return scale_g, bias_g, scale_u, bias_u


@triton.jit
def _fp8_row_gemv_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    N,
    KW,
    stride_wn,
    stride_sn,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    BF16: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN_K: tl.constexpr,
    ASM: tl.constexpr = True,
    PDL: tl.constexpr = False,
    PDL_GDC: tl.constexpr = True,
    TRIGGER: tl.constexpr = 0,
    SCALE_BN: tl.constexpr = 1,
    SCALE_WORDS: tl.constexpr = 0,
):
    """One program: outputs `cols` (of N) from weight rows `cols` (and, gated, the up rows `N + cols`).

    Block scales (SCALE_WORDS > 0, not gated): `scale_ptr` is `[ceil(N / SCALE_BN), ceil(K / (4 * SCALE_WORDS))]`
    (row stride `stride_sn`) and BLOCK_N divides SCALE_BN, so the program's rows lie in one n-block and every
    activation is scaled by its K block's scale inside the loop (`_step`) instead of each sum by its row's after it.

    `w_ptr` is the e4m3 weight seen as int32 words (`[rows, KW]`, KW = K / 4, row stride `stride_wn` words) and
    `x_ptr` the activation row seen as int64 (four 16-bit activations each): a thread's 16 weight bytes of a row
    are one 16-byte load kept packed in 4 registers across the loop (a loop-carried fp8 tile is unpacked into one
    register a byte: 200+ registers and ~4 byte moves a byte under Triton 3.6), and its 16 activations two.

    Pipelining: PREFETCH + 1 register buffers of tiles and the loop unrolled by as many steps, so that while a
    step's FMAs run the next PREFETCH tiles are in flight and no tile is copied between registers (a rotating
    window would cost a move a register a step); a step past the last tile is skipped (a uniform branch)."""
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    rows = tl.minimum(cols, N - 1).to(tl.int64)  # rows past N re-read row N - 1 (stores masked): unmasked loads
    # The epilogue's parameters first (weights, never a kernel's output: before the PDL wait too), so that their
    # latency hides under the K loop instead of following it in every program.
    scale_g, bias_g, scale_u, bias_u = _row_params(scale_ptr, bias_ptr, rows, N, HAS_BIAS, GATED, SCALE_WORDS == 0)
    s_row = scale_ptr + ((pid * BLOCK_N) // SCALE_BN) * stride_sn  # block scales: the program's n-block
    gate, up = _row_sums(x_ptr, w_ptr, rows, N, KW, stride_wn, GATED, BF16, BLOCK_N, BLOCK_K, PREFETCH, EVEN_K, ASM,
                         PDL, PDL_GDC, TRIGGER, s_row, SCALE_WORDS)  # fmt: skip
    out_ty = out_ptr.dtype.element_ty
    if SCALE_WORDS == 0:
        gate = gate * scale_g
    if HAS_BIAS:
        gate += bias_g
    if GATED:  # main's rounding points: each projection stored (rounded), SiLU in fp32 rounded, the product rounded
        up = up * scale_u
        if HAS_BIAS:
            up += bias_u
        res = silu_mul(gate, up, out_ty)
    else:
        res = gate
    tl.store(out_ptr + cols, res.to(out_ty), mask=col_ok)


@triton.jit
def _fp8_row_gemv_rope_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    N,
    KW,
    stride_wn,
    rope,  # the epilogue's operands (`rope_launch_args`)
    HAS_BIAS: tl.constexpr,
    BF16: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN_K: tl.constexpr,
    ASM: tl.constexpr = True,
    PDL: tl.constexpr = False,
    PDL_GDC: tl.constexpr = True,
    TRIGGER: tl.constexpr = 0,
):
    """The qkv projection's program with the rotary/KV-write epilogue (`triton_rope_epilogue.py`): rows are
    BLOCK_N / 2 features of one head's first half and the same features D/2 further on (`rope_rows`: every pair the
    program rotates), the sums are `_row_sums`' (the plain kernel's), scaled, biased, then `rope_kv_store`: rounded to
    the activation dtype, rotated (q, k) and stored: q into `q_out`, k and v into the caches at `slot_mapping[0]`
    (-1: nothing written; an fp8 cache stores K / k_scale, V / v_scale)."""
    head, first, rows = rope_rows(tl.program_id(0), BLOCK_N, HEAD_DIM)
    rows = rows.to(tl.int64)  # all < N (whole heads)
    scale, bias, _, _ = _row_params(scale_ptr, bias_ptr, rows, N, HAS_BIAS, False)  # before the loop (and wait)
    res, _ = _row_sums(x_ptr, w_ptr, rows, N, KW, stride_wn, False, BF16, BLOCK_N, BLOCK_K, PREFETCH, EVEN_K, ASM,
                       PDL, PDL_GDC, TRIGGER, scale_ptr, 0)  # fmt: skip
    res = res * scale
    if HAS_BIAS:  # before the rounding, as the plain GEMV (Qwen2's qkv bias: before the rotation)
        res += bias
    rope_kv_store(res, head, first, rope, HEAD_DIM, PAGE, FP8_CACHE, BLOCK_N)


def supported(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
              *, gated: bool = False) -> bool:  # fmt: skip
    """Whether `fp8_row_gemv` takes these operands: one row of bf16/fp16 activations, contiguous, 8-byte aligned;
    an e4m3 weight `[N, K]` (gated: an even N) with contiguous rows, K and the row stride multiples of 4 and a
    4-byte aligned start (the kernel reads it as int32 words, the row as int64); N fp32 scales, `[N]` or `[N, 1]`
    (never block scales, whose count may match N: `fp8_row_gemv_block`); a contiguous bias of N values in x's
    dtype."""
    n = w_fp8.shape[0]
    return (_takes_row_and_weight(x, w_fp8, bias, gated) and w_scale.dtype == torch.float32
            and tuple(w_scale.shape) in ((n,), (n, 1)) and w_scale.is_contiguous())  # fmt: skip


def _takes_row_and_weight(x: torch.Tensor, w_fp8: torch.Tensor, bias: torch.Tensor | None, gated: bool) -> bool:
    """`supported`'s conditions on the row, the weight and the bias (the scales aside)."""
    if not (x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16) and x.is_contiguous()
            and w_fp8.dim() == 2 and w_fp8.dtype == torch.float8_e4m3fn and w_fp8.shape[1] == x.shape[1]
            and w_fp8.stride(-1) == 1):  # fmt: skip
        return False
    n, k = w_fp8.shape
    if (gated and n % 2) or k == 0 or k % 4 or w_fp8.stride(0) % 4 or w_fp8.data_ptr() % 4 or x.data_ptr() % 8:
        return False
    return bias is None or (bias.shape == (n,) and bias.is_contiguous() and bias.dtype == x.dtype)


def _pdl_options(x: torch.Tensor, cfg: RowGemvConfig, pdl: bool | None, pdl_gdc: bool) -> dict[str, bool | int]:
    """The kernels' PDL constexprs and launch option (`fp8_row_gemv`'s `pdl` and `pdl_gdc`; by default PDL where
    `pdl_active(x)` unless the config says use_pdl=0), the trigger at the config's place; none for a plain launch."""
    if not ((pdl_active(x) and cfg.use_pdl == 1) if pdl is None else pdl):
        return {}
    return peeled_pdl_options(pdl_gdc) | {"TRIGGER": cfg.trigger}


def fp8_row_gemv(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    gated: bool = False,
    pdl: bool | None = None,
    pdl_gdc: bool = True,
    **knobs: int,
) -> torch.Tensor:
    """W8A16 `x @ (w_fp8 * w_scale)^T (+ bias)` `[1, N]` for one row `x` `[1, K]` (where `supported`); `gated`:
    `silu(gate) * up` `[1, N / 2]` of the merged gate/up weight's two halves.

    `knobs` (block_n, block_k, num_warps, prefetch, trigger, use_pdl) override FLOTILLA_FP8_ROW_GEMV_CONFIG's
    (`env_knobs`), which override `default_config`. `pdl`: launched by programmatic dependent launch (default:
    `pdl_active`, the one-row chain on sm_90+, unless the config says use_pdl=0); `pdl_gdc=False` (tests only)
    keeps the PDL code path without the griddepcontrol instructions, so that the interpreter can run it."""
    assert supported(x, w_fp8, w_scale, bias, gated=gated), (
        f"unsupported operands {tuple(x.shape)} {x.dtype} x {tuple(w_fp8.shape)} {w_fp8.dtype}"
    )
    n_w, k = w_fp8.shape
    n = n_w // 2 if gated else n_w
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    cfg = default_config(n, k, device_sms(x), gated=gated, **(env_knobs(n_w, k, device_card(x)) | knobs))
    assert cfg.block_k % 4 == 0
    words = w_fp8.view(torch.int32)  # [N, K / 4]: 4 e4m3 bytes a word (little-endian: K order within the word)
    even_k = (k // 4) % (cfg.block_k // 4) == 0  # whole tiles: unmasked loads
    _fp8_row_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x.view(torch.int64), words, w_scale, bias if bias is not None else out, out, n, k // 4, words.stride(0), 0,
        HAS_BIAS=bias is not None, GATED=gated, BF16=x.dtype == torch.bfloat16, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, PREFETCH=cfg.prefetch, EVEN_K=even_k, ASM=not INTERPRETING, num_warps=cfg.num_warps,
        num_stages=1, **_pdl_options(x, cfg, pdl, pdl_gdc),
    )  # fmt: skip
    return out


def block_supported(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                    bias: torch.Tensor | None = None) -> bool:  # fmt: skip
    """Whether `fp8_row_gemv_block` takes these operands: `supported`'s one row and weight, with fp32 block scales
    `[ceil(N / block_n), ceil(K / block_k)]` (contiguous rows) in place of the row scales, blocks a power of two
    of at least 16 each way (a program's rows then lie in one n-block and a weight word in one k-block)."""
    if not (all(b >= 16 and b & (b - 1) == 0 for b in block) and _takes_row_and_weight(x, w_fp8, bias, False)):
        return False
    n, k = w_fp8.shape
    return (scale.dtype == torch.float32 and scale.stride(-1) == 1
            and tuple(scale.shape) == (triton.cdiv(n, block[0]), triton.cdiv(k, block[1])))  # fmt: skip


def fp8_row_gemv_block(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
    *,
    pdl: bool | None = None,
    pdl_gdc: bool = True,
    **knobs: int,
) -> torch.Tensor:
    """W8A16 `x @ (w_fp8 * scale)^T (+ bias)` `[1, N]` with one fp32 scale a `block` of the weight
    (`fp8_block_linear.fp8_block_linear_ref`'s contract) for one row `x` `[1, K]` (where `block_supported`): the
    plain kernel's loop, tiles and launch (knobs and `pdl` as `fp8_row_gemv`; the weight shape's measured entry),
    each activation scaled by its K block's scale in the loop; the tile's rows cut to the block's where it is
    taller, so that a program reads one row of scales."""
    assert block_supported(x, w_fp8, scale, block, bias), (
        f"unsupported operands {tuple(x.shape)} {x.dtype} x {tuple(w_fp8.shape)} {w_fp8.dtype} in {block} blocks"
    )
    n, k = w_fp8.shape
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    cfg = default_config(n, k, device_sms(x), gated=False, **(env_knobs(n, k, device_card(x)) | knobs))
    cfg = dataclasses.replace(cfg, block_n=min(cfg.block_n, block[0]))
    words = w_fp8.view(torch.int32)
    _fp8_row_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x.view(torch.int64), words, scale, bias if bias is not None else out, out, n, k // 4, words.stride(0),
        scale.stride(0), HAS_BIAS=bias is not None, GATED=False, BF16=x.dtype == torch.bfloat16,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PREFETCH=cfg.prefetch, EVEN_K=(k // 4) % (cfg.block_k // 4) == 0,
        ASM=not INTERPRETING, SCALE_BN=block[0], SCALE_WORDS=block[1] // 4, num_warps=cfg.num_warps, num_stages=1,
        **_pdl_options(x, cfg, pdl, pdl_gdc),
    )  # fmt: skip
    return out


def fp8_row_gemv_rope_ref(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
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
    """The unfused pair in PyTorch: the W8A16 projection rounded to x's dtype, split into q/k/v heads, q and k
    rotated, k and v stored at `slot_mapping`; returns the rotated query `[T, H, D]`."""
    qkv = fp8_weight_only_linear_ref(x, w_fp8, w_scale, bias)
    return qkv_rope_ref(qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
                        k_scale, v_scale)


def fuses_rope(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
               head_dim: int) -> bool:  # fmt: skip
    """Whether `fp8_row_gemv_rope` takes this qkv projection: operands `supported` takes, whole heads, and a
    configuration (the plain kernel's for this shape) whose tile holds whole rotation pairs of one head."""
    if not (supported(x, w_fp8, w_scale, bias) and head_dim % 2 == 0 and w_fp8.shape[0] % head_dim == 0):
        return False
    n, k = w_fp8.shape
    cfg = default_config(n, k, device_sms(x), gated=False, **env_knobs(n, k, device_card(x)))
    return fits_rope(cfg.block_n, head_dim)


def fp8_row_gemv_rope(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
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
    **knobs: int,
) -> torch.Tensor:
    """`fp8_row_gemv_rope_ref` in one launch for one row `x` `[1, K]` (where `fuses_rope`): returns the rotated
    query `[1, H, D]` (new); the rotated key and the value land in the `[blocks, page, Hkv, D]` caches. Knobs and
    `pdl` as `fp8_row_gemv` (the same configuration as the plain kernel's for this weight shape)."""
    head_dim = cos_sin_cache.shape[-1]
    n, k = w_fp8.shape
    assert fuses_rope(x, w_fp8, w_scale, bias, head_dim), "fp8_row_gemv_rope needs fuses_rope()"
    check_rope_operands(n, cos_sin_cache, k_cache, v_cache, num_heads, num_kv_heads)
    q_out = torch.empty(1, num_heads, head_dim, dtype=x.dtype, device=x.device)
    cfg = default_config(n, k, device_sms(x), gated=False, **(env_knobs(n, k, device_card(x)) | knobs))
    assert fits_rope(cfg.block_n, head_dim), f"tile {cfg.block_n} vs heads"
    words = w_fp8.view(torch.int32)
    _fp8_row_gemv_rope_kernel[(n // cfg.block_n,)](
        x.view(torch.int64), words, w_scale, bias if bias is not None else q_out, n, k // 4, words.stride(0),
        rope_launch_args(positions, cos_sin_cache, slot_mapping, q_out, k_cache, v_cache, num_heads, num_kv_heads,
                         k_scale, v_scale),
        HAS_BIAS=bias is not None, BF16=x.dtype == torch.bfloat16, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        PREFETCH=cfg.prefetch, EVEN_K=(k // 4) % (cfg.block_k // 4) == 0, ASM=not INTERPRETING,
        num_warps=cfg.num_warps, num_stages=1, **rope_constexprs(cos_sin_cache, k_cache),
        **_pdl_options(x, cfg, pdl, pdl_gdc),
    )  # fmt: skip
    return q_out


__all__ = [
    "ENV_CONFIGS",
    "MEASURED_CONFIGS",
    "RowGemvConfig",
    "block_supported",
    "default_config",
    "env_knobs",
    "fp8_row_gemv",
    "fp8_row_gemv_block",
    "fp8_row_gemv_rope",
    "fp8_row_gemv_rope_ref",
    "fuses_rope",
    "parse_config",
    "parse_configs",
    "supported",
]
