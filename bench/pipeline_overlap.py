"""Pipeline-parallel overlap on the CPU: the same greedy workload at -pp 1, at -pp 2 one step at a
time, and at -pp 2 with up to two steps in flight (the batch queue, `engine/batch_queue.py`).

    OMP_NUM_THREADS=1 python bench/pipeline_overlap.py --num-prompts 8 --input-len 64 --output-len 32

Random weights of `--shape` (bench/model_dirs.py, default small-llama: 8 layers, hidden 512, fp32).
Each worker gets one torch thread; two stages can only overlap when the machine has two idle cores,
so the figure says as much about the host's load as about the engine. Greedy tokens of the three runs
are compared and must be equal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

from model_dirs import make_model_dir

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams


def run(model_dir: str, prompts: list[list[int]], output_len: int, pp: int, overlap: bool) -> dict:
    """Tokens/s of one configuration (start-up and a short warm-up excluded) and its tokens."""
    llm = LLM(model_dir, pipeline_parallel_size=pp, max_model_len=512, max_num_seqs=len(prompts))
    try:
        if not overlap:
            llm.engine.batches = None  # the synchronous path: one step in flight
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        llm.generate([p[:8] for p in prompts], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
        steps = llm.engine.stats.num_steps
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    finally:
        llm.engine.shutdown()
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"pp": pp, "overlap": overlap, "seconds": seconds, "output_tokens_per_s": generated / seconds,
            "num_steps": llm.engine.stats.num_steps - steps, "tokens": [o.outputs[0].token_ids for o in outs]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="small-llama")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_model_dir(args.shape, tmp, weights_seed=0))
        rng = random.Random(0)
        prompts = [[rng.randrange(3, 1000) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
        runs = [run(model_dir, prompts, args.output_len, pp, overlap)
                for pp, overlap in ((1, False), (2, False), (2, True))]
    assert all(r["tokens"] == runs[0]["tokens"] for r in runs), "greedy tokens differ between configurations"
    for r in runs:
        del r["tokens"]
        print(f"pp={r['pp']} overlap={r['overlap']!s:5}  {r['seconds']:6.2f} s  "
              f"{r['output_tokens_per_s']:7.1f} output tok/s  {r['num_steps']} steps")
    result = {"args": vars(args), "cpu_count": os.cpu_count(), "loadavg_after": os.getloadavg(), "runs": runs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
