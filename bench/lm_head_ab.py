"""The one-row LM head on the Triton GEMV (FLOTILLA_LM_HEAD_GEMV, kernels/dispatch.py) against cuBLAS, in ONE engine.

    python3 bench/lm_head_ab.py --json lm-head-ab.json [--model DIR] [--on bn=8,bk=512,w=4,s=3] [--steps 48]

The engine (default: Llama-3.1-8B shape, bf16, random weights under `--load-format dummy`, bench/model_dirs.py; or
`--model`, e.g. the W4A16 directory of bench/results/w4a16-model.sh, whose LM head stays bf16) starts once. The switch
is the module global `dispatch.LM_HEAD_GEMV` (read at every call), set in-process to `--on`'s knobs or None (cuBLAS)
on every card.
The LM head runs eagerly after the step's CUDA graph (`ModelRunner._draw`), so no graph is captured again. Jobs, in
order (the JSON is rewritten after each):
- `ab`: one request of 512 random tokens, then the phases on, off, off, on (each: 3 settling steps, `--steps` timed
  whole steps), mean ms a step of each side over its two phases;
- `profile`: `--profile-steps` steps at context 512 under torch.profiler, off and on: launches a step and the GPU
  time a step of the LM head's kernel (cuBLAS's `nvjet`/`gemv`/`gemm` kernels off; the `_gemv_kernel` launch beyond
  the layers' on) and of the greedy argmax;
- `tokens`: 32 greedy tokens of a fixed prompt at batch 1, on and off (equal unless a last-bit difference of the
  sums' order moves a thin argmax margin of the random weights).
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

PHASES = ("on", "off", "off", "on")


def set_switch(value: str, on: str) -> None:
    """`dispatch.LM_HEAD_GEMV` in-process, on every card: `on`'s knobs ("on") or None ("off")."""
    from flotilla.kernels import dispatch
    from flotilla.kernels.card_tables import DEFAULT

    dispatch.LM_HEAD_GEMV = {DEFAULT: dispatch.lm_head_gemv_knobs(on) if value == "on" else None}


def ab(engine, on: str, vocab: int, steps: int, rng: random.Random) -> dict:
    """One request of 512 random tokens decoding while the switch takes PHASES in turn (module docstring)."""
    from flotilla.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=len(PHASES) * (steps + 3) + 32, ignore_eos=True)
    req = engine.add_request([rng.randrange(100, vocab) for _ in range(512)], params)
    start_decoding(engine, [req], settle=0)
    rows = []
    for value in PHASES:
        set_switch(value, on)
        for _ in range(3):
            engine.step()
        graphed: list[bool] = []
        times = timed_steps(engine, steps, lambda seen=graphed: seen.append(engine.runner.last_step.graphed))
        rows.append({"switch": value, "ms_per_step": 1e3 * statistics.fmean(times),
                     "ms_median": 1e3 * statistics.median(times), "graphed": sum(graphed)})  # fmt: skip
        print(f"  phase LM_HEAD_GEMV {value:3s} {rows[-1]['ms_per_step']:.3f} ms/step (median "
              f"{rows[-1]['ms_median']:.3f}, graphed {sum(graphed)}/{steps})", flush=True)  # fmt: skip
    engine.abort([req.request_id])
    mean = {v: statistics.fmean(r["ms_per_step"] for r in rows if r["switch"] == v) for v in ("on", "off")}
    print(f"AB on {mean['on']:.3f} ms, off {mean['off']:.3f} ms: {1e3 * (mean['on'] - mean['off']):+.0f} us a step",
          flush=True)  # fmt: skip
    return {"steps": steps, "phases": rows, "ms_per_step": mean}


def head_kernels(prof: dict, layers: int) -> dict:
    """The profile's LM-head and argmax kernels: us a step and launches a step of each kind."""
    rows = prof["kernels"]

    def pick(pred) -> dict:
        chosen = [k for k in rows if pred(k["key"])]
        return {"us_per_step": sum(k["us_per_step"] for k in chosen),
                "launches_per_step": sum(k["launches_per_step"] for k in chosen), "keys": [k["key"] for k in chosen]}

    return {"cublas": pick(lambda key: any(s in key for s in ("nvjet", "gemv2", "gemm", "Kernel2"))),
            "triton_gemv": pick(lambda key: key.startswith("_gemv_kernel")),
            "argmax": pick(lambda key: "argmax" in key or "_pick_slice" in key), "layers": layers}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--model", default="", help="a model directory (default: bf16 random weights of --shape)")
    p.add_argument("--shape", default="llama-3.1-8b", help="bench/model_dirs.py's SHAPES (tiny-llama: a CPU dry run)")
    p.add_argument("--on", default="1", help="FLOTILLA_LM_HEAD_GEMV's value for the 'on' side")
    p.add_argument("--jobs", default="ab,profile,tokens")
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--profile-steps", type=int, default=6)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from int4_step_ab import greedy, profile
    from model_dirs import make_model_dir

    from flotilla.engine.llm import LLM
    from flotilla.kernels import dispatch

    dispatch.lm_head_gemv_knobs(a.on)  # a bad value fails here, before the engine starts
    jobs = a.jobs.split(",")
    t0 = time.perf_counter()
    model = a.model or str(make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape)))
    llm = LLM(model, load_format="dummy", max_model_len=1024, max_num_seqs=4, max_num_batched_tokens=4096,
              enable_prefix_caching=False)  # fmt: skip
    engine = llm.engine
    cfg = engine.config.model.hf_config
    vocab = cfg["vocab_size"]
    out: dict = {"command": " ".join(sys.argv), "on": a.on, "startup_s": time.perf_counter() - t0,
                 "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                 "quantization": engine.config.model.quantization,
                 "env": {k: v for k, v in os.environ.items() if k.startswith("FLOTILLA_")}}  # fmt: skip
    print(f"startup {out['startup_s']:.1f} s on {out['device']}, quantization {out['quantization']}, on = {a.on}",
          flush=True)  # fmt: skip

    def save() -> None:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")

    save()
    rng = random.Random(0)
    for value in ("on", "off"):  # compile the GEMV outside the timing: one greedy step each
        set_switch(value, a.on)
        greedy(engine, vocab, tokens=2)
    if "ab" in jobs:
        out["ab"] = ab(engine, a.on, vocab, a.steps, rng)
        save()
    if "profile" in jobs:
        out["profile"] = {}
        for value in ("off", "on"):
            set_switch(value, a.on)
            prof = profile(engine, vocab, a.profile_steps, rng)
            heads = head_kernels(prof, cfg["num_hidden_layers"])
            out["profile"][value] = {"launches_per_step": prof["launches_per_step"], "heads": heads,
                                     "wall_us_per_step": prof["wall_us_per_step"], "kernels": prof["kernels"][:12]}
            print(f"PROFILE LM_HEAD_GEMV {value}: {prof['launches_per_step']:.0f} launches/step, "
                  + ", ".join(f"{n} {h['us_per_step']:.1f} us x{h['launches_per_step']:.0f}"
                              for n, h in heads.items() if n != "layers"), flush=True)  # fmt: skip
            save()
    if "tokens" in jobs:
        out["tokens"] = {}
        for value in ("on", "off"):
            set_switch(value, a.on)
            out["tokens"][value] = greedy(engine, vocab)
        on, off = out["tokens"]["on"], out["tokens"]["off"]
        first = next((i for i, (x, y) in enumerate(zip(on, off, strict=True)) if x != y), None)
        out["tokens_equal"], out["tokens_first_difference"] = first is None, first
        print(f"TOKENS bs1 on vs off: {'equal' if first is None else f'differ from token {first}'}", flush=True)
        save()
    sys.stdout.flush()
    os._exit(0)  # skip the engine's teardown


if __name__ == "__main__":
    main()
