"""Session 11's CPU one-row decode changes, A/B in one process, interleaved (a noisy shared CPU).

One `LLM(quantization="gguf")` (the embedded model's own Q4_1 GGUF, bf16, torch threads as the environment gives
them); four configurations toggled at run time on the same engine, step by step: `base` (the reference CPU path op
for op, `FLOTILLA_CPU_STEP_MEMO=0`, and the dense bf16 LM head), `memo` (the per-step memo: rotary/KV write,
decode gather, one-add RMSNorm residual), `head` (the Q8_0 LM head as two 4-bit planes) and `both` (the default).
For --rounds rounds: one prompt of --input-len tokens of bench/data text (a new window each round), greedy,
--output-len tokens, the configuration changing every engine step in rotation (so load drift on the shared machine
falls on all alike); per configuration the 25th percentile and the median of its steps. Then whether each
configuration's greedy tokens (one prompt, 64 tokens, whole requests) equal `base`'s.

    OMP_NUM_THREADS=1 python bench/cpu_step_ab.py --rounds 4 --output-len 200 \\
        --json bench/results/cpu-2026-12-04-s11/step-ab-t1.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import flotilla.engine.models.llama_cpu_decode as cpu_decode
import flotilla.kernels.dispatch as dispatch
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

DATA = Path(__file__).parent / "data"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=210)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--json")
    parser.add_argument("--set", choices=["s11", "s12"], default="s11",
                        help="s11: the four above (session 12's plain-call decode layers off); s12: `s11` (session "
                             "11's default), `layers` (+ the plain-call decode layers, llama_cpu_decode.py)")
    args = parser.parse_args()
    # no prefix cache: the configurations' token check reruns one prompt, and a cached prefix would turn its
    # prefill into a 2-token extend (another attention path, other roundings) for all but the first
    llm = LLM(max_model_len=2048, quantization="gguf", enable_prefix_caching=False)
    head = llm.engine.runner.model.lm_head
    packed = head.cpu_int_weight
    # (step memo, LM head weight, plain-call decode layers)
    if args.set == "s11":
        configs = {"base": (False, None, False), "memo": (True, None, False), "head": (False, packed, False),
                   "both": (True, packed, False)}
    else:
        configs = {"s11": (True, packed, False), "layers": (True, packed, True)}
    default = configs["both" if args.set == "s11" else "layers"]

    def use(config: tuple) -> None:
        dispatch.CPU_STEP_MEMO, head.cpu_int_weight, cpu_decode.CPU_DECODE_LAYERS = config

    ids = llm.get_tokenizer().encode("\n\n".join(p.read_text() for p in sorted(DATA.glob("*.txt"))))
    runs = []
    names = list(configs)
    for r in range(args.rounds):
        # one request; the configuration changes every step, in rotation (reversed every other round), so load
        # drift on the shared machine falls on all four alike
        prompt = ids[r * 300 : r * 300 + args.input_len]
        params = SamplingParams(temperature=0.0, max_tokens=args.output_len, min_tokens=args.output_len,
                                ignore_eos=True, output_kind="final_only")
        llm.engine.add_request(prompt, params)
        order = names if r % 2 == 0 else names[::-1]
        times: dict[str, list[float]] = {name: [] for name in names}
        step = 0
        while llm.engine.has_unfinished_requests():
            name = order[step % len(order)]
            use(configs[name])
            start = time.perf_counter()
            llm.engine.step()
            if step > 0:  # the first is the prefill
                times[name].append(time.perf_counter() - start)
            step += 1
        for name in names:
            ms = sorted(t * 1e3 for t in times[name])
            runs.append({"round": r, "config": name, "steps": len(ms), "median_ms": statistics.median(ms),
                         "p25_ms": ms[len(ms) // 4], "loadavg_1min": os.getloadavg()[0]})
        print(f"round {r + 1} (load {os.getloadavg()[0]:.1f}): "
              + ", ".join(f"{x['config']} p25 {x['p25_ms']:.1f} / median {x['median_ms']:.1f} ms"
                          for x in runs[-len(names):]),
              flush=True)
    use(default)
    medians = {name: {stat: statistics.median(x[stat] for x in runs if x["config"] == name)
                      for stat in ("p25_ms", "median_ms")} for name in configs}
    print("over rounds (ms a one-row decode step, p25 / median): "
          + ", ".join(f"{k} {v['p25_ms']:.2f} / {v['median_ms']:.2f}" for k, v in medians.items()))
    # greedy tokens per configuration, whole requests (the rotation above mixes them)
    prompt = ids[150 : 150 + args.input_len]
    tokens = {}
    for name in names:
        use(configs[name])
        out = llm.generate([{"prompt_token_ids": prompt}],
                           SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True), use_tqdm=False)
        tokens[name] = out[0].outputs[0].token_ids
    equal = {name: tokens[name] == tokens[names[0]] for name in names}
    print(f"greedy tokens (64, one prompt) equal the first's: {equal}")
    use(default)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"torch_threads": torch.get_num_threads(), "input_len": args.input_len,
                                               "output_len": args.output_len, "runs": runs, "over_rounds": medians,
                                               "tokens_equal_base": equal},
                                              indent=2))


if __name__ == "__main__":
    main()
