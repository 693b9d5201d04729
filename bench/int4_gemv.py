"""The int4 (W4A16, group 128) matmul paths alone against bf16, on one CUDA GPU, at decode row counts.

    python3 bench/int4_gemv.py --json int4-gemv.json [--rows 1,2,4,16,64] [--grid] [--grid-rows 1]
    python3 bench/int4_gemv.py --json wide.json --rows 1 --paths int4_gemv,int4_gemv_wide,bf16_cublas --wide

Llama-3.1-8B's projections (qkv 4096->6144, o 4096->4096, gate_up 4096->28672, down 14336->4096) with
random symmetric int4 weights (zero point 8, as the dummy W4A16 checkpoint of bench/results/quant-gpu.sh),
bf16 activations. Timed per call, each in one CUDA graph of many calls rotating over weight copies that
together exceed the L2 several times (`bench/kernels.py`'s `graph_ms`), so every call streams its weight
from HBM, as a decode step does. Paths (`kernels.dispatch.packed_int_linear` picks by rows):

- `int4_gemv`: the W4A16 GEMV (`triton_int4_gemv.py`), default config (the dispatch's path up to
  INT4_GEMV_MAX_ROWS rows: FMA up to 2 rows, `tl.dot` above); `int4_gemv_dot` the tensor-core path
  at every row count (is the FMA/dot boundary right?);
- `int4_gemm`: the dequantizing `tl.dot` GEMM (`triton_int4_gemm.py`; up to INT4_GEMM_MAX_ROWS);
- `int4_dequant_cublas`: one-pass dequantization to bf16, then F.linear (above);
- `bf16_cublas`: F.linear on the bf16 weight of the same shape (the baseline the int4 step is held to).

GB/s is the int4 bytes a call must read (0.5 byte a weight + a bf16 scale per 128) over its time, for
every path (also the dequantizing one: what it costs against what it must read); the copy bandwidth of
the same run is the ceiling. Every output is checked against the fp32 reference first (rel_err).

- `int4_gemv_wide`: the wide W4A16 GEMV (`triton_int4_gemv_wide.py`, 1-4 rows: 16-byte weight loads, FMA),
  default launch (the dispatch's path with FLOTILLA_INT4_GEMV_WIDE=1).

`--wide` times the wide GEMV over `wide_grid()` tiles at `--grid-rows` and prints, per projection, its best
tile against the default wide launch, the old default GEMV and bf16 cuBLAS ("WIDE" lines), then the layer
total of each projection's best with the FLOTILLA_INT4_GEMV_WIDE_CONFIG value that selects them ("WIDE_GRID").
The grid's kernels are compiled first by `--warm-jobs` processes in parallel (Triton's disk cache), so the
timing process only loads them. `--paths` limits the paths timed (the GEMM and dequantize paths take seconds).

`--grid` times the GEMV over tiles (rows per program, words per step, warps, pipeline stages) at the
`--grid-rows` row counts and prints, per row count, the configuration with the least total time over
the four projections (one call each: what a decoder layer runs) next to the default's total, and the
sum of each projection's own best with the FLOTILLA_INT4_GEMV_TILES value that selects them: the line
to set `triton_int4_gemv.default_config` from. The JSON is rewritten after every case.
Without CUDA the script says so and exits 0 (nothing to measure).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

PATHS = ("int4_gemv", "int4_gemv_dot", "int4_gemv_wide", "int4_gemm", "int4_dequant_cublas", "bf16_cublas")
SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
GROUP = 128
L2_ROTATION_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
GRAPH_BYTES = 1 * 2**30  # int4 bytes streamed per graph replay (~0.25 ms at copy rate)
DEV = "cuda"


def grid(m: int) -> list[dict]:
    """GEMV tiles around the default. FMA: rows per program, words (8 inputs) per step, warps (the
    accumulator and the step's partial sums within ~128 fp32 registers a thread); `tl.dot` (one group a
    step): rows per program, warps, pipeline stages, split-K by the default rule or one more doubling."""
    fma = [{"use_dot": 0, "block_n": bn, "block_w": bw, "num_warps": w, "num_stages": 1}
           for bn in (16, 32) for bw in (32, 64, 128) for w in (4, 8) if 2 * m * bn * bw <= 128 * 32 * w]
    fma.append({"use_dot": 0, "block_n": 8, "block_w": 64, "num_warps": 4, "num_stages": 1})
    dot = [{"use_dot": 1, "block_n": bn, "num_warps": w, "num_stages": st}
           for bn in (64, 128) for w in (4, 8) for st in (2, 3)]
    return fma + dot


def wide_grid(m: int) -> list[dict]:
    """Wide-GEMV launches around `wide_config`'s lead: rows per program (16 or 32: 4 or 8 rows a thread at 128
    words a step), words a step (64-256: 256-1,024 bytes of a row), warps, pipeline depth (1: 16-byte loads
    straight to registers; 2-4: cp.async through shared memory), and one more split-K doubling. Kept small:
    every entry is 1-2 compiles (split or not) per row count."""
    cfgs = [{"block_n": bn, "block_w": 128, "num_warps": 4, "num_stages": st} for bn in (16, 32) for st in (1, 2, 3, 4)]
    cfgs += [{"block_n": 16, "block_w": 256, "num_warps": 4, "num_stages": 3},
             {"block_n": 32, "block_w": 64, "num_warps": 4, "num_stages": 3},
             {"block_n": 64, "block_w": 128, "num_warps": 8, "num_stages": 3},
             {"block_n": 32, "block_w": 128, "num_warps": 8, "num_stages": 3},
             {"block_n": 16, "block_w": 64, "num_warps": 4, "num_stages": 4}]  # fmt: skip
    return cfgs if m <= 2 else [c for c in cfgs if c["block_n"] <= 32]


def wide_knobs(cfg: dict, n: int, k: int, m: int) -> dict:
    """A grid entry as `int4_gemv_wide` knobs: the default split-K rule, doubled with "split2": 1."""
    from flotilla.kernels.triton_int4_gemv_wide import wide_config
    from flotilla.kernels.triton_utils import num_sms

    knobs = {key: v for key, v in cfg.items() if key != "split2"}
    if cfg.get("split2"):
        knobs["split_k"] = 2 * wide_config(m, n, k, num_sms(0), **knobs).split_k
    return knobs


def _warm_one(job: tuple[int, int, int, list[dict]]) -> str:
    """Compile (into Triton's disk cache) the wide GEMV at one shape for each launch: a worker process."""
    m, n, k, cfgs = job
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    packed = torch.zeros(n, k // 8, device=DEV, dtype=torch.int32)
    scales = torch.ones(n, k // GROUP, device=DEV, dtype=torch.bfloat16)
    x = torch.zeros(m, k, device=DEV, dtype=torch.bfloat16)
    failed = 0
    for cfg in cfgs:
        try:
            int4_gemv_wide(x, packed, scales, None, GROUP, **wide_knobs(cfg, n, k, m))
        except Exception:  # recorded by the timing process
            failed += 1
    torch.cuda.synchronize()
    return f"{n}x{k} m{m}: {len(cfgs)} launches, {failed} failed"


def prewarm(rows: list[int], jobs: int) -> None:
    """Compile every wide-grid kernel in `jobs` processes at once (a compile is ~1-2 s of one CPU core)."""
    import concurrent.futures
    import multiprocessing

    work = []
    for m in rows:
        cfgs = [{}] + wide_grid(m) + [dict(c, split2=1) for c in wide_grid(m)[:2]]
        for n, k in SHAPES.values():
            work += [(m, n, k, cfgs[i::3]) for i in range(3)]  # 3 jobs per shape: the compiles spread
    started = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        done = list(pool.map(_warm_one, work))
    print(f"warm: {len(work)} jobs in {time.perf_counter() - started:.0f} s ({done[0]})", flush=True)


def int4_bytes(n: int, k: int) -> int:
    """Bytes an int4 call must read: the packed codes and the bf16 group scales."""
    return n * k // 2 + n * (k // GROUP) * 2


def weights(n: int, k: int, sets: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`sets` random symmetric int4 weights `[n, k]`: (packed int32, bf16 scales, uint8 zero points = 8)."""
    out = []
    for _ in range(sets):
        packed = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), device=DEV, dtype=torch.int64).to(torch.int32)
        scales = (torch.rand(n, k // GROUP, device=DEV) * 0.004 + 0.001).bfloat16()
        zeros = torch.full((n, k // GROUP), 8, dtype=torch.uint8, device=DEV)
        out.append((packed, scales, zeros))
    return out


def bench_shape(name: str, n: int, k: int, m: int, grid_cfgs: list[dict], paths: tuple[str, ...] = PATHS,
                wide_cfgs: list[dict] | None = None) -> dict:
    """All paths of one projection at `m` rows (and the GEMV over `grid_cfgs`): us per call, GB/s, errors."""
    import torch.nn.functional as F
    from timing import time_variant  # bench/timing.py

    from flotilla.kernels.packed_int_linear import packed_int_linear_ref
    from flotilla.kernels.triton_int4_gemm import int4_dequantize, int4_linear
    from flotilla.kernels.triton_int4_gemv import default_config, int4_gemv
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide, wide_config
    from flotilla.kernels.triton_utils import num_sms

    nbytes = int4_bytes(n, k)
    sets = max(3, -(-L2_ROTATION_BYTES // nbytes))
    ws = weights(n, k, sets)
    dense_sets = max(3, -(-L2_ROTATION_BYTES // (2 * n * k)))
    dense = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16).div_(k**0.5) for _ in range(dense_sets)]
    xs = torch.randn(sets, m, k, device=DEV, dtype=torch.bfloat16)
    calls = sets * max(1, round(GRAPH_BYTES / (sets * nbytes)))
    ref = packed_int_linear_ref(xs[0].float(), *ws[0], 4, GROUP)
    ref16 = F.linear(xs[0 % dense_sets].float(), dense[0].float())
    result: dict = {"name": name, "n": n, "k": k, "m": m, "int4_bytes": nbytes, "weight_sets": sets,
                    "calls_per_graph": calls,
                    "gemv_default_config": dataclasses.asdict(default_config(m, n, k, num_sms(0))),
                    "wide_default_config": dataclasses.asdict(wide_config(m, n, k, num_sms(0)))}  # fmt: skip

    def gemv(i: int, **knobs) -> torch.Tensor:
        packed, scales, _ = ws[i % sets]
        return int4_gemv(xs[i % sets], packed, scales, None, GROUP, **knobs)

    variants: dict[str, tuple[Callable[[int], torch.Tensor], torch.Tensor, int]] = {
        "int4_gemv": (gemv, ref, nbytes),
        "int4_gemv_dot": (lambda i: gemv(i, use_dot=True), ref, nbytes),
        "int4_gemv_wide": (lambda i: int4_gemv_wide(xs[i % sets], ws[i % sets][0], ws[i % sets][1], None, GROUP),
                           ref, nbytes),
        "int4_gemm": (lambda i: int4_linear(xs[i % sets], *ws[i % sets], GROUP), ref, nbytes),
        "int4_dequant_cublas": (lambda i: F.linear(xs[i % sets], int4_dequantize(*ws[i % sets], GROUP, torch.bfloat16)),
                                ref, nbytes),
        "bf16_cublas": (lambda i: F.linear(xs[i % sets], dense[i % dense_sets]), ref16, 2 * n * k),
    }  # fmt: skip
    variants = {tag: v for tag, v in variants.items() if tag in paths}
    for cfg in grid_cfgs:
        tag = "int4_gemv " + " ".join(f"{key}={v}" for key, v in cfg.items())
        variants[tag] = (lambda i, c=cfg: gemv(i, **c), ref, nbytes)
    for cfg in wide_cfgs or []:
        knobs = wide_knobs(cfg, n, k, m)
        tag = "int4_gemv_wide " + " ".join(f"{key}={v}" for key, v in knobs.items())
        variants[tag] = (lambda i, c=knobs: int4_gemv_wide(xs[i % sets], ws[i % sets][0], ws[i % sets][1], None, GROUP,
                                                           **c), ref, nbytes)  # fmt: skip
    for tag, (fn, expect, read) in variants.items():  # a config that fails (resources) is recorded, not fatal
        row = time_variant(fn, calls if read == nbytes else max(3, calls // 4), expect, read,
                           replays=5 if " " in tag else 15)
        row.pop("ms", None)  # this script's rows carry "us" alone
        result[tag] = row
    if "us" in result.get("bf16_cublas", {}):
        for tag in ("int4_gemv", "int4_gemv_dot", "int4_gemv_wide", "int4_gemm", "int4_dequant_cublas"):
            if "us" in result.get(tag, {}):
                result[tag]["speedup_vs_bf16"] = result["bf16_cublas"]["us"] / result[tag]["us"]
    for key, family in (("best_int4_gemv", "int4_gemv"), ("best_int4_gemv_wide", "int4_gemv_wide")):
        timed = {t: v["us"] for t, v in result.items() if _family(t) == family and isinstance(v, dict) and "us" in v
                 and v["rel_err"] < 1e-2}  # fmt: skip
        if timed:
            best = min(timed, key=timed.__getitem__)
            result[key] = {"tag": best, "us": timed[best], "gbps": nbytes / timed[best] / 1e3}
    return result


def _family(tag: str) -> str:
    """Which GEMV a result tag times: "int4_gemv" (the old kernel, its dot path and grid), "int4_gemv_wide", or ""."""
    if tag == "int4_gemv_wide" or tag.startswith("int4_gemv_wide "):
        return "int4_gemv_wide"
    return "int4_gemv" if tag.startswith("int4_gemv") else ""


def wide_summary(cases: list[dict], m: int) -> dict | None:
    """Layer totals at `m` rows (one call of each projection): the wide GEMV's default launch and each projection's
    best grid tile (with the FLOTILLA_INT4_GEMV_WIDE_CONFIG that selects them), the old GEMV, bf16 cuBLAS."""
    rows = [c for c in cases if c["m"] == m and "best_int4_gemv_wide" in c]
    if len(rows) < len(SHAPES):
        return None

    def total(tag: str) -> float | None:
        return sum(c[tag]["us"] for c in rows) if all("us" in c.get(tag, {}) for c in rows) else None

    env = []
    for c in rows:
        knobs = c["best_int4_gemv_wide"]["tag"].split()[1:]
        if knobs:
            env.append(f"{c['n']}x{c['k']}:" + ",".join(knobs))
    return {"m": m, "wide_default_layer_us": total("int4_gemv_wide"),
            "wide_best_layer_us": sum(c["best_int4_gemv_wide"]["us"] for c in rows),
            "old_default_layer_us": total("int4_gemv"), "bf16_layer_us": total("bf16_cublas"),
            "per_shape_best": {c["name"]: c["best_int4_gemv_wide"]["tag"] for c in rows}, "env": ";".join(env)}


def grid_summary(cases: list[dict], m: int) -> dict | None:
    """The GEMV tile with the least time summed over the four projections at `m` rows, and the default's."""
    rows = [c for c in cases if c["m"] == m]
    if len(rows) < len(SHAPES):
        return None
    tags = [t for t in rows[0] if _family(t) == "int4_gemv" and all("us" in c.get(t, {}) and c[t]["rel_err"] < 1e-2
                                                                    for c in rows)]  # fmt: skip
    if not tags:
        return None
    totals = {t: sum(c[t]["us"] for c in rows) for t in tags}
    best = min(totals, key=totals.__getitem__)
    per_shape = {c["name"]: c["best_int4_gemv"] for c in rows if "best_int4_gemv" in c}
    return {"m": m, "best": best, "best_layer_us": totals[best], "default_layer_us": totals.get("int4_gemv"),
            "per_shape_best": {name: b["tag"] for name, b in per_shape.items()},
            "per_shape_layer_us": sum(b["us"] for b in per_shape.values()),
            "env": tiles_env({SHAPES[name]: b["tag"] for name, b in per_shape.items()})}


def tiles_env(best: dict[tuple[int, int], str]) -> str:
    """FLOTILLA_INT4_GEMV_TILES for the per-shape winners (`triton_int4_gemv._parse_tiles`): `NxK:knobs`
    entries; a shape whose winner is the default gets none."""
    entries = []
    for (n, k), tag in best.items():
        knobs = "use_dot=1" if tag == "int4_gemv_dot" else ",".join(tag.split()[1:])
        if knobs:
            entries.append(f"{n}x{k}:{knobs}")
    return ";".join(entries)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--rows", default="1,2,4,16,64", help="comma list of M (input rows)")
    p.add_argument("--grid", action="store_true", help="also time the GEMV over grid() tiles at --grid-rows")
    p.add_argument("--grid-rows", default="1", help="comma list of M for --grid and --wide")
    p.add_argument("--wide", action="store_true", help="also time the wide GEMV over wide_grid() at --grid-rows")
    p.add_argument("--paths", default=",".join(PATHS), help="comma list of the paths to time (default: all)")
    p.add_argument("--warm-jobs", type=int, default=8, help="processes compiling the --wide grid first (0: none)")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: bench/int4_gemv.py needs a CUDA GPU")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from kernels import copy_bandwidth  # bench/kernels.py

    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    results: dict = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "device": props.name,
                     "torch": torch.__version__, "copy": copy_bandwidth(), "cases": [], "grid": []}  # fmt: skip
    copy = results["copy"]["gbps"]
    print(f"copy {copy:.0f} GB/s", flush=True)
    grid_rows = {int(r) for r in a.grid_rows.split(",")} if a.grid else set()
    wide_rows = {int(r) for r in a.grid_rows.split(",")} if a.wide else set()
    paths = tuple(t for t in a.paths.split(",") if t)
    if wide_rows and a.warm_jobs > 0:
        try:  # only a head start: the timing compiles what is missing
            prewarm(sorted(wide_rows), a.warm_jobs)
        except Exception as exc:
            print(f"warm: failed ({exc!r:.200})", flush=True)
    for m in (int(r) for r in a.rows.split(",")):
        for name, (n, k) in SHAPES.items():
            started = time.perf_counter()
            r = bench_shape(name, n, k, m, grid(m) if m in grid_rows else [], paths,
                            wide_grid(m) + [dict(c, split2=1) for c in wide_grid(m)[:2]] if m in wide_rows else None)
            results["cases"].append(r)
            Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
            cells = [f"{t} {r[t]['us']:.1f} us {r[t]['gbps']:.0f} GB/s" if "us" in r[t] else f"{t} {r[t]['error']}"
                     for t in PATHS if t in r]  # fmt: skip
            g = r.get("int4_gemv_wide" if "int4_gemv_wide" in paths else "int4_gemv", {})
            lead = f"x{g.get('speedup_vs_bf16', 0):.2f} bf16, {g.get('gbps', 0) / copy:.2f} copy"
            print(f"INT4 {name} m{m}: {lead} | " + " | ".join(cells) + f" ({time.perf_counter() - started:.0f} s)",
                  flush=True)  # fmt: skip
            if "best_int4_gemv" in r and m in grid_rows:
                b = r["best_int4_gemv"]
                print(f"BEST {name} m{m}: {b['us']:.1f} us {b['gbps']:.0f} GB/s {b['tag']}", flush=True)
            if "best_int4_gemv_wide" in r and m in wide_rows:
                b = r["best_int4_gemv_wide"]
                us = {t: r.get(t, {}).get("us", 0) for t in ("int4_gemv_wide", "int4_gemv", "bf16_cublas")}
                print(f"WIDE {name} m{m}: best {b['us']:.1f} us {b['gbps']:.0f} GB/s ({b['tag']}) | default "
                      f"{us['int4_gemv_wide']:.1f} us | old int4_gemv {us['int4_gemv']:.1f} us | bf16 "
                      f"{us['bf16_cublas']:.1f} us", flush=True)  # fmt: skip
                for tag, v in sorted(((t, v) for t, v in r.items() if _family(t) == "int4_gemv_wide"),
                                     key=lambda tv: tv[1].get("us", 1e9)):  # fmt: skip
                    cell = f"{v['us']:.1f} us {v['gbps']:.0f} GB/s err {v['rel_err']:.1e}" if "us" in v else v["error"]
                    print(f"  {name} m{m} {tag}: {cell}", flush=True)
            torch.cuda.empty_cache()
        wide = wide_summary(results["cases"], m) if m in wide_rows else None
        if wide:
            results.setdefault("wide", []).append(wide)
            Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
            print(f"WIDE_GRID m{m}: layer us: wide best {wide['wide_best_layer_us']:.1f}, wide default "
                  f"{wide['wide_default_layer_us'] or 0:.1f}, old int4 {wide['old_default_layer_us'] or 0:.1f}, bf16 "
                  f"{wide['bf16_layer_us'] or 0:.1f}: FLOTILLA_INT4_GEMV_WIDE_CONFIG=\"{wide['env']}\"",
                  flush=True)  # fmt: skip
        summary = grid_summary(results["cases"], m) if m in grid_rows else None
        if summary:
            results["grid"].append(summary)
            Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
            print(f"GRID m{m}: best over the 4 projections {summary['best']} {summary['best_layer_us']:.1f} us a layer "
                  f"(default {summary['default_layer_us']:.1f} us; each projection's best "
                  f"{summary['per_shape_layer_us']:.1f} us: FLOTILLA_INT4_GEMV_TILES=\"{summary['env']}\")",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
