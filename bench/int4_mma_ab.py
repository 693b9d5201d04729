"""The wide int4 GEMV's tensor-core step (FLOTILLA_INT4_WIDE_MMA, `kernels/triton_int4_mma.py`) against its FMA step:
the kernel alone at Llama-3.1-8B's four projections, and the int4 batch-1 decode step in ONE engine.

    python3 bench/int4_mma_ab.py kernel --json kernel.json [--pairs 2]
    python3 bench/int4_mma_ab.py engine --model /tmp/llama8b-w4a16 --json engine.json [--steps 64] [--pairs 2]

`kernel`: per projection (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336; random int4 g128, bf16
activations, weight copies rotated past the L2 as bench/int4_gemv.py) each output checked first against
`packed_int_linear_ref` (symmetric; with zero points at o_proj) and against the FMA step, then timed per call (one
CUDA graph of many calls, `bench/timing.py`) in the order off on on off, `--pairs` times; the gated form (gate/up +
SiLU, the engine's MLP) checked on against off at gate_up. `KERNEL` lines: us a call per variant, GB/s of int4
bytes, errors.
`engine`: the int4 engine (an int4 W4A16 checkpoint's config under `--load-format dummy`, bench/results/w4a16-model.sh)
starts once at bench/latency.py's context-512 sizes; a phase sets `triton_int4_gemv_wide.WIDE_MMA` (read at every
call), captures the batch-1 decode graphs again, then times a fresh 512-token request (`decode_steps`); phases off on
on off, `--pairs` times; then each variant's 32 greedy tokens. `AB` lines. Without CUDA both say so and exit 0, unless
`--cpu-smoke` (the plumbing: `kernel` under TRITON_INTERPRET at small shapes, `engine` on a tiny model's CPU path).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import time
from pathlib import Path

import torch

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
SMOKE_SHAPES = {"small": (64, 1024)}
SMOKE_KNOBS = {"layout": 1, "block_n": 16, "block_w": 32}  # the table's layout 1 at a shape it has no entry for
# every kernel variant is a compile (seconds each): zero points checked at o_proj only, the gated form at gate_up only
# (the engine's MLP; its checkpoint is symmetric)
ZEROS_CHECKED = ("o_proj", "small")
GATED_CHECKED = ("gate_up_proj", "small")
GROUP = 128
MAX_MODEL_LEN = 704  # bench/latency.py's at context 512


def _weights(n: int, k: int, sets: int, device: str, zeros: bool, seed: int = 0):
    """`sets` random int4 weights `[n, k]` (packed int32, bf16 scales, uint8 zero points: random or all 8)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(sets):
        packed = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), generator=g, dtype=torch.int64).to(torch.int32)
        scales = (torch.rand(n, k // GROUP, generator=g) * 0.004 + 0.001).bfloat16()
        z = torch.randint(0, 16, (n, k // GROUP), generator=g) if zeros else torch.full((n, k // GROUP), 8)
        out.append((packed.to(device), scales.to(device), z.to(torch.uint8).to(device)))
    return out


def check_shape(n: int, k: int, device: str, knobs: dict, zeros_too: bool, gated: bool) -> dict:
    """The MMA step's output against the reference and the FMA step's, symmetric (and with zero points where
    `zeros_too`); the gated form's where `gated`; whether the launch takes the MMA step at all (`mma_takes`)."""
    from flotilla.kernels.card_tables import device_card
    from flotilla.kernels.packed_int_linear import packed_int_linear_ref
    from flotilla.kernels.triton_int4_gemv_fused import fuses_gated, int4_gemv_wide_gated
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide, wide_config
    from flotilla.kernels.triton_int4_mma import mma_takes
    from flotilla.kernels.triton_utils import device_sms

    x = torch.randn(1, k, generator=torch.Generator().manual_seed(n + k)).to(torch.bfloat16).to(device)
    cfg = wide_config(1, n, k, device_sms(x), card=device_card(x), **knobs)
    row: dict = {"mma_taken": mma_takes(1, 0, GROUP, cfg.block_n, cfg.block_w, cfg.layout)}
    for zeros in (False, True) if zeros_too else (False,):
        packed, scales, z = _weights(n, k, 1, device, zeros, seed=1)[0]
        zp = z if zeros else None
        ref = packed_int_linear_ref(x.float(), packed, scales.float(), z, 4, GROUP)
        on = int4_gemv_wide(x, packed, scales, zp, GROUP, mma=True, **knobs).float()
        off = int4_gemv_wide(x, packed, scales, zp, GROUP, mma=False, **knobs).float()
        tag = "zeros" if zeros else "symmetric"
        row[f"rel_err_{tag}"] = ((on - ref).norm() / ref.norm()).item()
        row[f"rel_err_{tag}_fma"] = ((off - ref).norm() / ref.norm()).item()
        row[f"max_abs_vs_fma_{tag}"] = (on - off).abs().max().item()
        if gated and fuses_gated(x, packed, scales, zp, GROUP, None):
            g_on = int4_gemv_wide_gated(x, packed, scales, zp, GROUP, mma=True, **knobs).float()
            g_off = int4_gemv_wide_gated(x, packed, scales, zp, GROUP, mma=False, **knobs).float()
            row[f"gated_rel_vs_fma_{tag}"] = ((g_on - g_off).norm() / g_off.norm().clamp_min(1e-30)).item()
    return row


def kernel(a: argparse.Namespace) -> dict:
    """The `kernel` job (module docstring)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if device == "cuda" else device,
                 "shapes": {}}  # fmt: skip
    for name, (n, k) in (SMOKE_SHAPES if a.cpu_smoke else SHAPES).items():
        row = out["shapes"][name] = check_shape(n, k, device, SMOKE_KNOBS if a.cpu_smoke else {},
                                               name in ZEROS_CHECKED, name in GATED_CHECKED)
        if device == "cuda":
            row |= time_shape(n, k, a.pairs)
        print(f"KERNEL {name} {n}x{k}: " + ", ".join(f"{key} {v:.4g}" if isinstance(v, float) else f"{key} {v}"
                                                  for key, v in row.items()), flush=True)  # fmt: skip
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


def time_shape(n: int, k: int, pairs: int) -> dict:
    """us a call off and on (phases off on on off, `pairs` times; each in a graph of calls over weight copies that
    exceed the L2), the int4 GB/s of each variant's mean."""
    from timing import time_variant  # bench/timing.py

    from flotilla.kernels.packed_int_linear import packed_int_linear_ref
    from flotilla.kernels.triton_int4_gemv_wide import int4_gemv_wide

    nbytes = n * k // 2 + n * (k // GROUP) * 2
    sets = max(3, -(-(256 * 2**20) // nbytes))
    ws = _weights(n, k, sets, "cuda", False)
    xs = torch.randn(sets, 1, k, device="cuda", dtype=torch.bfloat16)
    calls = sets * max(1, round(2**30 / (sets * nbytes)))
    ref = packed_int_linear_ref(xs[0].float(), *ws[0], 4, GROUP)
    us: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(pairs):
        for variant in ("off", "on", "on", "off"):
            row = time_variant(lambda i, v=variant: int4_gemv_wide(xs[i % sets], ws[i % sets][0], ws[i % sets][1],
                                                                   None, GROUP, mma=v == "on"),
                               calls, ref, nbytes, replays=5)  # fmt: skip
            if "us" not in row:
                return {f"error_{variant}": row.get("error", "?")}
            us[variant].append(row["us"])
    mean = {v: statistics.fmean(t) for v, t in us.items()}
    return {"us_off": mean["off"], "us_on": mean["on"], "gbps_off": nbytes / mean["off"] / 1e3,
            "gbps_on": nbytes / mean["on"] / 1e3, "phases_us": us}  # fmt: skip


def engine_ab(a: argparse.Namespace) -> dict:
    """The `engine` job (module docstring)."""
    from decode_steps import one_request_phase
    from int4_step_ab import greedy
    from quant_gpu import _recapture_decode

    from flotilla.engine.llm import LLM
    from flotilla.kernels import triton_int4_gemv_wide

    t0 = time.perf_counter()
    llm = LLM(a.model, load_format="dummy", max_num_seqs=4, max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=4096,
              gpu_memory_utilization=a.gpu_memory_utilization)  # fmt: skip
    engine = llm.engine
    vocab = engine.config.model.hf_config["vocab_size"]
    out: dict = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                 else "cpu", "startup_s": time.perf_counter() - t0, "phases": [], "tokens": {}}  # fmt: skip
    print(f"AB startup {out['startup_s']:.1f} s on {out['device']} ({a.model})", flush=True)

    def switch(on: bool) -> float:
        triton_int4_gemv_wide.WIDE_MMA = on
        return _recapture_decode(engine, 1)

    rng = random.Random(0)
    for _ in range(a.pairs):
        for variant in ("off", "on", "on", "off"):
            capture_s = switch(variant == "on")
            row = one_request_phase(engine, vocab, a.steps, rng) | {"variant": variant, "recapture_s": capture_s}
            out["phases"].append(row)
            print(f"  phase {variant:4s} {row['ms_median']:.3f} ms median (mean {row['ms_mean']:.3f}, graphed "
                  f"{row['graphed']}/{a.steps})", flush=True)  # fmt: skip
            a.json.write_text(json.dumps(out, indent=1) + "\n")
    for variant in ("off", "on"):
        switch(variant == "on")
        out["tokens"][variant] = greedy(engine, vocab)
    switch(False)
    per = {v: [r["ms_median"] for r in out["phases"] if r["variant"] == v] for v in ("off", "on")}
    out["ms"] = {v: statistics.fmean(t) for v, t in per.items()}
    out["tokens_equal"] = out["tokens"]["off"] == out["tokens"]["on"]
    a.json.write_text(json.dumps(out, indent=1) + "\n")
    for v, ms in out["ms"].items():
        print(f"AB {v}: {ms:.3f} ms a step (phases {', '.join(f'{x:.3f}' for x in per[v])})")
    print(f"AB on vs off: {1e3 * (out['ms']['off'] - out['ms']['on']):+.1f} us a step below off; every phase below "
          f"off's: {max(per['on']) < min(per['off'])}; greedy tokens equal: {out['tokens_equal']}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("job", choices=("kernel", "engine"))
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--model", default="/tmp/llama8b-w4a16")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--cpu-smoke", action="store_true", help="without a GPU: the plumbing (module docstring)")
    a = p.parse_args()
    if not torch.cuda.is_available() and not a.cpu_smoke:
        print(f"skipped: bench/int4_mma_ab.py {a.job} needs a CUDA GPU (--cpu-smoke: the plumbing on the CPU)")
        return
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    (kernel if a.job == "kernel" else engine_ab)(a)


if __name__ == "__main__":
    main()
