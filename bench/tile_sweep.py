"""One-row GEMV tiles chosen INSIDE the engine, per kernel family (bench/tile_families.py: int4, bf16, fp8): a
coordinate descent over Llama-3.1-8B's projections, each candidate timed as whole batch-1 decode steps (the GEMVs
launched by PDL back to back in a CUDA graph, the fused gated/rope forms as the engine runs them), not alone.

    python3 bench/tile_sweep.py --family bf16 --json bf16-sweep.json [--budget-s 200]
    python3 bench/tile_sweep.py --family fp8 --json fp8-sweep.json          # the engine with --quantization fp8
    python3 bench/tile_sweep.py --family int4 --model /tmp/llama8b-w4a16    # bench/int4_tile_sweep.py
    python3 bench/tile_sweep.py --family skinny32 --json skinny-sweep.json  # a cached-prefix extend's 32-row GEMMs
    python3 bench/tile_sweep.py --family fp8 --dry-run   # the descent on a made-up cost (no GPU): what it would try

The engine (`--load-format dummy`: random weights of the model directory's shape; bench/model_dirs.py and
bench/results/w4a16-model.sh write them) starts once. A table is set in-process (the family's `apply`) and the batch-1
decode graphs are captured again (`quant_gpu._recapture_decode`, ~0.1 s once the kernels are compiled). Steps:
- record: one capture and one short greedy request with the family's host functions wrapped, to note the operands
  each projection's launch gets (dtypes, strides, 16-byte alignment: what Triton specializes on; the LM head runs
  after the graph, so only the request sees it);
- warm: worker processes rebuild such operands and launch every candidate once (`--warm-jobs` at once), so Triton's
  disk cache holds the kernels and the engine process only loads them (a compile is seconds of one CPU core);
- descent, shape by shape (`--shapes`): phases [incumbent, candidates..., incumbent], each phase a fresh request of
  512 random tokens, 3 settling steps and `--steps` timed steps (the median counts); the best candidate is taken when
  it beats the incumbent's mean by `--margin-us` and again in a confirming pair (candidate, incumbent); then the next
  shape from the table so far (bench/tile_descent.py). `--budget-s` (from start) stops it, keeping what was taken;
- final: the start table against the descent's in the order orig new new orig (`--ab-steps` each), and the greedy
  tokens of a fixed prompt under both (a tile of another split or step sums in another order: equal expected, not
  bit-guaranteed).
The `extend` family (skinny32: the skinny GEMM's 32-row tiles, `cublas` one of each shape's candidates) times
instead a cached-prefix request's step, 20 new tokens over 2,000 cached ones (issue 19's TTFT), as replays of the
engine's one-sequence mixed graph of 32 rows (bench/extend_graph.py: the step recorded once, each phase that one graph
captured again and replayed `--steps` times between CUDA events); the engine runs with prefix caching on; its greedy
check is a cached-prefix request's tokens (the first from that graph).
Printed: SWEEP lines (the summary: each shape's pick, the A/B, the lines that adopt the table for the card it ran on:
its per-card table entry and the environment variables that select it) and a line per phase. The JSON is rewritten
after each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from tile_descent import Table, Tile, bowl_cost, sweep_rounds
from tile_families import FAMILIES, Family, dry_start


def short(t: Tile) -> str:
    """A tile in one short line (`block_n=16` -> `bn16`)."""
    return " ".join(f"{''.join(w[0] for w in k.split('_'))}{v}" for k, v in t.items())


# ---- the engine side (CUDA) ----


class DecodeSteps:
    """What a phase of the GEMV families times: batch-1 decode steps (`recapture`: the batch-1 decode graphs; `time`:
    a fresh request of 512 tokens, 3 settling steps, `steps` timed steps; `greedy`: a fixed prompt's tokens).
    bench/extend_graph.py's `ExtendGraph` is the same for the `extend` families."""

    label = "bs1 ctx512"  # the SWEEP A/B line's name for what is timed

    def __init__(self, engine, vocab: int, rng: random.Random) -> None:
        self.engine, self.vocab, self.rng = engine, vocab, rng

    def recapture(self) -> float:
        """The batch-1 decode graphs captured again; the seconds it took."""
        from quant_gpu import _recapture_decode

        return _recapture_decode(self.engine, 1)

    def time(self, steps: int) -> dict:
        """A fresh request's `steps` timed decode steps (`decode_steps.one_request_phase`)."""
        from decode_steps import one_request_phase

        return one_request_phase(self.engine, self.vocab, steps, self.rng)

    def greedy(self, tokens: int = 32) -> list[int]:
        """A fixed prompt's greedy tokens."""
        from int4_step_ab import greedy

        return greedy(self.engine, self.vocab, tokens)

    def describe(self) -> dict:
        """What is timed."""
        return {"decode_batch": 1, "context": 512}


def phase(bench, family: Family, table: Table, steps: int) -> dict:
    """One timed phase under `table`: set in-process, the bench's graphs captured again, then timed (`bench.time`)."""
    family.apply(table)
    capture_s = bench.recapture()
    return bench.time(steps) | {"recapture_s": capture_s}


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


def record(bench, family: Family) -> dict[str, tuple[str, str, list, dict]]:
    """Per projection, the host call (module, function, operand descriptions; knob keywords left out) the engine
    makes at the family's rows (`Family.rows`), with the family's host functions wrapped: the decode families from
    one capture and one short greedy request, the extend ones from one capture of the extend's graph."""
    import importlib

    seen: dict[str, tuple[str, str, list, dict]] = {}
    names = {v: s for s, v in family.shapes.items()}
    saved = []
    for mod_name, fn_name in family.hosts:
        mod = importlib.import_module(f"flotilla.kernels.{mod_name}")
        fn = getattr(mod, fn_name)
        saved.append((mod, fn_name, fn))

        def wrapped(*args, _fn=fn, _mod=mod_name, _name=fn_name, **kwargs):
            x, weight = args[0], args[1]
            shape = names.get((weight.shape[0], x.shape[-1]))
            if shape and x.reshape(-1, x.shape[-1]).shape[0] == family.rows and shape not in seen:
                kw = {k: _describe(v) for k, v in kwargs.items() if k not in family.knob_names}
                seen[shape] = (_mod, _name, [_describe(a) for a in args], kw)
            return _fn(*args, **kwargs)

        setattr(mod, fn_name, wrapped)
    try:
        bench.recapture()
        if family.step == "decode":
            bench.greedy(tokens=2)
    finally:
        for mod, fn_name, fn in saved:
            setattr(mod, fn_name, fn)
    return seen


def _warm_one(job) -> str:
    """A worker: the recorded host call launched once per candidate tile, given as keywords (compiled into Triton's
    disk cache)."""
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
            failed.append(f"{short(tile)}: {exc!r:.120}")
    if device == "cuda":
        torch.cuda.synchronize()
    return f"{fn_name} {len(tiles)} tiles, {len(failed)} failed {failed[:2]}"


def warm(seen: dict, cands: dict[str, list[Tile]], jobs: int, launch=dict) -> list[str]:
    """Every candidate of every recorded projection launched in `jobs` worker processes (spawned: CUDA), each as the
    keywords `launch` gives it (`Family.launch`; a candidate it maps to None runs no kernel of the family)."""
    import concurrent.futures
    import multiprocessing

    work = []
    for shape, tiles in cands.items():
        if shape in seen:
            mod_name, fn_name, args, kwargs = seen[shape]
            kws = [kw for kw in map(launch, tiles) if kw is not None]
            work += [(mod_name, fn_name, args, kwargs, kws[i:i + 2], "cuda") for i in range(0, len(kws), 2)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max(1, jobs), mp_context=ctx) as pool:
        return list(pool.map(_warm_one, work))


def _counters_ready(family: Family) -> None:
    """int4: the split-K arrival counters of the plain and the fused kernels allocated now (outside any capture): a
    capture cannot allocate them, and a split tile captured without them would run as one range (fused) or with a
    reduce launch (plain), not as timed standalone."""
    if family.name != "int4":
        return
    import torch

    from flotilla.kernels import triton_int4_gemv, triton_int4_gemv_fused
    from flotilla.kernels.split_k_counters import arrival_counters

    device = torch.device("cuda", torch.cuda.current_device())
    arrival_counters(triton_int4_gemv._COUNTERS, device, 1, triton_int4_gemv._COUNTER_SLOTS)
    arrival_counters(triton_int4_gemv_fused._COUNTERS, device, 1, triton_int4_gemv_fused._COUNTER_SLOTS)


def parse_args(argv: list[str] | None = None, family: str = "bf16") -> argparse.Namespace:
    """The command line (module docstring); `family` is --family's default (bench/int4_tile_sweep.py: int4)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default=family, choices=sorted(FAMILIES))
    p.add_argument("--model", default=None, help="default: the family's (/tmp/llama8b, /tmp/llama8b-w4a16)")
    p.add_argument("--json", default=None, help="default: FAMILY-tile-sweep.json")
    p.add_argument("--shapes", default=None, help="descent order (comma list of the family's shapes; default: o, "
                   "qkv, down, gate_up, then lm_head for bf16)")
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
    p.add_argument("--dry-run", action="store_true", help="the descent on a made-up cost (no GPU, no engine)")
    a = p.parse_args(argv)
    fam = FAMILIES[a.family]
    a.model = a.model or fam.model
    a.json = a.json or f"{a.family}-tile-sweep.json"
    order = [s for s in ("o", "qkv", "down", "gate_up", "lm_head") if s in fam.shapes]
    a.shapes = [s for s in a.shapes.split(",") if s] if a.shapes else order
    if not all(s in fam.shapes for s in a.shapes):
        p.error(f"--shapes: of {list(fam.shapes)}")
    return a


def main(argv: list[str] | None = None, family: str = "bf16") -> None:
    """The command line's sweep (module docstring)."""
    a = parse_args(argv, family)
    t0 = time.perf_counter()
    fam = FAMILIES[a.family]
    if a.dry_run:
        dry_run(a, fam)
        return
    run_engine(a, fam, t0)


def dry_run(a: argparse.Namespace, fam: Family) -> None:
    """The descent on `tile_descent.bowl_cost` around the family's made-up optimum, from `dry_start`: what it would
    try, and the SWEEP lines."""
    table = dry_start(fam)
    cost = bowl_cost(fam.dry_best)
    final = sweep_rounds(table, a.shapes, lambda s, t: fam.candidates(s, t, a.candidates), cost, lambda: False,
                         a.margin_us / 1e3, a.rounds,
                         log=lambda r: print(f"  {r['shape']:7s} {r['role']:17s} {short(r['tile'])}: "
                                             f"{r['ms']:.3f} ms"))  # fmt: skip
    for s in a.shapes:
        print(f"SWEEP {s}: {short(table[s])} -> {short(final[s])}")
    print(f"SWEEP dry-run {fam.name}: {cost(table):.3f} -> {cost(final):.3f} ms")
    for line in adopt_lines(fam, final, "dry-run"):
        print(f"SWEEP adopt: {line}")


def adopt_lines(fam: Family, table: Table, card: str | None) -> list[str]:
    """The family's adopt lines; on a machine without the engine's kernels (dry-run, CPU) the pure ones."""
    try:
        return fam.adopt(table, card)
    except ImportError as exc:  # dry-run where flotilla is not importable
        return [f"(no adopt lines: {exc})"]


def run_engine(a: argparse.Namespace, fam: Family, t0: float) -> None:
    """The sweep in one engine of the family's weights (module docstring)."""
    import logging

    import torch

    if not torch.cuda.is_available():
        print("skipped: bench/tile_sweep.py needs a CUDA GPU (--dry-run runs the descent alone)")
        return
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from flotilla.engine.llm import LLM
    from flotilla.kernels.card_tables import card_name
    from flotilla.kernels.triton_utils import num_sms

    extend = fam.step == "extend"
    if extend:  # bench/prefix.py's engine of prefix7-gpu.sh: prefix caching on, its length and token budget
        from extend_graph import MAX_MODEL_LEN

        sizes = {"max_model_len": MAX_MODEL_LEN, "max_num_batched_tokens": 8192}
    else:
        sizes = {"max_model_len": 512 + max(a.steps, a.ab_steps) + 128, "max_num_batched_tokens": 4096}
    llm = LLM(a.model, load_format="dummy", quantization=fam.quantization, max_num_seqs=4, **sizes,
              enable_prefix_caching=extend, gpu_memory_utilization=a.gpu_memory_utilization)  # fmt: skip
    engine = llm.engine
    vocab = engine.config.model.hf_config["vocab_size"]
    card = card_name(torch.cuda.current_device())
    out: dict = {"command": " ".join(sys.argv), "family": fam.name, "startup_s": time.perf_counter() - t0,
                 "device": card, "phases": [], "warm": [],
                 "env": {k: v for k, v in os.environ.items() if k.startswith("FLOTILLA_")}}  # fmt: skip
    print(f"startup {out['startup_s']:.1f} s on {card} ({fam.name})", flush=True)
    rng = random.Random(0)
    if extend:
        from extend_graph import ExtendGraph

        bench = ExtendGraph(engine, vocab, rng)
    else:
        bench = DecodeSteps(engine, vocab, rng)
    out["timed"] = bench.describe()
    print(f"timed: {out['timed']}", flush=True)

    def save() -> None:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")

    orig = fam.start(card, num_sms(torch.cuda.current_device()))
    shapes = [s for s in a.shapes if s in orig]  # bf16's LM head only where the Triton GEMV runs it
    out["start_table"] = orig
    _counters_ready(fam)
    try:
        seen = record(bench, fam)
        out["recorded"] = {s: f"{v[0]}.{v[1]}" for s, v in seen.items()}
    except Exception as exc:  # no warm-up then: the engine compiles each tile on first use
        seen, out["recorded"] = {}, f"failed: {exc!r:.300}"
    deadline = t0 + a.budget_s - a.reserve_s

    def time_table(table: Table) -> float:
        try:
            ph = phase(bench, fam, table, a.steps)
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
        print(f"  {r['shape']:7s} {r['role']:17s} {short(r['tile'])}: {r['ms']:.3f} ms{extra}", flush=True)
        save()

    warmed: set = set()
    out["notes"] = []

    def before(cands: dict[str, list[Tile]]) -> None:  # a round's candidates compiled by worker processes
        out.setdefault("candidates", []).append(cands)
        out["notes"] += [f"{s} {short(t)}: {fam.note(s, t)}" for s, ts in cands.items() for t in ts if fam.note(s, t)]
        todo = {s: [t for t in ts if (s, tuple(t.items())) not in warmed] for s, ts in cands.items()}
        warmed.update((s, tuple(t.items())) for s, ts in cands.items() for t in ts)
        t = time.perf_counter()
        try:
            done = warm(seen, todo, a.warm_jobs, fam.launch) if a.warm_jobs > 0 and seen else ["none"]
        except Exception as exc:  # only a head start: the engine compiles what is missing
            done = [f"failed: {exc!r:.300}"]
        out["warm"].append({"s": time.perf_counter() - t, "jobs": done})
        print(f"warm round {len(out['warm'])}: {time.perf_counter() - t:.1f} s, shapes {list(cands)}, recorded "
              f"{out['recorded']}; {done}", flush=True)  # fmt: skip
        save()

    final = sweep_rounds(orig, shapes, lambda s, t: fam.candidates(s, t, a.candidates), time_table,
                         lambda: time.perf_counter() > deadline, a.margin_us / 1e3, a.rounds, before, log)  # fmt: skip
    out["final_table"] = final
    out["descent_stopped_early"] = time.perf_counter() > deadline
    out["adopt"] = fam.adopt(final, card)  # the last line: the environment variables that select the table
    out["config"] = out["adopt"][-1]
    if fam.name == "int4":  # bench/results/tile20-gpu.sh's summary prints FLOTILLA_INT4_GEMV_WIDE_CONFIG="<config>"
        out["config"] = out["config"].partition("=")[2].strip('"')
    save()
    if out["notes"]:
        print(f"SWEEP note: {out['notes']}", flush=True)
    final_ab(bench, fam, orig, final, a, out)
    save()
    for s in shapes:
        note = fam.note(s, final[s])
        print(f"SWEEP {s} {fam.shapes[s][0]}x{fam.shapes[s][1]}: {short(orig[s])} -> {short(final[s])}"
              + (f" ({note})" if note else ""))  # fmt: skip
    o, n = out["ab"]["orig"], out["ab"]["new"]
    print(f"SWEEP {fam.name} A/B {bench.label} on {card} (orig new new orig, {a.ab_steps} steps each, median): orig "
          f"{o:.3f} ms, new {n:.3f} ms ({1e3 * (n - o):+.1f} us); greedy tokens equal: {out['tokens_equal']}; descent "
          f"{'stopped by the budget' if out['descent_stopped_early'] else 'complete'}; {len(out['phases'])} phases")
    for line in out["adopt"]:
        print(f"SWEEP adopt: {line}")
    if fam.name == "int4":  # the line bench/results/tile20-gpu.sh's readers look for
        print(f"SWEEP FLOTILLA_INT4_GEMV_WIDE_CONFIG=\"{out['config']}\"", flush=True)
    save()
    sys.stdout.flush()
    os._exit(0)  # skip the engine's teardown


def final_ab(bench, fam: Family, orig: Table, final: Table, a, out: dict) -> None:
    """The start table against the descent's (orig new new orig, longer phases) and the greedy tokens under both."""
    ab: dict[str, list[float]] = {"orig": [], "new": []}
    for name in ("orig", "new", "new", "orig"):
        ph = phase(bench, fam, orig if name == "orig" else final, a.ab_steps)
        ab[name].append(ph["ms_median"])
        print(f"  ab {name}: {ph['ms_median']:.3f} ms median (mean {ph['ms_mean']:.3f}, graphed "
              f"{ph['graphed']}/{a.ab_steps})", flush=True)  # fmt: skip
    out["ab"] = {k: statistics.fmean(v) for k, v in ab.items()} | {"phases": ab}
    tokens = {}
    for name, table in (("orig", orig), ("new", final)):
        fam.apply(table)
        bench.recapture()
        tokens[name] = bench.greedy()
    out["tokens_equal"] = tokens["orig"] == tokens["new"]
    out["tokens"] = tokens


if __name__ == "__main__":
    main()
