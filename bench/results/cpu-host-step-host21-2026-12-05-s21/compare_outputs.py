"""Token ids of the base tree and this branch on the paths the branch changed, on a tiny HF Llama (random init,
fp32, CPU): penalised requests (every penalty, greedy and seeded sampling, n=2) beside plain ones under a tight
KV pool (preemptions) with the CUDA-graph staging run uncaptured (requests finishing at every row), and n-gram
speculation on prompts that repeat themselves. Each tree runs in a subprocess of its own (bench/host_step.py's
layout); the script prints whether every token id agrees.

    python bench/results/cpu-host-step-host21-2026-12-05-s21/compare_outputs.py /tmp/host21-base .
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2]


def run_one() -> dict:
    """This process's tree: the outputs, and how many preemptions and accepted drafts there were."""
    from model_dirs import make_model_dir

    from flotilla.engine.cuda_graphs import StepGraphs
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams

    model = str(make_model_dir("tiny-llama", tempfile.mkdtemp(prefix="host21-cmp-"), weights_seed=0))
    rng = random.Random(0)
    llm = LLM(model, max_model_len=256, block_size=8, max_num_seqs=8, num_gpu_blocks_override=40,
              enable_prefix_caching=False)
    runner, sched = llm.engine.runner, llm.engine.config.scheduler
    runner.graphs = StepGraphs(runner.model, sched.max_num_seqs, sched.max_num_batched_tokens, 256, 8, runner.device)
    kinds = [{"repetition_penalty": 1.5}, {"frequency_penalty": 0.9, "presence_penalty": 0.6},
             {"repetition_penalty": 0.8, "frequency_penalty": -0.5, "presence_penalty": 0.3}, {}]
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randint(8, 40))] for _ in range(16)]
    params = [SamplingParams(temperature=0 if i % 2 else 0.9, seed=i, n=2 if i % 5 == 0 else 1, max_tokens=20 + 9 * i,
                             ignore_eos=True, **kinds[i % 4]) for i in range(16)]
    penalised = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]
    preemptions = llm.engine.scheduler.num_preemptions
    spec = LLM(model, max_model_len=256, block_size=8, speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    blocks = [[rng.randrange(3, 1024) for _ in range(6)] for _ in range(6)]
    repeating = [b * 5 + b[:2] for b in blocks]
    greedy = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
    ngram = [o.outputs[0].token_ids for o in spec.generate(repeating, greedy, use_tqdm=False)]
    return {"penalised": penalised, "ngram": ngram, "preemptions": preemptions,
            "accepted_drafts": spec.engine.speculator.counts.num_accepted_tokens}


def main() -> None:
    sys.path.insert(0, str(BENCH))
    from host_step import _layout

    results = []
    for tree in (Path(t).resolve() for t in sys.argv[1:3]):
        path = ":".join((str(_layout(tree)), str(tree / "bench")))
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one"], env=env, cwd="/tmp",
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"{tree}: {sum(len(c) for o in r['penalised'] for c in o)} penalised-run tokens, "
              f"{sum(map(len, r['ngram']))} n-gram-run tokens, {r['preemptions']} preemptions, "
              f"{r['accepted_drafts']} accepted drafts", flush=True)
    base, branch = results
    for key in ("penalised", "ngram"):
        print(f"{key}: {'identical' if base[key] == branch[key] else 'DIFFERENT'}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--one"]:
        print(json.dumps(run_one()), flush=True)
    else:
        main()
