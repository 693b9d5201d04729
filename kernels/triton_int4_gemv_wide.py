"""W4A16 GEMV for one to four rows that streams the packed weights in 16-byte loads: `out = x @ dequant(W)^T (+ b)`.

Same contract and layout as `triton_int4_gemv.int4_gemv` (`packed` int32 `[N, K/8]`, input `8j + i` of a row in
bits `4i..4i+3` of word `j`; `scales` `[N, K/group]`; `zeros` uint8 or None for the symmetric middle code 8),
for groups that are a multiple of 32 inputs. Nothing is repacked: 16 bytes of a row are 4 consecutive words,
32 consecutive inputs of one group, so the tile `[BLOCK_N rows, BLOCK_W/4 chunks, 4 words]` with the words
contiguous is loaded 16 bytes a thread, and every chunk has one scale (and zero point).

Why another kernel: at one row `int4_gemv`'s tensor-core path (the default) reads 0.5-0.9 TB/s of int4 bytes
(its dequantized tile goes to the MMA operand layout through shared memory), its FMA path less (2-byte weight
and activation gathers). A decode step's weights should stream at ~3+ TB/s. Here every weight costs about
three instructions and stays in the registers it was loaded into:

- Nibbles to floats without a conversion: a nibble `c` placed in the mantissa of a power of two is a float
  `m + c/16` (exact). One shift serves two nibbles: bits `15..18` under the exponent of 16.0 give
  `16 + c/16`, bits `19..22` under that of 1.0 give `1 + c/16`, so a word's 8 nibbles cost 4 shifts and
  8 bit-selects (`lop3`, one per value: `(t & mask) | magic`; PTX by `tl.inline_asm_elementwise`, plain
  Triton under the interpreter).
- The products `x_i v_i` are exact in fp32 for bf16 activations, and `sum_i x_i (c_i - z) = 16 (sum_i x_i v_i
  - sum_i (m_i + z/16) x_i)`: the second sum reads activations only (shared by the program's rows; the zero
  point's share once per chunk with asymmetric weights). So a weight costs its select, one FMA, and a share
  of its word's shift; the chunk's scale folds in with one FMA per word and row.
- Each nibble plane is computed in the words' own layout and multiplied by activations loaded in that
  layout (each thread's 32 inputs of a chunk, per plane a `[chunks, 4]` tile): no layout conversion, no
  shared memory except the load pipeline. Rows of the batch (up to 4) reuse each plane.

At one bf16 row the K loop can instead run on the tensor cores from registers (`triton_int4_mma.py`, about half the
instructions a weight; FLOTILLA_INT4_WIDE_MMA, off by default): `tile_sums` picks the step.

Split-K (a second grid axis over word ranges) with `triton_int4_gemv`'s arrival counters: the last program
of a row tile sums the partials in a fixed order (bit-reproducible) and stores the output.
Every choice comes from the shapes (CUDA-graph capturable). `wide_config` is a lead; FLOTILLA_INT4_GEMV_WIDE_CONFIG
overrides it (same syntax as FLOTILLA_INT4_GEMV_TILES); `bench/int4_gemv.py --wide` times a grid on the GPU.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from flotilla.kernels.card_tables import DEFAULT, H200, device_card
from flotilla.kernels.pdl import pdl_active, peeled_pdl_options
from flotilla.kernels.switches import env_choice, env_flag
from flotilla.kernels.triton_int4_gemv import _epilogue, _parse_tiles, _SplitK
from flotilla.kernels.triton_int4_mma import halves, mma_rows, mma_step, mma_takes
from flotilla.kernels.triton_utils import INTERPRETING, device_sms

MAX_ROWS = 4
_X_KINDS = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
# The H200 grid's one-row winners for Llama-3.1-8B's projections (bench/int4_gemv.py --wide in
# bench/results/qgemv10-gpu.sh, session 10 call 4: qkv 11.7, o 9.4, gate_up 35.4, down 22.6 us against the
# lead's 16.0 / 14.8 / 70.7 / 32.1; one stage won everywhere), and 16 x 128-word tiles at one stage elsewhere.
# Layout 1 at those four shapes since session 16 (call 3, an H100, bench/results/gpu-2026-12-05-s16/call3): with the
# PDL launch ("top", below) the int4 bs1 ctx 512 step 2.714 vs 3.597 ms in one engine (0.476x the bf16 step), greedy
# tokens equal; the projections alone qkv 8.5 vs 11.8 us, o 7.8 vs 9.0, gate_up 24.5 vs 35.5, down 15.3 vs 23.5.
# gate_up at 2 warps and down at 32 rows a program since session 20's in-engine coordinate descent (call 4, an H100,
# bench/results/tile20-gpu.sh: each shape's one-knob neighbours timed inside the int4 engine's PDL graph, where the
# fused gated/rope forms run): bs1 ctx 512 2.609 -> 2.541 ms (orig/new/new/orig, 64 steps each; 0.449x the same
# call's bf16 5.659), greedy tokens equal; qkv and o kept theirs. Measured at one row only (the table serves 1-4).
# Per card since session 25 (`card_tables.py`): the table above is DEFAULT's (every card without its own); the H200's
# differs at o_proj, where session 25's in-engine descent on the H200 (call 4, bench/results/gpu-2026-12-06-s25/
# call4/tile20.log) took 8 rows x 256 words without split-K: bs1 ctx 512 2.262 -> 2.203 ms (orig/new/new/orig, 64 steps
# each), greedy tokens equal; qkv, gate_up and down kept theirs.
_H100_TILES = (
    "block_n=16,block_w=128,num_warps=4,num_stages=1;"
    "6144x4096:block_n=16,block_w=128,num_warps=4,num_stages=1,split_k=2,layout=1;"
    "4096x4096:block_n=16,block_w=128,num_warps=4,num_stages=1,split_k=2,layout=1;"
    "28672x4096:block_n=16,block_w=128,num_warps=2,num_stages=1,layout=1;"
    "4096x14336:block_n=32,block_w=128,num_warps=4,num_stages=1,split_k=4,layout=1"
)
MEASURED_TILES: dict[str, str] = {
    DEFAULT: _H100_TILES,
    H200: _H100_TILES.replace("4096x4096:block_n=16,block_w=128,num_warps=4,num_stages=1,split_k=2,layout=1",
                              "4096x4096:block_n=8,block_w=256,num_warps=4,num_stages=1,split_k=1,layout=1"),
}
# Tiles from the environment (`triton_int4_gemv._parse_tiles` syntax, e.g. "block_n=32,block_w=128;4096x14336:
# split_k=4"): bench/results/qgemv10-gpu.sh passes a grid's winners to the engine; it replaces every card's table.
# Unset, the measured tables: `_WIDE_TILES` DEFAULT's, `_CARD_TILES` the other cards'. Read once at import.
_ENV_TILES = os.environ.get("FLOTILLA_INT4_GEMV_WIDE_CONFIG", "")
_WIDE_TILES = _parse_tiles(_ENV_TILES or MEASURED_TILES[DEFAULT], "FLOTILLA_INT4_GEMV_WIDE_CONFIG")
_CARD_TILES = {} if _ENV_TILES else {c: _parse_tiles(t) for c, t in MEASURED_TILES.items() if c != DEFAULT}
# FLOTILLA_INT4_WIDE_PDL (default "1" since session 16's call 3, above; "0" turns it off): a one-row call launched by
# programmatic dependent launch (`kernels/pdl.py`; only where `pdl_active`, i.e. FLOTILLA_PDL on, sm_90+, one row)
# with its first step's words and scales loaded before `griddepcontrol.wait`, so that they stream while the kernel
# ahead (RMSNorm, the attention merge, SiLU-and-mul) runs. "1": the kernel behind may start at once (as the bf16
# GEMV does); "late": only once every program is past its K loop. Read at import; the module global `WIDE_PDL`
# ("", "top", "late") is read at every call (the benchmarks flip it). docs/quantization.md.
WIDE_PDL_VALUES = {"0": "", "1": "top", "late": "late"}
WIDE_PDL = env_choice("FLOTILLA_INT4_WIDE_PDL", WIDE_PDL_VALUES, "top")
# Tiles of the PDL launches (same syntax as FLOTILLA_INT4_GEMV_WIDE_CONFIG; unset: that table): the preload before
# the wait is one step, so a wider step (block_w) preloads more. Read at import.
_PDL_TILES = _parse_tiles(os.environ.get("FLOTILLA_INT4_WIDE_PDL_CONFIG", ""), "FLOTILLA_INT4_WIDE_PDL_CONFIG")

# FLOTILLA_INT4_WIDE_MMA (default "0"; "1" on): one-row bf16 launches at `layout=1` with groups of 128 (or a multiple)
# run the K loop on the tensor cores, `mma_step` (fewer instructions a weight: docs/decode-gemm.md). Read at import;
# the module global `WIDE_MMA` is read at every call (the benchmarks flip it).
WIDE_MMA = env_flag("FLOTILLA_INT4_WIDE_MMA", False)


TileTable = dict[tuple[int, int] | None, dict[str, int]]


def set_wide_tiles(
    entries: Mapping[tuple[int, int], Mapping[str, int]],
) -> tuple[TileTable, TileTable, dict[str, TileTable]]:
    """Replace the tile-table entries of the given `(n, k)` weight shapes in-process (benchmarks:
    bench/int4_tile_sweep.py times tiles inside the engine, capturing its decode graphs again after each change).
    Every launch of those shapes takes them: the plain table's, and the PDL table's too where it has entries of its
    own (FLOTILLA_INT4_WIDE_PDL_CONFIG, looked up first for PDL launches); the fused forms
    (`triton_int4_gemv_fused.py`) look their tiles up through `wide_config` and follow. An entry is whole knobs (a
    shape's entry wins whole: knobs it lacks come from the lead, not from the every-shape entry). Returns the previous
    tables, for `restore_wide_tiles`. A qkv tile the rope form cannot take (`fuses_rope`) makes the engine run the
    unfused pair there. Every card's table takes the entries (a benchmark runs on one)."""
    global _WIDE_TILES, _PDL_TILES, _CARD_TILES
    previous = (dict(_WIDE_TILES), dict(_PDL_TILES), {c: dict(t) for c, t in _CARD_TILES.items()})
    new: TileTable = {shape: dict(knobs) for shape, knobs in entries.items()}
    _WIDE_TILES = {**_WIDE_TILES, **new}
    _CARD_TILES = {c: {**t, **new} for c, t in _CARD_TILES.items()}
    if _PDL_TILES:
        _PDL_TILES = {**_PDL_TILES, **new}
    return previous


def restore_wide_tiles(previous: tuple[TileTable, TileTable, dict[str, TileTable]]) -> None:
    """Put back the tables `set_wide_tiles` returned."""
    global _WIDE_TILES, _PDL_TILES, _CARD_TILES
    _WIDE_TILES, _PDL_TILES = dict(previous[0]), dict(previous[1])
    _CARD_TILES = {c: dict(t) for c, t in previous[2].items()}


def wide_tiles(card: str | None) -> TileTable:
    """The plain launches' table on `card`: its own measured table, else DEFAULT's (or the environment's)."""
    return _CARD_TILES.get(card, _WIDE_TILES) if card is not None else _WIDE_TILES


@dataclasses.dataclass(frozen=True, slots=True)
class WideConfig:
    """Tile and launch knobs of one `int4_gemv_wide` launch."""

    block_n: int  # weight rows (output features) per program
    block_w: int  # packed words per loop step (a multiple of 4: chunks of 16 bytes)
    split_k: int  # word ranges (second grid axis)
    num_warps: int
    num_stages: int  # software-pipeline depth of the K loop (> 1: cp.async through shared memory)
    layout: int = 0  # 0: main's [rows, chunks, 4] word tile; 1: [rows, words] and PTX scale loads (`_step_loads`)


def wide_supported(m: int, k: int, group_size: int) -> bool:
    """True when `int4_gemv_wide` can run: 1..MAX_ROWS rows, a group of 32 inputs or a multiple of it."""
    return 1 <= m <= MAX_ROWS and group_size % 32 == 0 and k % group_size == 0


def wide_config(
    m: int,
    n: int,
    k: int,
    num_sms: int,
    *,
    block_n: int | None = None,
    block_w: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    pdl: bool = False,
    layout: int | None = None,
    card: str | None = None,
) -> WideConfig:
    """The launch of an `[m, k] x [n, k]^T` call; given knobs (then FLOTILLA_INT4_GEMV_WIDE_CONFIG's) are kept.
    `pdl`: a PDL launch, whose knobs come from FLOTILLA_INT4_WIDE_PDL_CONFIG first (when set).

    The table (`card`'s `MEASURED_TILES` entry, else DEFAULT's, or FLOTILLA_INT4_GEMV_WIDE_CONFIG; `wide_tiles`)
    gives the knobs it has; the rest follow the
    first lead (CPU-inspected sm_90 code): 4 warps with one row of 128 words (512 contiguous bytes) a warp and
    step, 32 rows a program, 16 while the row tiles are fewer than 2 per SM, 3 stages; split-K by powers of two
    while the programs are fewer than 2 per SM and each range keeps 2 steps.
    """
    plain = wide_tiles(card)
    tables = (_PDL_TILES, plain) if pdl else (plain,)
    given = next((t[key] for t in tables for key in ((n, k), None) if key in t), {})
    block_w = block_w or given.get("block_w") or min(128, max(32, triton.next_power_of_2(k // 8) // 2))
    num_warps = num_warps or given.get("num_warps") or 4
    num_stages = num_stages or given.get("num_stages") or 3
    block_n = block_n or given.get("block_n")
    if block_n is None:
        block_n = 32
        while triton.cdiv(n, block_n) < 2 * num_sms and block_n > 16:
            block_n //= 2
    split_k = split_k or given.get("split_k")
    if split_k is None:
        tiles = triton.cdiv(n, block_n)
        split_k = 1
        while tiles * split_k < 2 * num_sms and k // 8 >= 2 * split_k * 2 * block_w and split_k < 16:
            split_k *= 2
    layout = layout if layout is not None else given.get("layout", 0)
    return WideConfig(block_n, block_w, split_k, num_warps, num_stages, layout)


@triton.jit
def _plane_pair(words, SHIFT: tl.constexpr, USE_ASM: tl.constexpr):
    """Nibbles `i` and `i + 1` of each word (`SHIFT` = 15 - 4i moves nibble i to bits 15..18, so i + 1 sits at
    19..22) as the fp32 `16 + c_i/16` and `1 + c_(i+1)/16`: exact, no int->float conversion."""
    if USE_ASM:
        # PTX shifts take no negative count: nibbles above bit 15 move right, the others left
        SHIFT_OP: tl.constexpr = f"shl.b32 t, $2, {SHIFT}" if SHIFT >= 0 else f"shr.u32 t, $2, {-SHIFT}"
        lo, hi = tl.inline_asm_elementwise(
            asm=f"""{{
            .reg .b32 t;
            {SHIFT_OP};
            lop3.b32 $0, t, 0x00078000, 0x41800000, 0xEA;
            lop3.b32 $1, t, 0x00780000, 0x3F800000, 0xEA;
            }}""",
            constraints="=r,=r,r",
            args=[words],
            dtype=(tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
    else:
        if SHIFT >= 0:  # noqa: SIM108 - a compile-time branch
            t = words << SHIFT
        else:
            t = words >> (-SHIFT)  # arithmetic: the bits kept (15..22) all come from the word
        lo = ((t & 0x00078000) | 0x41800000).to(tl.float32, bitcast=True)
        hi = ((t & 0x00780000) | 0x3F800000).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _load(ptrs, mask, other, EVEN: tl.constexpr):
    """`tl.load`, unmasked when the launch is whole tiles (a mask costs a predicate and a zeroed register)."""
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=mask, other=other)


@triton.jit
def _halves(pair, X_KIND: tl.constexpr):
    """The two 16-bit activations of an int32 (little-endian: the first in the low half) as fp32."""
    if X_KIND == 0:  # bf16: the top 16 bits of an fp32
        return (pair << 16).to(tl.float32, bitcast=True), (pair & -65536).to(tl.float32, bitcast=True)
    lo = pair.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (pair >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _pick(a, b, c, d, J: tl.constexpr):
    """`(a, b, c, d)[J]` for a compile-time `J` (Triton code: no dict of tensors)."""
    if J == 0:  # noqa: SIM116
        return a
    elif J == 1:
        return b
    elif J == 2:
        return c
    return d


@triton.jit
def _x_pair(a, b, c, d, p: tl.constexpr, X_KIND: tl.constexpr):
    """Activations 2p and 2p + 1 of a word as fp32, from its 8-byte units `a..d` (16-bit kinds: `a`, `b`)."""
    if X_KIND == 2:
        unit = _pick(a, b, c, d, p)
        return unit.to(tl.int32).to(tl.float32, bitcast=True), (unit >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    unit = _pick(a, b, a, b, p // 2)
    if p % 2 == 0:  # noqa: SIM108 - a compile-time branch
        pair = unit.to(tl.int32)
    else:
        pair = (unit >> 32).to(tl.int32)
    return _halves(pair, X_KIND)


@triton.jit
def _word_sums(r, q, xs, word, x8_ptrs, x_ok, HAS_ZEROS: tl.constexpr, X_KIND: tl.constexpr, USE_ASM: tl.constexpr,
               EVEN: tl.constexpr):
    """Word `j` of every chunk (`word [BLOCK_N, C]`) against one activation row (`x8_ptrs [C]`: the word's
    first 8 bytes of activations): `r += sum_i x_i v_i` per row and chunk; the activation-only sums per chunk
    `[C]`: `q += sum_i (m_i + 1/2) x_i` (symmetric: z/16 = 1/2 folded in) or `q += sum_i m_i x_i` and
    `xs += sum_i x_i` (asymmetric)."""
    # 8-byte loads: a warp's load of one plane per chunk (64-byte stride) touches 16 cache lines whatever its
    # width, so wide loads are fewer L1 passes
    a = _load(x8_ptrs, x_ok, 0, EVEN)
    b = _load(x8_ptrs + 1, x_ok, 0, EVEN)
    if X_KIND == 2:  # fp32: 4 units a word
        c = _load(x8_ptrs + 2, x_ok, 0, EVEN)
        d = _load(x8_ptrs + 3, x_ok, 0, EVEN)
    else:
        c = a
        d = b
    for p in tl.static_range(4):  # nibbles 2p (bits 15..18, m = 16) and 2p + 1 (bits 19..22, m = 1)
        lo, hi = _plane_pair(word, 15 - 8 * p, USE_ASM)
        xl, xh = _x_pair(a, b, c, d, p, X_KIND)
        r += xl[None, :] * lo
        r += xh[None, :] * hi
        if HAS_ZEROS:
            q += 16.0 * xl + xh
            xs += xl + xh
        else:
            q += 16.5 * xl + 1.5 * xh
    return r, q, xs


@triton.jit
def _row_step(acc, w0, w1, w2, w3, s, zf, x8_ptrs, x_ok, HAS_ZEROS: tl.constexpr, X_KIND: tl.constexpr,
              USE_ASM: tl.constexpr, EVEN: tl.constexpr):
    """`acc [BLOCK_N, C] += scale * (sum x_i v_i - sum (m_i + z/16) x_i)` over each chunk's 4 words: 1/16 of the
    row's dot with the chunk's dequantized weights (`(c - z) * scale`). `x8_ptrs [C]`: the chunks' first 8 bytes
    of activations (a word's activations are 16 bytes, 32 with fp32)."""
    U: tl.constexpr = 4 if X_KIND == 2 else 2  # 8-byte units of a word's activations
    r = tl.zeros(acc.shape, tl.float32)
    q = tl.zeros(x8_ptrs.shape, tl.float32)
    xs = tl.zeros(x8_ptrs.shape, tl.float32)
    r, q, xs = _word_sums(r, q, xs, w0, x8_ptrs, x_ok, HAS_ZEROS, X_KIND, USE_ASM, EVEN)
    r, q, xs = _word_sums(r, q, xs, w1, x8_ptrs + U, x_ok, HAS_ZEROS, X_KIND, USE_ASM, EVEN)
    r, q, xs = _word_sums(r, q, xs, w2, x8_ptrs + 2 * U, x_ok, HAS_ZEROS, X_KIND, USE_ASM, EVEN)
    r, q, xs = _word_sums(r, q, xs, w3, x8_ptrs + 3 * U, x_ok, HAS_ZEROS, X_KIND, USE_ASM, EVEN)
    d = r - q[None, :]
    if HAS_ZEROS:
        d -= zf * xs[None, :]
    return acc + s * d


@triton.jit
def _gather(ptrs, USE_ASM: tl.constexpr):
    """An unmasked load of scales or zero points (every address valid) as PTX where compiled: an elementwise op, it
    takes the layout of the values it is combined with (the words'). A `tl.load` tile of them gets a layout of its own,
    and Triton 3.6 then moves the whole step to it (session 10's qgemv10-layout.diff: threads across rows)."""
    BITS: tl.constexpr = ptrs.dtype.element_ty.primitive_bitwidth
    if not USE_ASM:
        v = tl.load(ptrs)
    elif BITS == 8:
        v = tl.inline_asm_elementwise("ld.global.nc.u8 $0, [$1];", "=h,l", [ptrs], dtype=tl.int16, is_pure=True,
                                      pack=1).to(tl.uint8)  # fmt: skip
    else:
        v = tl.inline_asm_elementwise("ld.global.nc.b16 $0, [$1];", "=h,l", [ptrs], dtype=tl.int16, is_pure=True,
                                      pack=1).to(ptrs.dtype.element_ty, bitcast=True)  # fmt: skip
    return v


@triton.jit
def _step_loads(p_ptrs, s_ptrs, z_ptrs, w0, cs, col_ok, w_end, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr,
                EVEN: tl.constexpr, LAYOUT: tl.constexpr = 0, USE_ASM: tl.constexpr = False):
    """One step's weight reads (no activation): the words from word `w0` on (16 bytes a thread), each chunk's scale
    as fp32, and its zero point over 16 (the scale as a stand-in when symmetric).
    LAYOUT 0 (main): `p_ptrs` `[BLOCK_N, C, 4]`, scales by `tl.load`; under Triton 3.6 a warp's threads then lie
    across rows and each thread does 4 chunks' activation work for one row (735 sm_90 instructions a 16 x 128 step).
    LAYOUT 1: `p_ptrs` `[BLOCK_N, BLOCK_W]` (contiguous along the row: a thread's 16 bytes, the warp along the row),
    split in registers by `_step_math`; scales and zero points by `_gather` (PTX) from rows clamped to N - 1 and
    groups clamped to the range's last (every address valid, no mask; masked chunks multiply zeros)."""
    chunk = w0 + 4 * cs  # [C] each chunk's first word
    chunk_ok = chunk < w_end  # whole chunks: K is a multiple of 32
    tile_ok = col_ok[:, None] & chunk_ok[None, :]
    group = (chunk * 8) // GROUP  # a chunk's 32 inputs lie in one group
    if LAYOUT == 0:
        words = _load(p_ptrs + w0, tile_ok[:, :, None], 0, EVEN)  # [BLOCK_N, C, 4] int32
        s = _load(s_ptrs + group[None, :], tile_ok, 0.0, EVEN).to(tl.float32)  # [BLOCK_N, C]
        if HAS_ZEROS:  # noqa: SIM108 - a compile-time branch
            zf = _load(z_ptrs + group[None, :], tile_ok, 0, EVEN).to(tl.float32) * 0.0625  # z/16
        else:
            zf = s
    else:
        BLOCK_W: tl.constexpr = p_ptrs.shape[1]
        ws = tl.arange(0, BLOCK_W)
        w_ok = col_ok[:, None] & ((((w0 + ws) // 4) * 4) < w_end)[None, :]  # whole chunks: 16-byte masks
        words = _load(p_ptrs + w0, w_ok, 0, EVEN)  # [BLOCK_N, BLOCK_W] int32
        group = tl.minimum(group, ((w_end - 4) * 8) // GROUP)
        s = _gather(s_ptrs + group[None, :], USE_ASM).to(tl.float32)
        if HAS_ZEROS:  # noqa: SIM108 - a compile-time branch
            zf = _gather(z_ptrs + group[None, :], USE_ASM).to(tl.float32) * 0.0625
        else:
            zf = s
    return words, s, zf


@triton.jit
def _step_math(acc0, acc1, acc2, acc3, words, s, zf, w0, cs, w_end, x_ptr, stride_xm, HAS_ZEROS: tl.constexpr,
               ROWS: tl.constexpr, X_KIND: tl.constexpr, USE_ASM: tl.constexpr, EVEN: tl.constexpr):
    """One step's sums into each row's accumulator, from `_step_loads`' tiles and the activations of the step."""
    U: tl.constexpr = 4 if X_KIND == 2 else 2  # 8-byte units of one word's 8 activations
    chunk = w0 + 4 * cs
    chunk_ok = chunk < w_end
    # the chunk's 4 words apart (in-thread: the 4 are one thread's registers)
    BLOCK_N: tl.constexpr = s.shape[0]
    C: tl.constexpr = s.shape[1]  # `words` is [BLOCK_N, C, 4] or [BLOCK_N, 4 C]: the same order
    wa, wb = tl.split(tl.reshape(words, [BLOCK_N, C, 2, 2]))  # words 0/2 and 1/3
    wd0, wd2 = tl.split(wa)
    wd1, wd3 = tl.split(wb)
    x8 = x_ptr + chunk * U  # the chunk's activations: its 4 words' U 8-byte units each
    acc0 = _row_step(acc0, wd0, wd1, wd2, wd3, s, zf, x8, chunk_ok, HAS_ZEROS, X_KIND, USE_ASM, EVEN)
    if ROWS > 1:
        acc1 = _row_step(acc1, wd0, wd1, wd2, wd3, s, zf, x8 + stride_xm, chunk_ok, HAS_ZEROS, X_KIND, USE_ASM, EVEN)
    if ROWS > 2:
        acc2 = _row_step(acc2, wd0, wd1, wd2, wd3, s, zf, x8 + 2 * stride_xm, chunk_ok, HAS_ZEROS, X_KIND, USE_ASM,
                         EVEN)  # fmt: skip
    if ROWS > 3:
        acc3 = _row_step(acc3, wd0, wd1, wd2, wd3, s, zf, x8 + 3 * stride_xm, chunk_ok, HAS_ZEROS, X_KIND, USE_ASM,
                         EVEN)  # fmt: skip
    return acc0, acc1, acc2, acc3


@triton.jit
def _mma_half(packed_ptr, scales_ptr, zeros_ptr, cols, N, stride_pn, stride_sn, stride_zn, BLOCK_W: tl.constexpr):
    """One row set's word, scale and zero-point pointers as `tile_sums`' layout 1 builds them."""
    p_ptrs = packed_ptr + cols.to(tl.int64)[:, None] * stride_pn + tl.arange(0, BLOCK_W)[None, :]
    cols_in = tl.minimum(cols, N - 1).to(tl.int64)
    return p_ptrs, scales_ptr + cols_in[:, None] * stride_sn, zeros_ptr + cols_in[:, None] * stride_zn


@triton.jit
def _mma_sums(x_ptr, packed_ptr, scales_ptr, zeros_ptr, cols, col_ok, N, stride_pn, stride_sn, stride_zn, w_start,
              w_end, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
              NUM_STAGES: tl.constexpr, USE_ASM: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr,
              PDL_GDC: tl.constexpr, TRIGGER_LATE: tl.constexpr):  # fmt: skip
    """`tile_sums` at one bf16 row on the tensor cores (`triton_int4_mma.py`): rows `cols[:BLOCK_N / 2]` and
    `cols[BLOCK_N / 2:]` are each thread's two MMA rows; the same loads (layout 1), PDL peel and trigger. Returns the
    one accumulator `[BLOCK_N, C]` whose sum over C, times 16, is each row's dot (as the FMA loop's)."""
    H: tl.constexpr = BLOCK_N // 2
    C: tl.constexpr = BLOCK_W // 4
    cs = tl.arange(0, C)
    cols_a, cols_b = halves(cols)
    ok_a, ok_b = halves(col_ok.to(tl.int32))
    pa, sa, za = _mma_half(packed_ptr, scales_ptr, zeros_ptr, cols_a, N, stride_pn, stride_sn, stride_zn, BLOCK_W)
    pb, sb, zb = _mma_half(packed_ptr, scales_ptr, zeros_ptr, cols_b, N, stride_pn, stride_sn, stride_zn, BLOCK_W)
    f0 = tl.zeros([H, C], tl.float32)
    f1 = tl.zeros([H, C], tl.float32)
    f2 = tl.zeros([H, C], tl.float32)
    f3 = tl.zeros([H, C], tl.float32)
    if PDL:  # as `tile_sums`: the first step's weights in flight before the wait
        wa, s_a, zf_a = _step_loads(pa, sa, za, w_start, cs, ok_a != 0, w_end, GROUP, HAS_ZEROS, EVEN, 1, USE_ASM)
        wb, s_b, zf_b = _step_loads(pb, sb, zb, w_start, cs, ok_b != 0, w_end, GROUP, HAS_ZEROS, EVEN, 1, USE_ASM)
        if PDL_GDC:
            if TRIGGER_LATE == 0:
                tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        chunk = w_start + 4 * cs
        f0, f1, f2, f3 = mma_step(f0, f1, f2, f3, wa, wb, s_a, s_b, zf_a, zf_b, x_ptr, chunk, chunk < w_end,
                                  HAS_ZEROS, USE_ASM, EVEN)  # fmt: skip
        w_loop = w_start + BLOCK_W
    else:
        w_loop = w_start
    for w0 in tl.range(w_loop, w_end, BLOCK_W, num_stages=NUM_STAGES):
        w0 = tl.multiple_of(w0, 4)
        wa, s_a, zf_a = _step_loads(pa, sa, za, w0, cs, ok_a != 0, w_end, GROUP, HAS_ZEROS, EVEN, 1, USE_ASM)
        wb, s_b, zf_b = _step_loads(pb, sb, zb, w0, cs, ok_b != 0, w_end, GROUP, HAS_ZEROS, EVEN, 1, USE_ASM)
        chunk = w0 + 4 * cs
        f0, f1, f2, f3 = mma_step(f0, f1, f2, f3, wa, wb, s_a, s_b, zf_a, zf_b, x_ptr, chunk, chunk < w_end,
                                  HAS_ZEROS, USE_ASM, EVEN)  # fmt: skip
    if PDL and PDL_GDC and TRIGGER_LATE == 1:
        tl.extra.cuda.gdc_launch_dependents()
    ra, rb = mma_rows(f0, f1, f2, f3, USE_ASM)
    total = tl.reshape(tl.permute(tl.join(ra, rb), (1, 0)), [BLOCK_N])  # rows in `cols`' order
    return tl.where(cs[None, :] == 0, total[:, None] * 0.0625, 0.0)


@triton.jit
def tile_sums(x_ptr, packed_ptr, scales_ptr, zeros_ptr, cols, col_ok, N, stride_xm, stride_pn, stride_sn, stride_zn,
              w_start, w_end, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_W: tl.constexpr, NUM_STAGES: tl.constexpr, X_KIND: tl.constexpr, USE_ASM: tl.constexpr,
              EVEN: tl.constexpr, PDL: tl.constexpr, PDL_GDC: tl.constexpr, TRIGGER_LATE: tl.constexpr,
              LAYOUT: tl.constexpr, MMA: tl.constexpr = False):  # fmt: skip
    """A program's K loop over words `w_start..w_end` of weight rows `cols` (`[BLOCK_N]`, `col_ok` those < N; any
    rows: `_int4_gemv_wide_kernel`'s consecutive tile, or the fused forms' gate/up or rotation-pair rows): each
    activation row's `[BLOCK_N, C]` accumulator (`acc0..acc3`; 1/16 of the dot per chunk lane). The PDL peel and
    trigger happen inside (`_int4_gemv_wide_kernel`'s comments). `MMA` (one bf16 row, layout 1, `mma_takes`): the
    tensor-core step (`_mma_sums`)."""
    if MMA:
        acc0 = _mma_sums(x_ptr, packed_ptr, scales_ptr, zeros_ptr, cols, col_ok, N, stride_pn, stride_sn, stride_zn,
                         w_start, w_end, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_W, NUM_STAGES, USE_ASM, EVEN, PDL, PDL_GDC,
                         TRIGGER_LATE)  # fmt: skip
        acc1 = acc0
        acc2 = acc0
        acc3 = acc0
    else:
        acc0, acc1, acc2, acc3 = _fma_sums(x_ptr, packed_ptr, scales_ptr, zeros_ptr, cols, col_ok, N, stride_xm,
                                           stride_pn, stride_sn, stride_zn, w_start, w_end, GROUP, HAS_ZEROS, ROWS,
                                           BLOCK_N, BLOCK_W, NUM_STAGES, X_KIND, USE_ASM, EVEN, PDL, PDL_GDC,
                                           TRIGGER_LATE, LAYOUT)  # fmt: skip
    return acc0, acc1, acc2, acc3


@triton.jit
def _fma_sums(x_ptr, packed_ptr, scales_ptr, zeros_ptr, cols, col_ok, N, stride_xm, stride_pn, stride_sn, stride_zn,
              w_start, w_end, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_W: tl.constexpr, NUM_STAGES: tl.constexpr, X_KIND: tl.constexpr, USE_ASM: tl.constexpr,
              EVEN: tl.constexpr, PDL: tl.constexpr, PDL_GDC: tl.constexpr, TRIGGER_LATE: tl.constexpr,
              LAYOUT: tl.constexpr):  # fmt: skip
    """`tile_sums` on the FMA units (any rows, either layout)."""
    C: tl.constexpr = BLOCK_W // 4  # 16-byte chunks of a row per step
    cs = tl.arange(0, C)
    cols64 = cols.to(tl.int64)
    if LAYOUT == 0:
        words4 = 4 * cs[:, None] + tl.arange(0, 4)[None, :]  # [C, 4]
        p_ptrs = packed_ptr + cols64[:, None, None] * stride_pn + words4[None, :, :]
        s_ptrs = scales_ptr + cols64[:, None] * stride_sn
        z_ptrs = zeros_ptr + cols64[:, None] * stride_zn
    else:
        p_ptrs = packed_ptr + cols64[:, None] * stride_pn + tl.arange(0, BLOCK_W)[None, :]
        cols_in = tl.minimum(cols, N - 1).to(tl.int64)  # rows past N read row N - 1's scales (unused): no masks
        s_ptrs = scales_ptr + cols_in[:, None] * stride_sn
        z_ptrs = zeros_ptr + cols_in[:, None] * stride_zn
    acc0 = tl.zeros([BLOCK_N, C], tl.float32)
    acc1 = tl.zeros([BLOCK_N, C], tl.float32)
    acc2 = tl.zeros([BLOCK_N, C], tl.float32)
    acc3 = tl.zeros([BLOCK_N, C], tl.float32)
    if PDL:
        # Launched by programmatic dependent launch (`kernels/pdl.py`, FLOTILLA_INT4_WIDE_PDL): the first step is
        # peeled so that its words and scales (weights: no kernel of the step writes them) are in flight before
        # the wait, while the kernel ahead (whose output is `x`) still runs. Same step function as the loop, same
        # order: bit-equal to the plain launch. Every store and every activation read comes after the wait.
        words, s, zf = _step_loads(p_ptrs, s_ptrs, z_ptrs, w_start, cs, col_ok, w_end, GROUP, HAS_ZEROS, EVEN, LAYOUT,
                                   USE_ASM)  # fmt: skip
        if PDL_GDC:  # False only in the interpreter's test of the peeled step (no griddepcontrol there)
            if TRIGGER_LATE == 0:
                tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        acc0, acc1, acc2, acc3 = _step_math(acc0, acc1, acc2, acc3, words, s, zf, w_start, cs, w_end, x_ptr,
                                            stride_xm, HAS_ZEROS, ROWS, X_KIND, USE_ASM, EVEN)  # fmt: skip
        w_loop = w_start + BLOCK_W
    else:
        w_loop = w_start
    for w0 in tl.range(w_loop, w_end, BLOCK_W, num_stages=NUM_STAGES):
        w0 = tl.multiple_of(w0, 4)
        words, s, zf = _step_loads(p_ptrs, s_ptrs, z_ptrs, w0, cs, col_ok, w_end, GROUP, HAS_ZEROS, EVEN, LAYOUT,
                                   USE_ASM)  # fmt: skip
        acc0, acc1, acc2, acc3 = _step_math(acc0, acc1, acc2, acc3, words, s, zf, w0, cs, w_end, x_ptr, stride_xm,
                                            HAS_ZEROS, ROWS, X_KIND, USE_ASM, EVEN)  # fmt: skip
    if PDL and PDL_GDC and TRIGGER_LATE == 1:
        # the kernel behind may start once every program is past its loop: its programs then take the SMs this
        # launch's programs leave, not the ones its later programs need
        tl.extra.cuda.gdc_launch_dependents()
    return acc0, acc1, acc2, acc3


@triton.jit
def _int4_gemv_wide_kernel(
    x_ptr,
    packed_ptr,
    scales_ptr,
    zeros_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    counter_ptr,
    M,
    N,
    KW,
    stride_xm,
    stride_pn,
    stride_sn,
    stride_zn,
    stride_om,
    words_per_split,
    GROUP: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    FIXUP: tl.constexpr,
    ROWS: tl.constexpr,  # M itself (1..4): each row has its own accumulator
    BLOCK_M: tl.constexpr,  # ROWS rounded up to a power of two (the epilogue's tile)
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    X_KIND: tl.constexpr,  # activations: 0 bf16, 1 fp16, 2 fp32 (read as int64 units: `x_ptr`, `stride_xm`)
    USE_ASM: tl.constexpr,
    EVEN: tl.constexpr = False,  # whole row tiles, whole word steps in every range
    PDL: tl.constexpr = False,  # launched by PDL: the first step's weights loaded before the wait
    PDL_GDC: tl.constexpr = True,  # the griddepcontrol instructions (False: the interpreter's test of the peel)
    TRIGGER_LATE: tl.constexpr = 0,  # with PDL: let the dependents start at the top (0) or after the loop (1)
    LAYOUT: tl.constexpr = 0,  # the word tile and scale loads (`_step_loads`): 0 main's, 1 [rows, words] + PTX scales
    MMA: tl.constexpr = False,  # the tensor-core step (`triton_int4_mma.py`, FLOTILLA_INT4_WIDE_MMA)
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_start = split * words_per_split
    w_end = tl.minimum(w_start + words_per_split, KW)
    acc0, acc1, acc2, acc3 = tile_sums(x_ptr, packed_ptr, scales_ptr, zeros_ptr, cols, col_ok, N, stride_xm,
                                       stride_pn, stride_sn, stride_zn, w_start, w_end, GROUP, HAS_ZEROS, ROWS,
                                       BLOCK_N, BLOCK_W, NUM_STAGES, X_KIND, USE_ASM, EVEN, PDL, PDL_GDC,
                                       TRIGGER_LATE, LAYOUT, MMA)  # fmt: skip
    res = tl.where(rows[:, None] == 0, tl.sum(acc0, 1)[None, :], 0.0)
    if ROWS > 1:
        res = tl.where(rows[:, None] == 1, tl.sum(acc1, 1)[None, :], res)
    if ROWS > 2:
        res = tl.where(rows[:, None] == 2, tl.sum(acc2, 1)[None, :], res)
    if ROWS > 3:
        res = tl.where(rows[:, None] == 3, tl.sum(acc3, 1)[None, :], res)
    _epilogue(res * 16.0, rows, cols, rows < M, col_ok, bias_ptr, out_ptr, part_ptr, counter_ptr, M, N, stride_om,
              pid_n, split, HAS_BIAS, SPLIT_K, FIXUP)  # partials [SPLIT_K, M, N]


def int4_gemv_wide(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
    bias: torch.Tensor | None = None,
    *,
    block_n: int | None = None,
    block_w: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    use_asm: bool | None = None,
    pdl: str | None = None,
    pdl_gdc: bool = True,
    layout: int | None = None,
    mma: bool | None = None,
) -> torch.Tensor:
    """`x` `[..., K]` (1..MAX_ROWS rows) times the int4 weight `[N, K]` (transposed), plus `bias`, in `x`'s
    dtype; fp32 accumulation. `zeros` None: symmetric (zero point 8). Knobs default to `wide_config` (shapes
    only: CUDA-graph capturable); `use_asm` (default: compiled, not interpreted) picks the PTX nibble path.
    `pdl`: "top" or "late" (when the dependents may start) launches by programmatic dependent launch with the
    first step's weights loaded before the wait, "" plainly; default: `WIDE_PDL` where `pdl_active(x)`.
    `pdl_gdc=False` (tests only) keeps the peeled first step without the griddepcontrol instructions, so that the
    interpreter can run it. `layout` 1: the [rows, words] word tile and PTX scale loads (`_step_loads`; knob
    `layout=1` of the tile tables); default the table's (0, main's). `mma`: the tensor-core step where it takes the
    launch (`triton_int4_mma.mma_takes`); default `WIDE_MMA` (FLOTILLA_INT4_WIDE_MMA)."""
    k = x.shape[-1]
    n = packed.shape[0]
    assert packed.shape[1] * 8 == k, f"packed {tuple(packed.shape)} does not match x's K = {k}"
    assert scales.shape == (n, k // group_size)
    assert packed.stride(-1) == 1 and scales.stride(-1) == 1 and (zeros is None or zeros.stride(-1) == 1)
    assert bias is None or (bias.shape == (n,) and bias.is_contiguous())
    assert x.dtype in _X_KINDS, f"int4_gemv_wide: activations {x.dtype}"
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1 or x2.stride(0) % (8 // x2.element_size()) or x2.data_ptr() % 8:
        x2 = x2.clone(memory_format=torch.contiguous_format)  # read as 8-byte units: every row 8-byte aligned
    m = x2.shape[0]
    assert wide_supported(m, k, group_size), f"int4_gemv_wide: {m} rows, K {k}, group {group_size}"
    x8 = x2.view(torch.int64)
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    pdl = pdl_mode(x, pdl)
    cfg = wide_config(m, n, k, device_sms(x), block_n=block_n, block_w=block_w, split_k=split_k,
                      num_warps=num_warps, num_stages=num_stages, pdl=bool(pdl), layout=layout,
                      card=device_card(x))  # fmt: skip
    assert cfg.block_w % 4 == 0, cfg
    words = k // 8
    out2 = out.view(-1, n)
    split = _SplitK.plan(out2, bias, words, cfg.block_n, cfg.block_w, cfg.split_k)
    _int4_gemv_wide_kernel[split.grid](
        *split.kernel_args(x8, packed, scales, zeros, out2, words),
        SPLIT_K=split.grid[1], FIXUP=split.counters is not None, ROWS=m, BLOCK_M=triton.next_power_of_2(m),
        **launch_constexprs(cfg, x, n, split.words_per_split, zeros, bias, group_size, pdl, pdl_gdc, use_asm,
                            mma),
    )  # fmt: skip
    split.reduce(out2, bias is not None)
    return out


def pdl_mode(x: torch.Tensor, pdl: str | None) -> str:
    """A call's PDL launch, "" (plain), "top" or "late" (`int4_gemv_wide`'s `pdl`): as given, or by default `WIDE_PDL`
    where `pdl_active(x)` (the module global, read at every call: the benchmarks flip it)."""
    if pdl is None:
        pdl = WIDE_PDL if WIDE_PDL and pdl_active(x) else ""
    assert pdl in ("", "top", "late"), pdl
    return pdl


def launch_constexprs(cfg: WideConfig, x: torch.Tensor, n: int, words_per_split: int, zeros: torch.Tensor | None,
                      bias: torch.Tensor | None, group_size: int, pdl: str, pdl_gdc: bool,
                      use_asm: bool | None, mma: bool | None = None) -> dict[str, Any]:  # fmt: skip
    """The compile-time arguments and launch options every kernel on `tile_sums` takes (this module's and
    `triton_int4_gemv_fused`'s), for `n` weight rows of `x`'s K in ranges of `words_per_split` words: the tile, the
    operands' kinds, EVEN (whole row tiles and word steps in every range: unmasked loads), the PDL launch (`pdl`,
    from `pdl_mode`; `pdl_gdc` False: without the griddepcontrol instructions), the layout, and the tensor-core step
    where `mma` (default: `WIDE_MMA`, read at every call) is on and `mma_takes` the launch."""
    words = x.shape[-1] // 8
    mma = WIDE_MMA if mma is None else mma
    even = n % cfg.block_n == 0 and words % cfg.block_w == 0 and words_per_split % cfg.block_w == 0
    options: dict[str, Any] = dict(GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None,
                                   BLOCK_N=cfg.block_n, BLOCK_W=cfg.block_w, NUM_STAGES=cfg.num_stages,
                                   X_KIND=_X_KINDS[x.dtype], USE_ASM=(not INTERPRETING) if use_asm is None else use_asm,
                                   EVEN=even, num_warps=cfg.num_warps, num_stages=cfg.num_stages)  # fmt: skip
    if cfg.layout:
        options["LAYOUT"] = cfg.layout
    if mma and mma_takes(x.numel() // x.shape[-1], options["X_KIND"], group_size, cfg.block_n, cfg.block_w, cfg.layout):
        options["MMA"] = True
    return options | _pdl_options(pdl, pdl_gdc)


def _pdl_options(pdl: str, gdc: bool) -> dict[str, bool | int]:
    """The kernel's PDL constexprs and launch option for `pdl` ("", "top", "late"); none for a plain launch."""
    if not pdl:
        return {}
    return peeled_pdl_options(gdc) | {"TRIGGER_LATE": int(pdl == "late")}


__all__ = ["MAX_ROWS", "WIDE_MMA", "WIDE_PDL", "TileTable", "WideConfig", "int4_gemv_wide", "launch_constexprs",
           "pdl_mode", "restore_wide_tiles", "set_wide_tiles", "wide_config", "wide_supported"]
