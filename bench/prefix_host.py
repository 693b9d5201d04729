"""The host's part of a cached-prefix request's time to first token, on the graph path's staging: where
the time goes from `add_request` to the point where the GPU's first kernel could start, and after.

    OMP_NUM_THREADS=1 python bench/prefix_host.py --prefix-len 2000 --suffix-len 20 --repeats 40

A tiny random Llama (bench/model_dirs.py `tiny-llama`, context widened) on the CPU, prefix caching on,
asynchronous scheduling (as on a GPU), and uncaptured StepGraphs so a step stages its inputs as a
graph replay would. The model's forward is a stub that notes when it is entered (the moment the
replay would launch the first kernel) and returns zeros, so the figures are the host's alone. Each
repeat: a request with a fresh `--prefix-len` prefix (computed in full, cached), then one with the
same prefix and a new `--suffix-len` suffix (the hit), whose timeline is recorded, in ms from the
start of `add_request`:
- `add`: add_request done; `schedule`: Scheduler.schedule done (prefix lookup, allocation);
- `flatten`: the step's host lists built; `forward`: the stub forward entered (staging done: the GPU
  would start here); `launch`: ModelRunner.launch done (LM head, argmax, copy launches queued);
- `step1`: the first step() returned; `collect`: the second step() starts waiting for the drawn ids
  (on a GPU: the wait for the forward; here there is nothing to wait for); `token`: the second step()
  returned the token.
On a GPU the host's work between `forward` and `collect` (the draw's launches, the next step's plan)
overlaps the forward, so the host's part of the time to first token is `forward` + (`token` - `collect`):
printed as the critical path. Medians over the repeats; `--cprofile FILE` profiles add_request + the
first step of every hit.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from model_dirs import make_model_dir

from flotilla.engine import model_runner as model_runner_module
from flotilla.engine.cuda_graphs import StepGraphs
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams


class StubForward(torch.nn.Module):
    """Zeros of the model's width for every input row; notes when it was entered."""

    def __init__(self, hidden: int, marks: dict[str, float]) -> None:
        super().__init__()
        self.hidden, self.marks = hidden, marks

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first-kernel moment of a replay, then zeros."""
        self.marks.setdefault("forward", time.perf_counter())
        return torch.zeros(ids.shape[0], self.hidden)


def mark_after(owner: Any, name: str, label: str, marks: dict[str, float], at_start: bool = False) -> None:
    """Wrap `owner.name` so that its return time (its start time with `at_start`) is noted as `label` (first call
    only per request)."""
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        if at_start:
            marks.setdefault(label, time.perf_counter())
        try:
            return inner(*args, **kwargs)
        finally:
            marks.setdefault(label, time.perf_counter())

    setattr(owner, name, timed)


def build_engine(prefix_len: int, suffix_len: int, block_size: int, folder: str) -> LLMEngine:
    """The tiny engine (its model written under `folder`) with a context wide enough for the prompt, uncaptured
    graphs attached."""
    model_dir = make_model_dir("tiny-llama", folder)
    config = json.loads((model_dir / "config.json").read_text())
    config["max_position_embeddings"] = 2 * (prefix_len + suffix_len) + 64
    (model_dir / "config.json").write_text(json.dumps(config))
    engine = LLMEngine.from_kwargs(
        str(model_dir), load_format="dummy", max_model_len=prefix_len + suffix_len + 32, enable_prefix_caching=True,
        async_scheduling=True, block_size=block_size, device="cpu",
        max_num_batched_tokens=max(2048, prefix_len + suffix_len + 32),
    )  # fmt: skip
    sched, runner = engine.config.scheduler, engine.runner
    runner.graphs = StepGraphs(runner.model, sched.max_num_seqs, sched.max_num_batched_tokens,
                               engine.config.model.max_model_len, runner.block_size, runner.device)
    return engine


def run_one(engine: LLMEngine, prompt: list[int], marks: dict[str, float] | None,
            profiler: cProfile.Profile | None = None) -> None:
    """One request of one token to the end; with `marks`, its timeline is noted there."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    if marks is not None:
        marks.clear()
        marks["start"] = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    engine.add_request(prompt, params)
    if marks is not None:
        marks["add"] = time.perf_counter()
    first = True
    while engine.has_unfinished_requests():
        outputs = engine.step()
        if first and profiler is not None:
            profiler.disable()
        if first and marks is not None:
            marks["step1"] = time.perf_counter()
        first = False
        if outputs and marks is not None:
            marks.setdefault("token", time.perf_counter())


def main() -> None:
    """Time the hits, print the medians (and save them as JSON with --json)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefix-len", type=int, default=2000)
    p.add_argument("--suffix-len", type=int, default=20)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--label", default="host")
    p.add_argument("--cprofile", default=None, help="profile add_request + the first step of every hit")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="prefix-host") as folder:
        engine = build_engine(a.prefix_len, a.suffix_len, a.block_size, folder)
    marks: dict[str, float] = {}
    runner = engine.runner
    assert runner.graphs is not None
    runner.graphs.model = StubForward(engine.config.model.hf_config["hidden_size"], marks)
    mark_after(engine.scheduler, "schedule", "schedule", marks)
    mark_after(runner, "launch", "launch", marks)
    mark_after(model_runner_module, "flatten", "flatten", marks)
    mark_after(runner, "collect", "collect", marks, at_start=True)
    vocab = engine.config.model.hf_config["vocab_size"]
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    profiler = cProfile.Profile() if a.cprofile else None
    timelines: list[dict[str, float]] = []
    for i in range(a.repeats + 3):
        prefix = tokens(a.prefix_len)
        run_one(engine, prefix + tokens(a.suffix_len), None)  # the prefix is cached now
        hit = prefix + tokens(a.suffix_len)
        run_one(engine, hit, marks, profiler if i >= 3 else None)
        if i >= 3:  # the first ones warm up
            start = marks["start"]
            timelines.append({k: 1e3 * (v - start) for k, v in marks.items() if k != "start"})
    order = ["add", "schedule", "flatten", "forward", "launch", "step1", "collect", "token"]
    for t in timelines:
        t["after"] = t["token"] - t["collect"]
        t["critical"] = t["forward"] + t["after"]
    medians = {k: round(statistics.median(t[k] for t in timelines), 4) for k in order + ["after", "critical"]}
    print(f"{a.label}: prefix {a.prefix_len} + {a.suffix_len} new tokens, median of {len(timelines)} hits, ms from "
          f"add_request: " + ", ".join(f"{k} {medians[k]:.3f}" for k in order), flush=True)
    print(f"{a.label}: host on the critical path {medians['critical']:.3f} ms = before the first kernel (add -> "
          f"forward entered) {medians['forward']:.3f} + after the wait (collect -> token) {medians['after']:.3f}; "
          f"prefix-cache hit tokens {engine.block_manager.prefix_cache_hits}", flush=True)
    if profiler is not None:
        profiler.dump_stats(a.cprofile)
        pstats.Stats(a.cprofile, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    if a.json:
        Path(a.json).write_text(json.dumps({"label": a.label, "workload": vars(a), "median_ms": medians,
                                            "timelines_ms": timelines}, indent=1))


if __name__ == "__main__":
    main()
