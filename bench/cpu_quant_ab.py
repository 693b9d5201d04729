"""Decode speed of 4-bit configurations of the embedded model in one process, interleaved (a noisy shared CPU).

Each configuration is one `LLM` (engine in this process, torch threads as the environment gives them); then, for
--rounds rounds, each in turn (the order alternating by round): `rows` prompts of --input-len tokens of
bench/data text, greedy, decoded together for --output-len tokens through the engine's own `step()`; the median
step time is the decode step at that many rows (the prefill steps are outliers it drops). Reports the median over
rounds per configuration and row count, the load average at each, and the ratio of each configuration to the
first.

    RTN_NUM_BITS=4 RTN_GROUP_SIZE=32 OMP_NUM_THREADS=1 python bench/cpu_quant_ab.py \\
        --json bench/results/cpu-2026-12-04-s10-gguf/quant-ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

DATA = Path(__file__).parent / "data"
# name -> LLM keyword arguments (model None: the embedded model, as `flotilla serve` with no model)
CONFIGS = {
    "gguf": {"quantization": "gguf"},
    "rtn4g32": {"quantization": "rtn"},  # RTN_NUM_BITS=4 RTN_GROUP_SIZE=32 from the environment
    "bf16": {},
}


def decode_ms(llm: LLM, prompts: list[list[int]], output_len: int) -> float:
    """Median ms of the engine steps while `prompts` are decoded together for `output_len` tokens: the one or two
    prefill steps are outliers the median drops, and so are steps a load spike hit."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True,
                            output_kind="final_only")
    for p in prompts:
        llm.engine.add_request(p, params)
    times = []
    while llm.engine.has_unfinished_requests():
        start = time.perf_counter()
        llm.engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="gguf,rtn4g32", help="comma-separated, from: " + ", ".join(CONFIGS))
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--input-len", type=int, default=210)
    parser.add_argument("--output-len", type=int, default=33)
    parser.add_argument("--json")
    args = parser.parse_args()
    names = args.configs.split(",")
    llms = {name: LLM(max_model_len=2048, **CONFIGS[name]) for name in names}
    tokenizer = next(iter(llms.values())).get_tokenizer()
    ids = tokenizer.encode("\n\n".join(p.read_text() for p in sorted(DATA.glob("*.txt"))))
    rng = random.Random(0)
    results: dict = {"env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "RTN_NUM_BITS", "RTN_GROUP_SIZE")},
                     "input_len": args.input_len, "output_len": args.output_len, "runs": []}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for rows in map(int, args.rows.split(",")):
            starts = [rng.randrange(0, len(ids) - args.input_len) for _ in range(rows)]
            prompts = [ids[s:s + args.input_len] for s in starts]  # the same prompts for every configuration
            for name in order:
                load = os.getloadavg()[0]
                ms = decode_ms(llms[name], prompts, args.output_len)
                results["runs"].append({"round": r, "config": name, "rows": rows, "decode_step_ms": ms,
                                        "loadavg_1min": load})
                print(f"round {r + 1} rows {rows} {name:<8}: {ms:6.1f} ms a decode step (load {load:.1f})", flush=True)
    medians = {}
    for rows in map(int, args.rows.split(",")):
        for name in names:
            medians[f"{name} rows {rows}"] = statistics.median(
                x["decode_step_ms"] for x in results["runs"] if x["config"] == name and x["rows"] == rows)
        for other in names[1:]:
            medians[f"{other} / {names[0]} rows {rows}"] = medians[f"{other} rows {rows}"] / medians[
                f"{names[0]} rows {rows}"]
    results["medians_ms"] = medians
    print(json.dumps(medians, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
