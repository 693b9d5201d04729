"""The int4 (W4A16) batch-1 decode step with the wide GEMV's fused forms (FLOTILLA_INT4_GATED: gate/up + SiLU-and-mul;
FLOTILLA_INT4_QKV_ROPE: qkv + rotary + KV write; `kernels/triton_int4_gemv_fused.py`) flipped in-process, in ONE engine.

    python3 bench/int4_fused_ab.py --model /tmp/llama8b-w4a16 --json int4-fused.json [--steps 64]

The engine (Llama-3.1-8B shape, compressed-tensors W4A16 g128 from bench/results/w4a16-model.sh, random codes under
`--load-format dummy`) starts once. A variant is the pair of switches (`none`, `gated`, `rope`, `both`), set as the
module globals `kernels/dispatch.py` reads at every call, after which the batch-1 decode graphs are captured again
(`quant_gpu._recapture_decode`). Jobs, in order (the JSON is rewritten after each):
- `ab`: the phases none, gated, rope, both, both, rope, gated, none (so that drift weighs on every variant alike); each
  phase a fresh request of 512 random tokens (context 512..512 + steps), 3 settling steps, `--steps` timed whole
  steps; mean ms a step per variant over its two phases, and each phase's graphed-step count;
- `launches`: per variant, a torch.profiler run of `--profile-steps` steps at context 512 (bench/int4_step_ab.py's
  `profile`): GPU launches a step and the launches of the kernels the fusions remove or add (times are not read:
  kernels overlap under PDL);
- `tokens`: per variant, 32 greedy tokens of a fixed 64-token prompt decoded at batch 1 (the fused forms keep every
  rounding point: equal tokens expected).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from decode_steps import one_request_phase

VARIANTS = {"none": (False, False), "gated": (True, False), "rope": (False, True), "both": (True, True)}
ORDER = ("none", "gated", "rope", "both", "both", "rope", "gated", "none")
# kernels whose launches a step say which path ran (per layer: the pair's second kernel, or the fused form)
KERNELS = ("_int4_gemv_wide_kernel", "_int4_gated_kernel", "_int4_rope_kernel", "_silu_and_mul_kernel",
           "_rotary_kv_write_kernel")  # fmt: skip


def set_variant(engine, name: str) -> float:
    """Set the two switches in-process and capture the batch-1 decode graphs again; the seconds it took."""
    from quant_gpu import _recapture_decode

    from flotilla.kernels import dispatch

    dispatch.INT4_GATED, dispatch.INT4_QKV_ROPE = VARIANTS[name]
    return _recapture_decode(engine, 1)


def phase(engine, name: str, vocab: int, steps: int, rng: random.Random) -> dict:
    """One timed phase of `name`: a fresh request of 512 tokens, 3 settling steps, `steps` timed steps."""
    capture_s = set_variant(engine, name)
    row = one_request_phase(engine, vocab, steps, rng)
    return {"name": name, "ms_per_step": row.pop("ms_mean"), **row, "recapture_s": capture_s}


def launches(engine, name: str, vocab: int, steps: int, rng: random.Random) -> dict:
    """`name`'s launches a step: all, and of each of KERNELS."""
    from int4_step_ab import profile

    set_variant(engine, name)
    p = profile(engine, vocab, steps, rng)
    per = {k: sum(r["launches_per_step"] for r in p["kernels"] if r["key"].startswith(k)) for k in KERNELS}
    # the analysis keys the plain int4 GEMVs by projection ("int4 GEMV qkv", ...), not by kernel name
    per["_int4_gemv_wide_kernel"] = p["int4_gemvs_per_step"]
    return {"launches_per_step": p["launches_per_step"], "kernels": per, "wall_us_per_step": p["wall_us_per_step"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--profile-steps", type=int, default=6)
    p.add_argument("--jobs", default="ab,launches,tokens")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from int4_step_ab import greedy

    from flotilla.engine.llm import LLM

    jobs = a.jobs.split(",")
    t0 = time.perf_counter()
    llm = LLM(a.model, load_format="dummy", max_model_len=512 + a.steps + 128, max_num_seqs=4,
              max_num_batched_tokens=4096, enable_prefix_caching=False)  # fmt: skip
    engine = llm.engine
    vocab = engine.config.model.hf_config["vocab_size"]
    out: dict = {"command": " ".join(sys.argv), "startup_s": time.perf_counter() - t0,
                 "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                 "quantization": engine.config.model.quantization, "order": ORDER, "failed": {},
                 "env": {k: v for k, v in os.environ.items() if k.startswith("FLOTILLA_")}}  # fmt: skip
    print(f"startup {out['startup_s']:.1f} s, quantization {out['quantization']}", flush=True)

    def save() -> None:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")

    save()
    names = []
    for name in VARIANTS:  # each variant captured once first (compiles its kernels); one that fails is left out
        try:
            t = time.perf_counter()
            set_variant(engine, name)
            names.append(name)
            print(f"  variant {name} captured ({time.perf_counter() - t:.1f} s)", flush=True)
        except Exception as exc:  # reported in the JSON; the others are still measured
            out["failed"][name] = repr(exc)[:400]
            print(f"  variant {name} left out: {out['failed'][name]}", flush=True)
    save()
    rng = random.Random(0)
    if "ab" in jobs:
        phases = []
        for name in (n for n in ORDER if n in names):
            phases.append(phase(engine, name, vocab, a.steps, rng))
            ph = phases[-1]
            print(f"  phase {name:6s} {ph['ms_per_step']:.3f} ms/step (median {ph['ms_median']:.3f}, graphed "
                  f"{ph['graphed']}/{a.steps}, recapture {ph['recapture_s']:.1f} s)", flush=True)  # fmt: skip
            out["ab"] = {"phases": phases}
            save()
        mean = {n: statistics.fmean(p["ms_per_step"] for p in phases if p["name"] == n) for n in names}
        out["ab"]["ms_per_step"] = mean
        print("AB " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in mean.items()), flush=True)
        save()
    if "launches" in jobs:
        out["launches"] = {}
        for name in names:
            out["launches"][name] = launches(engine, name, vocab, a.profile_steps, rng)
            r = out["launches"][name]
            print(f"  launches {name:6s} {r['launches_per_step']:.0f}/step: "
                  + ", ".join(f"{k} x{v:.0f}" for k, v in r["kernels"].items()), flush=True)  # fmt: skip
            save()
    if "tokens" in jobs:
        out["tokens"] = {}
        for name in names:
            set_variant(engine, name)
            out["tokens"][name] = greedy(engine, vocab)
            save()
        base = out["tokens"].get("none")
        print(f"tokens equal to none's: { {n: t == base for n, t in out['tokens'].items()} }", flush=True)
        save()
    sys.stdout.flush()
    os._exit(0)  # skip the engine's teardown (a stage's time limit once ran out in it)


if __name__ == "__main__":
    main()
