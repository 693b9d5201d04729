"""Multi-LoRA decode cost: ms per engine step with adapters against the same engine without LoRA.

    python bench/lora.py --shape llama-3.1-8b --rank 16 --adapters 8 --batch-sizes 1,64 --context 512

For each batch size, `batch` requests of `context` random tokens are prefilled, then `--steps` whole
decode steps are timed (as bench/latency.py). Three runs: the engine without `--enable-lora`; the
LoRA engine serving only base-model requests; the LoRA engine with the batch spread round-robin over
`--adapters` random rank-`--rank` adapters on all seven projections (q/k/v/o/gate/up/down, written in
PEFT's file format with random nonzero A and B). Targets (issue 25): batch 64 with 8 adapters at most
1.25x the no-LoRA step, batch 1 at most 1.15x.

`--kernels stacked,segments,pair` measures the LoRA engine once per kernel set (FLOTILLA_LORA_KERNELS,
kernels/dispatch.py): `stacked` is the default (the A stack as extra rows of the base weight: one GEMM
for the base product and every slot's shrink, one expand kernel per projection, from 2 tokens on; the
expand in the GEMV's epilogue at batch 1), `segments` the segment pair from 16 tokens on (fifth
session), `pair` the per-token pair everywhere; each row names its set. On an 8B shape give one set per
process (bench/results/lora-gpu.sh does): a later engine of the same process may find no memory left
for its KV cache (H200, 2026-12-03).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
from pathlib import Path

import torch
from decode_steps import start_decoding, timed_steps
from model_dirs import SHAPES, make_model_dir
from safetensors.torch import save_file

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(config: dict, path: Path, rank: int, seed: int, scale: float = 0.01) -> Path:
    """A random PEFT LoRA adapter of `config`'s shape (bf16, entries of standard deviation `scale`), as
    PEFT's save_pretrained lays it out."""
    h, i = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config.get("num_key_value_heads", 1) * head_dim
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            fan_in, fan_out = shapes[target]
            block = "mlp" if target in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{target}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(rank, fan_in, generator=g) * scale).bfloat16()
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=g) * scale).bfloat16()
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS), "bias": "none"}))
    return path


def step_ms(engine, batch: int, context: int, steps: int, loras: list, profile_steps: int = 0) -> tuple[float, dict]:
    """Mean ms per decode step with `batch` requests, request k on `loras[k % len(loras)]`; with
    `profile_steps`, also the GPU kernel time of that many more steps by kernel name (us per step)."""
    from flotilla.engine.sampling_params import SamplingParams

    rng = random.Random(0)
    vocab = engine.config.model.hf_config["vocab_size"]
    params = SamplingParams(temperature=0.0, max_tokens=4 * steps + 32, ignore_eos=True)
    reqs = [engine.add_request([rng.randrange(100, vocab) for _ in range(context)], params,
                               lora_request=loras[k % len(loras)]) for k in range(batch)]
    start_decoding(engine, reqs)
    times = timed_steps(engine, steps)
    kernels = kernel_us_per_step(engine, profile_steps) if profile_steps else {}
    engine.abort([r.request_id for r in reqs])
    return 1e3 * statistics.fmean(times), kernels


def kernel_us_per_step(engine, steps: int) -> dict:
    """`steps` engine steps under torch.profiler: each GPU kernel name's time and launches per step,
    largest first (the top 16, then "busy": all kernels together)."""
    from decode_profile import kernel_times

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    totals = kernel_times(prof)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
    out = {name[:60]: [round(us / steps, 1), round(n / steps, 1)] for name, (us, n) in ranked[:16]}
    out["busy"] = [round(sum(us for us, _ in totals.values()) / steps, 1), sum(n for _, n in totals.values()) / steps]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--workdir", default="/tmp/bench-lora")
    p.add_argument("--kernels", default="stacked",
                   help="comma-separated LoRA kernel sets to measure: stacked, segments, pair (or 2, 1, 0)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="profile this many more LoRA steps at the largest batch: GPU time by kernel")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    from flotilla.engine.llm_engine import LLMEngine
    from flotilla.engine.lora.request import LoRARequest
    from flotilla.kernels import dispatch

    work = Path(a.workdir)
    model_dir = make_model_dir(a.shape, work / a.shape)
    config = SHAPES[a.shape]
    loras = [LoRARequest(f"a{k}", k + 1, str(write_adapter(config, work / f"adapter-{k}", a.rank, k)))
             for k in range(a.adapters)]
    batches = [int(b) for b in a.batch_sizes.split(",")]
    common = dict(load_format="dummy", max_model_len=a.context + 4 * a.steps + 64, max_num_seqs=max(batches),
                  enable_prefix_caching=False, gpu_memory_utilization=0.85)
    results = {"shape": a.shape, "rank": a.rank, "adapters": a.adapters, "context": a.context, "rows": []}
    base = LLMEngine.from_kwargs(str(model_dir), **common)
    plain = {b: step_ms(base, b, a.context, a.steps, [None])[0] for b in batches}
    del base
    torch.cuda.empty_cache()
    for kernels in [dispatch.lora_kernel_set(k) for k in a.kernels.split(",")]:
        # Read when the LoRA layers are built (the stacked weights) and at every call, so the graphs
        # capture this set.
        dispatch.LORA_KERNELS = kernels
        engine = LLMEngine.from_kwargs(str(model_dir), **common, enable_lora=True, max_loras=a.adapters,
                                       max_lora_rank=a.rank)
        for b in batches:
            lora_ms, profile = step_ms(engine, b, a.context, a.steps, loras[: min(b, a.adapters)],
                                       a.profile_steps if b == max(batches) else 0)
            graphed = engine.runner.last_step.graphed  # of the LoRA steps
            row = {"batch": b, "kernels": kernels, "no_lora_ms": plain[b],
                   "lora_engine_base_ms": step_ms(engine, b, a.context, a.steps, [None])[0],
                   "lora_ms": lora_ms, "lora_graphed": graphed}
            row["ratio"] = row["lora_ms"] / row["no_lora_ms"]
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            if profile:
                row["kernels_us_per_step"] = profile
                print(json.dumps({"batch": b, "kernels": kernels, "kernels_us_per_step": profile}), flush=True)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
