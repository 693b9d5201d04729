"""W4A16 GEMV for decode at one or a few rows: `out = x @ dequant(W)^T (+ bias)`, W never materialised.

Same contract as `packed_int_linear_ref` at 4 bits (layout in `packed_int_linear.py`): `packed` int32
`[N, K/8]`, input `8j + i` of a row in bits `4i..4i+3` of word `j`; `scales` `[N, K/group]`; `zeros`
uint8 `[N, K/group]` (None: symmetric, every zero point the middle code 8). At M = 1..16 the product is
a pure weight stream (0.5 byte a weight plus a scale per group), so what matters is that the
arithmetic per weight stays below what the SMs issue while the bytes stream: at the H200's ~4.2 TB/s
a step reads ~8.5 int4 weights per ns, and an SM partition issues one warp instruction per clock.
`triton_int4_gemm.py` dequantizes each weight to the activation dtype (an int->float conversion at a
quarter of the FMA rate or less, a scale and a zero load per element); here each weight costs a shift,
a mask and one FMA per row:

- A nibble `c` is turned into the float `1 + c/16` by placing it in the mantissa of 1.0
  (`0x3F800000 | c << 19`, bitcast): no int->float conversion, exact.
- Scale and zero point factor out of a word's eight products: with `v = 1 + c/16` and
  `v_z = 1 + z/16`, `sum_i x_i (c_i - z) s = 16 s (sum_i x_i v_i - v_z sum_i x_i)`; so per word and row
  one FMA folds the word's partial sum into the accumulator, and `sum_i x_i` is shared by all rows.
- Each program owns BLOCK_N weight rows and walks K in steps of BLOCK_W words (8 inputs each); a step
  loads the `[BLOCK_N, BLOCK_W]` word tile (rows contiguous along K, coalesced) and, for each nibble
  position i, the activations at `8w + i` (L1/L2 hits, shared by the program's rows). The fp32
  accumulator `[BLOCK_M, BLOCK_N, BLOCK_W]` is summed over the word axis once after the loop, so the
  loop has no cross-thread reduction. The words are loaded in a scrambled order within the step: with
  vectorised word loads the compiler gave the words and the (stride-8) activation loads different
  layouts and moved every unpacked nibble plane through shared memory.

That FMA path costs ~4.5 instructions a weight at one row (sm_90 code, addresses and loads included)
and one FMA more per weight and added row. The tensor-core path (`_int4_gemv_dot_kernel`, default from
3 rows) turns two nibbles of a word into two bf16 `1 + c/16` with one mask, puts a group's values in
K order with `tl.join`, and multiplies on the tensor cores with the batch padded to 16 (as the fp8
GEMV's `tl.dot` path); scale and zero point fold per group as above, with `sum x` over the group. It
costs ~3.2-4.3 instructions a weight at any row count up to 16, but needs 64- or 128-row tiles, so the
small projections split K.

Split-K as `triton_gemv.py` (a second grid axis cuts the words into ranges when the row tiles alone are
too few for the SMs; fp32 partials `[split, M, N]`, summed in a fixed order: bit-reproducible), but
without its reduce launch: the last program of each row tile to finish (an arrival counter, atomic
with acquire/release at GPU scope) sums the partials and stores the output (`_epilogue`).

Every choice comes from the shapes alone (no host sync), so a call can be captured in a CUDA graph.
`default_config` is a lead; `bench/int4_gemv.py --grid` times tiles on the GPU.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

from flotilla.kernels.launch_knobs import KnobSyntax, Table
from flotilla.kernels.split_k_counters import arrival_counters
from flotilla.kernels.triton_gemv import _split_k_reduce_kernel
from flotilla.kernels.triton_utils import device_sms, dot_dtype, dot_precision

_REDUCE_BLOCK = 1024


# The int4 GEMVs' tile syntax (`launch_knobs.py`; FLOTILLA_INT4_GEMV_TILES, FLOTILLA_INT4_GEMV_WIDE_CONFIG,
# FLOTILLA_INT4_WIDE_PDL_CONFIG): `;`-separated knob lists, each for every shape or, prefixed `NxK:`, for the `[N, K]`
# weights only, the knobs named by their keywords, e.g. "use_dot=0,block_n=32,block_w=64;4096x4096:use_dot=1,
# block_n=64". `layout` is the wide kernel's alone; `split_k` this kernel takes from its arguments only.
KNOBS = KnobSyntax("FLOTILLA_INT4_GEMV_TILES",
                   {k: k for k in ("block_n", "block_w", "split_k", "num_warps", "num_stages", "use_dot", "layout")},
                   shapeless=True)  # fmt: skip


def _parse_tiles(spec: str, variable: str = KNOBS.variable) -> Table:
    """An int4 tile string (`KNOBS`) as a table; a ValueError naming `variable` for anything else."""
    return dataclasses.replace(KNOBS, variable=variable).table(spec)


# Tiles for one-row calls from the environment (`_parse_tiles`): bench/results/int4g-gpu.sh times a grid
# (bench/int4_gemv.py --grid) and runs the engine with the winners in the same device call. Read once at
# import; unset: `default_config`'s choice.
_ONE_ROW_TILES = _parse_tiles(os.environ.get("FLOTILLA_INT4_GEMV_TILES", ""))
# Split-K arrival counters, one int32 per row tile, zero between launches (the last program of a tile
# resets its own), per device. Launches on one stream run one after the other, so they share them; the
# engine runs its forward on one stream per device. Allocated by the first split call (the warm-up
# before graph capture), never inside a capture: a capture without them uses the reduce launch.
_COUNTERS: dict[torch.device, torch.Tensor] = {}
_COUNTER_SLOTS = 1 << 16
# fp32 accumulator elements (`acc` and the step's partial sums) a thread may hold before it spills.
_ACC_PER_THREAD = 64


@dataclasses.dataclass(frozen=True, slots=True)
class Int4GemvConfig:
    """Tile and launch knobs of one int4 GEMV launch."""

    block_n: int  # weight rows (output features) per program
    block_w: int  # packed int32 words (8 inputs each) per loop step (tl.dot: one group's)
    split_k: int  # K ranges (second grid axis); 1 = no partials, no reduce kernel
    num_warps: int
    num_stages: int  # software-pipeline depth of the K loop
    use_dot: bool  # tensor cores (rows padded to 16) instead of FMA


def dot_supported(m: int, group_size: int) -> bool:
    """True when the `tl.dot` path can run: at most 16 rows, a power-of-two group of 16..256 inputs."""
    return m <= 16 and 16 <= group_size <= 256 and group_size & (group_size - 1) == 0


def default_config(
    m: int,
    n: int,
    k: int,
    num_sms: int,
    group_size: int = 128,
    *,
    block_n: int | None = None,
    block_w: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    use_dot: bool | None = None,
) -> Int4GemvConfig:
    """The launch configuration for an `[m, k] x [n, k]^T` int4 GEMV; given knobs are kept, the rest chosen.

    - `tl.dot` wherever it can run (at most 16 rows, a power-of-two group of 16..256), FMA otherwise.
      Measured on the H200 at one row (Llama-3.1-8B, bench/int4_gemv.py --grid in session 6 and branch
      qgemv7's `old_dot_best`, bench/results/gpu-2026-12-04-s7/call4/qgemv7.stdout): the dot path with
      128-row tiles and 3 stages takes 16.5 / 10.7 / 52.3 / 27.3 us on qkv / o / gate_up / down (~0.8-1.2
      TB/s of int4 bytes), the FMA path 43.4 / 17.9 / 139.7 / 56.8 us (its activation loads are 2-byte
      gathers, one L1 request per weight: the L1 is its limit); the dot path costs the same at any row count
      up to 16 (padded).
    - FMA tiles: 64 words (512 inputs, 256 bytes of a row) a step, 32 rows a program (8 KB a step; the
      compiled loop: 4.5 instructions a weight, against 4.9 at 16 rows and 4.8 at 64 rows x 8 warps),
      fewer rows while there are fewer programs than SMs, the accumulator within `_ACC_PER_THREAD`
      registers at more rows. Llama-3.1-8B: 32 rows for qkv and gate_up, 16 for o and down.
    - Dot tiles: 128 rows, one group a step, 4 warps, 3 stages (the measured best; 64 rows x 2 stages,
      the previous default from 3 rows, took 25.8 us on qkv at 4 rows).
    - Split-K (partials and a reduce launch, as `triton_gemv.py`): powers of two while programs are still
      fewer than the SMs and each range keeps at least 4 steps. Llama-3.1-8B on 132 SMs: FMA no split
      anywhere; dot qkv 2, o and down 4.
    """
    given = _ONE_ROW_TILES.get((n, k), _ONE_ROW_TILES.get(None)) if m == 1 else None
    if given:
        block_n = block_n or given.get("block_n")
        block_w = block_w or given.get("block_w")
        num_warps = num_warps or given.get("num_warps")
        num_stages = num_stages or given.get("num_stages")
        use_dot = bool(given["use_dot"]) if use_dot is None and "use_dot" in given else use_dot
    can_dot = dot_supported(m, group_size)
    use_dot = can_dot if use_dot is None else (use_dot and can_dot)
    block_m = triton.next_power_of_2(max(m, 1))
    words = k // 8
    num_warps = num_warps or 4
    if use_dot:  # measured best at one row on the H200 (sessions 6 and 7): 128 rows, 3 stages
        num_stages = num_stages or 3
        block_w = group_size // 8
        block_n = block_n or 128
    else:
        num_stages = num_stages or 1
        block_w = block_w or min(64, max(16, triton.next_power_of_2(words)))
    if block_n is None:
        budget = _ACC_PER_THREAD * 32 * num_warps // 2  # acc and the step's partial sums
        block_n = max(4, min(32, budget // (block_m * block_w)))
        block_n = min(block_n, max(4, triton.next_power_of_2(n)))
        while triton.cdiv(n, block_n) < num_sms and block_n > 4:
            block_n //= 2
    if split_k is None:
        tiles = triton.cdiv(n, block_n)
        split_k = 1
        while tiles * split_k < num_sms and words >= 2 * split_k * 4 * block_w and split_k < 16:
            split_k *= 2
    return Int4GemvConfig(block_n, block_w, split_k, num_warps, num_stages, use_dot)


def split_ranges(words: int, split_k: int, block_w: int) -> tuple[int, int]:
    """K cut into at most `split_k` ranges of whole `block_w`-word steps (only the last range ragged, no empty range):
    `(words a range, ranges)`. The int4 GEMVs' second grid axis (`_SplitK`, `triton_int4_gemv_fused`)."""
    words_per_split = triton.cdiv(triton.cdiv(words, split_k), block_w) * block_w
    return words_per_split, triton.cdiv(words, words_per_split)


def _counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The device's split-K arrival counters (`_COUNTERS`), or None where the call must use the reduce
    launch: too many row tiles, or the first use inside a CUDA-graph capture."""
    return arrival_counters(_COUNTERS, device, tiles, _COUNTER_SLOTS)


@dataclasses.dataclass(frozen=True, slots=True)
class _SplitK:
    """An int4 GEMV launch's split of K into word ranges (the grid's second axis) and the buffers they write;
    shared by this module's kernels and `triton_int4_gemv_wide`'s, which take the same leading arguments."""

    grid: tuple[int, int]  # (row tiles, K ranges)
    words_per_split: int
    part: torch.Tensor  # fp32 partials [splits, M, N]; the output itself with one range
    bias: torch.Tensor  # the bias, or a stand-in pointer (the output) without one
    counters: torch.Tensor | None  # arrival counters (the kernels' FIXUP); None: one range, or `reduce` sums

    @classmethod
    def plan(cls, out2: torch.Tensor, bias: torch.Tensor | None, words: int, block_n: int, block_w: int,
             split_k: int) -> _SplitK:
        """Ranges for the `[M, N]` output `out2` over `words` packed words, `split_k` at most."""
        m, n = out2.shape
        words_per_split, splits = split_ranges(words, split_k, block_w)
        part = torch.empty(splits, m, n, dtype=torch.float32, device=out2.device) if splits > 1 else out2
        grid = (triton.cdiv(n, block_n), splits)
        counters = _counters(out2.device, grid[0]) if splits > 1 else None
        return cls(grid, words_per_split, part, bias if bias is not None else out2, counters)

    def kernel_args(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                    out2: torch.Tensor, words: int) -> tuple:
        """The kernels' leading arguments, `x_ptr` to `words_per_split` (`x`: the activations' 2-D view)."""
        m, n = out2.shape
        return (x, packed, scales, zeros if zeros is not None else packed, self.bias, out2, self.part,
                self.counters if self.counters is not None else self.part, m, n, words, x.stride(0), packed.stride(0),
                scales.stride(0), zeros.stride(0) if zeros is not None else 0, out2.stride(0), self.words_per_split)

    def reduce(self, out2: torch.Tensor, has_bias: bool) -> None:
        """After the kernel: sum the partials into `out2` (plus the bias) where no arrival counters did."""
        splits = self.grid[1]
        if splits > 1 and self.counters is None:
            m, n = out2.shape
            block = min(_REDUCE_BLOCK, triton.next_power_of_2(n))
            _split_k_reduce_kernel[(m, triton.cdiv(n, block))](
                self.part, self.bias, out2, m, n, out2.stride(0), HAS_BIAS=has_bias, SPLIT_K=splits, BLOCK=block
            )


@triton.jit
def _load(ptrs, mask, other, EVEN: tl.constexpr):
    """`tl.load`, unmasked when the launch's shapes are whole tiles (a masked load costs a predicate and a
    register zeroed for `other`: ~10 % of the FMA loop's instructions at one row)."""
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=mask, other=other)


@triton.jit
def _partials(part_ptr, split, rows, cols, M, N):
    """Where K range `split` keeps its fp32 partial of outputs `cols`: `[SPLIT_K, M, N]` partials at `rows` (a
    `[BLOCK_M, BLOCK_N]` tile), or `[SPLIT_K, N]` where `rows` is None (a one-row program's `[BLOCK_N]`)."""
    if rows is None:
        ptrs = part_ptr + split * N + cols
    else:
        ptrs = part_ptr + (split * M + rows).to(tl.int64)[:, None] * N + cols[None, :]
    return ptrs


@triton.jit
def _split_k_fixup(res, ok, part_ptr, counter_ptr, tile, split, rows, cols, M, N, SPLIT_K: tl.constexpr):
    """Split-K without a reduce launch, for a program's fp32 sums `res` over K range `split`: its partial stored
    (`_partials`, masked by `ok`), then its arrival counted by the program's counter `counter_ptr + tile` (atomic,
    acquire/release at GPU scope). The last of the SPLIT_K ranges to arrive sums every range's partial in range order
    (a fixed order: the same sum every run, read from L2). Returns `(total, last)`: the sum over all ranges where
    `last`, else `res`. Where `last` the caller resets the counter to 0 for the next launch on the stream, after its
    own stores (there, not here: the compiled code stays what was measured)."""
    tl.store(_partials(part_ptr, split, rows, cols, M, N), res, mask=ok)
    tl.debug_barrier()  # every thread's partial is written before the counter's release
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLIT_K - 1
    total = res
    if last:
        total = tl.zeros_like(res)
        for s in tl.static_range(SPLIT_K):  # a fixed order: the sum is the same every run
            total += tl.load(_partials(part_ptr, s, rows, cols, M, N), mask=ok, other=0.0,
                             cache_modifier=".cg")  # from L2: other SMs wrote them
    return total, last


@triton.jit
def _epilogue(res, rows, cols, row_ok, col_ok, bias_ptr, out_ptr, part_ptr, counter_ptr, M, N, stride_om, pid_n,
              split, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, FIXUP: tl.constexpr):
    """Store a program's `[BLOCK_M, BLOCK_N]` fp32 result: the output (plus bias) without split-K; else its
    partial (`[SPLIT_K, M, N]`), and with FIXUP the last of a row tile's K ranges to arrive (`_split_k_fixup`, a
    counter per row tile) adds the bias to the sum of the partials and stores the output: no reduce launch.
    Without FIXUP `_split_k_reduce_kernel` runs after."""
    ok = row_ok[:, None] & col_ok[None, :]
    o_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            res += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(o_ptrs, res.to(out_ptr.dtype.element_ty), mask=ok)
    elif FIXUP:
        total, last = _split_k_fixup(res, ok, part_ptr, counter_ptr, pid_n, split, rows, cols, M, N, SPLIT_K)
        if last:
            if HAS_BIAS:
                total += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(counter_ptr + pid_n, 0)  # ready for the next launch on this stream
    else:
        tl.store(_partials(part_ptr, split, rows, cols, M, N), res, mask=ok)


@triton.jit
def _int4_gemv_kernel(
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    EVEN: tl.constexpr = False,  # M == BLOCK_M, whole row tiles, whole word steps in every range
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # The step's words in a scrambled order (still whole 128-byte lines per warp): with no contiguity the
    # word loads take the layout of the activation loads (stride 8), so the unpacked tiles need no
    # layout conversion through shared memory (with vectorised word loads the compiler converted every
    # nibble plane: 16 barriers a step).
    ws = tl.arange(0, BLOCK_W)
    ws = (ws % 4) * (BLOCK_W // 4) + ws // 4
    row_ok = rows < M
    col_ok = cols < N
    cols64 = cols.to(tl.int64)
    w_start = split * words_per_split
    w_end = tl.minimum(w_start + words_per_split, KW)
    p_ptrs = packed_ptr + cols64[:, None] * stride_pn + ws[None, :]
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ws[None, :] * 8
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_W], tl.float32)
    for w0 in tl.range(w_start, w_end, BLOCK_W, num_stages=NUM_STAGES):
        w_ok = (w0 + ws) < w_end
        tile_ok = col_ok[:, None] & w_ok[None, :]
        words = _load(p_ptrs + w0, tile_ok, 0, EVEN)  # [BLOCK_N, BLOCK_W] int32
        group = ((w0 + ws) * 8) // GROUP
        scale = _load(scales_ptr + cols64[:, None] * stride_sn + group[None, :], tile_ok, 0.0, EVEN)
        if HAS_ZEROS:
            zero = _load(zeros_ptr + cols64[:, None] * stride_zn + group[None, :], tile_ok, 0, EVEN)
            vz = ((zero.to(tl.int32) << 19) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + z/16
        else:
            vz = tl.full([BLOCK_N, BLOCK_W], 1.5, tl.float32)  # the middle code 8
        part = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_W], tl.float32)  # sum_i x_i v_i of each word
        xsum = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)  # sum_i x_i of each word's inputs
        for i in tl.static_range(8):
            # fp32 right after the load: the interpreter's bf16 arithmetic is wrong, the GPU's is lossy
            xi = _load(x_ptrs + w0 * 8 + i, row_ok[:, None] & w_ok[None, :], 0.0, EVEN).to(tl.float32)
            if i * 4 <= 19:  # noqa: SIM108 - move nibble i to mantissa bits 19..22 (a compile-time branch)
                bits = words << (19 - i * 4)
            else:
                bits = words >> (i * 4 - 19)
            v = ((bits & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + c/16, exact
            part += xi[:, None, :] * v[None, :, :]
            xsum += xi
        acc += scale.to(tl.float32)[None, :, :] * (part - vz[None, :, :] * xsum[:, None, :])
    res = tl.sum(acc, 2) * 16.0  # [BLOCK_M, BLOCK_N]
    _epilogue(res, rows, cols, row_ok, col_ok, bias_ptr, out_ptr, part_ptr, counter_ptr, M, N, stride_om, pid_n, split,
              HAS_BIAS, SPLIT_K, FIXUP)  # partials [SPLIT_K, M, N]


@triton.jit
def _bf16_pair(words, SHIFT: tl.constexpr):
    """Nibbles i and i + 4 of each word as two bf16 `1 + c/16` (one mask for both: bits `4i..4i+3` and
    `4i+16..4i+19` moved to the mantissa bits 3..6 of each 16-bit half)."""
    if SHIFT >= 0:  # noqa: SIM108 - a compile-time branch
        p = words << SHIFT
    else:
        p = words >> (-SHIFT)
    p = (p & 0x00780078) | 0x3F803F80
    return p.to(tl.int16).to(tl.bfloat16, bitcast=True), (p >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _int4_gemv_dot_kernel(
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EVEN_N: tl.constexpr = False,  # whole row tiles: the weight loads need no mask
):
    GW: tl.constexpr = GROUP // 8
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ws = tl.arange(0, GW)
    ks = tl.arange(0, GROUP)
    row_ok = rows < M
    col_ok = cols < N
    cols64 = cols.to(tl.int64)
    w_start = split * words_per_split
    w_end = tl.minimum(w_start + words_per_split, KW)
    p_ptrs = packed_ptr + cols64[:, None] * stride_pn + ws[None, :]
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for w0 in tl.range(w_start, w_end, GW, num_stages=NUM_STAGES):  # one group a step
        words = _load(p_ptrs + w0, col_ok[:, None], 0, EVEN_N)  # [BLOCK_N, GW]
        l0, h0 = _bf16_pair(words, 3)
        l1, h1 = _bf16_pair(words, -1)
        l2, h2 = _bf16_pair(words, -5)
        l3, h3 = _bf16_pair(words, -9)
        # Input i of a word to position i: a join appends an axis after the others, so the innermost join
        # gives bit 2 of i (nibble i or i + 4), the next bit 1, the outermost bit 0: axes (bit 2, bit 1, bit 0).
        v = tl.join(tl.join(tl.join(l0, h0), tl.join(l2, h2)), tl.join(tl.join(l1, h1), tl.join(l3, h3)))
        v = tl.reshape(v, [BLOCK_N, GROUP])  # 1 + c/16 of the group's inputs in order
        x = tl.load(x_ptrs + w0 * 8, mask=row_ok[:, None], other=0.0)  # [BLOCK_M, GROUP]
        a = tl.dot(v.to(DOT_DTYPE), tl.trans(x.to(DOT_DTYPE)), input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
        xsum = tl.sum(x.to(tl.float32), axis=1)  # [BLOCK_M]
        group = w0 // GW
        scale = _load(scales_ptr + cols64 * stride_sn + group, col_ok, 0.0, EVEN_N).to(tl.float32)
        if HAS_ZEROS:
            zero = _load(zeros_ptr + cols64 * stride_zn + group, col_ok, 0, EVEN_N)
            vz = ((zero.to(tl.int32) << 19) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + z/16
        else:
            vz = tl.full([BLOCK_N], 1.5, tl.float32)
        acc += scale[:, None] * (a - vz[:, None] * xsum[None, :])
    res = tl.trans(acc) * 16.0  # [BLOCK_M, BLOCK_N]
    _epilogue(res, rows, cols, row_ok, col_ok, bias_ptr, out_ptr, part_ptr, counter_ptr, M, N, stride_om, pid_n, split,
              HAS_BIAS, SPLIT_K, FIXUP)  # partials [SPLIT_K, M, N]


def int4_gemv(
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
    use_dot: bool | None = None,
) -> torch.Tensor:
    """`x` `[..., K]` (few rows) times the int4 weight `[N, K]` (transposed), plus `bias`, in `x`'s dtype;
    fp32 accumulation. `zeros` None: a symmetric scheme (zero point 8). The knobs default to
    `default_config` (shapes only: CUDA-graph capturable); they are exposed for tests and the benchmark."""
    k = x.shape[-1]
    n = packed.shape[0]
    assert k % 8 == 0 and packed.shape[1] * 8 == k, f"packed {tuple(packed.shape)} does not match x's K = {k}"
    assert group_size % 8 == 0 and k % group_size == 0 and scales.shape == (n, k // group_size)
    assert packed.stride(-1) == 1 and scales.stride(-1) == 1 and (zeros is None or zeros.stride(-1) == 1)
    assert bias is None or (bias.shape == (n,) and bias.is_contiguous())
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    cfg = default_config(m, n, k, device_sms(x), group_size, block_n=block_n, block_w=block_w, split_k=split_k,
                         num_warps=num_warps, num_stages=num_stages, use_dot=use_dot)  # fmt: skip
    words = k // 8
    out2 = out.view(-1, n)
    split = _SplitK.plan(out2, bias, words, cfg.block_n, cfg.block_w, cfg.split_k)
    grid = split.grid
    args = split.kernel_args(x2, packed, scales, zeros, out2, words)
    common = dict(GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None, SPLIT_K=grid[1],
                  FIXUP=split.counters is not None,
                  BLOCK_N=cfg.block_n, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.use_dot:
        _int4_gemv_dot_kernel[grid](*args, BLOCK_M=16, DOT_DTYPE=dot_dtype(x.dtype),
                                    DOT_PRECISION=dot_precision(x.dtype), EVEN_N=n % cfg.block_n == 0,
                                    **common)  # fmt: skip
    else:
        block_m = triton.next_power_of_2(m)
        even = (m == block_m and n % cfg.block_n == 0 and split.words_per_split % cfg.block_w == 0
                and words % cfg.block_w == 0)
        _int4_gemv_kernel[grid](*args, BLOCK_M=block_m, BLOCK_W=cfg.block_w, EVEN=even, **common)
    split.reduce(out2, bias is not None)
    return out


__all__ = ["Int4GemvConfig", "default_config", "dot_supported", "int4_gemv"]
