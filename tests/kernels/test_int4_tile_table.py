"""The wide int4 GEMV's tile table replaced in-process (`triton_int4_gemv_wide.set_wide_tiles`, what
bench/int4_tile_sweep.py does between captures): the lookup returns the new tile, the plain launch and the fused gated
form run it (an impossible tile fails the launch, a good one gives the explicit launch's bits), the PDL table follows
where it has entries, restoring brings the old table back; and the sweep's coordinate descent as a pure function."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_cases import DEVICE, rel_err, tolerance

from flotilla.kernels import triton_int4_gemv_wide as wide
from flotilla.kernels.packed_int_linear import pack_codes, packed_int_linear_ref

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import tile_descent  # noqa: E402 - bench/ is not a package
import tile_sweep as sweep  # noqa: E402
from tile_families import INT4, INT4_KNOBS, int4_spec, int4_valid, rope_fits  # noqa: E402

dry_cost = tile_descent.bowl_cost(INT4.dry_best)

N, K, GROUP = 48, 256, 128
TILE = {"block_n": 16, "block_w": 32, "num_warps": 4, "num_stages": 1, "split_k": 2, "layout": 1}


@pytest.fixture
def tables(monkeypatch):
    """The module's tables, put back after the test whatever it set."""
    monkeypatch.setattr(wide, "_WIDE_TILES", dict(wide._WIDE_TILES))
    monkeypatch.setattr(wide, "_PDL_TILES", dict(wide._PDL_TILES))


def _operands(n: int = N, k: int = K):
    g = torch.Generator().manual_seed(n + k)
    codes = torch.randint(0, 16, (n, k), generator=g)
    scales = (torch.rand(n, k // GROUP, generator=g) * 0.02 + 0.001).to(torch.bfloat16)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16)
    zeros = torch.full((n, k // GROUP), 8, dtype=torch.uint8)
    ref = packed_int_linear_ref(x.float(), pack_codes(codes, 4), scales.float(), zeros, 4, GROUP)
    return (x.to(DEVICE), pack_codes(codes, 4).to(DEVICE), scales.to(DEVICE), None, GROUP), ref


def _cfg(tile_n: int = N, pdl: bool = False) -> dict:
    c = wide.wide_config(1, tile_n, K, 132, pdl=pdl)
    return {key: getattr(c, key) for key in INT4_KNOBS}


def test_replaced_tile_is_looked_up_and_launched(tables):
    """After `set_wide_tiles` the lookup returns the new whole tile for that shape only; the launch without knobs runs
    it (bit-equal to the launch given the same knobs explicitly, the reference to rounding); a tile the kernel cannot
    take (words not whole 16-byte chunks) fails the knob-less launch, so the table does reach it; restoring gives the
    old lookup back."""
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide, restore_wide_tiles, set_wide_tiles

    args, ref = _operands()
    before, other = _cfg(), _cfg(N + 16)
    previous = set_wide_tiles({(N, K): TILE})
    assert _cfg() == TILE and _cfg(pdl=True) == TILE  # the PDL launch falls back to the plain table
    assert _cfg(N + 16) == other  # another shape keeps its tile
    out = int4_gemv_wide(*args, pdl="")
    explicit = {key: v for key, v in TILE.items()}
    assert torch.equal(out, int4_gemv_wide(*args, pdl="", **explicit))
    assert rel_err(out.cpu(), ref) < tolerance(torch.bfloat16)
    set_wide_tiles({(N, K): dict(TILE, block_w=6)})
    with pytest.raises(AssertionError):
        int4_gemv_wide(*args, pdl="")
    restore_wide_tiles(previous)
    assert _cfg() == before


def test_pdl_table_follows_where_it_has_entries(tables):
    """With FLOTILLA_INT4_WIDE_PDL_CONFIG entries (looked up first for PDL launches), the replaced tile goes there too;
    an empty PDL table stays empty."""
    from flotilla.kernels.triton_int4_gemv import _parse_tiles
    from flotilla.kernels.triton_int4_gemv_wide import restore_wide_tiles, set_wide_tiles

    wide._PDL_TILES = {}
    previous = set_wide_tiles({(N, K): TILE})
    assert wide._PDL_TILES == {}
    restore_wide_tiles(previous)
    wide._PDL_TILES = _parse_tiles("block_n=32,block_w=64")
    assert _cfg(pdl=True)["block_n"] == 32
    set_wide_tiles({(N, K): TILE})
    assert _cfg(pdl=True) == TILE and _cfg() == TILE


def test_gated_form_follows_the_replaced_tile(tables):
    """The fused gated form looks its tile up through the same table: with a replaced tile (split-K 2, layout 1) it
    equals the plain GEMV given that tile explicitly, then SiLU-and-mul, bit for bit."""
    from flotilla.kernels.triton_activation import silu_and_mul
    from flotilla.kernels.triton_int4_gemv_fused import int4_gemv_wide_gated
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide, set_wide_tiles

    args, _ = _operands(2 * 32)
    set_wide_tiles({(64, K): TILE})
    got = int4_gemv_wide_gated(*args, pdl="", pdl_gdc=False)
    assert torch.equal(got, silu_and_mul(int4_gemv_wide(*args, pdl="", **TILE)))


def test_candidates_are_the_current_tile_then_valid_neighbours():
    """The incumbent first, no duplicates, only tiles the kernel compiles; the rope form's head rule."""
    start = {"block_n": 16, "block_w": 128, "num_warps": 4, "num_stages": 1, "split_k": 2, "layout": 1}
    cands = INT4.candidates("o", start)
    assert cands[0] == start and len(cands) == len({tuple(sorted(c.items())) for c in cands}) > 8
    assert all(int4_valid("o", c) for c in cands)
    assert {"block_n": 16, "block_w": 128, "num_warps": 4, "num_stages": 1, "split_k": 4, "layout": 1} in cands
    assert len(INT4.candidates("o", start, limit=3)) == 3
    assert not int4_valid("o", dict(start, block_w=96)) and not int4_valid("o", dict(start, split_k=16))
    assert rope_fits(16) and rope_fits(64) and not rope_fits(256)


def _start() -> dict:
    return {s: {"block_n": 16, "block_w": 128, "num_warps": 4, "num_stages": 1, "split_k": 2, "layout": 1}
            for s in INT4.shapes}  # fmt: skip


def test_descent_finds_each_shapes_best_and_keeps_ties():
    """On a separable cost (`dry_cost`) the descent takes each shape's cheaper neighbour, shape after shape, each
    through a confirming pair; a cost where nothing beats the incumbent by the margin leaves the table alone."""
    table = _start()
    cands = {s: INT4.candidates(s, table[s]) for s in ("o", "qkv", "down", "gate_up")}
    log: list[dict] = []
    final = tile_descent.descend(table, cands, dry_cost, lambda: False, 0.001, log.append)
    assert final["down"]["num_warps"] == 8 and final["gate_up"]["block_n"] == 32
    assert final["o"]["split_k"] == 4 and final["qkv"]["split_k"] == 4
    assert dry_cost(final) < dry_cost(table) and table == _start()  # the input is not changed
    assert [r["shape"] for r in log if r["role"] == "taken"] == ["o", "qkv", "down", "gate_up"]
    flat = tile_descent.descend(table, cands, lambda t: 2.6, lambda: False, 0.001)
    assert flat == table
    # a tile whose phase failed (the engine side times it as inf) is never taken; the others still are
    failing = tile_descent.descend(table, cands, lambda t: float("inf") if t["down"]["num_warps"] == 8 else dry_cost(t),
                            lambda: False, 0.001)  # fmt: skip
    assert failing["down"] == table["down"] and failing["gate_up"] == final["gate_up"]
    spec = int4_spec(final, {"block_n": 16})
    from flotilla.kernels.triton_int4_gemv import _parse_tiles

    parsed = _parse_tiles(spec)
    assert parsed[None] == {"block_n": 16} and parsed[(4096, 14336)] == final["down"]


def test_descent_stops_when_out_of_time():
    """The budget: no phase after `out_of_time()`; what was taken before stays, nothing after."""
    table = _start()
    cands = {s: INT4.candidates(s, table[s]) for s in ("o", "qkv")}
    phases = []

    def cost(t):
        phases.append(1)
        return dry_cost(t)

    final = tile_descent.descend(table, cands, cost, lambda: len(phases) >= 16, 0.001)
    assert len(phases) == 16  # o's 15 phases (incumbent, 11 candidates, incumbent, confirm pair), then qkv's first
    assert final["o"]["split_k"] == 4 and final["qkv"] == table["qkv"]
    assert tile_descent.descend(table, cands, cost, lambda: True, 0.001) == table


def test_dry_run_prints_the_config():
    """`--dry-run` runs the descent without a GPU and prints the FLOTILLA_INT4_GEMV_WIDE_CONFIG line."""
    out = subprocess.run([sys.executable, str(BENCH / "int4_tile_sweep.py"), "--dry-run", "--shapes", "down"],
                         capture_output=True, text=True, check=True, timeout=120).stdout  # fmt: skip
    assert "SWEEP down:" in out and "num_warps=8" in out.split("FLOTILLA_INT4_GEMV_WIDE_CONFIG=")[1]


def test_rounds_revisit_only_the_shapes_that_changed():
    """`sweep_rounds`: round 1 over every shape; a later round over those whose tile changed (their new neighbourhood),
    until a round changes nothing; `before` sees each round's candidates (where the engine side compiles them)."""
    seen: list[list[str]] = []
    cost = lambda t: dry_cost(t) - (0.002 if t["down"]["num_warps"] == 8 and t["down"]["split_k"] == 4 else 0)  # noqa: E731
    final = tile_descent.sweep_rounds(_start(), ["o", "down"], INT4.candidates, cost, lambda: False, 0.001, 5,
                                      lambda c: seen.append(list(c)))  # fmt: skip
    assert seen == [["o", "down"], ["o", "down"], ["down"]]
    assert final["down"]["num_warps"] == 8 and final["down"]["split_k"] == 4  # two knobs away: found in round 2


def test_warm_job_rebuilds_the_recorded_operands():
    """The warm-up's worker side: operands described in the engine process (dtype, shape, strides, address modulo 16:
    what Triton specializes on) come back alike, a KV-cache-sized one cut to 2 rows of its first dimension (same
    strides); a job launches each candidate through the recorded host function (plain and gated) and counts the
    tiles that fail."""
    args, _ = _operands()
    x = torch.zeros(1, K + 4, dtype=torch.bfloat16, device=DEVICE)[:, 4:]  # 8 bytes past a 16-byte boundary
    desc = [sweep._describe(v) for v in (x, *args[1:])]
    assert desc[3] == ("V", None) and desc[4] == ("V", GROUP)
    again = sweep._rebuild(desc[0], DEVICE)
    assert (again.dtype, again.shape, again.stride()) == (x.dtype, x.shape, x.stride())
    assert again.data_ptr() % 16 == x.data_ptr() % 16 == 8
    cache = sweep._rebuild(("T", "bfloat16", (100_000, 16, 8, 128), (16384, 1024, 128, 1), 0), DEVICE)
    assert cache.shape == (2, 16, 8, 128) and cache.stride() == (16384, 1024, 128, 1) and cache.data_ptr() % 16 == 0
    done = sweep._warm_one(("triton_int4_gemv_wide", "int4_gemv_wide", desc, {}, [TILE, dict(TILE, block_w=6)],
                            DEVICE))  # fmt: skip
    assert "2 tiles, 1 failed" in done
    gate_up, _ = _operands(64)
    desc = [sweep._describe(v) for v in gate_up]
    assert "1 tiles, 0 failed" in sweep._warm_one(("triton_int4_gemv_fused", "int4_gemv_wide_gated", desc, {}, [TILE],
                                                   DEVICE))  # fmt: skip
