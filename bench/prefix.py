"""Prefix caching: TTFT and throughput of concurrent requests that share a system prompt.

    python bench/prefix.py --num-requests 64 --prefix-len 200 --suffix-len 20 --output-len 32

Runs, in one process, on the same weights: (a) unique prompts of the same length, (b) prompts that
share a `--prefix-len`-token prefix with prefix caching on, (c) the same with it off; and (d) one
request whose prefix is already cached vs (e) the same request on an empty cache. All requests of a
scenario are added at once (offline engine, greedy, ignore_eos). TTFT is the time from adding a
request to its first token. Without --model it runs the embedded SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def run_batch(engine: LLMEngine, prompts: list[list[int]], output_len: int) -> dict:
    """Add every prompt at once, step to the end; TTFT per request and total tokens/s."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    ids = [engine.add_request(p, params).request_id for p in prompts]
    first: dict[str, float] = {}
    fed_before = engine.runner.num_tokens_fed
    while engine.has_unfinished_requests():
        for out in engine.step():
            first.setdefault(out.request_id, time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    ttft = [first[i] for i in ids]
    tokens = sum(map(len, prompts)) + output_len * len(prompts)
    return {
        "seconds": elapsed,
        "total_tokens_per_s": tokens / elapsed,
        "output_tokens_per_s": output_len * len(prompts) / elapsed,
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "tokens_fed_to_model": engine.runner.num_tokens_fed - fed_before,
    }


def main() -> None:
    """Parse arguments, run the scenarios, print and save JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prefix-len", type=int, default=200)
    p.add_argument("--suffix-len", type=int, default=20)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--skip-batch", action="store_true", help="only the single-request cached/uncached TTFT")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rng = random.Random(a.seed)
    args = {"dtype": a.dtype, "max_model_len": a.max_model_len or (a.prefix_len + a.suffix_len + a.output_len + 16)}
    cached = LLMEngine.from_kwargs(a.model, **args, enable_prefix_caching=True)
    vocab = cached.config.model.hf_config["vocab_size"]

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    prefix = tokens(a.prefix_len)
    shared = [prefix + tokens(a.suffix_len) for _ in range(a.num_requests)]
    unique = [tokens(a.prefix_len + a.suffix_len) for _ in range(a.num_requests)]
    run_batch(cached, [tokens(16)], 2)  # warm-up
    result: dict = {"command": "python bench/prefix.py " + " ".join(sys.argv[1:]),
                    "workload": vars(a), "device": cached.config.device.device,
                    "dtype": cached.config.model.dtype}
    if not a.skip_batch:
        result["unique_prompts"] = run_batch(cached, unique, a.output_len)
        result["shared_prefix_cache_on"] = run_batch(cached, shared, a.output_len)
    one = [prefix + tokens(a.suffix_len)]
    result["single_cached_prefix"] = run_batch(cached, one, 1)  # the prefix blocks are in the cache now
    del cached
    uncached = LLMEngine.from_kwargs(a.model, **args, enable_prefix_caching=False)
    run_batch(uncached, [tokens(16)], 2)
    if not a.skip_batch:
        result["shared_prefix_cache_off"] = run_batch(uncached, shared, a.output_len)
    result["single_uncached"] = run_batch(uncached, one, 1)
    result["single_ttft_speedup"] = result["single_uncached"]["ttft_mean_s"] / result["single_cached_prefix"][
        "ttft_mean_s"]
    print(json.dumps(result, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
