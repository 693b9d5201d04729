"""Decode GEMMs of Llama-3.1-8B on the GPU: cuBLAS (`F.linear`) against the Triton skinny GEMM, per shape and M.

    python bench/skinny_gemm.py --rows 1,16,32,64,128 --grid-rows 64 --workers 12 --json out.json

For each projection (qkv 6144x4096, o 4096x4096, gate_up 28672x4096 and gate_up with the gated SiLU
epilogue, down 4096x14336, the LM head 128256x4096) and each M of `--rows`, times:
- `torch`: `F.linear` (gated: `F.linear` then the SiLU-and-mul kernel the engine runs);
- `default`: the skinny GEMM at `default_config` (rows 17..256; M <= 16 is the GEMV's and cuBLAS's);
- at `--grid-rows`: every configuration of the grid (tiles, warps, stages fitting shared memory, splits of K),
  and at the other rows the `--top` best of the grid for that shape.
Each figure is one CUDA graph of `--calls` back-to-back launches replayed `--reps` times (median of the
replays, per launch), the weight rotated over copies worth more than the 50 MB L2, so every launch streams
its weight from HBM, and the boundary between kernels is paid as in the engine's graphs. GB/s counts the
weight bytes only. Compilation goes first, over `--workers` processes (each compiles its share of the
variants by launching them once into Triton's on-disk cache), so the timing process only loads binaries.
Printed: one `BEST` line per shape and M, and `CONFIGS <spec>` (FLOTILLA_SKINNY_GEMM_CONFIGS) with the
winner of each shape at each padded M where it beat cuBLAS.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {  # name: (N rows of the weight, K, gated)
    "qkv": (6144, 4096, False),
    "o": (4096, 4096, False),
    "gate_up": (28672, 4096, False),
    "gate_up_silu": (28672, 4096, True),
    "down": (4096, 14336, False),
    "lm_head": (128256, 4096, False),
}
L2_BYTES = 50 << 20


def _one_row_tiles() -> list:
    """Tiles tried at M = 1 (the batch padded to 16): narrow column tiles, deep K steps, both load paths."""
    from flotilla.kernels.triton_skinny_gemm import SkinnyGemmConfig

    tiles = ((64, 128, 4), (64, 128, 6), (64, 256, 4), (128, 128, 4))
    return [SkinnyGemmConfig(block_n=bn, block_k=bk, num_stages=st, tma=t) for bn, bk, st in tiles for t in (0, 1)]


ONE_ROW_TILES = _one_row_tiles()


def grid_configs(bm: int, gated: bool) -> list:
    """Tile configurations (split 1) that fit shared memory at batch tile `bm`: pointer loads (cp.async) and,
    at 4 warps, tensor-descriptor loads (TMA); 32-wide column tiles too at `bm` <= 32."""
    from flotilla.kernels.triton_skinny_gemm import SMEM_LIMIT, SkinnyGemmConfig, smem_bytes

    out = []
    # 32-wide column tiles only at batch tiles of up to 32 rows (a cached prefix's short extend): twice the
    # programs of 64-wide ones on qkv / o_proj (192 / 128 on 132 SMs) without a split-K fix-up
    for bn in ((32,) if bm <= 32 else ()) + (64, 128, 256):
        for bk in (64, 128):
            for warps in (4, 8):
                if warps == 8 and bn * (2 if gated else 1) < 256:  # 8 warps where 4 would need 200+ registers
                    continue
                for stages in (4, 5, 6):  # a weight stream wants 3+ tiles in flight
                    for tma in (0, 1) if warps == 4 else (0,):  # TMA issues from one thread: 4 warps are enough
                        cfg = SkinnyGemmConfig(block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, tma=tma)
                        if smem_bytes(cfg, bm, gated) <= SMEM_LIMIT:
                            out.append(cfg)
    return out


def splits_for(cfg, n: int, k: int, sms: int) -> list[int]:
    """Splits of K worth timing: 1, and more while the column tiles fill under two waves (4+ K tiles a range)."""
    tiles = -(-n // cfg.block_n)
    if tiles >= 2 * sms:
        return [1]
    return [s for s in (1, 2, 3, 4, 6, 8) if s == 1 or k // cfg.block_k >= 4 * s]


def variants(name: str, m: int, grid: bool, top: list | None, sms: int) -> list:
    """The skinny-GEMM configurations timed for one shape and M."""
    from flotilla.kernels.triton_skinny_gemm import block_m, default_config

    n_rows, k, gated = SHAPES[name]
    n = n_rows // 2 if gated else n_rows
    if m == 1:  # the GEMV's territory: a small grid on the shapes the engine runs on the GEMV at one row
        return [dataclasses.replace(cfg, split_k=s) for cfg in ONE_ROW_TILES for s in splits_for(cfg, n, k, sms)
                if name in ("qkv", "o", "down")]  # fmt: skip
    if m < 16:
        return []
    found = [default_config(m, n, k, sms, gated)]
    if grid:
        for cfg in grid_configs(block_m(m), gated):  # 32-wide tiles are there to avoid the fix-up: split 2 at most
            found += [dataclasses.replace(cfg, split_k=s) for s in splits_for(cfg, n, k, sms)
                      if cfg.block_n > 32 or s <= 2]
    for cfg in top or []:
        found.append(cfg)
    seen, out = set(), []
    for cfg in found:
        if cfg not in seen:
            seen.add(cfg)
            out.append(cfg)
    return out


class Operands:
    """A shape's activations and weight copies (enough to outgrow L2)."""

    def __init__(self, name: str, m: int) -> None:
        n_rows, k, self.gated = SHAPES[name]
        copies = max(1, -(-4 * L2_BYTES // (n_rows * k * 2)))
        g = torch.Generator(device="cuda").manual_seed(0)
        self.x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        self.weights = [torch.randn(n_rows, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5
                        for _ in range(copies)]  # fmt: skip
        self.bytes = n_rows * k * 2


def torch_call(ops: Operands, w: torch.Tensor) -> torch.Tensor:
    from flotilla.kernels.triton_activation import silu_and_mul

    y = F.linear(ops.x, w)
    return silu_and_mul(y) if ops.gated else y


def time_us(fn, ops: Operands, calls: int, reps: int) -> float:
    """Median per-launch us of `calls` launches `fn(w)` captured in one CUDA graph, the weight rotated over
    `ops.weights` (bench/kernels.py's `graph_ms`, as bench/timing.py times the GEMVs; its warm-up launches compile /
    load and allocate the split-K counters outside the capture)."""
    from kernels import graph_ms  # bench/kernels.py

    return 1e3 * graph_ms(lambda i: fn(ops.weights[i % len(ops.weights)]), calls, reps)


def check(ops: Operands, cfg) -> float:
    """Relative error of the skinny GEMM against the torch path on the first weight copy."""
    from flotilla.kernels.triton_skinny_gemm import skinny_gemm

    ref = torch_call(ops, ops.weights[0]).double()
    out = skinny_gemm(ops.x, ops.weights[0], gated=ops.gated, config=cfg).double()
    return float((out - ref).norm() / ref.norm())


def time_shape(name: str, m: int, cfgs: list, a) -> list[dict]:
    """Rows of timings for one shape and M: torch first, then each configuration (the fastest checked
    against torch: `rel_err`)."""
    from flotilla.kernels.triton_skinny_gemm import parse_config, skinny_gemm

    ops = Operands(name, m)
    t_torch = time_us(lambda w: torch_call(ops, w), ops, a.calls, a.reps)
    rows = [{"shape": name, "m": m, "impl": "torch", "us": t_torch, "gbps": ops.bytes / t_torch / 1e3}]
    if m <= 16 and not ops.gated:  # the engine's Triton GEMV (its default tiles), for reference
        from flotilla.kernels.triton_gemv import gemv

        t = time_us(lambda w: gemv(ops.x, w), ops, a.calls, a.reps)
        rows.append({"shape": name, "m": m, "impl": "gemv", "us": t, "gbps": ops.bytes / t / 1e3})
    for cfg in cfgs:
        try:
            t = time_us(lambda w, c=cfg: skinny_gemm(ops.x, w, gated=ops.gated, config=c), ops, a.calls, a.reps)
        except Exception as e:  # a config that fails to compile or launch is reported, not fatal
            rows.append({"shape": name, "m": m, "impl": "triton", "config": cfg.spec(), "error": str(e)[:200]})
            continue
        rows.append({"shape": name, "m": m, "impl": "triton", "config": cfg.spec(), "us": t,
                     "gbps": ops.bytes / t / 1e3})  # fmt: skip
    timed = [r for r in rows if r["impl"] == "triton" and "us" in r]
    if timed:
        best = min(timed, key=lambda r: r["us"])
        best["rel_err"] = check(ops, parse_config(best["config"]))
    return rows


def plan(a, sms: int, tops: dict) -> list[tuple[str, int, list]]:
    grid_rows = int(a.grid_rows)
    return [(name, m, variants(name, m, m == grid_rows, tops.get(name), sms)) for name in a.shapes for m in a.rows]


def compile_share(a, sms: int, tops: dict, part: int, parts: int) -> None:
    """Launch every `parts`-th distinct kernel variant once (Triton compiles it into its cache). Variants
    differing only in the number of K ranges (> 1) or in N and K (all multiples of 16) are one kernel."""
    from flotilla.kernels.triton_skinny_gemm import skinny_gemm

    seen: set[tuple] = set()
    for name, m, cfgs in plan(a, sms, tops):
        n_rows, k, gated = SHAPES[name]
        x = w = None
        for cfg in cfgs:
            key = (dataclasses.replace(cfg, split_k=min(cfg.split_k, 2)), gated, m % 16 == 0, m == 1, block_of(m))
            if key in seen:
                continue
            seen.add(key)
            if len(seen) % parts != part:
                continue
            if x is None:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(n_rows, k, device="cuda", dtype=torch.bfloat16)
            try:
                skinny_gemm(x, w, gated=gated, config=cfg)
            except Exception as e:  # the timing process reports it
                print(f"compile {name} m={m} {cfg.spec()}: {str(e)[:120]}", flush=True)
    torch.cuda.synchronize()


def block_of(m: int) -> int:
    from flotilla.kernels.triton_skinny_gemm import block_m

    return block_m(m)


def compile_all(a, sms: int, tops: dict) -> float:
    """`--workers` child processes compile the plan's variants; returns the seconds it took."""
    t0 = time.perf_counter()
    if a.workers <= 1:
        return 0.0
    procs = [subprocess.Popen([sys.executable, __file__, "--compile-part", f"{i}/{a.workers}",
                               "--tops", json.dumps({k: [c.spec() for c in v] for k, v in tops.items()}),
                               *sys.argv[1:]]) for i in range(a.workers)]  # fmt: skip
    for p in procs:
        p.wait()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,24,32,64,128")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--grid-rows", default="64", help="M timed over the whole grid ('' for none)")
    p.add_argument("--top", type=int, default=4, help="grid winners per shape timed at the other rows")
    p.add_argument("--calls", type=int, default=24)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    p.add_argument("--json", default=None)
    p.add_argument("--compile-part", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tops", default="{}", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.rows = [int(r) for r in a.rows.split(",")]
    a.shapes = a.shapes.split(",")
    from flotilla.kernels.triton_skinny_gemm import CUBLAS, block_m, config_key, parse_config
    from flotilla.kernels.triton_utils import num_sms

    sms = num_sms(0)
    tops = {k: [parse_config(s) for s in v] for k, v in json.loads(a.tops).items()}
    if a.compile_part is not None:
        part, parts = (int(v) for v in a.compile_part.split("/"))
        if a.grid_rows and tops:  # second round: only the winners at the other rows
            a.rows = [m for m in a.rows if str(m) != a.grid_rows]
        compile_share(a, sms, tops, part, parts)
        return
    result = {"command": "python bench/skinny_gemm.py " + " ".join(sys.argv[1:]),
              "device": torch.cuda.get_device_name(), "sms": sms, "rows": [], "best": {}}  # fmt: skip

    winners: dict[str, str] = {}

    def save() -> None:
        result["configs"] = ";".join(f"{key}:{spec}" for key, spec in sorted(winners.items()))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)

    grid_rows = [int(a.grid_rows)] if a.grid_rows else []
    order = grid_rows + sorted((m for m in a.rows if m not in grid_rows), reverse=True)  # M = 1 last
    rows_all, a.rows = a.rows, grid_rows
    result["compile_s"] = [compile_all(a, sms, {})]
    a.rows = rows_all
    for i, m in enumerate(order):
        if i == 1 and grid_rows:  # the grid's winners at the other rows: compile them in parallel first
            a.rows = [r for r in rows_all if r not in grid_rows]
            result["compile_s"].append(compile_all(a, sms, tops))
            a.rows = rows_all
        for name in a.shapes:
            rows = time_shape(name, m, variants(name, m, m in grid_rows, tops.get(name), sms), a)
            result["rows"] += rows
            t_torch = rows[0]["us"]
            timed = sorted((r for r in rows if r["impl"] == "triton" and "us" in r), key=lambda r: r["us"])
            line = f"BEST {name:13s} m={m:<4d} torch {t_torch:8.2f} us {rows[0]['gbps']:6.0f} GB/s"
            line += "".join(f" | gemv {r['us']:.2f} us {r['gbps']:.0f} GB/s" for r in rows if r["impl"] == "gemv")
            if timed:
                best = timed[0]
                default = next((r.get("us", float("nan")) for r in rows if r["impl"] == "triton"), float("nan"))
                line += (f" | triton {best['us']:8.2f} us {best['gbps']:6.0f} GB/s ({best['us'] / t_torch:.3f}x) "
                         f"{best['config']} err {best['rel_err']:.1e} | default {default:.2f} us")
                n_rows, k, gated = SHAPES[name]
                result["best"][f"{name}@{m}"] = {"torch_us": t_torch, **best}
                if m in grid_rows:
                    tops[name] = [parse_config(r["config"]) for r in timed[: a.top]]
                if m > 16:  # the engine's rows 17..128: the winner, or cuBLAS where it was faster
                    ok = best["us"] < t_torch and best["rel_err"] < 2e-2
                    winners[config_key(n_rows, k, block_m(m), gated)] = best["config"] if ok else CUBLAS
            print(line, flush=True)
            torch.cuda.empty_cache()  # the shape's weight copies, before the next shape's
            save()
    save()
    print(f"CONFIGS {result['configs']}", flush=True)


if __name__ == "__main__":
    main()
