"""The int4 (W4A16, group 128) matmul paths alone against bf16, on one CUDA GPU, at decode row counts.

    python3 bench/int4_gemv.py --json int4-gemv.json [--rows 1,2,4,16,64] [--grid] [--grid-rows 1]

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

PATHS = ("int4_gemv", "int4_gemv_dot", "int4_gemm", "int4_dequant_cublas", "bf16_cublas")
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


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in fp64."""
    return float((out.double() - ref.double()).norm() / ref.double().norm())


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


def bench_shape(name: str, n: int, k: int, m: int, grid_cfgs: list[dict]) -> dict:
    """All paths of one projection at `m` rows (and the GEMV over `grid_cfgs`): us per call, GB/s, errors."""
    import torch.nn.functional as F

    from flotilla.kernels.packed_int_linear import packed_int_linear_ref
    from flotilla.kernels.triton_int4_gemm import int4_dequantize, int4_linear
    from flotilla.kernels.triton_int4_gemv import default_config, int4_gemv
    from flotilla.kernels.triton_utils import num_sms
    from kernels import graph_ms  # bench/kernels.py

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
                    "gemv_default_config": dataclasses.asdict(default_config(m, n, k, num_sms(0)))}  # fmt: skip

    def gemv(i: int, **knobs) -> torch.Tensor:
        packed, scales, _ = ws[i % sets]
        return int4_gemv(xs[i % sets], packed, scales, None, GROUP, **knobs)

    variants: dict[str, tuple[Callable[[int], torch.Tensor], torch.Tensor, int]] = {
        "int4_gemv": (gemv, ref, nbytes),
        "int4_gemv_dot": (lambda i: gemv(i, use_dot=True), ref, nbytes),
        "int4_gemm": (lambda i: int4_linear(xs[i % sets], *ws[i % sets], GROUP), ref, nbytes),
        "int4_dequant_cublas": (lambda i: F.linear(xs[i % sets], int4_dequantize(*ws[i % sets], GROUP, torch.bfloat16)),
                                ref, nbytes),
        "bf16_cublas": (lambda i: F.linear(xs[i % sets], dense[i % dense_sets]), ref16, 2 * n * k),
    }  # fmt: skip
    for cfg in grid_cfgs:
        tag = "int4_gemv " + " ".join(f"{key}={v}" for key, v in cfg.items())
        variants[tag] = (lambda i, c=cfg: gemv(i, **c), ref, nbytes)
    for tag, (fn, expect, read) in variants.items():
        try:  # a config that fails (resources) is recorded, not fatal
            err = rel_err(fn(0).float(), expect)
            ms = graph_ms(fn, calls if read == nbytes else max(3, calls // 4), replays=5 if tag.startswith("int4_gemv ")
                          else 15)  # fmt: skip
            result[tag] = {"us": 1e3 * ms, "gbps": read / ms / 1e6, "rel_err": err}
        except Exception as exc:
            result[tag] = {"error": repr(exc)[:300]}
    if "us" in result["bf16_cublas"]:
        for tag in ("int4_gemv", "int4_gemv_dot", "int4_gemm", "int4_dequant_cublas"):
            if "us" in result[tag]:
                result[tag]["speedup_vs_bf16"] = result["bf16_cublas"]["us"] / result[tag]["us"]
    timed = {t: v["us"] for t, v in result.items() if t.startswith("int4_gemv") and isinstance(v, dict) and "us" in v
             and v["rel_err"] < 1e-2}  # fmt: skip
    if timed:
        best = min(timed, key=timed.__getitem__)
        result["best_int4_gemv"] = {"tag": best, "us": timed[best], "gbps": nbytes / timed[best] / 1e3}
    return result


def grid_summary(cases: list[dict], m: int) -> dict | None:
    """The GEMV tile with the least time summed over the four projections at `m` rows, and the default's."""
    rows = [c for c in cases if c["m"] == m]
    if len(rows) < len(SHAPES):
        return None
    tags = [t for t in rows[0] if t.startswith("int4_gemv") and all("us" in c.get(t, {}) and c[t]["rel_err"] < 1e-2
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
    p.add_argument("--grid-rows", default="1", help="comma list of M for --grid")
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
    for m in (int(r) for r in a.rows.split(",")):
        for name, (n, k) in SHAPES.items():
            started = time.perf_counter()
            r = bench_shape(name, n, k, m, grid(m) if m in grid_rows else [])
            results["cases"].append(r)
            Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
            cells = [f"{t} {r[t]['us']:.1f} us {r[t]['gbps']:.0f} GB/s" if "us" in r[t] else f"{t} {r[t]['error']}"
                     for t in PATHS]  # fmt: skip
            g = r["int4_gemv"]
            lead = f"x{g.get('speedup_vs_bf16', 0):.2f} bf16, {g.get('gbps', 0) / copy:.2f} copy"
            print(f"INT4 {name} m{m}: {lead} | " + " | ".join(cells) + f" ({time.perf_counter() - started:.0f} s)",
                  flush=True)  # fmt: skip
            if "best_int4_gemv" in r and m in grid_rows:
                b = r["best_int4_gemv"]
                print(f"BEST {name} m{m}: {b['us']:.1f} us {b['gbps']:.0f} GB/s {b['tag']}", flush=True)
            torch.cuda.empty_cache()
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
