"""The kernel families bench/tile_sweep.py tunes inside the engine: for each, the projections it serves at batch 1
(Llama-3.1-8B's shapes), each shape's knobs and the moves to its neighbours, which tiles the kernel takes, the host
functions the engine launches it through (recorded, then called by the compile workers with a candidate's knobs as
keywords), how a table is set in-process, and the lines that adopt a table for a card.

- int4: the wide W4A16 GEMV (`triton_int4_gemv_wide.py`; the fused gated and rope forms look up the same table).
- bf16: the one-row bf16 GEMV (`triton_gemv.py`: o_proj, down; its rope form for qkv, `triton_gemv_rope.py`), the
  gated GEMV (`triton_gated_gemv.py`: gate_up) and the LM head's GEMV (`dispatch.LM_HEAD_GEMV`, run after the graph).
- fp8: the one-row W8A16 GEMV (`triton_fp8_row_gemv.py`: plain, gated for gate_up, rope for qkv).
- skinny32: the skinny GEMM (`triton_skinny_gemm.py`, gated for gate_up) at 32-row batch tiles, or cuBLAS, per shape:
  a cached-prefix extend's step (`Family.step` "extend", bench/extend_graph.py), not a batch-1 decode step.

The pure parts (shapes, moves, validity, the dry-run's made-up optimum) import nothing from the engine; `start`,
`apply` and `adopt` import the kernel modules when called (the engine side).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tile_descent import Tile, neighbours

Table = dict[str, Tile]
LLAMA = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
HEAD_DIM = 128  # Llama-3.1-8B: a rope form takes a qkv tile only if it holds whole rotation pairs of one head


def pow2(v: int) -> bool:
    """A positive power of two."""
    return v > 0 and v & (v - 1) == 0


def rope_fits(block_n: int) -> bool:
    """Whether a qkv tile of `block_n` rows holds whole rotation pairs of one head (`triton_rope_epilogue.fits_rope`
    at Llama's head width): else the engine runs the unfused pair there (GEMV + rotary/KV kernel)."""
    return 2 <= block_n <= HEAD_DIM and (HEAD_DIM // 2) % (block_n // 2) == 0


def _other_warps(w: int) -> list[int]:
    return [8, 2] if w == 4 else [4]


@dataclasses.dataclass(frozen=True)
class Family:
    """One kernel family's knob space and its hooks into the engine (module docstring)."""

    name: str
    shapes: dict[str, tuple[int, int]]  # projection -> (weight rows, K): the table's keys
    moves: Callable[[str, Tile], list[Tile]]  # a shape's tile -> the knobs of each neighbour
    valid: Callable[[str, Tile], bool]  # whether the kernel takes the tile for that shape
    hosts: tuple[tuple[str, str], ...]  # (kernels module, host function) the engine launches these shapes through
    quantization: str | None  # the engine's --quantization
    model: str  # default --model (bench/results/w4a16-model.sh and model_dirs.py write them)
    dry_best: dict[str, Tile]  # --dry-run: the knobs of each shape's made-up optimum
    start: Callable[[str | None, int], Table]  # (card, SMs) -> each shape's tile as the engine launches it now
    apply: Callable[[Table], None]  # set a table in-process (then the decode graphs are captured again)
    adopt: Callable[[Table, str | None], list[str]]  # the lines that make a table the card's
    knob_names: tuple[str, ...]  # every knob a host function takes as a keyword (stripped from recorded calls)
    note: Callable[[str, Tile], str] = lambda shape, tile: ""  # what the engine does differently with a tile
    rows: int = 1  # the launch's input rows the family tunes (the GEMVs: one; the skinny GEMM: a 32-row batch tile)
    step: str = "decode"  # what a phase times: "decode" (batch-1 steps) or "extend" (a cached-prefix extend's graph)
    # a tile as the keywords its host function takes (compile workers), None where no kernel of the family runs it
    launch: Callable[[Tile], dict | None] = lambda tile: dict(tile)

    def candidates(self, shape: str, tile: Tile, limit: int = 12) -> list[Tile]:
        """`tile` first, then its valid neighbours (at most `limit` in all)."""
        return neighbours(tile, self.moves(shape, tile), lambda t: self.valid(shape, t), limit)


# ---- int4: the wide W4A16 GEMV ----

INT4_KNOBS = ("block_n", "block_w", "num_warps", "num_stages", "split_k", "layout")


def _int4_moves(shape: str, t: Tile) -> list[Tile]:
    """Split-K halved/doubled, rows a program halved/doubled, words a step halved/doubled, warps 2/8, one more stage,
    the other word layout, and split-K doubled with half the words a step."""
    return [
        {"split_k": t["split_k"] * 2}, {"split_k": t["split_k"] // 2},
        {"block_n": t["block_n"] // 2}, {"block_n": t["block_n"] * 2},
        {"block_w": t["block_w"] // 2}, {"block_w": t["block_w"] * 2},
        {"num_warps": 8 if t["num_warps"] == 4 else 4}, {"num_warps": 2 if t["num_warps"] == 4 else 4},
        {"num_stages": t["num_stages"] + 1}, {"layout": 1 - t["layout"]},
        {"split_k": t["split_k"] * 2, "block_w": t["block_w"] // 2},
    ]  # fmt: skip


def int4_valid(shape: str, t: Tile) -> bool:
    """A tile the wide kernel compiles: power-of-two rows (8..64) and words (32..256, whole 16-byte chunks), 2-8 warps,
    1-4 stages, split-K 1..8, layout 0/1. (A qkv tile the rope form rejects is timed: the engine runs the pair.)"""
    return (pow2(t["block_n"]) and 8 <= t["block_n"] <= 64 and pow2(t["block_w"]) and 32 <= t["block_w"] <= 256
            and t["num_warps"] in (2, 4, 8) and 1 <= t["num_stages"] <= 4 and 1 <= t["split_k"] <= 8
            and t["layout"] in (0, 1))  # fmt: skip


def int4_spec(table: Table, every_shape: Tile | None) -> str:
    """FLOTILLA_INT4_GEMV_WIDE_CONFIG (and a `MEASURED_TILES` entry) selecting `table` (`_parse_tiles` syntax): the
    every-shape entry, then `NxK:` whole knobs per shape."""
    entries = [",".join(f"{k}={every_shape[k]}" for k in every_shape)] if every_shape else []
    for shape, tile in table.items():
        n, k = LLAMA[shape]
        entries.append(f"{n}x{k}:" + ",".join(f"{key}={tile[key]}" for key in INT4_KNOBS))
    return ";".join(entries)


def _int4_start(card: str | None, sms: int) -> Table:
    from flotilla.kernels.triton_int4_gemv_wide import wide_config

    out = {}
    for shape, (n, k) in LLAMA.items():
        c = wide_config(1, n, k, sms, pdl=True, card=card)  # the PDL launch's lookup, as the engine's
        out[shape] = {key: int(getattr(c, key)) for key in INT4_KNOBS}
    return out


def _int4_apply(table: Table) -> None:
    from flotilla.kernels.triton_int4_gemv_wide import set_wide_tiles

    set_wide_tiles({LLAMA[s]: t for s, t in table.items()})


def _int4_adopt(table: Table, card: str | None) -> list[str]:
    from flotilla.kernels.triton_int4_gemv_wide import wide_tiles

    spec = int4_spec(table, wide_tiles(card).get(None))
    return [f'triton_int4_gemv_wide.MEASURED_TILES["{card}"] = "{spec}"', f'FLOTILLA_INT4_GEMV_WIDE_CONFIG="{spec}"']


INT4 = Family(
    name="int4", shapes=dict(LLAMA), moves=_int4_moves, valid=int4_valid,
    hosts=(("triton_int4_gemv_wide", "int4_gemv_wide"), ("triton_int4_gemv_fused", "int4_gemv_wide_gated"),
           ("triton_int4_gemv_fused", "int4_gemv_wide_rope")),
    quantization=None, model="/tmp/llama8b-w4a16",
    dry_best={"qkv": {"split_k": 4}, "o": {"split_k": 4, "block_w": 64}, "gate_up": {"block_n": 32},
              "down": {"num_warps": 8}},
    start=_int4_start, apply=_int4_apply, adopt=_int4_adopt, knob_names=INT4_KNOBS,
    note=lambda s, t: "" if s != "qkv" or rope_fits(t["block_n"]) else "rope form rejects it: unfused pair",
)  # fmt: skip


# ---- bf16: the one-row GEMV, its rope form, the gated GEMV, the LM head ----

BF16_SHAPES = {**LLAMA, "lm_head": (128256, 4096)}
GEMV_KNOBS = ("block_n", "block_k", "split_k", "num_warps", "num_stages")
GATED_KNOBS = ("block_n", "block_k", "num_warps", "num_stages")


def _bf16_moves(shape: str, t: Tile) -> list[Tile]:
    """Rows a program halved/doubled, K a step halved/doubled, warps 2/8 (or back to 4), a stage more/less, rows
    doubled with half the K step and the reverse, then split-K doubled/halved (the shapes that may split)."""
    moves = [
        {"block_n": t["block_n"] // 2}, {"block_n": t["block_n"] * 2},
        {"block_k": t["block_k"] // 2}, {"block_k": t["block_k"] * 2},
        *({"num_warps": w} for w in _other_warps(t["num_warps"])),
        {"num_stages": t["num_stages"] + 1}, {"num_stages": t["num_stages"] - 1},
        {"block_n": t["block_n"] * 2, "block_k": t["block_k"] // 2},
        {"block_n": t["block_n"] // 2, "block_k": t["block_k"] * 2},
    ]  # fmt: skip
    if "split_k" in t:
        moves += [{"split_k": t["split_k"] * 2}, {"split_k": t["split_k"] // 2}]
    return moves


def bf16_valid(shape: str, t: Tile) -> bool:
    """A tile of the FMA path: power-of-two rows (2..128) and K steps (64..2048), 2-8 warps, 1-5 stages, split-K
    1..8, the fp32 accumulator (gate and up: two) at most 128 values a thread; qkv (the rope form): one K range and
    whole rotation pairs of a head."""
    halves = 2 if shape == "gate_up" else 1
    ok = (pow2(t["block_n"]) and 2 <= t["block_n"] <= 128 and pow2(t["block_k"]) and 64 <= t["block_k"] <= 2048
          and t["num_warps"] in (2, 4, 8) and 1 <= t["num_stages"] <= 5 and 1 <= t.get("split_k", 1) <= 8
          and halves * t["block_n"] * t["block_k"] <= 128 * 32 * t["num_warps"])  # fmt: skip
    return ok and (shape != "qkv" or (t.get("split_k", 1) == 1 and rope_fits(t["block_n"])))


def _bf16_start(card: str | None, sms: int) -> Table:
    from flotilla.kernels import dispatch, triton_gated_gemv
    from flotilla.kernels.triton_gemv import default_config

    out = {}
    for shape in ("qkv", "o", "down"):
        n, k = LLAMA[shape]
        c = default_config(1, n, k, sms, card=card)
        out[shape] = {key: int(getattr(c, key)) for key in GEMV_KNOBS}
    n, k = LLAMA["gate_up"]
    g = triton_gated_gemv.default_config(1, n // 2, k, sms,
                                         **(triton_gated_gemv.one_row_knobs(1, card) | triton_gated_gemv.ENV_KNOBS))
    out["gate_up"] = {key: int(getattr(g, key)) for key in GATED_KNOBS}
    head = dispatch.lm_head_gemv_for(card)
    if head is not None:  # else cuBLAS runs the head: nothing to tune
        n, k = BF16_SHAPES["lm_head"]
        c = default_config(1, n, k, sms, **head)
        out["lm_head"] = {key: int(getattr(c, key)) for key in GEMV_KNOBS}
    return out


def _bf16_apply(table: Table) -> None:
    from flotilla.kernels import dispatch, triton_gated_gemv
    from flotilla.kernels.card_tables import DEFAULT
    from flotilla.kernels.triton_gemv import set_one_row_tiles

    set_one_row_tiles({LLAMA[s]: t for s, t in table.items() if s in ("qkv", "o", "down")})
    if "gate_up" in table:
        triton_gated_gemv.ENV_KNOBS = dict(table["gate_up"])
    if "lm_head" in table:  # every card's
        dispatch.LM_HEAD_GEMV = {DEFAULT: {**table["lm_head"], "use_dot": False}}


def _bf16_adopt(table: Table, card: str | None) -> list[str]:
    from flotilla.kernels import triton_gated_gemv, triton_gemv
    from flotilla.kernels.dispatch import LM_HEAD_KNOBS

    gemv = triton_gemv.tiles_spec({LLAMA[s]: table[s] for s in ("qkv", "o", "down") if s in table})
    gated = triton_gated_gemv.KNOBS.spec(table.get("gate_up", {}))
    head = LM_HEAD_KNOBS.spec({**table["lm_head"], "use_dot": 0}) if "lm_head" in table else ""
    return [f'triton_gemv.ONE_ROW_TILES["{card}"] = "{gemv}"',
            f'triton_gated_gemv.ONE_ROW_CONFIGS["{card}"] = "{gated}"',
            *([f'dispatch.LM_HEAD_GEMV_MEASURED["{card}"] = "{head}"'] if head else []),
            f'FLOTILLA_GEMV_CONFIG="{gemv}" FLOTILLA_GATED_GEMV_CONFIG="{gated}"'
            + (f' FLOTILLA_LM_HEAD_GEMV="{head}"' if head else "")]  # fmt: skip


BF16 = Family(
    name="bf16", shapes=BF16_SHAPES, moves=_bf16_moves, valid=bf16_valid,
    hosts=(("triton_gemv", "gemv"), ("triton_gemv_rope", "gemv_rope"), ("triton_gated_gemv", "gated_gemv")),
    quantization=None, model="/tmp/llama8b",
    dry_best={"qkv": {"num_stages": 3}, "o": {"block_n": 16}, "gate_up": {"block_k": 256}, "down": {"num_warps": 8},
              "lm_head": {"split_k": 2}},
    start=_bf16_start, apply=_bf16_apply, adopt=_bf16_adopt, knob_names=GEMV_KNOBS,
)  # fmt: skip


# ---- fp8: the one-row W8A16 GEMV (plain, gated, rope) ----

FP8_KNOBS = ("block_n", "block_k", "num_warps", "prefetch", "trigger", "use_pdl")


def _fp8_moves(shape: str, t: Tile) -> list[Tile]:
    """Rows a program halved/doubled, K a step halved/doubled, warps 2/8 (or back to 4), a tile more/less in flight,
    rows doubled with half the K step and the reverse, the other PDL trigger point, the plain launch."""
    return [
        {"block_n": t["block_n"] // 2}, {"block_n": t["block_n"] * 2},
        {"block_k": t["block_k"] // 2}, {"block_k": t["block_k"] * 2},
        *({"num_warps": w} for w in _other_warps(t["num_warps"])),
        {"prefetch": t["prefetch"] + 1}, {"prefetch": t["prefetch"] - 1},
        {"block_n": t["block_n"] * 2, "block_k": t["block_k"] // 2},
        {"block_n": t["block_n"] // 2, "block_k": t["block_k"] * 2},
        {"trigger": 1 - t["trigger"]}, {"use_pdl": 1 - t["use_pdl"]},
    ]  # fmt: skip


def fp8_valid(shape: str, t: Tile) -> bool:
    """A tile the row kernel takes: power-of-two rows (2..64) and K steps (128..2048 bytes, at most K), 2-8 warps, 1-3
    tiles in flight, trigger and use_pdl 0/1, at most 256 weight bytes a thread a step (gate and up: both); qkv (the
    rope form): whole rotation pairs of a head."""
    halves = 2 if shape == "gate_up" else 1
    ok = (pow2(t["block_n"]) and 2 <= t["block_n"] <= 64 and pow2(t["block_k"])
          and 128 <= t["block_k"] <= min(2048, LLAMA[shape][1]) and t["num_warps"] in (2, 4, 8)
          and 1 <= t["prefetch"] <= 3 and t["trigger"] in (0, 1) and t["use_pdl"] in (0, 1)
          and halves * t["block_n"] * t["block_k"] <= 256 * 32 * t["num_warps"])  # fmt: skip
    return ok and (shape != "qkv" or rope_fits(t["block_n"]))


def fp8_spec(table: Table) -> str:
    """`triton_fp8_row_gemv.parse_configs` syntax: `ROWSxK:bn=..,bk=..,w=..,p=..,t=..,d=..` per shape."""
    from flotilla.kernels.triton_fp8_row_gemv import KNOBS

    return KNOBS.table_spec({LLAMA[s]: t for s, t in table.items()})


def _fp8_start(card: str | None, sms: int) -> Table:
    from flotilla.kernels.triton_fp8_row_gemv import default_config, env_knobs

    out = {}
    for shape, (rows, k) in LLAMA.items():
        gated = shape == "gate_up"
        c = default_config(rows // 2 if gated else rows, k, sms, gated=gated, **env_knobs(rows, k, card))
        out[shape] = {key: int(getattr(c, key)) for key in FP8_KNOBS}
    return out


_FP8_START_ENV: list = []


def _fp8_apply(table: Table) -> None:
    from flotilla.kernels import triton_fp8_row_gemv as row

    if not _FP8_START_ENV:
        _FP8_START_ENV.append(dict(row.ENV_CONFIGS))
    row.ENV_CONFIGS = {**_FP8_START_ENV[0], **{LLAMA[s]: dict(t) for s, t in table.items()}}


def _fp8_adopt(table: Table, card: str | None) -> list[str]:
    spec = fp8_spec(table)
    return [f'triton_fp8_row_gemv.MEASURED_CONFIGS["{card}"] = "{spec}"', f'FLOTILLA_FP8_ROW_GEMV_CONFIG="{spec}"']


FP8 = Family(
    name="fp8", shapes=dict(LLAMA), moves=_fp8_moves, valid=fp8_valid,
    hosts=(("triton_fp8_row_gemv", "fp8_row_gemv"), ("triton_fp8_row_gemv", "fp8_row_gemv_rope")),
    quantization="fp8", model="/tmp/llama8b",
    dry_best={"qkv": {"prefetch": 2}, "o": {"block_n": 8}, "gate_up": {"num_warps": 8}, "down": {"block_k": 1024}},
    start=_fp8_start, apply=_fp8_apply, adopt=_fp8_adopt, knob_names=FP8_KNOBS,
)  # fmt: skip


# ---- skinny32: the skinny GEMM at 32-row batch tiles (a cached-prefix extend's 20 new tokens, its mixed graph) ----

SKINNY_KNOBS = ("block_n", "block_k", "split_k", "num_warps", "num_stages", "tma", "cublas")
SKINNY_BM = 32  # the batch tile: a 17..32-token step pads to the 32-row one-sequence mixed graph


def skinny_key(shape: str) -> tuple[int, int, int, bool]:
    """A projection's `triton_skinny_gemm` table key `(weight rows, K, BLOCK_M, gated)` (gate_up: the gated form)."""
    n, k = LLAMA[shape]
    return n, k, SKINNY_BM, shape == "gate_up"


def _skinny_moves(shape: str, t: Tile) -> list[Tile]:
    """From cuBLAS: back to the tile it carries. Else cuBLAS first (the table's other choice), the other load path
    (TMA/pointers), split-K doubled/halved, columns halved/doubled, K a step halved/doubled, warps 8/4, a stage
    more/less, columns doubled with half the K step and the reverse."""
    if t["cublas"]:
        return [{"cublas": 0}]
    return [
        {"cublas": 1}, {"tma": 1 - t["tma"]}, {"split_k": t["split_k"] * 2}, {"split_k": t["split_k"] // 2},
        {"block_n": t["block_n"] // 2}, {"block_n": t["block_n"] * 2},
        {"block_k": t["block_k"] // 2}, {"block_k": t["block_k"] * 2},
        {"num_warps": 8 if t["num_warps"] == 4 else 4},
        {"num_stages": t["num_stages"] + 1}, {"num_stages": t["num_stages"] - 1},
        {"block_n": t["block_n"] * 2, "block_k": t["block_k"] // 2},
        {"block_n": t["block_n"] // 2, "block_k": t["block_k"] * 2},
    ]  # fmt: skip


def skinny_valid(shape: str, t: Tile) -> bool:
    """A tile the skinny GEMM compiles for the shape at 32 rows: power-of-two columns (32..256, whole tiles of the
    output) and K steps (32..256, whole steps of K), split-K 1..8, 4 or 8 warps, 2..7 stages whose pipeline fits
    `triton_skinny_gemm.SMEM_LIMIT`, the fp32 accumulators (gate_up: two) at most 128 values a thread; `cublas` 0/1
    (1: the shape stays on cuBLAS; the knobs are the tile it would go back to). The gated form runs the gate's K loop
    and then the up's, one pipeline at a time: its shared memory is the plain form's (sm_90 compiles of the first
    round's candidates, session 33: 128 x 64 at 5 stages takes 102,400 bytes, 5 x (128 + 32) x 64 x 2)."""
    gated = shape == "gate_up"
    n, k = LLAMA[shape]
    cols = n // 2 if gated else n
    smem = t["num_stages"] * (t["block_n"] + SKINNY_BM) * t["block_k"] * 2
    return (pow2(t["block_n"]) and 32 <= t["block_n"] <= 256 and cols % t["block_n"] == 0
            and pow2(t["block_k"]) and 32 <= t["block_k"] <= 256 and k % t["block_k"] == 0
            and 1 <= t["split_k"] <= 8 and t["num_warps"] in (4, 8) and 2 <= t["num_stages"] <= 7
            and smem <= 220 * 1024 and t["tma"] in (0, 1) and t["cublas"] in (0, 1)
            and (2 if gated else 1) * t["block_n"] * SKINNY_BM <= 128 * 32 * t["num_warps"])  # fmt: skip


def skinny_config(tile: Tile):
    """A tile as the `SkinnyGemmConfig` it launches, None for `cublas`."""
    from flotilla.kernels.triton_skinny_gemm import SkinnyGemmConfig

    return None if tile["cublas"] else SkinnyGemmConfig(**{k: v for k, v in tile.items() if k != "cublas"})


def _skinny_start(card: str | None, sms: int) -> Table:
    """Each shape's launch today at 32 rows: its table entry, `cublas` (with the lead tile) where the table keeps the
    shape on cuBLAS or has no entry (the dispatch's `table` mode runs only measured shapes)."""
    from flotilla.kernels.triton_skinny_gemm import configs, default_config

    table, out = configs(card), {}
    for shape in LLAMA:
        n, k, bm, gated = skinny_key(shape)
        c = default_config(bm, n // 2 if gated else n, k, sms, gated, card)
        out[shape] = {key: int(getattr(c, key)) for key in SKINNY_KNOBS[:-1]} | {"cublas": int(table.get(
            (n, k, bm, gated)) is None)}  # fmt: skip
    return out


def _skinny_apply(table: Table) -> None:
    from flotilla.kernels.triton_skinny_gemm import set_configs

    set_configs({skinny_key(s): skinny_config(t) for s, t in table.items()})


def skinny_spec(table: Table, card: str | None) -> str:
    """The card's whole skinny-GEMM table with the shapes of `table` replaced (`triton_skinny_gemm.table_spec`)."""
    from flotilla.kernels.triton_skinny_gemm import configs, table_spec

    return table_spec({**configs(card), **{skinny_key(s): skinny_config(t) for s, t in table.items()}})


def _skinny_adopt(table: Table, card: str | None) -> list[str]:
    spec = skinny_spec(table, card)
    return [f'triton_skinny_gemm.MEASURED_CONFIGS["{card}"] = "{spec}"', f'FLOTILLA_SKINNY_GEMM_CONFIGS="{spec}"']


SKINNY32 = Family(
    name="skinny32", shapes=dict(LLAMA), moves=_skinny_moves, valid=skinny_valid,
    hosts=(("triton_skinny_gemm", "skinny_gemm"),), quantization=None, model="/tmp/llama8b",
    dry_best={"qkv": {"tma": 1}, "o": {"block_n": 128, "block_k": 64}, "gate_up": {"num_stages": 4},
              "down": {"split_k": 4}},
    start=_skinny_start, apply=_skinny_apply, adopt=_skinny_adopt, knob_names=("config",),
    note=lambda s, t: "cuBLAS" if t["cublas"] else "", rows=SKINNY_BM, step="extend",
    launch=lambda t: None if t["cublas"] else {"config": skinny_config(t)},
)  # fmt: skip

FAMILIES = {f.name: f for f in (INT4, BF16, FP8, SKINNY32)}


def dry_start(family: Family) -> Table:
    """--dry-run's start: every shape at one tile of the family's knob space (no engine to ask)."""
    tiles = {
        "int4": {"block_n": 16, "block_w": 128, "num_warps": 4, "num_stages": 1, "split_k": 2, "layout": 1},
        "bf16": {"block_n": 8, "block_k": 512, "split_k": 1, "num_warps": 4, "num_stages": 2},
        "fp8": {"block_n": 16, "block_k": 512, "num_warps": 4, "prefetch": 2, "trigger": 0, "use_pdl": 1},
        "skinny32": {"block_n": 64, "block_k": 128, "split_k": 1, "num_warps": 4, "num_stages": 5, "tma": 0,
                     "cublas": 0},
    }[family.name]
    out = {s: dict(tiles) for s in family.shapes}
    if family.name == "bf16":
        out["gate_up"] = {"block_n": 4, "block_k": 512, "num_warps": 4, "num_stages": 3}
        out["qkv"] = dict(tiles, block_n=16)
    if family.name == "fp8":
        out["qkv"] = dict(tiles, block_n=8, prefetch=3)
    if family.name == "skinny32":  # the H200 table's 32-row entries (`triton_skinny_gemm.H200_CONFIGS`)
        out["o"] = dict(tiles, num_stages=6, tma=1)
        out["gate_up"] = dict(tiles, block_n=128, block_k=64, num_warps=8)
        out["down"] = dict(tiles, split_k=2)
    return out
