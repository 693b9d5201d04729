"""Skinny GEMM for decode batches in Triton: `out = x @ weight.T (+ bias)` with `x` `[M, K]`, M ~17..256.

Same contract as `F.linear` (the oracle, `skinny_gemm_ref`). At decode, a batch of M = 64 tokens still
reads every weight byte once for only 64 multiply-adds, so a projection is a weight stream at ~64 FLOP a
byte (~300 TFLOP/s at the H200's bandwidth, a third of its bf16 peak): what counts is how close the
stream gets to copy bandwidth. cuBLAS's kernels for Llama-3.1-8B at batch 64 (H200 profile of the
sixth session, bench/results/gpu-2026-12-04-s6/prof-bf16-b64.json) reach ~70 % of copy on qkv and
o_proj (16.6 and 11.7 us for 50 and 34 MB) and ~80 % on down (33.5 us plus a split-K reduce kernel of
2.5 us), ~89 % on gate_up.

Layout ("swap AB", as cuBLAS's and the GEMV's small-M tiles): the weight `[N, K]` is the MMA's wide
side and the batch its narrow one, so one program owns BLOCK_N output features (weight rows) for the
whole batch (BLOCK_M >= M: every weight byte is read by exactly one program, whatever M is) and
computes the `[BLOCK_N, BLOCK_M]` tile `W[cols] @ x.T` over its K range, BLOCK_K at a time, through
shared memory with `num_stages` loads in flight (tensor cores: wgmma on sm_90).

Split-K: where `N / BLOCK_N` programs are too few (or leave a ragged last wave) a second grid axis cuts K
into `split_k` ranges of whole BLOCK_K tiles. Each range writes an fp32 partial; the last program of a
column tile to arrive (an atomic counter per tile, acq_rel) sums the partials in a fixed order (so the
result is the same every run), adds the bias, stores the output and resets its counter: no reduce
kernel (the graph node and the ~1 us gap around it, which cuBLAS's split-K pays on down_proj). The
counters are allocated once per device outside a CUDA-graph capture; a capture that finds none runs
the call without split-K.

Gated epilogue (`gated=True`, the merged gate/up projection of a SiLU MLP): the weight is `[2 * N, K]`
(gate rows, then up rows); each program loads the matching gate and up tiles, keeps two accumulators
and writes `silu(gate) * up` `[M, N]`, rounded as `F.linear` then `silu_and_mul_ref` would (each
projection to the output dtype first), so the SiLU kernel and the `[M, 2N]` intermediate go away.

Every choice is made from shapes alone, never from tensor values: a call never syncs with the host and
can be captured in a CUDA graph. `default_config` is a lead; bench/skinny_gemm.py times a grid of
configurations per projection shape on the H200 and prints the winners in the form
FLOTILLA_SKINNY_GEMM_CONFIGS reads (`parse_configs`); bench/tile_sweep.py --family skinny32 chooses the 32-row
tiles inside the engine (a cached-prefix extend's graph replayed) and prints a card's `MEASURED_CONFIGS` entry.
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
from flotilla.kernels.launch_knobs import KnobSyntax, parse_shape
from flotilla.kernels.split_k_counters import arrival_counters
from flotilla.kernels.triton_activation import silu_mul
from flotilla.kernels.triton_utils import device_sms, dot_dtype, dot_precision

# Shared memory a program may use for its pipeline (bytes; an H200 SM has 228 KB, 227 KB per block).
SMEM_LIMIT = 220 * 1024
# Split-K arrival counters (kernels/split_k_counters.py): one int32 per column tile, per device.
_COUNTERS: dict[torch.device, torch.Tensor] = {}
_COUNTER_SLOTS = 1 << 14


@dataclasses.dataclass(frozen=True)
class SkinnyGemmConfig:
    """Tile sizes and pipeline depth of one launch (BLOCK_M follows from M)."""

    block_n: int = 128
    block_k: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    tma: int = 0  # 1: tiles loaded through tensor descriptors (TMA on sm_90) instead of pointers

    def spec(self) -> str:
        """The `knob=value,...` form `parse_configs` reads."""
        return KNOBS.spec(dataclasses.asdict(self))


CUBLAS = "cublas"  # a table entry's knobs that keep its shape on cuBLAS
# The knobs of FLOTILLA_SKINNY_GEMM_CONFIGS's entries (`launch_knobs.py`): any of `bn=,bk=,sk=,w=,s=,t=`.
KNOBS = KnobSyntax("FLOTILLA_SKINNY_GEMM_CONFIGS", {"bn": "block_n", "bk": "block_k", "sk": "split_k",
                                                    "w": "num_warps", "s": "num_stages", "t": "tma"})  # fmt: skip


def parse_config(knobs: str) -> SkinnyGemmConfig:
    """`"bn=128,bk=64,sk=2,w=4,s=5"` (any subset; the rest default) as a configuration."""
    return SkinnyGemmConfig(**KNOBS.knobs(knobs))


def _table_key(key: str) -> tuple[int, int, int, bool]:
    """`"NxK@BM"` or `"NxK@BM+silu"` as `(N, K, BM, gated)`."""
    shape, _, bm = key.replace(" ", "").partition("@")
    gated = bm.endswith("+silu")
    bm = bm.removesuffix("+silu")
    expected = "NxK@BM:knobs, e.g. 4096x4096@64:bn=64"
    if not bm.isdigit():
        raise ValueError(f"{KNOBS.variable}: bad batch tile in {key!r} (expected {expected})")
    return (*parse_shape(KNOBS.variable, shape, expected), int(bm), gated)


def parse_configs(spec: str) -> dict[tuple[int, int, int, bool], SkinnyGemmConfig | None]:
    """`"NxK@BM:knobs;NxK@BM+silu:knobs;NxK@BM:cublas;..."` as `{(N, K, BLOCK_M, gated): config}`: N the
    weight's rows, BLOCK_M `block_m(M)`, `+silu` the gated epilogue on a merged gate/up weight; `cublas`
    (None in the table): the shape stays on cuBLAS (`cublas_preferred`)."""
    table = {}
    for entry in (e.strip() for e in spec.split(";") if e.strip()):
        key, _, knobs = entry.partition(":")
        table[_table_key(key)] = None if knobs.strip() == CUBLAS else parse_config(knobs)
    return table


def config_key(n_rows: int, k: int, bm: int, gated: bool) -> str:
    """The `NxK@BM[+silu]` form of a table key (`parse_configs`)."""
    return f"{n_rows}x{k}@{bm}" + ("+silu" if gated else "")


# The H200 sweep's winners for Llama-3.1-8B's projections (bf16; bench/skinny_gemm.py in
# bench/results/dec7-gpu.sh, seventh session call 4: bench/results/gpu-2026-12-04-s7/call4/dec7/): per padded
# batch tile, the fastest configuration where it beat cuBLAS, `cublas` where cuBLAS was faster (M = 128 on
# qkv / o / down / LM head; plain gate_up at 32). At M = 64, us (cuBLAS -> skinny): qkv 16.41 -> 15.98,
# o 12.21 -> 11.89, gate_up + SiLU 63.85 -> 58.97, down 36.16 -> 32.84, LM head 272.3 -> 250.5.
H200_CONFIGS = (
    "128256x4096@128:cublas;128256x4096@32:bn=128,bk=128,sk=1,w=4,s=4,t=0;"
    "128256x4096@64:bn=256,bk=64,sk=1,w=4,s=5,t=1;28672x4096@128:bn=256,bk=64,sk=1,w=8,s=4,t=0;"
    "28672x4096@128+silu:bn=128,bk=64,sk=1,w=8,s=5,t=0;28672x4096@32:cublas;"
    "28672x4096@32+silu:bn=128,bk=64,sk=1,w=8,s=5,t=0;28672x4096@64:bn=256,bk=64,sk=1,w=4,s=4,t=1;"
    "28672x4096@64+silu:bn=128,bk=64,sk=1,w=8,s=5,t=0;4096x14336@128:cublas;"
    "4096x14336@32:bn=64,bk=128,sk=2,w=4,s=5,t=0;4096x14336@64:bn=64,bk=128,sk=1,w=4,s=6,t=1;"
    "4096x4096@128:cublas;4096x4096@32:bn=64,bk=128,sk=1,w=4,s=6,t=1;4096x4096@64:bn=64,bk=128,sk=1,w=4,s=6,t=1;"
    "6144x4096@128:cublas;6144x4096@32:bn=64,bk=128,sk=1,w=4,s=5,t=0;6144x4096@64:bn=64,bk=128,sk=1,w=4,s=5,t=0"
)
# The H100's entry (session 33, bench/results/gpu-2026-12-07-s33/call3/: bench/tile_sweep.py --family skinny32 on an
# H100 80GB HBM3, the 32-row tiles chosen inside the engine, a 20-token extend over a 2,000-token cached prefix replayed
# as its one-sequence mixed graph): the H200's table but, at M = 32, o_proj without TMA, gate_up + SiLU on 4 warps and
# down on cuBLAS. A replay 5.822 -> 5.733 ms (orig new new orig; the random model's greedy tokens differ: another K
# order), the cached-prefix TTFT 7.07 -> 6.95 ms.
H100_CONFIGS = (
    "128256x4096@128:cublas;128256x4096@32:bn=128,bk=128,sk=1,w=4,s=4,t=0;"
    "128256x4096@64:bn=256,bk=64,sk=1,w=4,s=5,t=1;28672x4096@128:bn=256,bk=64,sk=1,w=8,s=4,t=0;"
    "28672x4096@128+silu:bn=128,bk=64,sk=1,w=8,s=5,t=0;28672x4096@32:cublas;"
    "28672x4096@32+silu:bn=128,bk=64,sk=1,w=4,s=5,t=0;28672x4096@64:bn=256,bk=64,sk=1,w=4,s=4,t=1;"
    "28672x4096@64+silu:bn=128,bk=64,sk=1,w=8,s=5,t=0;4096x14336@128:cublas;"
    "4096x14336@32:cublas;4096x14336@64:bn=64,bk=128,sk=1,w=4,s=6,t=1;"
    "4096x4096@128:cublas;4096x4096@32:bn=64,bk=128,sk=1,w=4,s=6,t=0;4096x4096@64:bn=64,bk=128,sk=1,w=4,s=6,t=1;"
    "6144x4096@128:cublas;6144x4096@32:bn=64,bk=128,sk=1,w=4,s=5,t=0;6144x4096@64:bn=64,bk=128,sk=1,w=4,s=5,t=0"
)
# Per card (`card_tables.py`): the H200's table serves every card without an entry of its own.
MEASURED_CONFIGS: dict[str, str] = {DEFAULT: H200_CONFIGS, H200: H200_CONFIGS, H100: H100_CONFIGS}
# FLOTILLA_SKINNY_GEMM_CONFIGS from the environment (bench/results/dec7-gpu.sh passes a sweep's winners to the engine
# run of the same call) replaces the table on every card; else the measured ones. Read once at import; benchmarks set
# entries in-process (`set_configs`: bench/tile_sweep.py, which captures the graphs again after each change).
ConfigTable = dict[tuple[int, int, int, bool], SkinnyGemmConfig | None]
_ENV_CONFIGS = os.environ.get("FLOTILLA_SKINNY_GEMM_CONFIGS", "")
_TABLES: dict[str, ConfigTable] = {card: parse_configs(spec) for card, spec in
                                   ({DEFAULT: _ENV_CONFIGS} if _ENV_CONFIGS else MEASURED_CONFIGS).items()}


def configs(card: str | None = None) -> ConfigTable:
    """The card's table (`MEASURED_CONFIGS` or FLOTILLA_SKINNY_GEMM_CONFIGS; `DEFAULT`'s off CUDA): `{(N, K, BLOCK_M,
    gated): config, or None for cuBLAS}`."""
    return for_card(_TABLES, card)


def set_configs(entries: ConfigTable) -> dict[str, ConfigTable]:
    """Replace the given entries on every card's table, in-process (benchmarks; the CUDA graphs that launched the old
    ones must be captured again); returns the previous tables for `restore_configs`."""
    global _TABLES
    previous = {card: dict(t) for card, t in _TABLES.items()}
    _TABLES = {card: {**t, **entries} for card, t in _TABLES.items()}
    return previous


def restore_configs(previous: dict[str, ConfigTable]) -> None:
    """Put back the tables `set_configs` returned."""
    global _TABLES
    _TABLES = {card: dict(t) for card, t in previous.items()}


def table_spec(table: ConfigTable) -> str:
    """A table in the form `parse_configs` reads (FLOTILLA_SKINNY_GEMM_CONFIGS, a `MEASURED_CONFIGS` entry), keys
    sorted as the measured table lists them."""
    return ";".join(f"{config_key(n, k, bm, gated)}:{CUBLAS if cfg is None else cfg.spec()}"
                    for (n, k, bm, gated), cfg in sorted(table.items(), key=lambda kv: config_key(*kv[0])))


def measured(m: int, n_rows: int, k: int, gated: bool = False, card: str | None = None) -> bool:
    """Whether the card's table has a configuration (not `cublas`) for this shape and padded batch tile."""
    return configs(card).get((n_rows, k, block_m(m), gated)) is not None


def cublas_preferred(m: int, n_rows: int, k: int, gated: bool = False, card: str | None = None) -> bool:
    """Whether the card's table keeps this shape on cuBLAS (the sweep measured cuBLAS faster)."""
    key, table = (n_rows, k, block_m(m), gated), configs(card)
    return key in table and table[key] is None


def block_m(m: int) -> int:
    """The batch side of the MMA tile: M padded to a power of two, at least 16."""
    return max(16, triton.next_power_of_2(m))


def smem_bytes(cfg: SkinnyGemmConfig, bm: int, gated: bool = False, elem: int = 2) -> int:
    """Shared memory of the software pipeline: `num_stages` weight and input tiles."""
    w_rows = cfg.block_n * (2 if gated else 1)
    return cfg.num_stages * (w_rows + bm) * cfg.block_k * elem


def default_config(m: int, n: int, k: int, sms: int, gated: bool = False, card: str | None = None) -> SkinnyGemmConfig:
    """The configuration for `[m, k] @ [n, k].T`: the card's table entry (`configs`) when the shape has one, else the
    shape of the H200 sweep's winners (64-wide column tiles 128 deep; gated 128-wide 64 deep), as many
    stages as shared memory holds up to 6, no split of K: on the H200 every split measured slower at M = 64
    (o_proj 11.9 us unsplit, 14.4 in two, 18.0 in three: the fix-up's latency at the end of a ~12 us kernel
    outweighs the SMs a 64-tile grid leaves idle)."""
    bm = block_m(m)
    rows = 2 * n if gated else n
    found = configs(card).get((rows, k, bm, gated))  # None (`cublas`): the caller asked anyway; the default
    if found is not None:
        return found
    # the sweep's winners were 64-wide column tiles 128 deep (plain) and 128-wide 64 deep (gated), unsplit
    cfg = SkinnyGemmConfig(block_n=128, block_k=64) if gated else SkinnyGemmConfig(block_n=64, block_k=128)
    stages = 6
    while stages > 2 and smem_bytes(dataclasses.replace(cfg, num_stages=stages), bm, gated) > SMEM_LIMIT:
        stages -= 1
    return dataclasses.replace(cfg, num_stages=stages)


def _counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The device's split-K arrival counters (`_COUNTERS`), or None where the call must run without split-K: too
    many column tiles, or the first use inside a CUDA-graph capture."""
    return arrival_counters(_COUNTERS, device, tiles, _COUNTER_SLOTS)


@triton.jit
def _mma_tile(w_ptr, x_ptr, cols, rows, offs_k, k0, k_end, K, stride_wn, stride_xm, row_ok, acc,
              BLOCK_K: tl.constexpr, EVEN: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """`acc += W[cols, k0:k_end] @ x[rows, k0:k_end].T`, BLOCK_K at a time."""
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + (k0 + offs_k)[None, :]
    x_ptrs = x_ptr + rows[None, :] * stride_xm + (k0 + offs_k)[:, None]
    for k in range(k0, k_end, BLOCK_K):
        if EVEN:
            w = tl.load(w_ptrs)
            xt = tl.load(x_ptrs, mask=row_ok[None, :], other=0.0)
        else:
            k_ok = (k + offs_k) < K
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
            xt = tl.load(x_ptrs, mask=row_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(w.to(DOT_DTYPE), xt.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    return acc


@triton.jit
def _finish(acc, up, cols, bias_ptr, N, OUT_DTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr):
    """The fp32 output tile as stored: bias added and rounded to the output dtype; gated: each projection
    rounded first, then `silu(gate) * up` rounded as `silu_and_mul_ref` (the SiLU rounded, then the product)."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols).to(tl.float32)[:, None]
        if GATED:
            up += tl.load(bias_ptr + N + cols).to(tl.float32)[:, None]
    if GATED:
        acc = silu_mul(acc, up, OUT_DTYPE)
    return acc.to(OUT_DTYPE)


@triton.jit
def _epilogue(acc, up, pid_n, split, splits, cols, rows, row_ok, bias_ptr, out_ptr, part_ptr, counter_ptr, M, N,
              stride_om, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
              GATED: tl.constexpr):  # fmt: skip
    """Store a program's `[BLOCK_N, BLOCK_M]` fp32 tile (transposed into `out` `[M, N]`): finished at once
    without split-K; else its partial, and the last program of the column tile to arrive sums the partials
    in a fixed order, finishes, stores and resets the tile's counter."""
    out_ty = out_ptr.dtype.element_ty
    ok = row_ok[None, :]
    o_ptrs = out_ptr + rows[None, :] * stride_om + cols[:, None]
    if not SPLIT:
        tl.store(o_ptrs, _finish(acc, up, cols, bias_ptr, N, out_ty, HAS_BIAS, GATED), mask=ok)
    else:
        # partials [splits, (2 if gated) * M, N]; the up half after the gate half
        p_ptrs = part_ptr + (split * M * (2 if GATED else 1) + rows).to(tl.int64)[None, :] * N + cols[:, None]
        tl.store(p_ptrs, acc, mask=ok)
        if GATED:
            tl.store(p_ptrs + M * N, up, mask=ok)
        tl.debug_barrier()  # every thread's partial is written before the counter's release
        arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            total_up = total
            step = M * N * (2 if GATED else 1)
            q_ptrs = part_ptr + rows.to(tl.int64)[None, :] * N + cols[:, None]
            for _ in range(splits):  # a fixed order: the sum is the same every run
                total += tl.load(q_ptrs, mask=ok, other=0.0, cache_modifier=".cg")  # from L2: other SMs wrote
                if GATED:
                    total_up += tl.load(q_ptrs + M * N, mask=ok, other=0.0, cache_modifier=".cg")
                q_ptrs += step
            tl.store(o_ptrs, _finish(total, total_up, cols, bias_ptr, N, out_ty, HAS_BIAS, GATED), mask=ok)
            tl.atomic_xchg(counter_ptr + pid_n, 0)  # ready for the next launch on this stream


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, counter_ptr,
    M, N, K, stride_xm, stride_wn, stride_om, k_per_split, splits,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr, EVEN: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One program: output features `cols` (N of them in all; gated: N gate and N up weight rows) for
    every row of the batch, over K range `split` of `splits`; tiles loaded by pointers (cp.async)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    offs_k = tl.arange(0, BLOCK_K)
    k0 = split * k_per_split
    k_end = tl.minimum(K, k0 + k_per_split)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc = _mma_tile(w_ptr, x_ptr, cols, rows, offs_k, k0, k_end, K, stride_wn, stride_xm, row_ok, acc,
                    BLOCK_K, EVEN, DOT_DTYPE, DOT_PRECISION)  # fmt: skip
    up = acc
    if GATED:
        up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        up = _mma_tile(w_ptr, x_ptr, cols + N, rows, offs_k, k0, k_end, K, stride_wn, stride_xm, row_ok, up,
                       BLOCK_K, EVEN, DOT_DTYPE, DOT_PRECISION)  # fmt: skip
    _epilogue(acc, up, pid_n, split, splits, cols, rows, row_ok, bias_ptr, out_ptr, part_ptr, counter_ptr, M, N,
              stride_om, BLOCK_N, BLOCK_M, HAS_BIAS, SPLIT, GATED)  # fmt: skip


@triton.jit
def _tma_tile(w_desc, x_desc, row0, k0, k_end, acc, BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr,
              DOT_PRECISION: tl.constexpr):  # fmt: skip
    """`acc += W[row0:row0 + BLOCK_N, k0:k_end] @ x[:, k0:k_end].T` from tensor descriptors (TMA on sm_90;
    whatever lies outside the tensors, rows past M or K past its end, loads as zeros)."""
    for k in range(k0, k_end, BLOCK_K):
        w = w_desc.load([row0, k])
        xt = tl.trans(x_desc.load([0, k]))
        acc = tl.dot(w.to(DOT_DTYPE), xt.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _skinny_gemm_tma_kernel(
    x_desc, w_desc, bias_ptr, out_ptr, part_ptr, counter_ptr,
    M, N, K, stride_om, k_per_split, splits,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """`_skinny_gemm_kernel` with the weight and input tiles brought in by the Tensor Memory Accelerator
    (one instruction a tile instead of per-thread address arithmetic and cp.async)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    k0 = split * k_per_split
    k_end = tl.minimum(K, k0 + k_per_split)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc = _tma_tile(w_desc, x_desc, pid_n * BLOCK_N, k0, k_end, acc, BLOCK_K, DOT_DTYPE, DOT_PRECISION)
    up = acc
    if GATED:
        up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        up = _tma_tile(w_desc, x_desc, N + pid_n * BLOCK_N, k0, k_end, up, BLOCK_K, DOT_DTYPE, DOT_PRECISION)
    _epilogue(acc, up, pid_n, split, splits, cols, rows, row_ok, bias_ptr, out_ptr, part_ptr, counter_ptr, M, N,
              stride_om, BLOCK_N, BLOCK_M, HAS_BIAS, SPLIT, GATED)  # fmt: skip


def skinny_gemm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    gated: bool = False) -> torch.Tensor:
    """The PyTorch reference: `F.linear`, then (gated) `silu_and_mul_ref` on the merged output."""
    y = F.linear(x, weight, bias)
    return silu_and_mul_ref(y) if gated else y


def supported(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> bool:
    """Whether `skinny_gemm` takes these operands: 2-D fp16/bf16 (fp32 in the interpreter), contiguous
    along K, whole 128-wide column tiles (every Llama projection; other shapes stay on cuBLAS)."""
    n = weight.shape[0] // (2 if gated else 1)
    return (x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1] and x.dtype == weight.dtype
            and x.stride(-1) == 1 and weight.stride(-1) == 1 and n % 128 == 0 and x.shape[1] % 8 == 0
            and (not gated or weight.shape[0] % 2 == 0))  # fmt: skip


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False,
                config: SkinnyGemmConfig | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` (`[M, K]` by `[N, K]`), or with `gated` `silu(gate) * up` of that product
    (`[M, N / 2]`); `config` overrides `default_config`."""
    assert supported(x, weight, gated), f"unsupported operands {tuple(x.shape)} x {tuple(weight.shape)}"
    m, k = x.shape
    n = weight.shape[0] // (2 if gated else 1)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    cfg = config or default_config(m, n, k, device_sms(x), gated, device_card(x))
    if n % cfg.block_n:  # columns are never masked: whole tiles only (n % 128 == 0 by `supported`)
        cfg = dataclasses.replace(cfg, block_n=128)
    bm = block_m(m)
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per_split)
    tiles = triton.cdiv(n, cfg.block_n)
    counters = _counters(x.device, tiles) if splits > 1 else None
    if counters is None:  # no counters (first call inside a capture): one range
        k_per_split, splits = triton.cdiv(k, cfg.block_k) * cfg.block_k, 1
    part = torch.empty(splits, (2 if gated else 1) * m, n, dtype=torch.float32, device=x.device) if splits > 1 else out
    common = dict(BLOCK_N=cfg.block_n, BLOCK_M=bm, BLOCK_K=cfg.block_k, HAS_BIAS=bias is not None, SPLIT=splits > 1,
                  GATED=gated, DOT_DTYPE=dot_dtype(x.dtype), DOT_PRECISION=dot_precision(x.dtype),
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)  # fmt: skip
    tail = (bias if bias is not None else out, out, part, counters if counters is not None else out, m, n, k)
    if cfg.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_desc = TensorDescriptor.from_tensor(x, [bm, cfg.block_k])
        w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k])
        _skinny_gemm_tma_kernel[(tiles, splits)](x_desc, w_desc, *tail, out.stride(0), k_per_split, splits,
                                                 **common)  # fmt: skip
    else:
        _skinny_gemm_kernel[(tiles, splits)](x, weight, *tail, x.stride(0), weight.stride(0), out.stride(0),
                                             k_per_split, splits, EVEN=k % cfg.block_k == 0, **common)  # fmt: skip
    return out


__all__ = [
    "CUBLAS", "H100_CONFIGS", "H200_CONFIGS", "MEASURED_CONFIGS", "ConfigTable", "SkinnyGemmConfig", "block_m",
    "config_key", "configs", "cublas_preferred", "default_config", "measured", "parse_config", "parse_configs",
    "restore_configs", "set_configs", "skinny_gemm", "skinny_gemm_ref", "smem_bytes", "supported", "table_spec",
]  # fmt: skip
