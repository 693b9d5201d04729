"""Batch-1 MLP gate/up on the GPU: cuBLAS + the SiLU kernel against the one-row gated GEMV (`triton_gated_gemv.py`).

    python bench/gated_gemv.py --json gated.json --best-out best.txt

At M = 1 and Llama-3.1-8B's shapes (gate/up `[28,672, 4,096]`, down `[4,096, 14,336]`, bf16), times inside CUDA
graphs (`--calls` back-to-back launches replayed `--reps` times, median per call; weights rotated over copies
worth more than the 50 MB L2, so every launch streams its weight from HBM):
- `pair`: what the engine runs today: `F.linear` (cuBLAS) then the SiLU-and-mul kernel (launched by PDL at one
  row, as in the engine);
- `gemv_pair`: the one-row Triton GEMV over all 28,672 rows then the SiLU kernel (for reference);
- `gated`: the gated GEMV at its default configuration, launched by PDL (the engine's launch), and `gated_plain`
  (no PDL);
- `mlp_*`: the MLP as a layer runs it at batch 1: RMSNorm (+ residual) -> gate/up (+ SiLU) -> down GEMV, each
  of `pair` and `gated` (PDL where the engine uses it: this is where the gated GEMV's early weight loads and the
  missing SiLU launch show).
Correctness first: every variant's output against `pair`'s on the first weight copy (relative error, share of
bit-equal outputs, max abs difference); a variant worse than 1e-2 relative is FAILED and never chosen.
Then `--sweep`: the gated GEMV over a small grid of tiles (compiled first by `--workers` processes), each checked
the same way. Prints `CASE`, `SWEEP` and `BEST` lines; `--best-out` gets the fastest passing config in the form
FLOTILLA_GATED_GEMV_CONFIG reads (or `default` when the default config is fastest or within 1 %).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

N_GATE_UP, K, N_DOWN = 28672, 4096, 4096
L2_BYTES = 50 << 20
# (block_n, block_k, num_warps, num_stages): the default (8, 512, 4, 2) and its neighbours within ~2x of the
# default's 64-register accumulator budget per thread
GRID = [(8, 512, 4, 2), (8, 512, 4, 3), (8, 512, 4, 4), (4, 512, 4, 3), (4, 1024, 4, 2), (8, 256, 4, 4),
        (16, 256, 4, 3), (4, 256, 4, 4), (16, 512, 8, 2), (16, 512, 8, 3), (8, 1024, 8, 2), (8, 512, 8, 3),
        (4, 512, 2, 3), (4, 256, 2, 4)]  # fmt: skip


def spec(cfg: tuple[int, int, int, int]) -> str:
    return "bn={},bk={},w={},s={}".format(*cfg)


def knobs(cfg: tuple[int, int, int, int]) -> dict[str, int]:
    return dict(zip(("block_n", "block_k", "num_warps", "num_stages"), cfg, strict=True))


class Operands:
    """One row of activations, a residual, the norm weight, and gate/up and down weight copies outgrowing L2."""

    def __init__(self) -> None:
        g = torch.Generator(device="cuda").manual_seed(0)
        bf = dict(device="cuda", dtype=torch.bfloat16)
        self.h = torch.randn(1, K, generator=g, **bf)
        self.res = torch.randn(1, K, generator=g, **bf)
        self.norm_w = 1 + 0.1 * torch.randn(K, generator=g, **bf)
        self.x = torch.randn(1, K, generator=g, **bf)
        copies = max(2, -(-4 * L2_BYTES // (N_GATE_UP * K * 2)))
        self.w = [torch.randn(N_GATE_UP, K, generator=g, **bf) / K**0.5 for _ in range(copies)]
        self.down = [torch.randn(N_DOWN, N_GATE_UP // 2, generator=g, **bf) / (N_GATE_UP // 2) ** 0.5
                     for _ in range(copies)]  # fmt: skip


def pair(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    from flotilla.kernels.triton_activation import silu_and_mul

    return silu_and_mul(F.linear(x, w))


def gemv_pair(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    from flotilla.kernels.triton_activation import silu_and_mul
    from flotilla.kernels.triton_gemv import gemv

    return silu_and_mul(gemv(x, w))


def gated(x: torch.Tensor, w: torch.Tensor, **kw) -> torch.Tensor:
    from flotilla.kernels.triton_gated_gemv import gated_gemv

    return gated_gemv(x, w, **kw)


def mlp(ops: Operands, i: int, gate_up) -> torch.Tensor:
    """A batch-1 MLP as a layer runs it: the post-attention RMSNorm with the residual, gate/up (+ SiLU), down."""
    from flotilla.kernels.triton_gemv import gemv
    from flotilla.kernels.triton_rmsnorm import rms_norm

    x, _ = rms_norm(ops.h, ops.norm_w, 1e-5, ops.res)
    return gemv(gate_up(x, ops.w[i % len(ops.w)]), ops.down[i % len(ops.down)])


def time_row(fn, ref: torch.Tensor, a: argparse.Namespace, per_weight: bool = True) -> dict:
    """`fn(0)` against `ref` (relative error, share of bit-equal outputs, max abs difference; "ok" under 1e-2), then
    the median per-call time of `a.calls` calls `fn(i)` (weight copy i % copies) in one CUDA graph replayed `a.reps`
    times (bench/timing.py): "us", and "gbps" of the gate/up weight (None where `per_weight` is off: the MLP reads
    more); {"error": ...} where anything fails."""
    from timing import time_variant  # bench/timing.py

    row = time_variant(fn, a.calls, ref, N_GATE_UP * K * 2, a.reps, checks=lambda out: agreement(out, ref))
    if "ms" in row:  # timed
        del row["ms"]  # this script's rows carry "us" alone
        row["ok"] = row["rel_err"] < 1e-2
        row["gbps"] = row["gbps"] if per_weight else None
    return row


def agreement(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Share of bit-equal outputs and the max abs difference (the relative error is time_variant's)."""
    return {"equal_share": float((out == ref).double().mean()),
            "max_abs": float((out.double() - ref.double()).abs().max())}  # fmt: skip


def compile_part(part: int, parts: int) -> None:
    """Launch every `parts`-th grid config once (Triton compiles it into its on-disk cache), PDL and not."""
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N_GATE_UP, K, device="cuda", dtype=torch.bfloat16)
    for j, cfg in enumerate(GRID):
        if j % parts == part:
            try:
                gated(x, w, pdl=True, **knobs(cfg))
            except Exception as e:  # the timing process reports it
                print(f"compile {spec(cfg)}: {str(e)[:160]}", flush=True)
    torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=32)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--workers", type=int, default=min(len(GRID), os.cpu_count() or 1))
    p.add_argument("--json", default=None)
    p.add_argument("--best-out", default=None)
    p.add_argument("--compile-part", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.compile_part is not None:
        compile_part(*(int(v) for v in a.compile_part.split("/")))
        return
    procs = []
    t0 = time.perf_counter()
    if a.sweep and a.workers > 1:  # the grid compiles in the background while the cases run
        procs = [subprocess.Popen([sys.executable, __file__, "--compile-part", f"{i}/{a.workers}"])
                 for i in range(a.workers)]  # fmt: skip
    ops = Operands()
    n = len(ops.w)
    gb = N_GATE_UP * K * 2 / 1e9
    result: dict = {"device": torch.cuda.get_device_name(), "weight_gb": gb, "cases": {}, "sweep": []}

    def save() -> None:
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)

    ref = pair(ops.x, ops.w[0])
    mlp_ref = mlp(ops, 0, pair)
    cases = {  # each checked on its first call (weight copy 0) against the pair's output
        "pair": (lambda i: pair(ops.x, ops.w[i % n]), ref),
        "gemv_pair": (lambda i: gemv_pair(ops.x, ops.w[i % n]), ref),
        "gated_plain": (lambda i: gated(ops.x, ops.w[i % n], pdl=False), ref),
        "gated": (lambda i: gated(ops.x, ops.w[i % n]), ref),
        "mlp_pair": (lambda i: mlp(ops, i, pair), mlp_ref),
        "mlp_gated": (lambda i: mlp(ops, i, gated), mlp_ref),
    }  # fmt: skip
    for name, (fn, expect) in cases.items():  # a failure is reported; the other cases still run
        row = time_row(fn, expect, a, per_weight=not name.startswith("mlp"))
        result["cases"][name] = row
        extra = f" {row['gbps']:.0f} GB/s" if row.get("gbps") else ""
        print(f"CASE {name:12s} " + (f"{row['us']:8.2f} us{extra} | vs pair: rel {row['rel_err']:.1e}, "
                                     f"equal {row['equal_share']:.3f}, max abs {row['max_abs']:.1e}"
                                     + ("" if row["ok"] else " FAILED") if "us" in row else row.get("error", "?")),
              flush=True)  # fmt: skip
        save()
    for proc in procs:
        proc.wait()
    result["compile_s"] = time.perf_counter() - t0
    from flotilla.kernels.triton_gated_gemv import default_config

    default = default_config(1, N_GATE_UP // 2, K, torch.cuda.get_device_properties(0).multi_processor_count)
    default_cfg = (default.block_n, default.block_k, default.num_warps, default.num_stages)
    for cfg in GRID if a.sweep else []:
        row = {"config": spec(cfg)} | time_row(lambda i, c=cfg: gated(ops.x, ops.w[i % n], **knobs(c)), ref, a)
        if "us" in row:
            print(f"SWEEP {spec(cfg):24s} {row['us']:8.2f} us {row['gbps']:5.0f} GB/s rel {row['rel_err']:.1e}"
                  + ("" if row["ok"] else " FAILED"), flush=True)  # fmt: skip
        else:  # reported; the next config still runs
            print(f"SWEEP {spec(cfg):24s} {row['error']}", flush=True)
        result["sweep"].append(row)
        save()
    passing = sorted((r for r in result["sweep"] if r.get("ok") and "us" in r), key=lambda r: r["us"])
    best = "default"
    if passing:
        d_us = next((r["us"] for r in passing if r["config"] == spec(default_cfg)), None)
        top = passing[0]
        if d_us is None or top["us"] < 0.99 * d_us:
            best = top["config"]
        print(f"BEST {top['config']} {top['us']:.2f} us {top['gbps']:.0f} GB/s (default {spec(default_cfg)}: "
              f"{d_us if d_us is None else round(d_us, 2)} us; pair {result['cases']['pair'].get('us')} us) "
              f"-> engine config: {best}", flush=True)  # fmt: skip
    result["best"] = best
    save()
    if a.best_out:
        with open(a.best_out, "w") as f:
            f.write(best + "\n")


if __name__ == "__main__":
    main()
