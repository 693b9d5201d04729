"""Where a large mixed step's GPU time goes: the ~16k-token prefill + decode steps that take ~60 % of the offline
1,000 x (512 in / 128 out) run (bench/throughput.py; issue 19's >= 0.80 of the FLOP bound).

    python bench/mixed_step_profile.py --decode-rows 448 --prompts 31 --prompt-len 512 --json out.json

`--decode-rows` requests of `--prompt-len` random tokens are prefilled and left decoding; then, `--steps` times,
`--prompts` new prompts are added and one engine step (synchronous scheduling: a step is one forward) runs under
torch.profiler. Reports per step the kernels grouped as bench/decode_profile.py groups them, and the GEMM group's
achieved TFLOP/s (2 x the linear layers' parameters x the step's tokens, plus the LM head's sampled rows, over the
GEMM group's kernel time): how far the step is from the 790 TFLOP/s the FLOP bound assumes, and how much of it is
not GEMM at all (norms, SiLU, rotary, attention).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile

import torch
from decode_profile import grouped, kernel_times
from decode_steps import start_decoding
from model_dirs import SHAPES, make_model_dir
from report import report

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams

# On the CPU (a smoke run of the script at a tiny shape) there is nothing to wait for.
ON_GPU = torch.cuda.is_available()
sync = torch.cuda.synchronize if ON_GPU else (lambda: None)
ACTIVITY, DEVICE_TYPE = (
    (torch.profiler.ProfilerActivity.CUDA, torch.autograd.DeviceType.CUDA)
    if ON_GPU
    else (torch.profiler.ProfilerActivity.CPU, torch.autograd.DeviceType.CPU)
)


def linear_params(cfg: dict) -> tuple[int, int]:
    """(parameters of the decoder layers' linear layers, parameters of the LM head)."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    layer = h * (heads * d + 2 * kv * d) + heads * d * h + 3 * h * cfg["intermediate_size"]
    return cfg["num_hidden_layers"] * layer, cfg["vocab_size"] * h


def profile_step(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """Add `prompts` and profile the one step that prefills them beside the running decode rows."""
    for p in prompts:
        engine.add_request(p, params)
    sync()
    with torch.profiler.profile(activities=[ACTIVITY]) as prof:
        engine.step()
        sync()
    kernels = kernel_times(prof, DEVICE_TYPE)
    groups = grouped(kernels)
    top = sorted(kernels.items(), key=lambda kv: kv[1][0], reverse=True)[:20]
    return {"busy_us": sum(v[0] for v in kernels.values()), "launches": sum(v[1] for v in kernels.values()),
            "groups_us": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
            "kernels": [{"name": n[:120], "us": us, "launches": c} for n, (us, c) in top]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    p.add_argument("--decode-rows", type=int, default=448)
    p.add_argument("--prompts", type=int, default=31)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--enforce-eager", action="store_true", help="capture no CUDA graphs (the profiled step runs "
                   "eagerly at 16k tokens anyway; saves the start-up's ~20 s of capture)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    model_dir = str(make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape)))
    max_len = min(4096, SHAPES[a.shape]["max_position_embeddings"])
    engine = LLMEngine.from_kwargs(
        model_dir, load_format="dummy", max_model_len=max_len, max_num_seqs=a.decode_rows + a.prompts * (a.steps + 1),
        max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=False, async_scheduling=False,
        enforce_eager=a.enforce_eager,
    )  # fmt: skip
    cfg = engine.config.model.hf_config
    rng = random.Random(0)

    def prompt() -> list[int]:
        return [rng.randrange(100, cfg["vocab_size"]) for _ in range(a.prompt_len)]

    decode = SamplingParams(temperature=0.0, max_tokens=512, ignore_eos=True)
    start_decoding(engine, [engine.add_request(prompt(), decode) for _ in range(a.decode_rows)])
    profile_step(engine, [prompt() for _ in range(a.prompts)], decode)  # warm-up: the step shape compiles once
    body, head = linear_params(cfg)
    tokens = a.decode_rows + a.prompts * a.prompt_len
    flops = 2 * body * tokens + 2 * head * (a.decode_rows + a.prompts)
    result = {"command": "python bench/mixed_step_profile.py " + " ".join(sys.argv[1:]),
              "device": torch.cuda.get_device_name() if ON_GPU else "cpu", "torch": torch.__version__,
              "step_tokens": tokens, "linear_flops": flops, "steps": []}  # fmt: skip
    for _ in range(a.steps):
        r = profile_step(engine, [prompt() for _ in range(a.prompts)], decode)
        r["gemm_tflops"] = flops / r["groups_us"].get("gemm", float("nan")) / 1e6
        r["gemm_share"] = r["groups_us"].get("gemm", 0.0) / max(r["busy_us"], 1e-9)
        result["steps"].append(r)
        print(f"step of {tokens} tokens: busy {r['busy_us'] / 1e3:.1f} ms, {r['launches']} kernels, GEMM "
              f"{r['gemm_tflops']:.0f} TFLOP/s ({100 * r['gemm_share']:.1f} % of busy); "
              + ", ".join(f"{g} {us / 1e3:.1f}" for g, us in r["groups_us"].items()), flush=True)  # fmt: skip
    for k in result["steps"][-1]["kernels"][:14]:
        print(f"    {k['us'] / 1e3:8.2f} ms x{k['launches']}  {k['name']}", flush=True)
    report(result, a.json, echo=False)


if __name__ == "__main__":
    main()
