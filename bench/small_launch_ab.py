"""The batch-1 decode step with other small-grid attention launches (FLOTILLA_DECODE_SMALL_LAUNCH, e.g. with the
"pages" flag; FLOTILLA_DECODE_SHORT_LAUNCH, the short-table launch) against main's, in ONE engine (issue 19's bf16
bs1 ctx 512 floor, issue 22's int4 ratio: the same attention in both steps).

    python3 bench/small_launch_ab.py --model /tmp/llama8b --json bf16.json \\
        --variants "SMALL=64,4,3,256,fused+dep+pages;SHORT=64,4,3,64,fused+dep" [--steps 64] [--pairs 2]

The engine (random weights, `--load-format dummy`; an int4 W4A16 checkpoint's config is detected as in
bench/quant_gpu.py) starts once at bench/latency.py's context-512 sizes (max_model_len 704: one 704-token block table,
44 pages, a short table). Variant `main` sets neither switch (main's launch); each `--variants` entry
`SMALL=<launch>` or `SHORT=<launch>` sets that switch (FLOTILLA_DECODE_<NAME>_LAUNCH) to the launch. A phase: the
variant's switch set in-process, the batch-1 decode graphs captured again (`quant_gpu._recapture_decode`: the decode
kernel reads its launch at each call, so a graph holds its capture's), then a fresh 512-token request, 3 settling
steps and `--steps` timed steps (`decode_steps.one_request_phase`). Order main B1 .. Bn Bn .. B1 main, `--pairs`
times, so that drift falls on all. Then each variant's 32 greedy tokens of a fixed prompt (other split points round
otherwise: the random model's tokens may differ, as every attention change before). Prints `AB` lines; the JSON is
rewritten after each phase.
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

SWITCHES = {"SMALL": "FLOTILLA_DECODE_SMALL_LAUNCH", "SHORT": "FLOTILLA_DECODE_SHORT_LAUNCH"}
MAX_MODEL_LEN = 704  # bench/latency.py's at context 512 with 32 steps: 512 + 4 * 32 + 64


def set_launch(engine, variant: str) -> float:
    """Both switches cleared, then `variant`'s ("SMALL=..." / "SHORT=..."; "main": none) set, and the batch-1 decode
    graphs captured again; the seconds the capture took."""
    from quant_gpu import _recapture_decode

    for env in SWITCHES.values():
        os.environ.pop(env, None)
    if variant != "main":
        name, _, launch = variant.partition("=")
        os.environ[SWITCHES[name]] = launch
    return _recapture_decode(engine, 1)


def run(engine, vocab: int, variants: list[str], steps: int, pairs: int, out: dict, save) -> None:
    """The phases in the order of the module docstring, then each variant's greedy tokens."""
    from decode_steps import one_request_phase
    from int4_step_ab import greedy

    rng = random.Random(0)
    names = []
    for name in variants:  # each captured once first (compiles it); a failing one is left out
        try:
            set_launch(engine, name)
            names.append(name)
        except Exception as exc:  # reported; the others are still measured
            out["failed"][name] = repr(exc)[:300]
            print(f"AB variant {name} left out: {out['failed'][name]}", flush=True)
    order = names + names[::-1]
    for _ in range(pairs):
        for name in order:
            capture_s = set_launch(engine, name)
            row = one_request_phase(engine, vocab, steps, rng) | {"variant": name, "recapture_s": capture_s}
            out["phases"].append(row)
            print(f"  phase {name:24s} {row['ms_median']:.3f} ms median (mean {row['ms_mean']:.3f}, graphed "
                  f"{row['graphed']}/{steps})", flush=True)  # fmt: skip
            save()
    for name in names:
        set_launch(engine, name)
        out["tokens"][name] = greedy(engine, vocab)
    save()


def summarize(out: dict, margin_us: float) -> dict:
    """Per variant the mean of its phases' medians; the verdict: the fastest launch beats main by >= `margin_us` a
    step and its slowest phase beats main's fastest (drift inside the call cannot make the gap)."""
    per: dict[str, list[float]] = {}
    for row in out["phases"]:
        per.setdefault(row["variant"], []).append(row["ms_median"])
    means = {name: statistics.fmean(v) for name, v in per.items()}
    summary: dict = {"ms": means, "phases_ms": per, "verdict": "nothing"}
    if "main" not in means or len(means) < 2:
        return summary
    best = min((n for n in means if n != "main"), key=means.get)
    gain_us = 1e3 * (means["main"] - means[best])
    clean = max(per[best]) < min(per["main"])
    summary |= {"best": best, "gain_us": gain_us, "clean": clean,
                "tokens_equal": out["tokens"].get(best) == out["tokens"].get("main")}  # fmt: skip
    if gain_us >= margin_us and clean:
        summary["verdict"] = "adopt"
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="/tmp/llama8b")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--variants", required=True, help="';'-separated SMALL=<launch> / SHORT=<launch>")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--margin-us", type=float, default=10.0, help="the least gain a step that adopts")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--cpu-smoke", action="store_true", help="run on the CPU (a tiny model: the phases' plumbing)")
    a = p.parse_args()
    if not torch.cuda.is_available() and not a.cpu_smoke:
        print("skipped: bench/small_launch_ab.py needs a CUDA GPU (--cpu-smoke: the plumbing on the CPU)")
        return
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from flotilla.engine.llm import LLM

    t0 = time.perf_counter()
    llm = LLM(a.model, load_format="dummy", max_num_seqs=4, max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=4096,
              gpu_memory_utilization=a.gpu_memory_utilization)  # fmt: skip
    engine = llm.engine
    vocab = engine.config.model.hf_config["vocab_size"]
    variants = ["main", *(v for v in a.variants.split(";") if v)]
    assert all(v.partition("=")[0] in SWITCHES for v in variants[1:]), f"--variants: {a.variants!r}"
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    out: dict = {"command": " ".join(sys.argv), "device": device, "model": a.model,
                 "startup_s": time.perf_counter() - t0, "max_model_len": MAX_MODEL_LEN, "variants": variants,
                 "phases": [], "tokens": {}, "failed": {},
                 "env": {k: v for k, v in os.environ.items() if k.startswith("FLOTILLA_")}}  # fmt: skip
    print(f"AB startup {out['startup_s']:.1f} s on {out['device']} ({a.model})", flush=True)

    def save() -> None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")

    run(engine, vocab, variants, a.steps, a.pairs, out, save)
    out["summary"] = s = summarize(out, a.margin_us)
    if a.cpu_smoke:  # the CPU runs no Triton decode kernel: the switches change nothing there
        s["verdict"] = "nothing (cpu smoke)"
    save()
    for name, ms in s["ms"].items():
        print(f"AB {name}: {ms:.3f} ms a step (phases {', '.join(f'{x:.3f}' for x in s['phases_ms'][name])})")
    if "best" in s:
        print(f"AB best {s['best']}: {s['gain_us']:+.1f} us a step below main; every phase below main's: "
              f"{s['clean']}; greedy tokens equal to main's: {s['tokens_equal']}; verdict {s['verdict']}")


if __name__ == "__main__":
    main()
