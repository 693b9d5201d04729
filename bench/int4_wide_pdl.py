"""The one-row wide int4 GEMV launched plainly (main) against its PDL launches (FLOTILLA_INT4_WIDE_PDL), alone and in
the chain a decode layer runs, on one CUDA GPU.

    python3 bench/int4_wide_pdl.py --json int4-wide-pdl.json [--warm-jobs 12] [--variants main,top,late,...]

Llama-3.1-8B's projections (qkv 4096->6144, o 4096->4096, gate_up 4096->28672, down 14336->4096), random symmetric
int4 codes, group 128, bf16 activations; `--sets` layers' worth of weights (112 MB each) rotated so that every call
streams its weight from HBM, as a decode step does. Each figure is a CUDA graph of many calls, median of replays.

Three timings per variant (a launch: PDL mode "" / "top" / "late" and a tile rule, `variants()`):
- `alone`: the projection's GEMV back to back (us per call, TB/s of int4 bytes). With PDL a call's first step loads
  while the call ahead finishes, so this is already a chain;
- `after_norm`: pairs RMSNorm -> GEMV (the engine's RMSNorm kernel, itself launched by PDL under FLOTILLA_PDL), minus
  the same number of RMSNorms alone: the GEMV's share of a pair (what the decode step pays for it after its norm);
- `layer`: the decoder layer's kernel chain without attention: RMSNorm -> qkv -> RMSNorm (attention's stand-in) ->
  o -> RMSNorm -> gate_up -> SiLU-and-mul -> down (us per layer; `small` = the same chain without the GEMVs).

Prints a table (alone/after-norm us per projection, layer us) per variant against main, then `BEST_MODE=` (the PDL
mode of the fastest layer) and `PDL_CONFIG=` (per projection the best tile of that mode by after-norm time, in
FLOTILLA_INT4_WIDE_PDL_CONFIG syntax) for the engine stage. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
GROUP = 128
HIDDEN = 4096
DEV = "cuda"


def variants() -> dict[str, tuple[str, str]]:
    """name -> (PDL mode, tile rule), most telling first (a run cut by its limit keeps those). Tile rules, `_`-joined
    flags on main's MEASURED_TILES launch (`measured`: none): `rows` the [rows, words] word tile and PTX scale loads
    (LAYOUT 1: 449 instead of 735 sm_90 instructions a 16 x 128 step under Triton 3.6), `w256` 256 words a step (at
    the measured split a qkv/o range is one step, so the PDL preload is the whole range), `s2x` split-K doubled, `n32`
    32 rows a program (layout 1: 8 rows a thread share each activation, 797 instructions a 128-byte step = 6.2 a byte
    against 7.0 at 16 rows; 124 registers)."""
    return {"main": ("", "measured"), "rows": ("", "rows"), "top": ("top", "measured"), "top_rows": ("top", "rows"),
            "late": ("late", "measured"), "late_rows": ("late", "rows"), "top_rows_w256": ("top", "rows_w256"),
            "late_rows_w256": ("late", "rows_w256"), "top_w256": ("top", "w256"), "plain_w256": ("", "w256"),
            "top_s2x": ("top", "s2x"), "rows_s2x": ("", "rows_s2x"), "top_rows_s2x": ("top", "rows_s2x"),
            "rows_n32_s2x": ("", "rows_n32_s2x"), "top_rows_n32_s2x": ("top", "rows_n32_s2x")}  # fmt: skip


KNOB_KEYS = ("block_n", "block_w", "split_k", "num_warps", "num_stages", "layout")


def knobs(tile: str, n: int, k: int) -> dict:
    """`int4_gemv_wide` knobs of a tile rule (`variants`) at one shape: main's measured launch, modified."""
    from flotilla.kernels.triton_int4_gemv_wide import wide_config

    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    base = wide_config(1, n, k, sms, layout=0)
    out = {key: getattr(base, key) for key in KNOB_KEYS}
    flags = set(tile.split("_")) - {"measured"}
    assert flags <= {"rows", "w256", "s2x", "n32"}, tile
    if "w256" in flags:
        out["block_w"] = 256
    if "s2x" in flags:
        out["split_k"] = 2 * base.split_k
    if "rows" in flags:
        out["layout"] = 1
    if "n32" in flags:
        out["block_n"] = 32
    return out


def config_string(tile: str) -> str:
    """A tile rule at every Llama projection, in FLOTILLA_INT4_GEMV_WIDE_CONFIG syntax."""
    parts = []
    for n, k in SHAPES.values():
        kn = knobs(tile, n, k)
        parts.append(f"{n}x{k}:" + ",".join(f"{key}={kn[key]}" for key in KNOB_KEYS))
    return ";".join(parts)


def int4_bytes(n: int, k: int) -> int:
    """Bytes a call must read: the packed codes and the bf16 group scales."""
    return n * k // 2 + n * (k // GROUP) * 2


def make_weights(sets: int) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """`sets` layers of random symmetric int4 weights: per projection (packed int32 [n, k/8], bf16 scales)."""
    out = []
    for _ in range(sets):
        layer = {}
        for name, (n, k) in SHAPES.items():
            packed = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), device=DEV, dtype=torch.int64).to(torch.int32)
            layer[name] = (packed, (torch.rand(n, k // GROUP, device=DEV) * 0.004 + 0.001).bfloat16())
        out.append(layer)
    return out


def graph_us(fn, calls: int, replays: int = 12) -> float:
    """Median us per call of `fn(0..calls-1)` captured in one CUDA graph: bench/kernels.py's `graph_ms`."""
    from kernels import graph_ms  # bench/kernels.py

    return 1e3 * graph_ms(fn, calls, replays)


def _warm_one(job: tuple[str, str]) -> str:
    """Compile (into Triton's disk cache) every projection's launch of one variant: a worker process."""
    mode, tile = job
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    x = torch.zeros(1, HIDDEN, device=DEV, dtype=torch.bfloat16)
    for n, k in SHAPES.values():
        packed = torch.zeros(n, k // 8, device=DEV, dtype=torch.int32)
        scales = torch.ones(n, k // GROUP, device=DEV, dtype=torch.bfloat16)
        xi = x if k == HIDDEN else torch.zeros(1, k, device=DEV, dtype=torch.bfloat16)
        int4_gemv_wide(xi, packed, scales, None, GROUP, pdl=mode, **knobs(tile, n, k))
    torch.cuda.synchronize()
    return f"{mode or 'plain'}/{tile}"


def prewarm(jobs: list[tuple[str, str]], workers: int) -> None:
    """Compile the variants' kernels in `workers` processes at once (a compile is seconds of one CPU core)."""
    import concurrent.futures
    import multiprocessing

    started = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(_warm_one, jobs))
    print(f"warm: {len(done)} variants in {time.perf_counter() - started:.0f} s", flush=True)


def check(layer: dict, mode: str, tile: str) -> float:
    """Relative error of the variant's qkv call against the plain default launch (a PDL launch must be bit-equal:
    0.0 expected when the tile is main's)."""
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    n, k = SHAPES["qkv"]
    x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
    ref = int4_gemv_wide(x, *layer["qkv"], None, GROUP, pdl="").float()
    out = int4_gemv_wide(x, *layer["qkv"], None, GROUP, pdl=mode, **knobs(tile, n, k)).float()
    return float((out - ref).norm() / ref.norm())


def measure(ws: list[dict], mode: str, tile: str, calls_per_layer: int) -> dict:
    """The three timings of one variant (module docstring)."""
    from flotilla.kernels.triton_activation import silu_and_mul
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide
    from flotilla.kernels.triton_rmsnorm import rms_norm

    sets = len(ws)
    kn = {name: knobs(tile, n, k) for name, (n, k) in SHAPES.items()}
    hs = torch.randn(sets, 1, HIDDEN, device=DEV, dtype=torch.bfloat16)
    inter = torch.randn(sets, 1, SHAPES["down"][1], device=DEV, dtype=torch.bfloat16)
    gate_up = torch.randn(sets, 1, SHAPES["gate_up"][0], device=DEV, dtype=torch.bfloat16)  # SiLU-and-mul's input
    norm_w = torch.rand(HIDDEN, device=DEV, dtype=torch.bfloat16) + 0.5

    def gemv(name: str, x: torch.Tensor, i: int) -> torch.Tensor:
        return int4_gemv_wide(x, *ws[i % sets][name], None, GROUP, pdl=mode, **kn[name])

    row: dict = {"mode": mode, "tile": tile, "knobs": kn, "alone_us": {}, "after_norm_us": {}, "pair_us": {}}
    calls = sets * calls_per_layer
    norm_us = graph_us(lambda i: rms_norm(hs[i % sets], norm_w, 1e-5), calls)
    row["norm_us"] = norm_us
    for name in SHAPES:
        x_of = (lambda i: inter[i % sets]) if name == "down" else (lambda i: hs[i % sets])
        row["alone_us"][name] = graph_us(lambda i, nm=name, xo=x_of: gemv(nm, xo(i), i), calls)
        if name == "down":  # its kernel ahead is SiLU-and-mul: the pair SiLU-and-mul -> down
            pair = graph_us(lambda i: gemv("down", silu_and_mul(gate_up[i % sets]), i), calls)
            small = graph_us(lambda i: silu_and_mul(gate_up[i % sets]), calls)
        else:
            pair = graph_us(lambda i, nm=name: gemv(nm, rms_norm(hs[i % sets], norm_w, 1e-5)[0], i), calls)
            small = norm_us
        row["pair_us"][name] = pair
        row["after_norm_us"][name] = pair - small

    def layer(i: int, with_gemv: bool = True) -> None:
        h = rms_norm(hs[i % sets], norm_w, 1e-5)[0]
        if with_gemv:
            gemv("qkv", h, i)
        a = rms_norm(hs[(i + 1) % sets], norm_w, 1e-5)[0]  # attention's stand-in (after qkv in stream order)
        o = gemv("o", a, i) if with_gemv else a
        h2 = rms_norm(o, norm_w, 1e-5)[0]
        gu = gemv("gate_up", h2, i) if with_gemv else gate_up[i % sets]
        g = silu_and_mul(gu)
        if with_gemv:
            gemv("down", g, i)

    row["layer_us"] = graph_us(layer, calls)
    row["small_us"] = graph_us(lambda i: layer(i, False), calls)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--variants", default=",".join(variants()), help="names from variants(), main first")
    p.add_argument("--sets", type=int, default=3, help="layers of weights rotated (112 MB each; L2 is 50-60 MB)")
    p.add_argument("--calls-per-set", type=int, default=8)
    p.add_argument("--warm-jobs", type=int, default=0, help="compile in this many processes first (0: inline)")
    p.add_argument("--warm-only", action="store_true", help="only compile (Triton's disk cache), e.g. in the "
                   "background while an engine that launches the same kernels starts")  # fmt: skip
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return
    table = variants()
    names = [v for v in a.variants.split(",") if v]
    assert all(v in table for v in names), f"unknown variant in {names}; known: {list(table)}"
    if a.warm_jobs or a.warm_only:
        prewarm([table[v] for v in names], max(1, a.warm_jobs))
    if a.warm_only:
        return
    ws = make_weights(a.sets)
    bw = {name: int4_bytes(n, k) for name, (n, k) in SHAPES.items()}
    result: dict = {"device": torch.cuda.get_device_name(), "command": " ".join(sys.argv), "bytes": bw, "rows": {}}
    for v in names:
        mode, tile = table[v]
        try:
            row = measure(ws, mode, tile, a.calls_per_set)
            row["rel_err_vs_main_qkv"] = check(ws[0], mode, tile)
        except Exception as exc:  # a variant that fails to compile or run is reported, the rest still measured
            row = {"mode": mode, "tile": tile, "error": repr(exc)[:300]}
        result["rows"][v] = row
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
        if "error" in row:
            print(f"{v}: ERROR {row['error']}", flush=True)
            continue
        print(f"{v:14s} layer {row['layer_us']:6.1f} us (small kernels {row['small_us']:5.1f}) | alone "
              + " ".join(f"{n} {row['alone_us'][n]:5.1f}" for n in SHAPES) + " | after norm "
              + " ".join(f"{n} {row['after_norm_us'][n]:5.1f}" for n in SHAPES)
              + f" | err {row['rel_err_vs_main_qkv']:.1e}", flush=True)  # fmt: skip
    summarize(result, names)
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


def summarize(result: dict, names: list[str]) -> None:
    """The decision lines: per projection and variant us (TB/s) against main; the best mode and its tiles."""
    rows = {v: r for v, r in result["rows"].items() if "error" not in r and v in names}
    if "main" not in rows:
        print("DECISION: main's row missing; no comparison")
        return
    main = rows["main"]
    print("DECISION (one row; us; TB/s = int4 bytes / alone time; 'after norm' = pair RMSNorm->GEMV minus RMSNorm):")
    head = "  ".join(f"{n + ' alone/after':>22s}" for n in SHAPES)
    print(f"  {'variant':14s} {'layer':>7s} {'vs main':>8s}  {head}")
    for v, r in rows.items():
        cells = "  ".join(f"{r['alone_us'][n]:5.1f} {result['bytes'][n] / r['alone_us'][n] / 1e6:4.2f}TB/s "
                          f"{r['after_norm_us'][n]:5.1f}" for n in SHAPES)  # fmt: skip
        print(f"  {v:14s} {r['layer_us']:7.1f} {r['layer_us'] - main['layer_us']:+8.1f}  {cells}")
    best = min(rows, key=lambda v: rows[v]["layer_us"])
    gain = main["layer_us"] - rows[best]["layer_us"]
    print(f"  best layer: {best} ({rows[best]['layer_us']:.1f} us vs main {main['layer_us']:.1f}: "
          f"{gain:+.1f} us a layer, x32 = {32 * gain / 1e3:+.3f} ms a step expected)")
    pdl_rows = [v for v in rows if rows[v]["mode"]]
    if not pdl_rows:
        print("VERDICT kernel: no PDL variant ran")
        return
    best_pdl = min(pdl_rows, key=lambda v: rows[v]["layer_us"])
    mode = rows[best_pdl]["mode"]
    pdl_gain = main["layer_us"] - rows[best_pdl]["layer_us"]
    print(f"VERDICT kernel: best PDL variant {best_pdl} saves {pdl_gain:+.1f} us a layer vs main in the chain "
          f"(negative: slower); best of all: {best} ({gain:+.1f})")
    config = _per_projection({v: r for v, r in rows.items() if r["mode"] == mode})
    plain = _per_projection({v: r for v, r in rows.items() if not r["mode"]})
    result["best"] = {"variant": best, "pdl_variant": best_pdl, "mode": mode, "config": config,
                      "plain_config": plain, "layer_gain_us": gain, "pdl_layer_gain_us": pdl_gain}
    print(f"BEST_MODE={'1' if mode == 'top' else mode}")  # FLOTILLA_INT4_WIDE_PDL's value for the engine stage
    print(f"PDL_CONFIG={config}")  # FLOTILLA_INT4_WIDE_PDL_CONFIG
    print(f"PLAIN_CONFIG={plain}")  # the plain launches' best tiles (FLOTILLA_INT4_GEMV_WIDE_CONFIG syntax)


def _per_projection(rows: dict) -> str:
    """Per projection the knobs of the row with the least after-norm time, in FLOTILLA_INT4_GEMV_WIDE_CONFIG syntax."""
    parts = []
    for name, (n, k) in SHAPES.items():
        kn = rows[min(rows, key=lambda v: rows[v]["after_norm_us"][name])]["knobs"][name]
        parts.append(f"{n}x{k}:" + ",".join(f"{key}={kn[key]}" for key in KNOB_KEYS))
    return ";".join(parts)


if __name__ == "__main__":
    main()
