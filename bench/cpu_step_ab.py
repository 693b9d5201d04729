"""Session 11's CPU one-row decode changes, A/B in one process, interleaved (a noisy shared CPU).

One `LLM(quantization="gguf")` (the embedded model's own Q4_1 GGUF, bf16, torch threads as the environment gives
them); four configurations toggled at run time on the same engine: `base` (the reference CPU path op for op,
`FLOTILLA_CPU_STEP_MEMO=0`, and the dense bf16 LM head), `memo` (the per-step memo: rotary/KV write, decode gather,
one-add RMSNorm residual), `head` (the Q8_0 LM head as two 4-bit planes) and `both` (the default). For --rounds
rounds, each configuration in turn (order reversed every other round): one prompt of --input-len tokens of
bench/data text (a new window each round, the same for every configuration), greedy, --output-len tokens; the median
engine step (the prefill step is an outlier the median drops). Prints per round, the medians, and whether each
configuration's greedy tokens equal `base`'s.

    OMP_NUM_THREADS=1 python bench/cpu_step_ab.py --rounds 6 --json bench/results/cpu-2026-12-04-s11/step-ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import flotilla.kernels.dispatch as dispatch
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

DATA = Path(__file__).parent / "data"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--input-len", type=int, default=210)
    parser.add_argument("--output-len", type=int, default=40)
    parser.add_argument("--json")
    args = parser.parse_args()
    llm = LLM(max_model_len=2048, quantization="gguf")
    head = llm.engine.runner.model.lm_head
    packed = head.cpu_int_weight
    configs = {"base": (False, None), "memo": (True, None), "head": (False, packed), "both": (True, packed)}
    ids = llm.get_tokenizer().encode("\n\n".join(p.read_text() for p in sorted(DATA.glob("*.txt"))))
    runs = []
    for r in range(args.rounds):
        prompt = ids[r * 300 : r * 300 + args.input_len]
        tokens = {}
        for name in configs if r % 2 == 0 else list(configs)[::-1]:
            dispatch.CPU_STEP_MEMO, head.cpu_int_weight = configs[name]
            params = SamplingParams(temperature=0.0, max_tokens=args.output_len, min_tokens=args.output_len,
                                    ignore_eos=True, output_kind="final_only")
            llm.engine.add_request(prompt, params)
            times, outputs = [], []
            while llm.engine.has_unfinished_requests():
                start = time.perf_counter()
                outputs += llm.engine.step()
                times.append(time.perf_counter() - start)
            tokens[name] = outputs[-1].outputs[0].token_ids
            runs.append({"round": r, "config": name, "decode_step_ms": statistics.median(times) * 1e3,
                         "loadavg_1min": os.getloadavg()[0]})
        same = {name: tokens[name] == tokens["base"] for name in configs}
        for run in runs[-len(configs):]:
            run["tokens_equal_base"] = same[run["config"]]
        print(f"round {r + 1}: " + ", ".join(f"{x['config']} {x['decode_step_ms']:.1f} ms" for x in runs[-4:])
              + f" (load {os.getloadavg()[0]:.1f}); tokens equal base: {same}", flush=True)
    dispatch.CPU_STEP_MEMO, head.cpu_int_weight = configs["both"]
    medians = {name: statistics.median(x["decode_step_ms"] for x in runs if x["config"] == name) for name in configs}
    print("medians (ms a one-row decode step): " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"torch_threads": torch.get_num_threads(), "input_len": args.input_len,
                                               "output_len": args.output_len, "runs": runs, "medians": medians},
                                              indent=2))


if __name__ == "__main__":
    main()
