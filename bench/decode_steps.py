"""Timing whole decode steps of an engine: the part every decode benchmark shares (bench/latency.py,
bench/lora.py, bench/structured.py, bench/decode_profile.py).

A benchmark adds its requests, calls `start_decoding` (prefill until every request has its first token,
then a few settling steps, so the timed steps are pure decode at a steady batch), then `timed_steps`.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

SETTLE_STEPS = 3  # steps after the last prefill before timing: the first decode steps still warm up


def start_decoding(engine: Any, requests: Iterable[Any], settle: int = SETTLE_STEPS) -> None:
    """Step `engine` until nothing waits and each of `requests` has an output token, then `settle` more."""
    requests = list(requests)
    while engine.scheduler.waiting or any(r.num_output_tokens == 0 for r in requests):
        engine.step()
    for _ in range(settle):
        engine.step()


def timed_steps(engine: Any, steps: int, after_step: Callable[[], None] | None = None) -> list[float]:
    """Wall seconds of each of `steps` engine steps; `after_step` (e.g. reading the runner's own
    timings) runs after each step, outside the timed span."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
        if after_step is not None:
            after_step()
    return times


def one_request_phase(engine: Any, vocab: int, steps: int, rng: random.Random) -> dict[str, Any]:
    """One A/B phase of a batch-1 decode comparison (bench/tile_sweep.py, bench/int4_fused_ab.py): a fresh greedy
    request of 512 random tokens, settled, then `steps` timed steps, then aborted; the median and mean ms a step and
    how many ran as a CUDA graph."""
    from flotilla.engine.sampling_params import SamplingParams

    req = engine.add_request([rng.randrange(100, vocab) for _ in range(512)],
                             SamplingParams(temperature=0.0, max_tokens=steps + 16, ignore_eos=True))  # fmt: skip
    start_decoding(engine, [req])
    graphed: list[bool] = []
    times = timed_steps(engine, steps, lambda: graphed.append(engine.runner.last_step.graphed))
    engine.abort([req.request_id])
    return {"ms_median": 1e3 * statistics.median(times), "ms_mean": 1e3 * statistics.fmean(times),
            "graphed": sum(graphed), "steps": steps}  # fmt: skip
