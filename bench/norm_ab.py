"""The RMSNorm in the one-row GEMVs' prologues (FLOTILLA_NORM_GEMV, kernels/dispatch.py) on against off, in ONE
engine (Llama-3.1-8B shape, bf16, random weights under `--load-format dummy`).

    python3 bench/norm_ab.py --json norm-ab.json [--jobs check,profile,ab1,tokens,ab64,sites]

The switch is the module global `dispatch.NORM_GEMV` (read at every call), set in-process; the batch-1 decode graphs
are captured again after each flip (`quant_gpu._recapture_decode`: a graph holds the launches of its capture). Jobs,
in order (the JSON is rewritten after each):
- `check`: at Llama-3.1-8B's shapes on the device, the fused qkv-rope and gated GEMVs given the un-normalised row
  against the norm kernel + the same GEMV: the share of bit-equal outputs, the largest difference, the next residual
  (must be bit-equal); and each pair's time in a loop of plain launches (CUDA events; not the graph's chain);
- `profile`: 8 batch-1 steps at context 512 under torch.profiler, off and on: launches a step (expected 236 -> 172)
  and the `_rms_norm_kernel` launches a step (65 -> 1);
- `ab1`: one request of 512 tokens prefilled once, then the phases on, off, off, on (each: graphs captured again,
  3 settling steps, `--steps` timed), mean ms a step of each side (both its phases);
- `tokens`: 32 greedy tokens of a fixed prompt at batch 1, on and off (equal unless a last-bit rstd difference moves
  a thin argmax margin of the random weights);
- `ab64`: 64 requests at context 512 in the same order (a control: a 64-row step never takes the prologue);
- `sites`: batch 1 with one site each, qkv, gated, gated, qkv (which fusion carries the gain).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from decode_steps import start_decoding, timed_steps
from model_dirs import SHAPES, make_model_dir

PHASES = ("1", "0", "0", "1")  # on, off, off, on
SITE_PHASES = ("qkv", "gated", "gated", "qkv")


def set_sites(engine, value: str, batch: int | None = 1) -> float:
    """FLOTILLA_NORM_GEMV=`value` in-process; the decode graphs of `batch` rows captured again (seconds taken)."""
    from quant_gpu import _recapture_decode

    from flotilla.kernels import dispatch

    dispatch.NORM_GEMV = dispatch.NORM_GEMV_SITES[value]
    return _recapture_decode(engine, batch) if batch else 0.0


def _time_us(fn, reps: int = 200) -> float:
    """Mean us of `fn()` over `reps` plain launches (CUDA events), after 10 warm-up calls."""
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / reps


def check(cfg: dict, dev: torch.device) -> dict:
    """The `check` job (module docstring), one layer's shapes of `cfg` (timed on CUDA only)."""
    from flotilla.engine.layers.rotary import _cos_sin_table
    from flotilla.kernels.layernorm import RMSNormPrologue
    from flotilla.kernels.triton_gated_gemv import gated_gemv
    from flotilla.kernels.triton_gemv_rope import gemv_rope
    from flotilla.kernels.triton_rmsnorm import rms_norm

    bf16 = torch.bfloat16
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, eps = cfg.get("head_dim") or h // heads, cfg["rms_norm_eps"]
    g = torch.Generator(device=dev).manual_seed(0)
    x = 4 * torch.randn(1, h, generator=g, device=dev).to(bf16)
    res = 4 * torch.randn(1, h, generator=g, device=dev).to(bf16)
    gamma = (1 + 0.1 * torch.randn(h, generator=g, device=dev)).to(bf16)
    w_qkv = (torch.randn((heads + 2 * kv) * d, h, generator=g, device=dev) / h**0.5).to(bf16)
    w_gu = (torch.randn(2 * inter, h, generator=g, device=dev) / h**0.5).to(bf16)
    cos_sin = _cos_sin_table(d, 4096, 500000.0, "null", dev)
    caches = [torch.zeros(4, 16, kv, d, dtype=bf16, device=dev) for _ in range(2)]
    pos, slot = torch.tensor([700], device=dev), torch.tensor([37], device=dev)
    out: dict = {}

    def rope(inp, norm=None):
        return gemv_rope(inp, w_qkv, None, pos, cos_sin, *caches, slot, heads, kv, norm=norm)

    for site, gemv in (("qkv", rope), ("gated", lambda inp, norm=None: gated_gemv(inp, w_gu, None, norm=norm))):
        hn, summed = rms_norm(x, gamma, eps, res)
        want = gemv(hn)
        norm = RMSNormPrologue.of(x, gamma, eps, res)
        got = gemv(x, norm)
        out[site] = {
            "equal_share": (got == want).float().mean().item(),
            "max_abs_diff": (got.float() - want.float()).abs().max().item(),
            "residual_bit_equal": bool(torch.equal(norm.residual_out, summed)),
        }
        if dev.type == "cuda":
            r = out[site]
            r["us_norm_then_gemv"] = _time_us(lambda f=gemv: f(rms_norm(x, gamma, eps, res)[0]))
            r["us_fused"] = _time_us(lambda f=gemv: f(x, RMSNormPrologue.of(x, gamma, eps, res)))
        r = out[site]
        print(f"CHECK {site}: equal {r['equal_share']:.4f}, max |diff| {r['max_abs_diff']:.3g}, residual bit-equal "
              f"{r['residual_bit_equal']}; plain launches: norm + GEMV {r.get('us_norm_then_gemv', 0):.1f} us, "
              f"fused {r.get('us_fused', 0):.1f} us", flush=True)  # fmt: skip
    return out


def ab(engine, phases: tuple[str, ...], batch: int, vocab: int, steps: int, rng: random.Random) -> dict:
    """`batch` requests of 512 random tokens decoding while the switch takes `phases` in turn (module docstring)."""
    from flotilla.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=len(phases) * (steps + 3) + 32, ignore_eos=True)
    reqs = [engine.add_request([rng.randrange(100, vocab) for _ in range(512)], params) for _ in range(batch)]
    start_decoding(engine, reqs, settle=0)
    rows = []
    for value in phases:
        capture_s = set_sites(engine, value, batch if batch == 1 else None)
        for _ in range(3):
            engine.step()
        graphed: list[bool] = []
        times = timed_steps(engine, steps, lambda seen=graphed: seen.append(engine.runner.last_step.graphed))
        rows.append({"sites": value, "ms_per_step": 1e3 * statistics.fmean(times),
                     "ms_median": 1e3 * statistics.median(times), "graphed": sum(graphed), "recapture_s": capture_s})
        print(f"  bs{batch} phase NORM_GEMV={value:5s} {rows[-1]['ms_per_step']:.3f} ms/step (median "
              f"{rows[-1]['ms_median']:.3f}, graphed {sum(graphed)}/{steps}, recapture {capture_s:.1f} s)",
              flush=True)  # fmt: skip
    engine.abort([r.request_id for r in reqs])
    mean = {v: statistics.fmean(r["ms_per_step"] for r in rows if r["sites"] == v) for v in dict.fromkeys(phases)}
    return {"batch": batch, "steps": steps, "phases": rows, "ms_per_step": mean}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--jobs", default="check,profile,ab1,tokens,ab64,sites")
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--steps64", type=int, default=24)
    p.add_argument("--profile-steps", type=int, default=8)
    p.add_argument("--shape", default="llama-3.1-8b", help="bench/model_dirs.py's SHAPES (tiny-llama: a CPU dry run)")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from int4_step_ab import greedy, profile
    from latency import roofline_ms

    from flotilla.engine.llm import LLM
    from flotilla.kernels import dispatch

    jobs = a.jobs.split(",")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    out: dict = {"command": " ".join(sys.argv), "device": device,
                 "env": {k: v for k, v in os.environ.items() if k.startswith("FLOTILLA_")},
                 "start_sites": sorted(dispatch.NORM_GEMV)}  # fmt: skip

    def save() -> None:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")

    rng = random.Random(0)
    if "check" in jobs:  # no engine needed (the bench script runs it alone first, under its own time limit)
        out["check"] = check(SHAPES[a.shape], torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        save()
    if not set(jobs) - {"check"}:
        os._exit(0)
    t0 = time.perf_counter()
    model = make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape))
    llm = LLM(str(model), load_format="dummy", dtype="bfloat16", max_model_len=1024, max_num_seqs=64,
              enable_prefix_caching=False)  # fmt: skip
    engine = llm.engine
    cfg = engine.config.model.hf_config
    vocab = cfg["vocab_size"]
    out["startup_s"] = time.perf_counter() - t0
    out["roofline_ms"] = {"bs1": roofline_ms(cfg, 1, 512), "bs64": roofline_ms(cfg, 64, 512)}
    print(f"startup {out['startup_s']:.1f} s on {out['device']}", flush=True)
    save()
    if "profile" in jobs:
        out["profile"] = {}
        for value in ("0", "1"):
            set_sites(engine, value)
            prof = profile(engine, vocab, a.profile_steps, rng)
            counts = {n: sum(k["launches_per_step"] for k in prof["kernels"] if n in k["key"])
                      for n in ("_rms_norm_kernel", "_gemv_rope_kernel", "_gated_gemv_kernel")}  # fmt: skip
            out["profile"][value] = {"launches_per_step": prof["launches_per_step"], "counts": counts,
                                     "wall_us_per_step": prof["wall_us_per_step"], "kernels": prof["kernels"][:16]}
            print(f"PROFILE NORM_GEMV={value}: {prof['launches_per_step']:.0f} launches/step, "
                  + ", ".join(f"{n} x{c:.0f}" for n, c in counts.items()), flush=True)  # fmt: skip
            save()
    if "ab1" in jobs:
        out["ab1"] = ab(engine, PHASES, 1, vocab, a.steps, rng)
        save()
    if "tokens" in jobs:
        out["tokens"] = {}
        for value in ("1", "0"):
            set_sites(engine, value)
            out["tokens"][value] = greedy(engine, vocab)
        on, off = out["tokens"]["1"], out["tokens"]["0"]
        first = next((i for i, (x, y) in enumerate(zip(on, off, strict=True)) if x != y), None)
        out["tokens_equal"], out["tokens_first_difference"] = first is None, first
        print(f"TOKENS bs1 on vs off: {'equal' if first is None else f'differ from token {first}'}", flush=True)
        save()
    if "ab64" in jobs:
        out["ab64"] = ab(engine, PHASES, 64, vocab, a.steps64, rng)
        save()
    if "sites" in jobs:
        out["sites"] = ab(engine, SITE_PHASES, 1, vocab, a.steps, rng)
        save()
    sys.stdout.flush()
    os._exit(0)  # skip the engine's teardown


if __name__ == "__main__":
    main()
