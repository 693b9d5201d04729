"""The coordinate descent of bench/tile_sweep.py, pure: a table of per-projection tiles, each shape's candidates (the
incumbent and its one-knob neighbours, from the kernel family's moves), and a cost that times a whole table.

No GPU, no engine: the engine side (tile_sweep.py) passes `time_table` (ms a decode step under a table); tests and
`--dry-run` pass a made-up cost.
"""

from __future__ import annotations

from collections.abc import Callable

Tile = dict[str, int]
Table = dict[str, Tile]


def neighbours(tile: Tile, moves: list[Tile], valid: Callable[[Tile], bool], limit: int = 12) -> list[Tile]:
    """`tile` first, then `tile` with each of `moves` applied (a move: the knobs it sets) where `valid` holds, each
    once; at most `limit`."""
    out = [dict(tile)]
    for move in moves:
        cand = {**tile, **move}
        if valid(cand) and cand not in out:
            out.append(cand)
    return out[:limit]


def descend(table: Table, cands: dict[str, list[Tile]], time_table: Callable[[Table], float],
            out_of_time: Callable[[], bool], margin: float, log: Callable[[dict], None] = lambda r: None) -> Table:
    """Coordinate descent over the shapes of `cands` (in its order): per shape, phases [incumbent, each candidate,
    incumbent] (`time_table` of the whole table: ms a step); the fastest candidate is taken when it beats the mean of
    the incumbent's two phases by `margin` ms and again in a confirming pair (candidate, incumbent). Stops when
    `out_of_time()` (checked before each phase), keeping what was taken. Every phase goes to `log`."""
    table = {s: dict(t) for s, t in table.items()}

    def timed(shape: str, tile: Tile, role: str) -> float | None:
        if out_of_time():
            return None
        ms = time_table({**table, shape: tile})
        log({"shape": shape, "role": role, "tile": dict(tile), "ms": ms})
        return ms

    for shape, tiles in cands.items():
        first = timed(shape, table[shape], "incumbent")
        if first is None:
            break
        times = {}
        for i, tile in enumerate(tiles):
            if tile == table[shape]:
                continue
            ms = timed(shape, tile, "candidate")
            if ms is None:
                break
            times[i] = ms
        last = timed(shape, table[shape], "incumbent")
        if last is None:
            break
        if not times:
            continue
        best = min(times, key=times.__getitem__)
        if times[best] >= (first + last) / 2 - margin:
            continue
        again = timed(shape, tiles[best], "confirm")
        inc = timed(shape, table[shape], "confirm_incumbent")
        if again is None or inc is None:
            break
        if again < inc - margin:
            table[shape] = dict(tiles[best])
            log({"shape": shape, "role": "taken", "tile": dict(tiles[best]), "ms": again})
    return table


def sweep_rounds(table: Table, shapes: list[str], candidates: Callable[[str, Tile], list[Tile]],
                 time_table: Callable[[Table], float], out_of_time: Callable[[], bool], margin: float, rounds: int,
                 before: Callable[[dict[str, list[Tile]]], None] = lambda c: None,
                 log: Callable[[dict], None] = lambda r: None) -> Table:
    """`descend` over each shape's `candidates(shape, tile)`, then again around the tiles it took: a later round goes
    over the shapes whose tile changed in the round before (their neighbourhood is new), at most `rounds` rounds.
    `before(cands)` runs ahead of each round's descent (the engine side compiles the candidates there)."""
    todo = list(shapes)
    for _ in range(rounds):
        if out_of_time():
            break
        cands = {s: candidates(s, table[s]) for s in todo}
        before(cands)
        new = descend(table, cands, time_table, out_of_time, margin, log)
        todo = [s for s in shapes if new[s] != table[s]]
        table = new
        if not todo or out_of_time():
            break
    return table


def bowl_cost(best: dict[str, Tile], base: float = 2.6, step: float = 0.004) -> Callable[[Table], float]:
    """`--dry-run`'s made-up step time (ms): per shape a bowl around the knobs of `best` (each knob away from it costs
    `step`), plus `base`."""

    def cost(table: Table) -> float:
        return base + step * sum(tile.get(k) != v for shape, tile in table.items() for k, v in best[shape].items())

    return cost
