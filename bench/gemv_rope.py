"""Per-layer time at one row: the qkv GEMV + `rotary_and_write_kv` pair against `gemv_rope` (one kernel), on a GPU.

    python bench/gemv_rope.py --json gemv_rope.json

Llama-3.1-8B's shapes (qkv 6,144 x 4,096, 32 query / 8 KV heads of 128, 16-token pages), bf16, one weight per layer
(`--layers`, 32: 1.6 GB, so each layer's weight comes from HBM as in a decode step, not from L2). First correctness:
the rotated query and both caches (bf16, then an fp8 cache with scales) from the fused kernel against the pair's, bit
for bit, at a few positions and slots. Then each variant's `--layers` calls captured in one CUDA graph (launched as
the engine launches them: by programmatic dependent launch where FLOTILLA_PDL and the device allow) and replayed:
us per layer, best of `--repeats` timings of `--iters` replays; also the plain GEMV alone (the pair's first kernel:
what the epilogue costs over it). Prints one line per figure and a `gemv_rope:` summary line; writes `--json`.
"""

from __future__ import annotations

import argparse
import json

import torch

from flotilla.engine.layers.rotary import _cos_sin_table
from flotilla.kernels.pdl import pdl_active
from flotilla.kernels.triton_gemv import gemv
from flotilla.kernels.triton_gemv_rope import fuses_rope, gemv_rope
from flotilla.kernels.triton_rotary_kv_write import rotary_and_write_kv

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, PAGE, BLOCKS = 32, 8, 128, 4096, 16, 64


def pair(x, weight, positions, cos_sin, k_cache, v_cache, slots, k_scale=1.0, v_scale=1.0):
    """The engine's unfused path at one row: the Triton GEMV, then the rotary + KV write kernel."""
    d = HEAD_DIM
    q, k, v = gemv(x, weight).split([HEADS * d, KV_HEADS * d, KV_HEADS * d], dim=-1)
    return rotary_and_write_kv(positions, q.view(1, HEADS, d), k.view(1, KV_HEADS, d), v.view(1, KV_HEADS, d),
                               cos_sin, k_cache, v_cache, slots, k_scale, v_scale)  # fmt: skip


def fused(x, weight, positions, cos_sin, k_cache, v_cache, slots, k_scale=1.0, v_scale=1.0):
    """The same in one launch."""
    return gemv_rope(x, weight, None, positions, cos_sin, k_cache, v_cache, slots, HEADS, KV_HEADS, k_scale, v_scale)


def check(weights, x, cos_sin) -> list[dict]:
    """Bit-equality of q and the caches, fused vs pair, at a few (position, slot) pairs and both cache dtypes."""
    rows = []
    for cache_dtype, scales in ((torch.bfloat16, (1.0, 1.0)), (torch.float8_e4m3fn, (0.05, 0.04))):
        for pos, slot in ((0, 0), (511, 511), (4095, 1023), (77, -1)):
            positions = torch.tensor([pos], device="cuda")
            slots = torch.tensor([slot], device="cuda")
            pools = [torch.randn(BLOCKS, PAGE, KV_HEADS, HEAD_DIM, device="cuda").to(cache_dtype) for _ in range(2)]
            a = [p.clone() for p in pools]
            b = [p.clone() for p in pools]
            qa = pair(x, weights[0], positions, cos_sin, *a, slots, *scales)
            qb = fused(x, weights[0], positions, cos_sin, *b, slots, *scales)
            torch.cuda.synchronize()
            k_eq, v_eq = (torch.equal(u.view(torch.uint8), w.view(torch.uint8)) for u, w in zip(a, b, strict=True))
            rows.append({"cache": str(cache_dtype).removeprefix("torch."), "pos": pos, "slot": slot,
                         "q_equal": torch.equal(qa, qb), "k_equal": k_eq, "v_equal": v_eq,
                         "q_max_abs_diff": float((qa.float() - qb.float()).abs().max())})
            print(f"check {rows[-1]}")
    return rows


def save(result: dict, path: str) -> None:
    """The JSON rewritten after each part, so that a run cut short keeps what it measured."""
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    from kernels import graph_ms  # bench/kernels.py

    torch.manual_seed(0)
    n = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    weights = [(torch.randn(n, HIDDEN, device="cuda") / HIDDEN**0.5).to(torch.bfloat16) for _ in range(a.layers)]
    x = torch.randn(1, HIDDEN, device="cuda").to(torch.bfloat16)
    cos_sin = _cos_sin_table(HEAD_DIM, 8192, 500000.0, "null", torch.device("cuda"))
    result: dict = {"layers": a.layers, "pdl": pdl_active(x), "fuses": fuses_rope(x, weights[0], HEAD_DIM)}
    print(f"pdl {result['pdl']}, fuses_rope {result['fuses']}")
    result["check"] = check(weights, x, cos_sin)
    result["bit_equal"] = all(r["q_equal"] and r["k_equal"] and r["v_equal"] for r in result["check"])
    save(result, a.json)
    caches = [[torch.zeros(BLOCKS, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
              for _ in range(a.layers)]  # fmt: skip
    positions = torch.tensor([511], device="cuda")
    slots = torch.tensor([511], device="cuda")

    def run(f):  # layer i's call: its weight and caches
        return lambda i: f(x, weights[i % a.layers], positions, cos_sin, *caches[i % a.layers], slots)

    times = {}
    for name, fn in (("pair", run(pair)), ("fused", run(fused)),
                     ("gemv_only", lambda i: gemv(x, weights[i % a.layers]))):  # fmt: skip
        # the `--layers` calls in one graph, best of `--repeats` timings of `--iters` replays (bench/kernels.py)
        times[name] = 1e3 * graph_ms(fn, a.layers, a.repeats, a.iters, min)
        print(f"{name}: {times[name]:.2f} us/layer")
        result["us_per_layer"] = times
        save(result, a.json)
    saved = (times["pair"] - times["fused"]) * a.layers
    result["saved_us_per_step"] = saved
    save(result, a.json)
    print(f"gemv_rope: bit_equal {result['bit_equal']}; pair {times['pair']:.2f} us/layer, fused {times['fused']:.2f}, "
          f"gemv alone {times['gemv_only']:.2f}; x{a.layers} layers: {saved:+.1f} us/step saved (pdl {result['pdl']})")


if __name__ == "__main__":
    main()
