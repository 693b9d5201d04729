"""Paged decode attention on an fp8 KV pool against a bf16 one, H200 (issue 22: fp8 KV must make the
batch-64 x 4,096 decode step faster, it made it 1.14x slower on 2026-12-03).

    python3 bench/fp8_kv_decode.py --json fp8-kv-decode.json [--batches 1,64] [--ctx 4096]

Llama-3.1-8B's attention (32 query heads, 8 KV heads, head dim 128, pages of 16 tokens), block tables
shuffled over a pool larger than the L2. For each launch configuration (tile, warps, pipeline stages) it
times `paged_decode_attention` on the bf16 pool and on the same values in fp8 (e4m3), in CUDA graphs of
many calls, and reports GB/s of K+V bytes read (each pool's own bytes). Variant `fp16_query`: the query
in fp16, so the fp8 tiles convert to fp16 operands (one `cvt` per two values) instead of to bf16 (a
further conversion per value): does the conversion cost the time? Each output is checked against the
bf16 pool's with the fp8 rounding (rel err printed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
CONFIGS = [{"block_n": bn, "num_warps": 4, "num_stages": st} for bn in (32, 64, 128) for st in (1, 2, 3)] + [
    {"block_n": bn, "num_warps": 8, "num_stages": 2} for bn in (64, 128)
]


def bench_batch(batch: int, ctx: int, results: dict, path: Path) -> None:
    """Every configuration on the bf16 pool, the fp8 pool and the fp8 pool with an fp16 query."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention
    from kernels import graph_ms  # bench/kernels.py

    blocks = batch * ctx // PAGE
    sets = max(1, -(-(256 << 20) // (2 * blocks * PAGE * KV_HEADS * HEAD_DIM * 2)))
    k16 = torch.randn(sets * blocks, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v16 = torch.randn_like(k16)
    pools = {"bf16": (k16, v16), "fp8": (k16.to(torch.float8_e4m3fn), v16.to(torch.float8_e4m3fn))}
    tables = torch.randperm(sets * blocks, device="cuda", dtype=torch.int32).view(sets, batch, -1)
    q = torch.randn(sets, batch, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    qsl = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    k8, v8 = pools["fp8"]
    ref = paged_decode_attention(q[0], k8.to(torch.bfloat16), v8.to(torch.bfloat16), tables[0], qsl, lens,
                                 HEAD_DIM**-0.5).float()  # fmt: skip
    calls = 20 if batch >= 16 else 100

    def attend(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: dict):
        return lambda i: paged_decode_attention(query[i % sets], k, v, tables[i % sets], qsl, lens, HEAD_DIM**-0.5,
                                                **cfg)  # fmt: skip

    for cfg in [{}, *CONFIGS]:
        for pool, query in (("bf16", q), ("fp8", q), ("fp8_fp16_query", q.half())):
            k, v = pools["bf16" if pool == "bf16" else "fp8"]
            fn = attend(query, k, v, cfg)
            nbytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * k.element_size()
            row: dict = {"batch": batch, "ctx": ctx, "pool": pool, **cfg}
            try:
                err = ((fn(0).float() - ref).norm() / ref.norm()).item()
                ms = graph_ms(fn, calls)
                row.update(us=1e3 * ms, gbps=nbytes / ms / 1e6, rel_err=err)
            except Exception as exc:  # a configuration that does not compile is recorded
                row["error"] = repr(exc)[:200]
            results["cases"].append(row)
            path.write_text(json.dumps(results, indent=1) + "\n")
    for pool in ("bf16", "fp8", "fp8_fp16_query"):
        rows = [r for r in results["cases"] if r["batch"] == batch and r["pool"] == pool and "us" in r]
        default = next(r for r in rows if "block_n" not in r)
        best = min(rows, key=lambda r: r["us"])
        knobs = {k: best.get(k) for k in ("block_n", "num_warps", "num_stages")}
        print(
            f"b{batch} ctx{ctx} {pool}: default {default['us']:.1f} us {default['gbps']:.0f} GB/s; "
            f"best {best['us']:.1f} us {best['gbps']:.0f} GB/s {knobs} err {best['rel_err']:.1e}",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--batches", default="64,1")
    p.add_argument("--ctx", type=int, default=4096)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    torch.manual_seed(0)
    results: dict = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(), "cases": []}
    for batch in (int(b) for b in a.batches.split(",")):
        bench_batch(batch, a.ctx, results, Path(a.json))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
