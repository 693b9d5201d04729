"""The fp8 W8A16 GEMV alone against the W8A8 path it replaces at decode and against bf16, on one CUDA GPU.

    python3 bench/fp8_gemv.py --json fp8-gemv.json [--rows 1,4,8,16] [--sweep]

Llama-3.1-8B's projections (qkv 4096->6144, o 4096->4096, gate_up 4096->28672, down 14336->4096) at M
decode rows, bf16 activations. Timed per call, each in one CUDA graph of many calls rotating over weight
copies that together exceed the L2 several times (`bench/kernels.py`'s `graph_ms`), so every call
streams its weight from HBM, as a decode step does:

- `fp8_gemv`: the Triton W8A16 GEMV (`kernels.dispatch.fp8_linear` at <= 16 rows), default config;
  `fp8_gemv_other_path` the same with the other arithmetic (FMA where the default is `tl.dot`, and
  the reverse), to check where the default switches.
- `w8a8`: the dispatch's path above 16 rows, `fp8_linear_scaled_mm`: the fused Triton per-token
  activation quantization + `torch._scaled_mm`; `w8a8_torch_quant`, what ran at every size before
  (the quantization in ~8 torch ops); `scaled_mm_only`, the GEMM alone on an activation quantized
  outside the timing.
- `bf16_gemv` (the Triton GEMV on a bf16 weight) and `bf16_cublas` (F.linear).

GB/s is the weight bytes a call must read (1 byte a weight for fp8, 2 for bf16) over its time; the
copy bandwidth of the same run is the ceiling. `speedup_vs_bf16` is the faster bf16 time over the
fp8 GEMV's, whose ideal is 2.0 (half the bytes). Every output is checked against the fp32 reference
of its scheme before it is timed. Without CUDA the script says so and exits 0 (nothing to measure).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
L2_ROTATION_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
DEV = "cuda"
GRAPH_BYTES = 2 * 2**30  # weight bytes streamed per graph replay (~0.5 ms at copy rate)
# A few tiles/paths around the default (`--sweep`): the FMA/dot boundary is the open question.
SWEEP = (
    {"use_dot": False},
    {"use_dot": True},
    {"use_dot": False, "num_warps": 8},
    {"use_dot": True, "block_n": 32, "block_k": 256},
    {"use_dot": True, "block_n": 64, "block_k": 256, "num_stages": 3},
    {"use_dot": True, "block_n": 128, "block_k": 128},
)


def grid(m: int) -> list[dict]:
    """`--grid`: a wider search around the defaults, per row count: FMA tiles (bytes in flight per program
    and the register budget) up to M = 4, `tl.dot` tiles from M = 4 on (both at M = 4, the boundary)."""
    cfgs: list[dict] = []
    if m <= 4:
        cfgs += [{"use_dot": False, "block_n": bn, "block_k": bk, "num_warps": w, "num_stages": st}
                 for bn in (4, 8, 16, 32) for bk in (512, 1024, 2048) for w in (4, 8) for st in (1, 2, 3)
                 if bn * bk * m <= 64 * 32 * w * 2]  # fmt: skip
    if m >= 4:
        cfgs += [{"use_dot": True, "block_n": bn, "block_k": bk, "num_warps": w, "num_stages": st}
                 for bn in (16, 32, 64) for bk in (128, 256, 512) for w in (4, 8) for st in (2, 4)]  # fmt: skip
    return cfgs


def bench_shape(name: str, n: int, k: int, m: int, sweep: bool, wide: bool = False) -> dict:
    """All variants of one projection at `m` rows: ms per call, GB/s of weight bytes, errors."""
    import torch.nn.functional as F
    from timing import fastest, time_variant  # bench/timing.py

    from flotilla.kernels.fp8_linear import fp8_weight_only_linear_ref, quantize_fp8_activations, quantize_fp8_rows
    from flotilla.kernels.fp8_scaled_mm import fp8_linear_scaled_mm
    from flotilla.kernels.linear import gemv_ref
    from flotilla.kernels.triton_gemv import default_config, fp8_gemv, gemv
    from flotilla.kernels.triton_utils import num_sms

    sets = max(3, -(-L2_ROTATION_BYTES // (n * k)))
    dense = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16).div_(k**0.5) for _ in range(sets)]
    fp8 = [quantize_fp8_rows(w) for w in dense]
    xs = torch.randn(sets, m, k, device=DEV, dtype=torch.bfloat16)
    x8 = [quantize_fp8_activations(x, None) for x in xs]
    calls = sets * max(1, round(GRAPH_BYTES / (sets * n * k)))
    ref8, ref16 = fp8_weight_only_linear_ref(xs[0], *fp8[0]), gemv_ref(xs[0], dense[0])
    result: dict = {"name": name, "n": n, "k": k, "m": m, "weight_sets": sets, "calls_per_graph": calls}
    result["fp8_default_config"] = dataclasses.asdict(default_config(m, n, k, num_sms(0), weight_bytes=1))

    def scaled_mm_only(i: int) -> torch.Tensor:
        (w, ws), (xq, xs_) = fp8[i % sets], x8[i % sets]
        return torch._scaled_mm(xq, w.t(), scale_a=xs_, scale_b=ws.reshape(1, -1), out_dtype=torch.bfloat16)

    variants: dict[str, tuple[Callable[[int], torch.Tensor], torch.Tensor, int]] = {
        "fp8_gemv": (lambda i: fp8_gemv(xs[i % sets], *fp8[i % sets]), ref8, 1),
        "w8a8": (lambda i: fp8_linear_scaled_mm(xs[i % sets], *fp8[i % sets]), ref8, 1),
        "w8a8_torch_quant": (lambda i: fp8_linear_scaled_mm(xs[i % sets], *fp8[i % sets], fused_quant=False), ref8, 1),
        "scaled_mm_only": (scaled_mm_only, ref8, 1),
        "bf16_gemv": (lambda i: gemv(xs[i % sets], dense[i % sets]), ref16, 2),
        "bf16_cublas": (lambda i: F.linear(xs[i % sets], dense[i % sets]), ref16, 2),
    }
    # The other arithmetic path at the default tiles for that path: is the FMA/dot boundary (M > 4) right?
    other = {"use_dot": not result["fp8_default_config"]["use_dot"]}
    variants["fp8_gemv_other_path"] = (lambda i: fp8_gemv(xs[i % sets], *fp8[i % sets], **other), ref8, 1)
    if sweep or wide:
        for cfg in grid(m) if wide else SWEEP:
            tag = "fp8_gemv " + " ".join(f"{key}={v}" for key, v in cfg.items())
            variants[tag] = (lambda i, c=cfg: fp8_gemv(xs[i % sets], *fp8[i % sets], **c), ref8, 1)
    for tag, (fn, ref, nbytes) in variants.items():
        result[tag] = time_variant(fn, calls, ref, n * k * nbytes)
    bf16_ms = min(result[t].get("ms", float("inf")) for t in ("bf16_gemv", "bf16_cublas"))
    for tag in ("fp8_gemv", "w8a8", "w8a8_torch_quant"):
        if "ms" in result[tag]:
            result[tag]["speedup_vs_bf16"] = bf16_ms / result[tag]["ms"]
    if "ms" in result["fp8_gemv"] and "ms" in result["w8a8_torch_quant"]:  # vs the path it replaced
        result["fp8_gemv"]["speedup_vs_w8a8"] = result["w8a8_torch_quant"]["ms"] / result["fp8_gemv"]["ms"]
    best = fastest(result, "fp8_gemv")
    if best:
        ms = result[best]["ms"]
        result["best_fp8_gemv"] = {"tag": best, "us": 1e3 * ms, "gbps": n * k / ms / 1e6}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--rows", default="1,4,8,16", help="comma list of M (decode rows)")
    p.add_argument("--sweep", action="store_true", help="also time a few other fp8 GEMV configurations")
    p.add_argument("--grid", action="store_true", help="time a wide grid of fp8 GEMV tiles (see grid())")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: bench/fp8_gemv.py needs a CUDA GPU")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from kernels import copy_bandwidth  # bench/kernels.py

    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    results: dict = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "device": props.name,
                     "torch": torch.__version__, "copy": copy_bandwidth(), "cases": []}  # fmt: skip
    copy = results["copy"]["gbps"]
    print(f"copy {copy:.0f} GB/s", flush=True)
    for m in (int(r) for r in a.rows.split(",")):
        for name, (n, k) in SHAPES.items():
            r = bench_shape(name, n, k, m, a.sweep, a.grid)
            results["cases"].append(r)
            Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
            cells = [f"{t} {r[t]['us']:.1f} us {r[t]['gbps']:.0f} GB/s" if "us" in r[t] else f"{t} {r[t]['error']}"
                     for t in r if isinstance(r[t], dict) and ("us" in r[t] or "error" in r[t])
                     and not (a.grid and t.startswith("fp8_gemv "))]  # fmt: skip
            f = r["fp8_gemv"]
            lead = (f"x{f.get('speedup_vs_bf16', 0):.2f} bf16, x{f.get('speedup_vs_w8a8', 0):.2f} w8a8, "
                    f"{f.get('gbps', 0) / copy:.2f} copy")  # fmt: skip
            print(f"FP8GEMV {name} m{m}: {lead} | " + " | ".join(cells), flush=True)
            if "best_fp8_gemv" in r:
                b = r["best_fp8_gemv"]
                print(f"BEST {name} m{m}: {b['us']:.1f} us {b['gbps']:.0f} GB/s {b['tag']}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
