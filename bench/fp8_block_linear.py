"""Block-scaled fp8 (W8A16) kernels against the per-channel fp8 paths, on one CUDA GPU, checked against the reference
on the card: the block GEMM (`kernels/triton_fp8_block_linear.py`) and the decode GEMVs' block forms that the
dispatch runs up to 16 rows (`triton_fp8_row_gemv.fp8_row_gemv_block` at one row, `triton_gemv.fp8_gemv_block`).

    python3 bench/fp8_block_linear.py --json fp8-block.json [--rows 1,4,16,64] [--sweep] [--no-bf16]
    python3 bench/fp8_block_linear.py --cpu-smoke --json smoke.json   # TRITON_INTERPRET=1, small shapes, no timing

Llama-3.1-8B's projections (qkv 4096->6144, o 4096->4096, gate_up 4096->28672, down 14336->4096) at M rows, bf16
activations, 128 x 128 blocks. Timed per call in one CUDA graph of many calls rotating over weight copies that
together exceed the L2 (bench/timing.py), so every call streams its weight from HBM:

- `block`: `dispatch.fp8_block_linear`, what a block-fp8 layer runs at M rows (`kernel`: `dispatch.fp8_block_kernel`'s
  choice), checked against `fp8_block_linear_ref` (fp32 on the card) before it is timed; `block_gemm`: the block GEMM
  at its default tiles at every M (the dispatch's kernel at all rows before session 37's decode forms); `--sweep`
  adds a few other GEMM tiles (`block <tiles>`).
- `channel_gemv`: the per-channel fp8 W8A16 GEMV (`triton_gemv.fp8_gemv`) on the same codes with one scale a row;
  `channel_dispatch`: what a per-channel fp8 layer runs at M rows (`dispatch.fp8_linear`: the one-row GEMV at 1,
  the GEMV up to 16, W8A8 `_scaled_mm` above); both checked against their own references.
- `bf16_cublas`: F.linear on a bf16 weight, the dense baseline (`--no-bf16` leaves it out).
Ratios: `block` / `channel_gemv`, `block` / `channel_dispatch` (the per-channel layer's own path: the goal is ~1),
`block_gemm` / `block` (the decode forms' speed-up over the GEMM).
GB/s is the weight bytes a call reads (1 a weight for fp8, plus the scales; 2 for bf16) over its time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
SMOKE_SHAPES = {"partial": (200, 300), "whole": (256, 384)}
BLOCK = (128, 128)
L2_ROTATION_BYTES = 256 * 2**20
GRAPH_BYTES = 2 * 2**30
# (block_m, block_n, block_k, split_k, num_warps, num_stages, swap_ab) around the defaults (`--sweep`)
SWEEP = ((16, 64, 128, 0, 4, 4, False), (16, 32, 128, 0, 4, 4, True), (16, 64, 128, 1, 4, 4, True),
         (16, 128, 128, 0, 4, 3, True), (16, 64, 64, 0, 4, 6, True), (32, 64, 128, 0, 4, 4, False),
         (64, 128, 64, 0, 8, 3, False))


def _operands(n: int, k: int, m: int, sets: int, device: str) -> dict:
    """`sets` copies of fp8 codes with block scales and with row scales, bf16 weights and rows of x."""
    from flotilla.kernels.fp8_block_linear import block_scale_shape

    codes = [(torch.randn(n, k, device=device) * 64).clamp(-448, 448).to(torch.float8_e4m3fn) for _ in range(sets)]
    block = [torch.rand(*block_scale_shape(n, k, BLOCK), device=device) * 1e-3 + 1e-4 for _ in range(sets)]
    rows = [torch.rand(n, 1, device=device) * 1e-3 + 1e-4 for _ in range(sets)]
    dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16).div_(k**0.5) for _ in range(sets)] \
        if device == "cuda" else []
    xs = torch.randn(sets, m, k, device=device, dtype=torch.bfloat16)
    return {"codes": codes, "block": block, "rows": rows, "dense": dense, "xs": xs}


def _sweep_config(m: int, n: int, k: int, tiles: tuple[int, ...]):
    """A BlockGemmConfig of `tiles`; split_k 0 takes the default's split for those tiles."""
    import triton

    from flotilla.kernels.triton_fp8_block_linear import BlockGemmConfig
    from flotilla.kernels.triton_utils import num_sms

    bm, bn, bk, split, warps, stages, swap = tiles
    if split == 0:
        tiles_out = triton.cdiv(n, bn) * triton.cdiv(m, bm)
        split = max(1, min(triton.cdiv(2 * num_sms(0), tiles_out), triton.cdiv(k, bk) // 4))
    return BlockGemmConfig(bm, bn, bk, split, warps, stages, swap)


def bench_shape(name: str, n: int, k: int, m: int, sweep: bool, bf16: bool = True) -> dict:
    """Every variant of one projection at `m` rows on the GPU: us a call, GB/s, rel_err against its reference."""
    import torch.nn.functional as F
    from timing import time_variant  # bench/timing.py

    from flotilla.kernels import dispatch
    from flotilla.kernels.fp8_block_linear import fp8_block_linear_ref
    from flotilla.kernels.fp8_linear import fp8_linear_ref, fp8_weight_only_linear_ref
    from flotilla.kernels.triton_fp8_block_linear import default_config, fp8_block_linear
    from flotilla.kernels.triton_gemv import fp8_gemv
    from flotilla.kernels.triton_utils import num_sms

    sets = max(3, -(-L2_ROTATION_BYTES // (n * k)))
    ops = _operands(n, k, m, sets, "cuda")
    codes, block, rows, dense, xs = ops["codes"], ops["block"], ops["rows"], ops["dense"], ops["xs"]
    calls = sets * max(1, round(GRAPH_BYTES / (sets * n * k)))
    ref_block = fp8_block_linear_ref(xs[0], codes[0], block[0], BLOCK)
    ref_w8a16 = fp8_weight_only_linear_ref(xs[0], codes[0], rows[0])
    ref_channel = ref_w8a16 if m <= dispatch.FP8_GEMV_MAX_ROWS else fp8_linear_ref(xs[0], codes[0], rows[0])
    cfg = default_config(m, n, k, BLOCK, num_sms(0))
    result: dict = {"name": name, "n": n, "k": k, "m": m, "weight_sets": sets, "calls_per_graph": calls,
                    "block_default": cfg.__dict__,
                    "kernel": dispatch.fp8_block_kernel(xs[0], codes[0], block[0], BLOCK)}
    block_bytes = n * k + block[0].numel() * 4
    variants: dict[str, tuple[Callable[[int], torch.Tensor], torch.Tensor, int]] = {
        "block": (lambda i: dispatch.fp8_block_linear(xs[i % sets], codes[i % sets], block[i % sets], BLOCK),
                  ref_block, block_bytes),
        "block_gemm": (lambda i: fp8_block_linear(xs[i % sets], codes[i % sets], block[i % sets], BLOCK), ref_block,
                       block_bytes),
        "channel_gemv": (lambda i: fp8_gemv(xs[i % sets], codes[i % sets], rows[i % sets]), ref_w8a16, n * k + n * 4),
        "channel_dispatch": (lambda i: dispatch.fp8_linear(xs[i % sets], codes[i % sets], rows[i % sets]),
                             ref_channel, n * k + n * 4),
    }
    if bf16:
        variants["bf16_cublas"] = (lambda i: F.linear(xs[i % sets], dense[i % sets]), F.linear(xs[0], dense[0]),
                                   2 * n * k)
    if sweep:
        for tiles in SWEEP:
            c = _sweep_config(m, n, k, tiles)
            tag = (f"block {c.block_m}x{c.block_n}x{c.block_k} s{c.split_k} w{c.num_warps} p{c.num_stages}"
                   f"{' swap' if c.swap_ab else ''}")
            variants[tag] = (lambda i, c=c: fp8_block_linear(xs[i % sets], codes[i % sets], block[i % sets], BLOCK,
                                                              config=c), ref_block, block_bytes)
    for tag, (fn, ref, nbytes) in variants.items():
        result[tag] = time_variant(fn, calls, ref, nbytes)
    ms = {tag: result[tag].get("ms") for tag in ("block", "block_gemm", "channel_gemv", "channel_dispatch")}
    if ms["block"]:
        for tag in ("channel_gemv", "channel_dispatch"):
            if ms[tag]:
                result["block"][f"vs_{tag}"] = ms["block"] / ms[tag]
        if ms["block_gemm"]:
            result["block"]["gemm_speedup"] = ms["block_gemm"] / ms["block"]
    return result


def cpu_smoke(json_path: str) -> None:
    """The kernels under TRITON_INTERPRET=1 at small shapes (one partial block each way) against the reference: the
    GEMM at 1, 16 and 65 rows, the decode forms at 1 (the row GEMV), 4 and 16 rows (the GEMV)."""
    from flotilla.kernels.fp8_block_linear import fp8_block_linear_ref
    from flotilla.kernels.triton_fp8_block_linear import fp8_block_linear
    from flotilla.kernels.triton_fp8_row_gemv import fp8_row_gemv_block
    from flotilla.kernels.triton_gemv import fp8_gemv_block

    kernels = {"gemm": fp8_block_linear, "row_gemv": lambda x, w, s, b: fp8_row_gemv_block(x, w, s, b, pdl=False),
               "gemv": fp8_gemv_block}
    cases = []
    for name, (n, k) in SMOKE_SHAPES.items():
        for kernel, m in (("gemm", 1), ("gemm", 16), ("gemm", 65), ("row_gemv", 1), ("gemv", 4), ("gemv", 16)):
            ops = _operands(n, k, m, 1, "cpu")
            out = kernels[kernel](ops["xs"][0], ops["codes"][0], ops["block"][0], BLOCK)
            ref = fp8_block_linear_ref(ops["xs"][0], ops["codes"][0], ops["block"][0], BLOCK)
            err = float((out.double() - ref.double()).norm() / ref.double().norm())
            cases.append({"name": name, "kernel": kernel, "n": n, "k": k, "m": m, "rel_err": err})
            print(f"SMOKE {kernel} {name} {n}x{k} m{m}: rel_err {err:.2e}", flush=True)
    Path(json_path).write_text(json.dumps({"cpu_smoke": cases}, indent=1) + "\n")
    if max(c["rel_err"] for c in cases) > 1.5e-2:
        sys.exit("SMOKE: the kernel disagrees with its reference")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--rows", default="1,16,64", help="comma list of M")
    p.add_argument("--sweep", action="store_true", help="also time a few other block tiles")
    p.add_argument("--no-bf16", action="store_true", help="leave out the bf16 cuBLAS baseline")
    p.add_argument("--cpu-smoke", action="store_true", help="interpreter check at small shapes, no timing")
    a = p.parse_args()
    if a.cpu_smoke:
        cpu_smoke(a.json)
        return
    if not torch.cuda.is_available():
        print("skipped: bench/fp8_block_linear.py needs a CUDA GPU")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    torch.manual_seed(0)
    results: dict = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
                     "device": torch.cuda.get_device_properties(0).name, "torch": torch.__version__, "cases": []}
    for m in (int(r) for r in a.rows.split(",")):
        for name, (n, k) in SHAPES.items():
            r = bench_shape(name, n, k, m, a.sweep, not a.no_bf16)
            results["cases"].append(r)
            Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
            timed = [t for t in r if isinstance(r[t], dict) and ("us" in r[t] or "error" in r[t])]
            cells = [f"{t} {r[t]['us']:.1f} us {r[t]['gbps']:.0f} GB/s err {r[t]['rel_err']:.1e}" if "us" in r[t]
                     else f"{t} {r[t]['error']}" for t in timed]
            ratios = " ".join(f"{key} {r['block'].get(key, float('nan')):.2f}"
                              for key in ("vs_channel_gemv", "vs_channel_dispatch", "gemm_speedup"))
            print(f"FPBLOCK {name} m{m} ({r['kernel']}): {ratios} | " + " | ".join(cells), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
