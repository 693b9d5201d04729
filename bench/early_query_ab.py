"""Paged decode attention's early query against the plain kernel, one process (issue 19: batch 1 x 4,096).

    python3 bench/early_query_ab.py --json attn24.json [--shapes b1e,b1fix,b64s,b64l,b1] [--pairs 2] [--workers 12]
    python3 bench/early_query_ab.py --json short.json --shapes e1s,e1k,b1fix   # the short-table launches (s34)

A split program of `kernels/triton_paged_decode.py` asks for its first K/V only after two dependent L2 round trips
(the sequence's length, then its query row and the query, which the compiled kernel stores to shared memory ahead
of the loop's first cp.async). Forms (`FORMS`): "query" (FLOTILLA_DECODE_EARLY_QUERY: the query read at the
sequence's index in the first round trip) against "plain". Shapes (Llama-3.1-8B heads, bf16 pool, 16-token
pages, tables shuffled over pools larger than the L2, CUDA graphs of back-to-back calls, `bench/kernels.py::graph_ms`):
"b1e" batch 1 in the engine's conditions (context 4,160 in a 4,288-token table: the figure issue 19 quotes, 9.77 us
on the H200 in session 23), "b1fix" the engine launch's grid and merge with one tile a program (its fixed cost; b1e
minus it: the streaming of the other three tiles), "b64s" batch 64 x 512 and "b64l" batch 64 x 4,096 (the general
launch: the env switches leave it alone; the rows pass the forms explicitly to show what they would do there), "b1"
batch 1 x 4,096 in a 4,096 table; first the floors of one launch in the same timing (`floors`). At batch 1 each small
launch in `B1_LAUNCHES` runs in both forms, A B B A (`--pairs` times) so that drift falls on all; each row
prints us, GB/s of K+V, the ratio to "plain" at the same launch and its error against the default's output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
from compile_workers import compile_in_workers  # bench/compile_workers.py
from decode_pool import HEAD_DIM, KV_HEADS, PAGE, decode_pool, l2_sets  # bench/decode_pool.py

# FLOTILLA_DECODE_SMALL_LAUNCH values timed at batch 1 ("" = the module's default, the engine's launch; session 23's
# H200 call 5 at 4,096: 32,4,3,128,fused+early 9.63 us, 32,4,3,128,fused 9.71, 64,4,3,128,fused 10.01)
B1_LAUNCHES = ("", "32,4,3,128,fused", "64,4,3,128,fused", "32,4,3,128,fused+early", "64,4,2,256,fused+dep")
SHAPES = {"b1e": (1, 4160, 4288), "b1": (1, 4096, 4096), "b64s": (64, 512, 512), "b64l": (64, 4096, 4096),
          "b1fix": (1, 1088, 1088), "e1s": (1, 530, 704), "e1k": (1, 530, 1024)}  # fmt: skip
# b1fix: the engine launch's grid and merge (17 splits x 8 KV heads, 17 partials a head) with one 64-key tile a
# program instead of four: its time is the launch's fixed cost, b1e's minus it the streaming of 3 tiles a program
# (H200, session 25 call 2: 6.79 against b1e's 10.26 us).
# e1s / e1k: batch 1 at context 530 in the block table of bench/latency.py's context-512 engine (704 tokens) and in
# the server's 1,024-token graph bucket: the short-table launch (`FLOTILLA_DECODE_SHORT_LAUNCH`, taken at tables of
# <= 1,024 tokens; the same kernel as these rows set through FLOTILLA_DECODE_SMALL_LAUNCH) against the small launch
# (""), whose 256-key splits run up to four tiles a program there. Splits at 704: 64 keys 11, 32 keys 22, 128 keys 6.
SHORT_CANDIDATES = ("64,4,3,64,fused+dep", "64,4,2,64,fused+dep", "32,4,3,32,fused+dep", "32,4,3,64,fused+dep",
                    "128,8,2,128,fused+dep", "64,4,3,128,fused+dep", "32,2,3,32,fused+dep")  # fmt: skip
# The "pages" flag (`SPLIT_TILES`: a split's page numbers read up front, no table read in the key loop, so the
# software pipeline issues later tiles' copies at once; b1e - b1fix = 3.5 us for 3 tiles a program suggests a round
# trip a tile) at the engine's launch and with deeper pipelines; at every table width (FLOTILLA_DECODE_SMALL_LAUNCH).
PAGES_CANDIDATES = ("64,4,3,256,fused+dep+pages", "64,4,4,256,fused+dep+pages", "32,4,4,256,fused+dep+pages",
                    "32,4,5,256,fused+dep+pages", "64,4,3,128,fused+dep+pages")  # fmt: skip
SHAPE_LAUNCHES = {"b1fix": ("64,4,3,64,fused+dep",), "e1s": ("", *SHORT_CANDIDATES, *PAGES_CANDIDATES),
                  "e1k": ("", *SHORT_CANDIDATES, *PAGES_CANDIDATES), "b1e": (*B1_LAUNCHES, *PAGES_CANDIDATES),
                  "b1": (*B1_LAUNCHES, *PAGES_CANDIDATES)}  # fmt: skip
PLAIN_ONLY = False  # --plain-only: the engine's form alone (FLOTILLA_DECODE_EARLY_QUERY off)
# the forms, as `paged_decode_attention` keywords (FLOTILLA_DECODE_EARLY_QUERY)
FORMS = {"plain": {"early_query": False}, "query": {"early_query": True}}


def _forms(launch: str) -> list[str]:
    """The forms that differ at `launch`: by PDL ("+early") the query is read after the wait, so no early query."""
    return ["plain"] if PLAIN_ONLY or "early" in launch.split(",")[-1] else list(FORMS)


def _pool(batch: int, ctx: int, table_tokens: int) -> dict:
    sets = l2_sets(batch, ctx)
    pool = decode_pool(batch, ctx, sets)
    tables = pool["tables"]
    width = table_tokens // PAGE
    if width > tables.shape[2]:  # the engine's graphs pad the table (with page 0, as model_runner does)
        wide = torch.zeros(sets, batch, width, device="cuda", dtype=tables.dtype)
        wide[:, :, : tables.shape[2]] = tables
        pool["tables"] = wide
    pool["sets"] = sets
    return pool


def _call(pool: dict, launch: str, form: str):
    """`paged_decode_attention` on copy `i` of the pool at `launch` ("": the default) in `form`."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention

    if launch:
        os.environ["FLOTILLA_DECODE_SMALL_LAUNCH"] = launch
    else:
        os.environ.pop("FLOTILLA_DECODE_SMALL_LAUNCH", None)
    sets = pool["sets"]

    def fn(i: int) -> torch.Tensor:
        return paged_decode_attention(pool["q"][i % sets], pool["k"], pool["v"], pool["tables"][i % sets], pool["qsl"],
                                      pool["lens"], HEAD_DIM**-0.5, **FORMS[form])  # fmt: skip

    return fn


def run_shape(name: str, pairs: int, results: dict, part: tuple[int, int] | None = None) -> None:
    """Time every launch of shape `name` in every form, in A B .. B A order `pairs` times; `part` (i, n): only
    compile the configurations i, i + n, ... of this shape (one call each)."""
    from kernels import graph_ms  # bench/kernels.py

    batch, ctx, table_tokens = SHAPES[name]
    pool = _pool(batch, ctx, table_tokens)
    nbytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * 2
    calls = 100 if batch == 1 else 20
    launches = SHAPE_LAUNCHES.get(name, B1_LAUNCHES if batch * KV_HEADS <= 16 else ("",))
    if part:
        jobs = [(launch, form) for launch in launches for form in _forms(launch)]
        for launch, form in jobs[part[0] :: part[1]]:
            _call(pool, launch, form)(0)
            torch.cuda.synchronize()
        return
    ref = _call(pool, "", "plain")(0).float()  # the default launch's output (the switches off)
    for launch in launches:
        forms = _forms(launch)
        times: dict[str, list[float]] = {form: [] for form in forms}
        errs = {}
        for _ in range(pairs):
            for form in forms + forms[::-1]:
                fn = _call(pool, launch, form)
                out = fn(0).float()
                errs[form] = ((out - ref).norm() / ref.norm()).item()
                times[form].append(graph_ms(fn, calls))
        plain = statistics.median(times["plain"])
        for form in forms:
            us = 1e3 * statistics.median(times[form])
            row = {"shape": name, "batch": batch, "ctx": ctx, "table": table_tokens, "launch": launch or "default",
                   "form": form, "us": us, "gbps": nbytes / us / 1e3, "us_all": [1e3 * t for t in times[form]],
                   "over_plain": us / (1e3 * plain), "rel_err_vs_default": errs[form]}  # fmt: skip
            results["rows"].append(row)
            print(f"{name:5s} {launch or 'default':24s} {form:5s}: {us:7.2f} us {row['gbps']:6.0f} GB/s "
                  f"x{row['over_plain']:.3f} plain (err vs default {errs[form]:.1e})", flush=True)  # fmt: skip


def floors(results: dict) -> None:
    """What one launch of this size costs without attention, in the same CUDA-graph timing: a one-element add (the
    launch floor), a sum of 16.8 MB of bf16 (a read of b1's K+V bytes by torch's reduction) and a copy of 8.4 MB
    (16.8 MB moved)."""
    from kernels import graph_ms  # bench/kernels.py

    nbytes = 2 * 4096 * KV_HEADS * HEAD_DIM * 2
    tiny = torch.zeros(1, device="cuda")
    src = torch.randn(l2_sets(1, 4096), nbytes // 2, device="cuda", dtype=torch.bfloat16)  # rotated past the L2
    half = src[:, : nbytes // 4]
    dst = torch.empty_like(half[0])
    sums = torch.empty(src.shape[0], device="cuda")
    sets = src.shape[0]
    rows = {"launch (1-element add)": lambda i: tiny.add_(1.0),
            "sum 16.8 MB": lambda i: torch.sum(src[i % sets], 0, dtype=torch.float32, out=sums[i % sets]),
            "copy 8.4 MB": lambda i: dst.copy_(half[i % sets])}  # fmt: skip
    for label, fn in rows.items():
        us = 1e3 * graph_ms(fn, 100)
        results.setdefault("floors", {})[label] = us
        print(f"FLOOR {label}: {us:.2f} us ({nbytes / us / 1e3:.0f} GB/s of 16.8 MB)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--shapes", default="b1e,b1fix,b64s,b64l,b1")
    parser.add_argument("--no-floors", action="store_true")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="child processes that compile every row first")
    parser.add_argument("--plain-only", action="store_true", help="time the plain form only (no early query)")
    parser.add_argument("--compile-part", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global PLAIN_ONLY
    PLAIN_ONLY = args.plain_only
    for env in ("FLOTILLA_DECODE_EARLY_QUERY", "FLOTILLA_DECODE_SMALL_LAUNCH", "FLOTILLA_DECODE_SHORT_LAUNCH"):
        os.environ.pop(env, None)
    torch.manual_seed(0)
    if args.compile_part:
        i, n = (int(x) for x in args.compile_part.split("/"))
        for name in args.shapes.split(","):
            run_shape(name, 0, {}, part=(i, n))
        return
    if args.workers > 1:
        compile_in_workers(__file__, args.workers)
    results: dict = {"gpu": torch.cuda.get_device_name(), "rows": []}
    if not args.no_floors:
        floors(results)
    for name in args.shapes.split(","):
        run_shape(name, args.pairs, results)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    best = {}
    for r in results["rows"]:
        if r["shape"] not in best or r["us"] < best[r["shape"]]["us"]:
            best[r["shape"]] = r
    for name, r in best.items():
        print(f"BEST {name}: {r['launch']} {r['form']} {r['us']:.2f} us {r['gbps']:.0f} GB/s")
    results["best"] = best
    args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
