"""The wide int4 GEMV's tiles chosen INSIDE the engine: a coordinate descent over Llama-3.1-8B's four projections, each
candidate timed as whole batch-1 decode steps (the GEMVs launched by PDL back to back in a CUDA graph), not alone.

    python3 bench/int4_tile_sweep.py --model /tmp/llama8b-w4a16 --json tile-sweep.json [--budget-s 150]
    python3 bench/int4_tile_sweep.py --dry-run   # the descent on a made-up cost (no GPU): what it would try

The engine (compressed-tensors W4A16 g128 from bench/results/w4a16-model.sh, random codes under `--load-format
dummy`) starts once. A table is set in-process (`triton_int4_gemv_wide.set_wide_tiles`; the fused gated and rope forms
look their tiles up through the same table) and the batch-1 decode graphs are captured again
(`quant_gpu._recapture_decode`, ~0.1 s once the kernels are compiled). Steps:
- record: one capture with the int4 host functions wrapped, to note the operands each projection's launch gets (dtypes,
  strides, 16-byte alignment: what Triton specializes on);
- warm: worker processes rebuild such operands and launch every candidate once (`--warm-jobs` at once), so Triton's
  disk cache holds the kernels and the engine process only loads them (a compile is seconds of one CPU core);
- descent, shape by shape (`--shapes`): phases [incumbent, candidates..., incumbent], each phase a fresh request of
  512 random tokens, 3 settling steps and `--steps` timed steps (the median counts); the best candidate is taken when
  it beats the incumbent's mean by `--margin-us` and again in a confirming pair (candidate, incumbent); then the next
  shape from the table so far. `--budget-s` (from start) stops it, keeping what was taken;
- final: the start table against the descent's in the order orig new new orig (`--ab-steps` each), and the greedy
  tokens of a fixed prompt under both (a tile of another split or step sums in another order: equal expected, not
  bit-guaranteed).
Printed: SWEEP lines (the summary: each shape's pick, the A/B, the FLOTILLA_INT4_GEMV_WIDE_CONFIG value that selects
the table) and a line per phase. The JSON is rewritten after each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
KNOBS = ("block_n", "block_w", "num_warps", "num_stages", "split_k", "layout")
HEAD_DIM = 128  # Llama-3.1-8B: the rope form takes a qkv tile only if it holds whole rotation pairs of one head
Tile = dict[str, int]
Table = dict[str, Tile]


def candidates(tile: Tile, limit: int = 12) -> list[Tile]:
    """`tile` first, then its neighbours one knob away (split-K halved/doubled, rows a program halved/doubled, words a
    step 64/256, warps 2/8, one more stage, the other word layout) and split-K doubled with half the words a step;
    only what the kernel takes (powers of two, block_w a multiple of 4); at most `limit`."""
    moves: list[Tile] = [
        {"split_k": tile["split_k"] * 2}, {"split_k": tile["split_k"] // 2},
        {"block_n": tile["block_n"] // 2}, {"block_n": tile["block_n"] * 2},
        {"block_w": tile["block_w"] // 2}, {"block_w": tile["block_w"] * 2},
        {"num_warps": 8 if tile["num_warps"] == 4 else 4}, {"num_warps": 2 if tile["num_warps"] == 4 else 4},
        {"num_stages": tile["num_stages"] + 1}, {"layout": 1 - tile["layout"]},
        {"split_k": tile["split_k"] * 2, "block_w": tile["block_w"] // 2},
    ]  # fmt: skip
    out = [dict(tile)]
    for move in moves:
        cand = {**tile, **move}
        if _valid(cand) and cand not in out:
            out.append(cand)
    return out[:limit]


def _valid(t: Tile) -> bool:
    """A tile the wide kernel compiles: power-of-two rows (8..64) and words (32..256, whole 16-byte chunks), 2-8 warps,
    1-4 stages, split-K 1..8, layout 0/1."""
    def pow2(v: int) -> bool:
        return v > 0 and v & (v - 1) == 0

    return (pow2(t["block_n"]) and 8 <= t["block_n"] <= 64 and pow2(t["block_w"]) and 32 <= t["block_w"] <= 256
            and t["num_warps"] in (2, 4, 8) and 1 <= t["num_stages"] <= 4 and 1 <= t["split_k"] <= 8
            and t["layout"] in (0, 1))  # fmt: skip


def rope_fits(tile: Tile) -> bool:
    """Whether the qkv rope form takes this tile (`triton_rope_epilogue.fits_rope` at Llama's head width): else the
    engine runs the unfused pair there (GEMV + rotary/KV kernel), which the timing then includes."""
    b = tile["block_n"]
    return 2 <= b <= HEAD_DIM and (HEAD_DIM // 2) % (b // 2) == 0


def descend(table: Table, cands: dict[str, list[Tile]], time_table: Callable[[Table], float],
            out_of_time: Callable[[], bool], margin: float, log: Callable[[dict], None] = lambda r: None) -> Table:
    """Coordinate descent over the shapes of `cands` (in its order): per shape, phases [incumbent, each candidate,
    incumbent] (`time_table` of the whole table: ms a step); the fastest candidate is taken when it beats the mean of
    the incumbent's two phases by `margin` ms and again in a confirming pair (candidate, incumbent). Stops when
    `out_of_time()` (checked before each phase), keeping what was taken. Every phase goes to `log`. Pure: the engine
    is behind `time_table`."""
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


def sweep_rounds(table: Table, shapes: list[str], time_table: Callable[[Table], float], out_of_time: Callable[[], bool],
                 margin: float, limit: int, rounds: int,
                 before: Callable[[dict[str, list[Tile]]], None] = lambda c: None,
                 log: Callable[[dict], None] = lambda r: None) -> Table:
    """`descend` over each shape's `candidates` (at most `limit`), then again around the tiles it took: a later round
    goes over the shapes whose tile changed in the round before (their neighbourhood is new), at most `rounds` rounds.
    `before(cands)` runs ahead of each round's descent (the engine side compiles the candidates there)."""
    todo = list(shapes)
    for _ in range(rounds):
        if out_of_time():
            break
        cands = {s: candidates(table[s], limit) for s in todo}
        before(cands)
        new = descend(table, cands, time_table, out_of_time, margin, log)
        todo = [s for s in shapes if new[s] != table[s]]
        table = new
        if not todo or out_of_time():
            break
    return table


def tile_spec(table: Table, every_shape: Tile | None) -> str:
    """FLOTILLA_INT4_GEMV_WIDE_CONFIG selecting `table` (`_parse_tiles` syntax): the every-shape entry, then `NxK:`
    whole knobs per shape."""
    entries = [",".join(f"{k}={every_shape[k]}" for k in every_shape)] if every_shape else []
    for shape, tile in table.items():
        n, k = SHAPES[shape]
        entries.append(f"{n}x{k}:" + ",".join(f"{key}={tile[key]}" for key in KNOBS))
    return ";".join(entries)


def _short(t: Tile) -> str:
    return f"bn{t['block_n']} bw{t['block_w']} w{t['num_warps']} s{t['num_stages']} k{t['split_k']} L{t['layout']}"


# ---- the engine side (CUDA) ----


def start_table(sms: int) -> Table:
    """Each shape's tile as the engine launches it now (the PDL launch's lookup), as whole knobs."""
    from flotilla.kernels.triton_int4_gemv_wide import wide_config

    out = {}
    for shape, (n, k) in SHAPES.items():
        c = wide_config(1, n, k, sms, pdl=True)
        out[shape] = {key: int(getattr(c, key)) for key in KNOBS}
    return out


def set_table(engine, table: Table) -> float:
    """Put `table` in the wide GEMV's tables (both) and capture the batch-1 decode graphs again; seconds it took."""
    from quant_gpu import _recapture_decode

    from flotilla.kernels.triton_int4_gemv_wide import set_wide_tiles

    set_wide_tiles({SHAPES[s]: t for s, t in table.items()})
    return _recapture_decode(engine, 1)


def phase(engine, table: Table, vocab: int, steps: int, rng: random.Random) -> dict:
    """One timed phase under `table`: a fresh request of 512 tokens, 3 settling steps, `steps` timed steps."""
    from decode_steps import start_decoding, timed_steps

    from flotilla.engine.sampling_params import SamplingParams

    capture_s = set_table(engine, table)
    req = engine.add_request([rng.randrange(100, vocab) for _ in range(512)],
                             SamplingParams(temperature=0.0, max_tokens=steps + 16, ignore_eos=True))  # fmt: skip
    start_decoding(engine, [req])
    graphed: list[bool] = []
    times = timed_steps(engine, steps, lambda: graphed.append(engine.runner.last_step.graphed))
    engine.abort([req.request_id])
    return {"ms_median": 1e3 * statistics.median(times), "ms_mean": 1e3 * statistics.fmean(times),
            "graphed": sum(graphed), "steps": steps, "recapture_s": capture_s}  # fmt: skip


HOSTS = (("triton_int4_gemv_wide", "int4_gemv_wide"), ("triton_int4_gemv_fused", "int4_gemv_wide_gated"),
         ("triton_int4_gemv_fused", "int4_gemv_wide_rope"))  # fmt: skip


def _describe(v):
    """A launch operand as something a worker can rebuild: a tensor's dtype, shape, strides and 16-byte alignment
    (what Triton specializes on), anything else as it is."""
    import torch

    if isinstance(v, torch.Tensor):
        return ("T", str(v.dtype).removeprefix("torch."), tuple(v.shape), tuple(v.stride()), v.data_ptr() % 16)
    return ("V", v)


def _rebuild(d, device: str = "cuda"):
    """`_describe`'s tensor again on `device` (zeros; a tensor over 256 MiB, the KV cache, cut to 2 rows of
    its first dimension: same strides), with the same address modulo 16."""
    import torch

    if d[0] == "V":
        return d[1]
    _, dtype, shape, stride, align = d
    dtype = getattr(torch, dtype)
    size = torch.empty(0, dtype=dtype).element_size()
    shape = list(shape)
    if shape and size * max(1, 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True))) > 2**28:
        shape[0] = min(shape[0], 2)
    elems = 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True)) if all(shape) else 1
    base = torch.zeros(elems * size + 32, dtype=torch.uint8, device=device)
    off = (align - base.data_ptr() % 16) % 16
    return base[off:off + elems * size].view(dtype).as_strided(shape, stride)


def record(engine) -> dict[str, tuple[str, str, list, dict]]:
    """Per projection, the host call (module, function, operand descriptions) the engine's capture makes, from one
    capture with the host functions wrapped."""
    import importlib

    from quant_gpu import _recapture_decode

    seen: dict[str, tuple[str, str, list, dict]] = {}
    names = {v: s for s, v in SHAPES.items()}
    saved = []
    for mod_name, fn_name in HOSTS:
        mod = importlib.import_module(f"flotilla.kernels.{mod_name}")
        fn = getattr(mod, fn_name)
        saved.append((mod, fn_name, fn))

        def wrapped(*args, _fn=fn, _mod=mod_name, _name=fn_name, **kwargs):
            x, packed = args[0], args[1]
            shape = names.get((packed.shape[0], x.shape[-1]))
            if shape and x.reshape(-1, x.shape[-1]).shape[0] == 1 and shape not in seen:
                seen[shape] = (_mod, _name, [_describe(a) for a in args], {k: _describe(v) for k, v in kwargs.items()})
            return _fn(*args, **kwargs)

        setattr(mod, fn_name, wrapped)
    try:
        _recapture_decode(engine, 1)
    finally:
        for mod, fn_name, fn in saved:
            setattr(mod, fn_name, fn)
    return seen


def _warm_one(job) -> str:
    """A worker: the recorded host call launched once per candidate tile (compiled into Triton's disk cache)."""
    import importlib

    import torch

    mod_name, fn_name, args, kwargs, tiles, device = job
    fn = getattr(importlib.import_module(f"flotilla.kernels.{mod_name}"), fn_name)
    a = [_rebuild(d, device) for d in args]
    kw = {k: _rebuild(d, device) for k, d in kwargs.items()}
    failed = []
    for tile in tiles:
        try:
            fn(*a, **kw, **tile)
        except Exception as exc:  # the engine process compiles (or fails) it again
            failed.append(f"{_short(tile)}: {exc!r:.120}")
    if device == "cuda":
        torch.cuda.synchronize()
    return f"{fn_name} {len(tiles)} tiles, {len(failed)} failed {failed[:2]}"


def warm(seen: dict, cands: dict[str, list[Tile]], jobs: int) -> list[str]:
    """Every candidate of every recorded projection launched in `jobs` worker processes (spawned: CUDA)."""
    import concurrent.futures
    import multiprocessing

    work = []
    for shape, tiles in cands.items():
        if shape in seen:
            mod_name, fn_name, args, kwargs = seen[shape]
            work += [(mod_name, fn_name, args, kwargs, tiles[i:i + 2], "cuda") for i in range(0, len(tiles), 2)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max(1, jobs), mp_context=ctx) as pool:
        return list(pool.map(_warm_one, work))


def _counters_ready() -> None:
    """The split-K arrival counters of the plain and the fused kernels allocated now (outside any capture): a capture
    cannot allocate them, and a split tile captured without them would run as one range (fused) or with a reduce
    launch (plain), not as timed standalone."""
    import torch

    from flotilla.kernels import triton_int4_gemv, triton_int4_gemv_fused
    from flotilla.kernels.split_k_counters import arrival_counters

    device = torch.device("cuda", torch.cuda.current_device())
    arrival_counters(triton_int4_gemv._COUNTERS, device, 1, triton_int4_gemv._COUNTER_SLOTS)
    arrival_counters(triton_int4_gemv_fused._COUNTERS, device, 1, triton_int4_gemv_fused._COUNTER_SLOTS)


def dry_cost(table: Table) -> float:
    """`--dry-run`'s made-up step time (ms): per shape a bowl around a fixed tile, plus noise-free base."""
    best = {"qkv": {"split_k": 4}, "o": {"split_k": 4, "block_w": 64}, "gate_up": {"block_n": 32},
            "down": {"num_warps": 8}}
    cost = 2.6
    for shape, tile in table.items():
        cost += 0.004 * sum(tile.get(k) != v for k, v in best[shape].items())
    return cost


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="/tmp/llama8b-w4a16")
    p.add_argument("--json", default="int4-tile-sweep.json")
    p.add_argument("--shapes", default="o,qkv,down,gate_up", help="descent order (comma list of SHAPES' names)")
    p.add_argument("--steps", type=int, default=24, help="timed steps a descent phase")
    p.add_argument("--ab-steps", type=int, default=64, help="timed steps a final A/B phase")
    p.add_argument("--candidates", type=int, default=12, help="tiles per shape at most (the incumbent included)")
    p.add_argument("--margin-us", type=float, default=3.0, help="a candidate must beat the incumbent by this (us/step)")
    p.add_argument("--budget-s", type=float, default=150.0, help="seconds from start; the descent stops in time for "
                   "the final A/B (--reserve-s)")
    p.add_argument("--reserve-s", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=3, help="descent rounds at most (a round without a change ends it)")
    p.add_argument("--warm-jobs", type=int, default=max(1, min(12, (os.cpu_count() or 1) - 2)),
                   help="worker processes compiling the candidates (each holds a CUDA context: ~0.5 GB)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="the engine's (the rest: the workers)")
    p.add_argument("--dry-run", action="store_true", help="the descent on dry_cost (no GPU, no engine)")
    a = p.parse_args()
    t0 = time.perf_counter()
    shapes = [s for s in a.shapes.split(",") if s]
    assert all(s in SHAPES for s in shapes), f"--shapes: one of {list(SHAPES)}"
    if a.dry_run:
        table = {s: {"block_n": 16, "block_w": 128, "num_warps": 4, "num_stages": 1, "split_k": 2, "layout": 1}
                 for s in SHAPES}  # fmt: skip
        final = sweep_rounds(table, shapes, dry_cost, lambda: False, a.margin_us / 1e3, a.candidates, a.rounds,
                             log=lambda r: print(f"  {r['shape']:7s} {r['role']:17s} {_short(r['tile'])}: "
                                                 f"{r['ms']:.3f} ms"))  # fmt: skip
        for s in shapes:
            print(f"SWEEP {s}: {_short(table[s])} -> {_short(final[s])}")
        print(f"SWEEP dry-run: {dry_cost(table):.3f} -> {dry_cost(final):.3f} ms; "
              f"FLOTILLA_INT4_GEMV_WIDE_CONFIG=\"{tile_spec(final, None)}\"")
        return
    run_engine(a, shapes, t0)


def run_engine(a, shapes: list[str], t0: float) -> None:
    """The sweep in one int4 engine (module docstring)."""
    import logging

    import torch

    if not torch.cuda.is_available():
        print("skipped: bench/int4_tile_sweep.py needs a CUDA GPU (--dry-run runs the descent alone)")
        return
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    sys.path.insert(0, str(Path(__file__).parent))
    from int4_step_ab import greedy

    from flotilla.engine.llm import LLM
    from flotilla.kernels import triton_int4_gemv_wide as wide
    from flotilla.kernels.triton_utils import num_sms

    llm = LLM(a.model, load_format="dummy", max_model_len=512 + max(a.steps, a.ab_steps) + 128, max_num_seqs=4,
              max_num_batched_tokens=4096, enable_prefix_caching=False,
              gpu_memory_utilization=a.gpu_memory_utilization)  # fmt: skip
    engine = llm.engine
    vocab = engine.config.model.hf_config["vocab_size"]
    out: dict = {"command": " ".join(sys.argv), "startup_s": time.perf_counter() - t0,
                 "device": torch.cuda.get_device_name(), "phases": [], "warm": [],
                 "env": {k: v for k, v in os.environ.items() if k.startswith("FLOTILLA_")}}  # fmt: skip
    print(f"startup {out['startup_s']:.1f} s on {out['device']}", flush=True)

    def save() -> None:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")

    orig = start_table(num_sms(0))
    out["start_table"] = orig
    _counters_ready()
    try:
        seen = record(engine)
        out["recorded"] = {s: f"{v[0]}.{v[1]}" for s, v in seen.items()}
    except Exception as exc:  # no warm-up then: the engine compiles each tile on first use
        seen, out["recorded"] = {}, f"failed: {exc!r:.300}"
    rng = random.Random(0)
    deadline = t0 + a.budget_s - a.reserve_s

    def time_table(table: Table) -> float:
        try:
            ph = phase(engine, table, vocab, a.steps, rng)
        except Exception as exc:  # a tile that fails to compile or capture: never taken, the sweep goes on
            ph = {"ms_median": float("inf"), "error": f"{exc!r:.300}", "graphed": 0, "recapture_s": 0.0}
            print(f"  phase failed: {ph['error']}", flush=True)
        out["phases"].append(ph)
        return ph["ms_median"]

    def log(r: dict) -> None:
        ph = out["phases"][-1]
        r = {**r, **({} if r["role"] == "taken" else {k: ph[k] for k in ("graphed", "recapture_s")})}
        out.setdefault("descent", []).append(r)
        extra = "" if r["role"] == "taken" else \
            f" (graphed {r['graphed']}/{a.steps}, recapture {r['recapture_s']:.1f} s)"
        print(f"  {r['shape']:7s} {r['role']:17s} {_short(r['tile'])}: {r['ms']:.3f} ms{extra}", flush=True)
        save()

    warmed: set = set()
    out["rope_unfused"] = []

    def before(cands: dict[str, list[Tile]]) -> None:  # a round's candidates compiled by worker processes
        out.setdefault("candidates", []).append(cands)
        out["rope_unfused"] += [_short(t) for t in cands.get("qkv", []) if not rope_fits(t)]
        todo = {s: [t for t in ts if (s, tuple(t.values())) not in warmed] for s, ts in cands.items()}
        warmed.update((s, tuple(t.values())) for s, ts in cands.items() for t in ts)
        t = time.perf_counter()
        try:
            done = warm(seen, todo, a.warm_jobs) if a.warm_jobs > 0 and seen else ["none"]
        except Exception as exc:  # only a head start: the engine compiles what is missing
            done = [f"failed: {exc!r:.300}"]
        out["warm"].append({"s": time.perf_counter() - t, "jobs": done})
        print(f"warm round {len(out['warm'])}: {time.perf_counter() - t:.1f} s, shapes {list(cands)}, recorded "
              f"{out['recorded']}; {done}", flush=True)  # fmt: skip
        save()

    final = sweep_rounds(orig, shapes, time_table, lambda: time.perf_counter() > deadline, a.margin_us / 1e3,
                         a.candidates, a.rounds, before, log)  # fmt: skip
    out["final_table"] = final
    out["descent_stopped_early"] = time.perf_counter() > deadline
    every = wide._WIDE_TILES.get(None)
    out["config"] = tile_spec(final, every)
    save()
    if out["rope_unfused"]:
        print(f"SWEEP note: qkv tiles the rope form rejects (the engine runs GEMV + rotary/KV there): "
              f"{out['rope_unfused']}", flush=True)  # fmt: skip
    # the A/B: orig new new orig, longer phases
    ab: dict[str, list[float]] = {"orig": [], "new": []}
    for name in ("orig", "new", "new", "orig"):
        ph = phase(engine, orig if name == "orig" else final, vocab, a.ab_steps, rng)
        ab[name].append(ph["ms_median"])
        print(f"  ab {name}: {ph['ms_median']:.3f} ms median (mean {ph['ms_mean']:.3f}, graphed "
              f"{ph['graphed']}/{a.ab_steps})", flush=True)  # fmt: skip
    out["ab"] = {k: statistics.fmean(v) for k, v in ab.items()} | {"phases": ab}
    tokens = {}
    for name, table in (("orig", orig), ("new", final)):
        set_table(engine, table)
        tokens[name] = greedy(engine, vocab)
    out["tokens_equal"] = tokens["orig"] == tokens["new"]
    save()
    for s in shapes:
        print(f"SWEEP {s} {SHAPES[s][0]}x{SHAPES[s][1]}: {_short(orig[s])} -> {_short(final[s])}"
              + ("" if s != "qkv" or rope_fits(final[s]) else " (rope form rejects it: unfused pair)"))  # fmt: skip
    o, n = out["ab"]["orig"], out["ab"]["new"]
    print(f"SWEEP A/B bs1 ctx512 (orig new new orig, {a.ab_steps} steps each, median): orig {o:.3f} ms, new {n:.3f} ms "
          f"({1e3 * (n - o):+.1f} us); greedy tokens equal: {out['tokens_equal']}; descent "
          f"{'stopped by the budget' if out['descent_stopped_early'] else 'complete'}; "
          f"{len(out['phases'])} phases")  # fmt: skip
    print(f"SWEEP FLOTILLA_INT4_GEMV_WIDE_CONFIG=\"{out['config']}\"", flush=True)
    save()
    sys.stdout.flush()
    os._exit(0)  # skip the engine's teardown


if __name__ == "__main__":
    main()
