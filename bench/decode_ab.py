"""One side of a decode A/B in one engine process: step latency, a per-kernel profile and greedy tokens.

    FLOTILLA_SKINNY_GEMM=0 python bench/decode_ab.py --label off --batch-sizes 1,64 --json off.json
    FLOTILLA_SKINNY_GEMM=1 python bench/decode_ab.py --label on --batch-sizes 1,64 --token-batch 64 --json on.json

Kernel levers are switched by the environment (read when the kernels are imported), so each side of an
A/B is its own process, started by the caller (bench/results/dec7-gpu.sh; first written on branch fuse6).
Here, one engine (Llama-3.1-8B shape, dummy weights, context 512 by default) measures, in order:
- `tokens`: the greedy continuations (`--tokens` tokens) of `--token-batch` fixed random prompts decoded
  together (so a batch-size-dependent path runs; a list such as 1,8 decodes each count in turn and keeps
  every row), for the caller to compare across sides (levers that keep every rounding point must give
  identical tokens);
- `latency`: ms per whole decode step at each batch size (bench/latency.py's `step_latency`, with its
  roofline at bf16 bytes: `roofline_ms_bf16` at the H200's peaks, `roofline_ms_bf16_card` at this card's, measured
  before the engine starts (bench/card_peaks.py; the JSON's "peaks"; null on the CPU));
- `profiles`: kernel time per step by kernel and group, launches and idle GPU time per step, at the
  `--profile-batch-sizes` (bench/decode_profile.py's `profile_batch`, under torch.profiler).
The JSON is rewritten after each part, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import tempfile
import time

import torch
from card_peaks import measured, peaks_json
from decode_profile import profile_batch
from latency import roofline_ms, step_latency
from model_dirs import SHAPES, make_model_dir

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams

SWITCHES = ("FLOTILLA_SKINNY_GEMM", "FLOTILLA_SKINNY_GEMM_CONFIGS", "FLOTILLA_FP8_GEMV", "FLOTILLA_DECODE_BF16_LAUNCH",
            "FLOTILLA_DECODE_FP8_LAUNCH",
            "FLOTILLA_DECODE_WAVE", "FLOTILLA_PDL", "FLOTILLA_PDL_L2_MB", "FLOTILLA_DECODE_SMALL_LAUNCH",
            "FLOTILLA_DECODE_FUSED_MERGE", "FLOTILLA_QKV_ROPE", "FLOTILLA_GATED_GEMV", "FLOTILLA_GATED_GEMV_CONFIG",
            "FLOTILLA_FP8_ROW_GEMV", "FLOTILLA_FP8_ROW_GEMV_CONFIG")


def greedy_tokens(engine: LLMEngine, prompt_len: int, tokens: int, batch: int = 1) -> list[list[int]]:
    """The greedy continuations of `batch` fixed random prompts decoded together (seeded: the same on every
    side)."""
    rng = random.Random(1234)
    vocab = engine.config.model.hf_config["vocab_size"]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    reqs = [engine.add_request([rng.randrange(100, vocab) for _ in range(prompt_len)], params) for _ in range(batch)]
    while engine.has_unfinished_requests():
        engine.step()
    return [list(req.output_token_ids) for req in reqs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", required=True)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--profile-batch-sizes", default=None, help="default: --batch-sizes; '' for none")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--profile-steps", type=int, default=16)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--token-batch", default="1",
                   help="prompts decoded together for `tokens`; a list (1,8): one run each, their rows in order")
    p.add_argument("--quantization", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    prof = a.batch_sizes if a.profile_batch_sizes is None else a.profile_batch_sizes
    prof_sizes = [int(x) for x in prof.split(",") if x]
    token_batches = [int(x) for x in a.token_batch.split(",")]
    model_dir = make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape))
    card = measured()  # before the engine takes the GPU's memory
    t0 = time.perf_counter()
    engine = LLMEngine.from_kwargs(
        str(model_dir), load_format="dummy", max_model_len=a.context + 4 * a.steps + 64,
        max_num_seqs=max(*sizes, *token_batches), enable_prefix_caching=False, quantization=a.quantization,
        kv_cache_dtype=a.kv_cache_dtype,
    )  # fmt: skip
    cfg = engine.config.model.hf_config
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    out: dict = {
        "label": a.label, "quantization": a.quantization, "kv_cache_dtype": a.kv_cache_dtype, "context": a.context,
        "device": device, "peaks": peaks_json(card),
        "switches": {k: os.environ.get(k) for k in SWITCHES}, "startup_s": time.perf_counter() - t0,
        "latency": [], "profiles": [],
    }  # fmt: skip

    def save() -> None:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)

    out["tokens"] = [row for batch in token_batches for row in greedy_tokens(engine, 32, a.tokens, batch)]
    save()
    rng = random.Random(0)
    for batch in sizes:
        row = step_latency(engine, batch, a.context, a.steps, rng)
        row["roofline_ms_bf16"] = roofline_ms(cfg, batch, a.context)
        row["roofline_ms_bf16_card"] = roofline_ms(cfg, batch, a.context, card) if card else None
        out["latency"].append(row)
        on_card = f", card's {row['roofline_ms_bf16_card']:.2f}" if card else ""
        print(f"{a.label}: batch {batch} ctx {a.context}: {row['ms_per_step']:.3f} ms/step "
              f"(bf16 roofline {row['roofline_ms_bf16']:.2f}{on_card}, graphed {row['graphed_steps']}/{row['steps']})",
              flush=True)  # fmt: skip
        save()
    for batch in prof_sizes:
        r = profile_batch(engine, batch, a.context, a.profile_steps, rng)
        r["idle_us_per_step"] = r["wall_us_per_step"] - r["gpu_busy_us_per_step"]
        out["profiles"].append(r)
        print(f"{a.label}: profile batch {batch}: wall {r['wall_us_per_step']:.0f} us, busy "
              f"{r['gpu_busy_us_per_step']:.0f}, {r['launches_per_step']:.0f} launches; "
              + ", ".join(f"{g} {us:.0f}" for g, us in r["groups_us_per_step"].items()), flush=True)  # fmt: skip
        save()


if __name__ == "__main__":
    main()
