"""Greedy tokens on the GPU vs HF transformers, same random bf16 weights, a real model's shape.

    python bench/greedy_match.py --shape llama-3.1-8b --num-prompts 8 --tokens 32 --json out.json

HF builds its random init on the GPU (bf16, sdpa attention) and generates each prompt alone; the
engine (CUDA graphs on) gets HF's weights copied in (`load_state`) and generates all prompts as one
batch. For every prompt: how many leading tokens match, and at the first divergence HF's gap between
its top two logits (a near-tie in bf16 is a gap of a few bf16 steps: 1/32 at |logit| 4 to 8).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile

import torch
from model_dirs import SHAPES, make_model_dir
from report import report

from flotilla.engine.llm import LLM
from flotilla.engine.model_loader import load_state
from flotilla.engine.sampling_params import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--near-tie", type=float, default=0.125, help="top-2 logit gap counted as a near-tie")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = str(make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape)))
    config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(0)
    with torch.device("cuda"):
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    rng = random.Random(0)
    prompts = [[rng.randrange(100, config.vocab_size) for _ in range(rng.randint(16, 200))]
               for _ in range(a.num_prompts)]
    hf_tokens, hf_gaps, hf_logits = [], [], []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids], device="cuda")
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                              do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            hf_tokens.append(out.sequences[0, len(ids):].tolist())
            top2 = torch.stack([lg[0].float().topk(2).values for lg in out.logits])
            hf_gaps.append((top2[:, 0] - top2[:, 1]).tolist())
            hf_logits.append(torch.stack([lg[0].float() for lg in out.logits]).cpu())
    llm = LLM(model_dir, load_format="dummy", max_model_len=512, gpu_memory_utilization=0.5, max_num_seqs=16)
    load_state(llm.engine.runner.model, hf.state_dict().items())
    params = SamplingParams(temperature=0.0, max_tokens=a.tokens, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    rows = []
    for ref, got, gaps, logits in zip(hf_tokens, ours, hf_gaps, hf_logits, strict=True):
        first = next((i for i, (x, y) in enumerate(zip(ref, got, strict=True)) if x != y), None)
        rows.append({
            "matching_prefix": a.tokens if first is None else first,
            "first_divergence": first,
            "hf_top2_gap_at_divergence": None if first is None else gaps[first],
            "near_tie": None if first is None else gaps[first] <= a.near_tie,
            "min_hf_gap_before": min(gaps[: a.tokens if first is None else first + 1]),
            # HF's logit for its own token minus its logit for ours, and HF's top logit there
            "hf_logit_hf_minus_ours": None
            if first is None
            else float(logits[first, ref[first]] - logits[first, got[first]]),
            "hf_top_logit": None if first is None else float(logits[first].max()),
        })
    result = {
        "command": "python bench/greedy_match.py " + " ".join(sys.argv[1:]),
        "shape": a.shape,
        "identical_prompts": sum(r["first_divergence"] is None for r in rows),
        "matching_tokens": sum(r["matching_prefix"] for r in rows),
        "total_tokens": a.tokens * a.num_prompts,
        "divergences_all_near_ties": all(r["near_tie"] in (None, True) for r in rows),
        "graphed_last_step": llm.engine.runner.last_step.graphed,
        "prompts": rows,
    }
    report(result, a.json)


if __name__ == "__main__":
    main()
