"""The one-row LM head (`[1, hidden] x [vocab, hidden]^T`, bf16) as cuBLAS against the Triton GEMV's tiles, on one
CUDA GPU.

    python3 bench/lm_head_gemv.py --json lm-head.json [--shapes llama-3.1-8b,qwen2.5-7b] [--budget-s 60]

At batch 1 the LM head is the decode step's largest single weight (Llama-3.1-8B: 128,256 x 4,096 bf16, 1.05 GB) and
runs through `kernels.dispatch.lm_head_linear`: cuBLAS (`F.linear`) unless FLOTILLA_LM_HEAD_GEMV names the Triton
GEMV (`kernels/triton_gemv.py`) and its knobs. Per shape, each variant is timed per call in one CUDA graph of many
calls rotating over weight copies (`bench/kernels.py`'s `graph_ms`; one copy already exceeds any L2 ~20 times, two
keep consecutive calls on different memory), so that every call streams its weight from HBM as a decode step does:

- `cublas`: `F.linear`, what the engine runs today; `cublas mv`: `torch.mv(W, x)`, the same product as a
  matrix-vector call (cuBLAS may pick another kernel);
- `gemv default`: the GEMV at `default_config`'s tiles (FLOTILLA_LM_HEAD_GEMV=1), plain launches;
- `gemv bn=.. bk=.. w=.. s=..`: a grid of FMA tiles (rows a program, K a step, warps, pipeline depth) within twice
  the 64-register accumulator budget, and a few `tl.dot` tiles (the row padded to 16), the first shape only
  (others: the default, and the first shape's best);
- `gemv+argmax` / `cublas+argmax`: the winner and cuBLAS each followed by the greedy sampler's argmax
  (`kernels/triton_argmax.py`), what a greedy step pays for its token after the graph.

GB/s is the weight bytes over the time (the copy bandwidth of the same run is printed as the ceiling). Every output is
checked against the fp32 product (relative error < 1e-2) and its argmax against cuBLAS's before it is timed. The grid
stops when `--budget-s` is spent (each config compiles once; the rest are recorded as skipped). The last line,
`SWITCH FLOTILLA_LM_HEAD_GEMV=...`, is the first shape's best GEMV as the switch's value (or 0 where cuBLAS is
faster). Without CUDA the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

# (vocab, hidden) of the LM heads: Llama-3.1-8B, Qwen2.5-7B, Llama-3.2-3B, Llama-3.2-1B
SHAPES = {"llama-3.1-8b": (128256, 4096), "qwen2.5-7b": (152064, 3584), "llama-3.2-3b": (128256, 3072),
          "llama-3.2-1b": (128256, 2048)}  # fmt: skip
DEV = "cuda"
COPIES = 2
GRAPH_BYTES = 6 * 2**30  # weight bytes a graph replay streams (~2 ms at HBM rate)


def grid() -> list[dict]:
    """FMA tiles whose accumulator fits 128 fp32 registers a thread, then a few `tl.dot` tiles."""
    # the likeliest first (the gated GEMV's one-row winner streams 8 weight rows x 512 K, 4 warps, 3 stages): the
    # grid stops at the time budget
    cfgs: list[dict] = [{"block_n": bn, "block_k": bk, "num_warps": w, "num_stages": s, "use_dot": False}
                        for s in (3, 2, 4) for w in (4, 8) for bk in (512, 1024) for bn in (8, 4, 16)
                        if bn * bk <= 64 * 32 * w * 2]  # fmt: skip
    cfgs += [{"block_n": bn, "block_k": bk, "num_warps": 4, "num_stages": s, "use_dot": True}
             for bn, bk in ((64, 128), (64, 256), (128, 128)) for s in (3, 4)]  # fmt: skip
    return cfgs


def spec(knobs: dict) -> str:
    """`knobs` as FLOTILLA_LM_HEAD_GEMV's value ("1" for the default tiles)."""
    from flotilla.kernels.dispatch import LM_HEAD_KNOBS

    return LM_HEAD_KNOBS.spec(knobs) or "1"


def bench_shape(name: str, n: int, k: int, cfgs: list[dict], deadline: float) -> dict:
    """cuBLAS and the GEMV configs `cfgs` at one LM-head shape: us a call, GB/s of weight bytes, errors."""
    import torch.nn.functional as F
    from timing import fastest, time_variant  # bench/timing.py

    from flotilla.kernels.dispatch import LM_HEAD_KNOBS
    from flotilla.kernels.triton_argmax import argmax_rows
    from flotilla.kernels.triton_gemv import default_config, gemv
    from flotilla.kernels.triton_utils import num_sms
    from kernels import graph_ms  # bench/kernels.py

    weights = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16).div_(k**0.5) for _ in range(COPIES)]
    xs = torch.randn(COPIES, 1, k, device=DEV, dtype=torch.bfloat16)
    calls = COPIES * max(1, round(GRAPH_BYTES / (COPIES * n * k * 2)))
    ref = (weights[0].float() @ xs[0, 0].float()).unsqueeze(0)
    want = F.linear(xs[0], weights[0]).argmax(dim=-1)
    dflt = default_config(1, n, k, num_sms(0))
    knobs = {f: getattr(dflt, f) for f in LM_HEAD_KNOBS.names.values()}
    result: dict = {"name": name, "n": n, "k": k, "calls_per_graph": calls, "weight_bytes": n * k * 2,
                    "default_config": knobs, "skipped": []}  # fmt: skip
    variants: dict[str, Callable[[int], torch.Tensor]] = {
        "cublas": lambda i: F.linear(xs[i % COPIES], weights[i % COPIES]),
        # the matrix-vector form (W @ x): may make cuBLAS pick another kernel than F.linear's one-row GEMM
        "cublas mv": lambda i: torch.mv(weights[i % COPIES], xs[i % COPIES, 0]).unsqueeze(0),
        "gemv default": lambda i: gemv(xs[i % COPIES], weights[i % COPIES], pdl=False),
    }
    for cfg in cfgs:
        variants["gemv " + spec(cfg)] = lambda i, c=cfg: gemv(xs[i % COPIES], weights[i % COPIES], pdl=False, **c)
    for tag, fn in variants.items():
        if time.monotonic() > deadline and tag not in ("cublas", "cublas mv", "gemv default"):
            result["skipped"].append(tag)
            continue
        result[tag] = time_variant(fn, calls, ref, n * k * 2, replays=7, checks=lambda out: {
            "argmax_equal": bool(torch.equal(out.argmax(dim=-1), want))})  # fmt: skip
    best = fastest(result, "gemv")
    if best:
        us = result[best]["us"]
        knobs = next((c for c in cfgs if "gemv " + spec(c) == best), {})
        result["best_gemv"] = {"tag": best, "us": us, "switch": spec(knobs),
                               "vs_cublas": us / result["cublas"].get("us", float("nan"))}  # fmt: skip
        for tag, fn in (("gemv+argmax", variants[best]), ("cublas+argmax", variants["cublas"])):
            ms = graph_ms(lambda i, f=fn: argmax_rows(f(i)), calls, replays=7)
            result[tag] = {"us": 1e3 * ms, "gbps": n * k * 2 / ms / 1e6}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--budget-s", type=float, default=60.0, help="seconds for the first shape's grid")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: bench/lm_head_gemv.py needs a CUDA GPU")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from kernels import copy_bandwidth  # bench/kernels.py

    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    out: dict = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "device": props.name,
                 "torch": torch.__version__, "copy": copy_bandwidth(), "cases": []}  # fmt: skip
    copy = out["copy"]["gbps"]
    print(f"copy {copy:.0f} GB/s on {props.name}", flush=True)
    names = a.shapes.split(",")
    cfgs = grid()
    for i, name in enumerate(names):
        n, k = SHAPES[name]
        r = bench_shape(name, n, k, cfgs, time.monotonic() + a.budget_s)
        out["cases"].append(r)
        torch.cuda.empty_cache()  # the shape's weight copies
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
        ranked = sorted((v["us"], t) for t, v in r.items() if isinstance(v, dict) and "rel_err" in v)
        for us, tag in ranked[:8] + [x for x in ranked[8:] if x[1] in ("cublas", "cublas mv", "gemv default")]:
            v = r[tag]
            print(f"LMHEAD {name} {tag}: {us:.1f} us {v['gbps']:.0f} GB/s ({v['gbps'] / copy:.2f} copy) "
                  f"err {v['rel_err']:.1e} argmax {'=' if v['argmax_equal'] else 'DIFFERS'}", flush=True)
        for tag, v in r.items():
            if isinstance(v, dict) and "error" in v:
                print(f"LMHEAD {name} {tag}: error {v['error']}", flush=True)
        if r["skipped"]:
            print(f"LMHEAD {name}: {len(r['skipped'])} configs skipped (budget)", flush=True)
        if "best_gemv" in r:
            b = r["best_gemv"]
            print(f"BEST {name}: {b['tag']} {b['us']:.1f} us = {b['vs_cublas']:.3f}x cuBLAS's "
                  f"{r['cublas'].get('us', float('nan')):.1f} us; with argmax {r['gemv+argmax']['us']:.1f} vs "
                  f"{r['cublas+argmax']['us']:.1f} us", flush=True)  # fmt: skip
        if i == 0:  # the other shapes: cuBLAS, the default and the first shape's winner
            best = r.get("best_gemv", {}).get("tag")
            cfgs = [c for c in cfgs if "gemv " + spec(c) == best]
    first = out["cases"][0] if out["cases"] else {}
    b = first.get("best_gemv")
    switch = b["switch"] if b and b["vs_cublas"] < 1.0 else "0"
    out["switch"] = switch
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"SWITCH FLOTILLA_LM_HEAD_GEMV={switch}", flush=True)


if __name__ == "__main__":
    main()
