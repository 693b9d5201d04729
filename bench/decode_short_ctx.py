"""Paged decode attention (bf16 KV) at batch 64 over a short context, H200 (issue 19's batch-64 decode floor).

    python3 bench/decode_short_ctx.py --json short.json [--batch 64] [--ctx 512] [--check-ctx 4096] [--best F]

Session 9's profile of the batch-64 x context-512 decode step put the attention at 38 us a layer (1,229 us of a
5.9 ms step). At 512 tokens one split is 512 programs of 8 tiles each, one wave; the question was whether that is
too little in flight per SM. (Its answer, session 9 call 3: no — the layer's K+V are 134 MB, so 35.9 us is
3,741 GB/s, and no launch below beat the default by more than 1.5 %.) This sweeps the
tile launch (block_n, warps, stages, key streams) and the splits per sequence at `--ctx` (Llama-3.1-8B heads, pages
of 16, block tables shuffled over a pool larger than the L2, CUDA graphs of 20 calls), then times the fastest few
and the default at `--check-ctx`, so a new default is not bought with the long context. `--best` receives the
fastest launch at `--ctx` as the two environment variables the engine reads:
FLOTILLA_DECODE_BF16_LAUNCH=block_n,warps,stages,key_streams and FLOTILLA_DECODE_WAVE (programs per SM that give
its splits through `default_num_splits`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from decode_pool import HEAD_DIM, KV_HEADS, decode_pool, l2_sets  # bench/decode_pool.py

TILES = [(64, 4, 2, 0), (64, 4, 3, 0), (64, 8, 2, 0), (32, 4, 3, 0), (32, 2, 3, 0), (128, 8, 2, 0), (32, 2, 4, 2),
         (64, 4, 3, 2), (16, 2, 3, 0)]  # fmt: skip
SPLITS = [1, 2, 4, 8]


def make_case(batch: int, ctx: int) -> dict:
    """Pools, queries and shuffled block tables for `batch` sequences of `ctx` tokens (several sets: > L2)."""
    sets = l2_sets(batch, ctx)
    return {**decode_pool(batch, ctx, sets), "sets": sets, "bytes": 2 * batch * ctx * KV_HEADS * HEAD_DIM * 2}


def time_launch(case: dict, tile: tuple[int, int, int, int], splits: int | None) -> dict:
    """One launch's graphed time, GB/s and error against the default launch's output."""
    from flotilla.kernels.triton_paged_decode import paged_decode_attention
    from kernels import graph_ms  # bench/kernels.py

    block_n, warps, stages, streams = tile
    knobs = {"block_n": block_n, "num_warps": warps, "num_stages": stages, "key_streams": streams,
             "num_splits": splits}  # fmt: skip

    def fn(i: int) -> torch.Tensor:
        s = i % case["sets"]
        return paged_decode_attention(case["q"][s], case["k"], case["v"], case["tables"][s], case["qsl"],
                                      case["lens"], HEAD_DIM**-0.5, **knobs)  # fmt: skip

    row = {"tile": list(tile), "splits": splits}
    try:
        out = fn(0).float()
        ref = case.setdefault("ref", out)  # the first launch timed (the default) is the reference
        if ref is not out:
            row["rel_err"] = ((out - ref).norm() / ref.norm()).item()
        ms = graph_ms(fn, 20)
        row.update(us=1e3 * ms, gbps=case["bytes"] / ms / 1e6)
    except Exception as exc:  # a launch that does not compile or does not fit is recorded
        row["error"] = repr(exc)[:200]
    print(" ", row, flush=True)
    return row


def wave_for(splits: int, batch: int) -> int:
    """The smallest FLOTILLA_DECODE_WAVE whose `default_num_splits` gives `splits` at this batch."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return -(-splits * batch * KV_HEADS // sms)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--check-ctx", type=int, default=4096)
    p.add_argument("--best", help="write the fastest launch at --ctx here as two environment assignments")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    torch.manual_seed(0)
    res: dict = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(), "short": [], "check": []}
    case = make_case(a.batch, a.ctx)
    res["short"].append(dict(time_launch(case, TILES[0], None), default=True))
    for tile in TILES:
        for splits in SPLITS:
            res["short"].append(time_launch(case, tile, splits))
            Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    ok = sorted((r for r in res["short"] if "us" in r), key=lambda r: r["us"])
    best = ok[0]
    print(
        f"b{a.batch} ctx{a.ctx}: default {res['short'][0]['us']:.1f} us {res['short'][0]['gbps']:.0f} GB/s; best "
        f"{best['us']:.1f} us {best['gbps']:.0f} GB/s tile {best['tile']} splits {best['splits']}",
        flush=True,
    )
    if a.best:
        tile = ",".join(str(x) for x in best["tile"])
        wave = wave_for(best["splits"] or 1, a.batch)
        Path(a.best).write_text(f"FLOTILLA_DECODE_BF16_LAUNCH={tile} FLOTILLA_DECODE_WAVE={max(wave, 1)}\n")
    del case
    torch.cuda.empty_cache()
    check = make_case(a.batch, a.check_ctx)
    res["check"].append(dict(time_launch(check, TILES[0], None), default=True))
    for r in ok[:3]:
        res["check"].append(time_launch(check, tuple(r["tile"]), r["splits"]))
    Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    print(
        f"b{a.batch} ctx{a.check_ctx}: "
        + "; ".join(f"{r['tile']} s{r['splits']} {r.get('us', float('nan')):.1f} us" for r in res["check"]),
        flush=True,
    )


if __name__ == "__main__":
    main()
