"""Prefix caching: TTFT and throughput of concurrent requests that share a system prompt.

    python bench/prefix.py --num-requests 64 --prefix-len 200 --suffix-len 20 --output-len 32

Runs, in one process, on the same weights: (a) unique prompts of the same length, (b) prompts that
share a `--prefix-len`-token prefix with prefix caching on, (c) the same with it off; and (d) one
request whose prefix is already cached vs (e) the same request on an empty cache. All requests of a
scenario are added at once (offline engine, greedy, ignore_eos). TTFT is the time from adding a
request to its first token. Without --model it runs the embedded SmolLM2-135M-Instruct;
`--shape llama-3.1-8b --load-format dummy` runs random weights of that shape (bench/model_dirs.py).
`single_cold_vs_warm` is the single-request TTFT on one engine (prefix caching on): a request with a
never-seen prefix (a miss, computed in full) vs the same prefix with a new suffix (a hit), after one
warm-up pair, median of `--repeats` pairs.
"""

from __future__ import annotations

import argparse
import gc
import logging
import random
import statistics
import sys
import time

from report import report

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
    added = time.perf_counter()
    first: dict[str, float] = {}
    fed_before = engine.runner.num_tokens_fed
    calls = []  # each engine.step() call's start and end, for the phases of a single request's TTFT
    while engine.has_unfinished_requests():
        called = time.perf_counter()
        for out in engine.step():
            first.setdefault(out.request_id, time.perf_counter() - start)
        calls.append((called - start, time.perf_counter() - start))
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
        # add_request, then each step() call until the first token: (start, end) in ms from the add
        "add_ms": 1e3 * (added - start),
        "step_calls_ms": [(round(1e3 * a, 3), round(1e3 * b, 3)) for a, b in calls if a < max(ttft)],
    }


def _profile_warm_step(engine: LLMEngine, prefix: list[int], tokens) -> dict:
    """Where a cached-prefix request's first step spends its time: runner host vs total, and the
    host-side operators of that step (torch.profiler, CPU self time)."""
    import torch

    run_batch(engine, [prefix + tokens(20)], 1)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    engine.add_request(prefix + tokens(20), params)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        engine.step()
        step_s = time.perf_counter() - t
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return {
        "step_s_profiled": step_s,
        "runner_host_s": engine.runner.last_step.host_s,
        "runner_total_s": engine.runner.last_step.total_s,
        "top_host_ops": [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in ops],  # (name, calls, ms)
    }


def _profile_cached_request(engine: LLMEngine, prefix: list[int], tokens) -> dict:
    """The GPU side of one cached-prefix request (add -> first token) under torch.profiler: its
    kernels grouped as bench/decode_profile.py groups them, the summed kernel time (busy), the span
    from the first kernel's start to the last one's end, and the wall time of the whole request."""
    import torch
    from decode_profile import grouped, kernel_times

    run_batch(engine, [prefix + tokens(20)], 1)  # the prefix is cached now
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        wall = run_batch(engine, [prefix + tokens(20)], 1)["ttft_mean_s"]
        torch.cuda.synchronize()
    kernels = kernel_times(prof)
    spans = [e.time_range for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    starts, ends = [s.start for s in spans], [s.end for s in spans]
    groups = grouped(kernels)
    top = sorted(kernels.items(), key=lambda kv: kv[1][0], reverse=True)[:30]
    return {
        "ttft_ms_profiled": 1e3 * wall,
        "gpu_busy_us": sum(v[0] for v in kernels.values()),
        "gpu_span_us": (max(ends) - min(starts)) if starts else 0.0,
        "launches": sum(v[1] for v in kernels.values()),
        "groups_us": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
        "kernels": [{"name": n[:120], "us": us, "launches": c} for n, (us, c) in top],
    }


_ABSENT = object()


def _cached_host_timeline(engine: LLMEngine, prefix_len: int, suffix_len: int, tokens, repeats: int) -> dict:
    """Where the host's time goes in a cached-prefix request (add -> first token), in ms from the start of
    add_request (median over `repeats` hits, each after its own cold request): the end of add_request, of
    Scheduler.schedule (prefix lookup, allocation), of flatten (the step's host lists), of the graph's input
    staging, the moment the replay (or, eagerly, the forward) is called and returns (the GPU's work starts at
    the call), the end of the draw's launches (LM head, argmax, copy: overlapping the GPU), of launch(), of
    the wait for the drawn ids (`sync_end`: the GPU is done), of Scheduler.update and of post-processing. Also
    the end of add_request's `_check_prompt_ids` (the prompt's block hashes, their look-up, the id check), of the
    scheduler's prefix look-up and allocation, and collect()'s start and end."""
    from flotilla.engine import model_runner as model_runner_module

    marks: dict[str, float] = {}
    runner, restore = engine.runner, []

    def wrap(owner, name: str, start: str | None, end: str | None) -> None:
        inner = getattr(owner, name)
        own = getattr(owner, "__dict__", {}).get(name, _ABSENT)  # an instance's own attribute, a module's or a class's
        restore.append((owner, name, own))

        def timed(*args, **kwargs):
            if start:
                marks.setdefault(start, time.perf_counter())
            try:
                return inner(*args, **kwargs)
            finally:
                if end:
                    marks.setdefault(end, time.perf_counter())

        setattr(owner, name, timed)

    wrap(engine, "_check_prompt_ids", None, "check_ids_end")  # the prompt's block hashes, look-up, id check
    wrap(engine.scheduler, "schedule", None, "schedule_end")
    wrap(engine.block_manager, "find_cached_prefix", None, "lookup_end")
    wrap(engine.block_manager, "allocate", None, "allocate_end")
    wrap(runner, "collect", "collect_start", "collect_end")  # the wait for the drawn ids, then the ids read
    wrap(model_runner_module, "flatten", None, "flatten_end")
    wrap(runner, "launch", None, "launch_end")
    wrap(runner, "_draw", "draw_start", "draw_end")
    wrap(engine.scheduler, "update", None, "update_end")
    wrap(engine, "_post_process", None, "post_end")
    if runner.graphs is not None:
        wrap(runner.graphs, "_stage", None, "stage_end")
    if runner.graphs is not None and runner.graphs._graphs:  # captured: the replay call of whichever graph runs
        for graph, _ in runner.graphs._graphs.values():
            wrap(graph, "replay", "replay_start", "replay_end")
    else:  # eager (or uncaptured graphs on the CPU): the forward
        wrap(runner.model, "forward", "replay_start", "replay_end")
    if runner.device.type == "cuda":
        import torch

        original_sync = torch.cuda.Event.synchronize
        restore.append((torch.cuda.Event, "synchronize", original_sync))

        def sync(event):
            try:
                return original_sync(event)
            finally:  # the request's last wait is collect()'s, for the drawn ids (staging waits too, earlier)
                marks["sync_end"] = time.perf_counter()

        torch.cuda.Event.synchronize = sync  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    lines: list[dict[str, float]] = []
    try:
        for i in range(repeats + 1):
            prefix = tokens(prefix_len)
            run_batch(engine, [prefix + tokens(suffix_len)], 1)
            prompt = prefix + tokens(suffix_len)
            marks.clear()
            start = time.perf_counter()
            engine.add_request(prompt, params)
            marks["add_end"] = time.perf_counter()
            while engine.has_unfinished_requests():
                if engine.step():
                    marks.setdefault("token", time.perf_counter())
            if i:  # the first warms up
                lines.append({k: 1e3 * (v - start) for k, v in marks.items()})
    finally:
        for owner, name, own in reversed(restore):
            if own is _ABSENT:
                delattr(owner, name)  # the class's method shows through again
            else:
                setattr(owner, name, own)
    keys = sorted({k for line in lines for k in line}, key=lambda k: statistics.median(x.get(k, 0) for x in lines))
    return {"repeats": len(lines), "median_ms": {k: round(statistics.median(x[k] for x in lines if k in x), 4)
                                                 for k in keys}}


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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
    p.add_argument("--shape", default=None, help="random weights of a known shape (bench/model_dirs.py)")
    p.add_argument("--load-format", default="auto", choices=("auto", "dummy"))
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--single-engine", action="store_true", help="skip the second (cache-off) engine")
    p.add_argument("--skip-batch", action="store_true", help="only the single-request cached/uncached TTFT")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile-kernels", action="store_true",
                   help="GPU kernels of one cached-prefix request (torch.profiler, CUDA activity)")
    p.add_argument("--host-timeline", type=int, default=0, metavar="N",
                   help="the host timeline of N cached-prefix requests (ms from add_request, medians)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rng = random.Random(a.seed)
    args = {"dtype": a.dtype, "max_model_len": a.max_model_len or (a.prefix_len + a.suffix_len + a.output_len + 16)}
    if a.shape:
        import tempfile

        from model_dirs import make_model_dir

        a.model = a.model or str(make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape)))
    if a.load_format != "auto":
        args["load_format"] = a.load_format
    if a.max_num_batched_tokens:
        args["max_num_batched_tokens"] = a.max_num_batched_tokens
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
                    "dtype": cached.config.model.dtype,
                    "async_scheduling": cached.config.scheduler.async_scheduling}
    if not a.skip_batch:
        result["unique_prompts"] = run_batch(cached, unique, a.output_len)
        result["shared_prefix_cache_on"] = run_batch(cached, shared, a.output_len)
    one = [prefix + tokens(a.suffix_len)]
    result["single_cached_prefix"] = run_batch(cached, one, 1)  # the prefix blocks are in the cache now
    pairs, phases = [], []
    for _ in range(a.repeats + 1):
        fresh = tokens(a.prefix_len)
        cold = run_batch(cached, [fresh + tokens(a.suffix_len)], 1)["ttft_mean_s"]
        warm = run_batch(cached, [fresh + tokens(a.suffix_len)], 1)
        pairs.append((cold, warm["ttft_mean_s"]))
        phases.append({k: warm[k] for k in ("add_ms", "step_calls_ms")})
    pairs, phases = pairs[1:], phases[1:]  # the first pair warms up kernels for these shapes
    cold_s = statistics.median(c for c, _ in pairs)
    warm_s = statistics.median(w for _, w in pairs)
    result["single_cold_vs_warm"] = {"pairs_s": pairs, "uncached_ttft_s": cold_s, "cached_ttft_s": warm_s,
                                     "speedup": cold_s / warm_s, "cached_phases": phases}
    if a.host_timeline:
        try:  # an extra: the figures above stand without it
            result["cached_host_timeline"] = _cached_host_timeline(cached, a.prefix_len, a.suffix_len, tokens,
                                                                   a.host_timeline)
        except Exception as exc:
            result["cached_host_timeline"] = {"error": repr(exc)[:300]}
    result["warm_step_profile"] = _profile_warm_step(cached, tokens(a.prefix_len), tokens)
    if a.profile_kernels and cached.config.device.device == "cuda":
        result["cached_request_profile"] = _profile_cached_request(cached, tokens(a.prefix_len), tokens)
    del cached
    gc.collect()
    _empty_device_cache()
    if not a.single_engine:  # a second engine with prefix caching off
        uncached = LLMEngine.from_kwargs(a.model, **args, enable_prefix_caching=False)
        run_batch(uncached, [tokens(16)], 2)
        if not a.skip_batch:
            result["shared_prefix_cache_off"] = run_batch(uncached, shared, a.output_len)
        result["single_uncached"] = run_batch(uncached, one, 1)
        result["single_ttft_speedup"] = (
            result["single_uncached"]["ttft_mean_s"] / result["single_cached_prefix"]["ttft_mean_s"]
        )
    report(result, a.json)


if __name__ == "__main__":
    main()
