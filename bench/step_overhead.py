"""Engine-core host time per decode step: `LLMEngine.step()` minus the model runner's `execute`.

    python bench/step_overhead.py --batch-sizes 64,256 --output-kinds cumulative,final_only --steps 50

On a tiny random Llama (bench/model_dirs.py's `tiny-llama`, on the CPU) `batch` requests of
`--prompt-len` random tokens (greedy, ignore_eos) are prefilled, `--warmup` decode steps run, then
`--steps` decode steps are timed one by one. Per step: the whole `engine.step()`, the runner's part
(`engine.runner.last_step.total_s`: input flattening, forward, sampling) and their difference, the
scheduler, block manager, detokenizer, output and stats work this benchmark is about. That difference
does not depend on the model's size, so the tiny model's figure is the big model's host overhead.
`--output-kinds` runs it per `SamplingParams.output_kind`: "cumulative" (the server's streaming
case, an output per request per step) and "final_only" (the offline `LLM`). `--profile N` prints
cProfile's top N functions (by own time) over the timed steps of each run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from model_dirs import SHAPES, make_model_dir

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams

BUDGET = 8192  # max_num_batched_tokens


def decoding(engine: LLMEngine) -> bool:
    """True when every request has its prompt computed, so the next step is a pure decode."""
    s = engine.scheduler
    return not s.waiting and all(r.num_computed_tokens >= r.num_prompt_tokens for r in s.running)


def max_tokens(batch: int, a: argparse.Namespace) -> int:
    """Enough output tokens that no request finishes before the timed steps end: requests prefilled
    early decode while the rest of the batch prefills, `BUDGET` tokens a step."""
    prefill_steps = -(-batch * a.prompt_len // BUDGET) + 1
    return prefill_steps + a.warmup + a.steps + 8


def measure(engine: LLMEngine, batch: int, output_kind: str, a: argparse.Namespace, rng: random.Random) -> dict:
    """Per-step times (ms) of `a.steps` decode steps at `batch` running requests."""
    vocab = SHAPES["tiny-llama"]["vocab_size"]
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=max_tokens(batch, a), output_kind=output_kind)
    ids = [
        engine.add_request([rng.randrange(3, vocab) for _ in range(a.prompt_len)], params).request_id
        for _ in range(batch)
    ]
    while not decoding(engine):
        engine.step()
    for _ in range(a.warmup):
        engine.step()
    totals, runners = [], []
    profiler = cProfile.Profile() if a.profile else None
    for _ in range(a.steps):
        if profiler is not None:
            profiler.enable()
        start = time.perf_counter()
        engine.step()
        totals.append(time.perf_counter() - start)
        if profiler is not None:
            profiler.disable()
        runners.append(engine.runner.last_step.total_s)
    assert len(engine.scheduler.running) == batch, "a request finished or was preempted while timed"
    engine.abort(ids)
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(a.profile)
        print(f"--- profile: batch {batch}, {output_kind} ({a.steps} steps) ---\n{text.getvalue()}", file=sys.stderr)
    core = [t - r for t, r in zip(totals, runners, strict=True)]
    ms = lambda xs: round(1e3 * statistics.median(xs), 4)  # noqa: E731
    return {
        "batch": batch,
        "output_kind": output_kind,
        "step_ms": ms(totals),
        "runner_ms": ms(runners),
        "engine_core_ms": ms(core),
        "engine_core_mean_ms": round(1e3 * statistics.mean(core), 4),
    }


def main() -> None:
    """Build the tiny model and engine, run every (batch, output kind) and print the JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="64,256")
    p.add_argument("--output-kinds", default="cumulative,final_only")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration; the lowest median wins")
    p.add_argument("--profile", type=int, default=0, metavar="N")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    logging.disable(logging.INFO)
    batches = [int(b) for b in a.batch_sizes.split(",")]
    kinds = a.output_kinds.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir("tiny-llama", Path(tmp) / "tiny-llama", weights_seed=0)
        # Room for every sequence of the largest batch (the CPU's default pool is smaller): no preemption.
        per_seq = -(-(a.prompt_len + max_tokens(max(batches), a)) // 16)
        engine = LLMEngine.from_kwargs(
            str(model_dir),
            device="cpu",
            max_num_seqs=max(batches),
            max_num_batched_tokens=BUDGET,
            num_gpu_blocks_override=max(batches) * per_seq,
        )
    rng = random.Random(0)  # fresh prompts every run: no prefix-cache hits between runs
    measure(engine, min(batches), kinds[0], argparse.Namespace(**{**vars(a), "profile": 0}), rng)  # warm-up
    results = []
    for batch in batches:
        for kind in kinds:
            runs = [measure(engine, batch, kind, a, rng) for _ in range(a.repeats)]
            results.append(min(runs, key=lambda r: r["engine_core_ms"]))
    out = {
        "command": "python bench/step_overhead.py " + " ".join(sys.argv[1:]),
        "prompt_len": a.prompt_len,
        "warmup": a.warmup,
        "steps": a.steps,
        "results": results,
    }
    print(json.dumps(out, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
