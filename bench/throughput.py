"""Offline throughput: N requests with fixed lengths (ignore_eos), Flotilla vs HF transformers `generate`.

    python bench/throughput.py --num-prompts 16 --input-len 128 --output-len 64 --hf --json out.json

Without --model it runs the embedded SmolLM2-135M-Instruct. Prompts are random token ids, as
`vllm bench throughput --dataset-name random`. The HF baseline runs the same prompts as one static
batch through `generate` (greedy, exactly output-len new tokens), on the same weights and dtype.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

import torch

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams


def make_prompts(n: int, input_len: int, vocab: int, seed: int, mixed: bool) -> list[list[int]]:
    """Random token-id prompts; with `mixed`, lengths uniform in [input_len/2, input_len*3/2]."""
    rng = random.Random(seed)
    lengths = [rng.randint(input_len // 2, input_len * 3 // 2) if mixed else input_len for _ in range(n)]
    return [[rng.randrange(100, vocab) for _ in range(length)] for length in lengths]


def run_flotilla(model: str | None, prompts: list[list[int]], output_len: int, engine_args: dict) -> dict:
    """Generate with Flotilla; returns wall time and output tokens/s (load and warm-up excluded)."""
    llm = LLM(model, **engine_args)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    prompt_tokens = sum(map(len, prompts))
    return {
        "seconds": elapsed,
        "output_tokens_per_s": generated / elapsed,
        "total_tokens_per_s": (generated + prompt_tokens) / elapsed,
        "requests_per_s": len(prompts) / elapsed,
        "model_dir": llm.engine.config.model.model,
        "dtype": llm.engine.config.model.dtype,
    }


def run_hf(model_dir: str, dtype: str, prompts: list[list[int]], output_len: int) -> dict:
    """HF transformers `generate` on the prompts as one left-padded static batch."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids[:2, -8:], attention_mask=mask[:2, -8:], max_new_tokens=2, do_sample=False, pad_token_id=0)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, **kwargs)
        elapsed = time.perf_counter() - start
    generated = (out.shape[1] - width) * len(prompts)
    return {"seconds": elapsed, "output_tokens_per_s": generated / elapsed}


def main() -> None:
    """Parse arguments, run both engines, print and save the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--mixed", action="store_true", help="random-mixed prompt lengths")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--hf", action="store_true", help="also run the HF transformers baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    engine_args = {"dtype": a.dtype, "max_num_seqs": a.max_num_seqs}
    probe = LLM(a.model, **engine_args, max_model_len=64).engine.config.model
    prompts = make_prompts(a.num_prompts, a.input_len, probe.hf_config["vocab_size"], a.seed, a.mixed)
    result = {
        "command": "python bench/throughput.py " + " ".join(__import__("sys").argv[1:]),
        "workload": {
            "num_prompts": a.num_prompts,
            "input_len": a.input_len,
            "output_len": a.output_len,
            "mixed": a.mixed,
        },
        "machine": {
            "cpu_count": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "flotilla": run_flotilla(a.model, prompts, a.output_len, engine_args),
    }
    if a.hf:
        result["hf_generate"] = run_hf(
            result["flotilla"]["model_dir"], result["flotilla"]["dtype"], prompts, a.output_len
        )
        result["speedup"] = result["flotilla"]["output_tokens_per_s"] / result["hf_generate"]["output_tokens_per_s"]
    print(json.dumps(result, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
