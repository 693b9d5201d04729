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

Per phase (ms, median over the hits; inclusive times of the functions named, the stub forward and the LM head
left out of `launch`): in `add_request`, `prompt` (ids copied, truncated, length-checked), `check_ids` (the prompt's
block hashes, the cache look-up they serve, the vocabulary check of the ids after the cached blocks), `admit`
(detokenizer, queued); then `schedule` (of it `lookup`: the prefix look-up, `allocate`: the blocks), `flatten`,
`stage` (the graph's padded buffers written and copied), `draw` (argmax and the ids' copy, without the LM head:
`logits`, the tiny model's on the CPU),
and after the wait `collect`, `update` (tokens in), `post` (detokenization, outputs). `--clock cpu` times the
thread's CPU time (robust to other processes on a shared machine); `--trees A B` runs each source tree in a
subprocess of its own, rounds interleaved (bench/host_step.py's layout), and prints each tree's median round.
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
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from model_dirs import make_model_dir

from flotilla.engine import model_runner as model_runner_module
from flotilla.engine.cuda_graphs import StepGraphs
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams

_CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
_clock = time.perf_counter  # --clock
# (owner attribute path, function, phase) of the per-phase times, each inclusive of what it calls
PHASES = ("prompt", "check_ids", "admit", "add", "schedule", "lookup", "allocate", "flatten", "stage", "draw",
          "logits", "collect", "update", "post")


class StubForward(torch.nn.Module):
    """Zeros of the model's width for every input row; notes when it was entered."""

    def __init__(self, hidden: int, marks: dict[str, float]) -> None:
        super().__init__()
        self.hidden, self.marks = hidden, marks

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first-kernel moment of a replay, then zeros."""
        self.marks.setdefault("forward", _clock())
        return torch.zeros(ids.shape[0], self.hidden)


def mark_after(owner: Any, name: str, label: str, marks: dict[str, float], at_start: bool = False) -> None:
    """Wrap `owner.name` so that its return time (its start time with `at_start`) is noted as `label` (first call
    only per request)."""
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        if at_start:
            marks.setdefault(label, _clock())
        try:
            return inner(*args, **kwargs)
        finally:
            marks.setdefault(label, _clock())

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
        marks["start"] = _clock()
    if profiler is not None:
        profiler.enable()
    engine.add_request(prompt, params)
    if marks is not None:
        marks["add"] = _clock()
    first = True
    while engine.has_unfinished_requests():
        outputs = engine.step()
        if first and profiler is not None:
            profiler.disable()
        if first and marks is not None:
            marks["step1"] = _clock()
        first = False
        if outputs and marks is not None:
            marks.setdefault("token", _clock())


def time_phases(engine: LLMEngine, totals: dict[str, float]) -> None:
    """Wrap the functions of each phase so that their (inclusive) times add up in `totals`."""
    from flotilla.engine.block_manager import BlockManager

    runner, scheduler = engine.runner, engine.scheduler
    assert runner.graphs is not None
    wraps = [(engine, "add_request", "add"), (engine, "_prompt_tokens", "prompt"),
             (engine, "_check_prompt_ids", "check_ids"), (engine, "_admit", "admit"),
             (scheduler, "schedule", "schedule"), (BlockManager, "find_cached_prefix", "lookup"),
             (BlockManager, "allocate", "allocate"), (model_runner_module, "flatten", "flatten"),
             (runner.graphs, "_stage", "stage"), (runner, "_draw", "draw"),
             (runner.model, "compute_logits", "logits"), (runner, "collect", "collect"),
             (scheduler, "update", "update"), (engine, "_post_process", "post")]  # fmt: skip
    for owner, name, phase in wraps:
        inner = getattr(owner, name)

        def timed(*args: Any, _inner: Any = inner, _phase: str = phase, **kwargs: Any) -> Any:
            start = _clock()
            try:
                return _inner(*args, **kwargs)
            finally:
                totals[_phase] += _clock() - start

        setattr(owner, name, timed)


def run_hits(a: argparse.Namespace) -> dict[str, Any]:
    """This process's tree: the hits' timelines and per-phase times (ms), their medians."""
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="prefix-host") as folder:
        engine = build_engine(a.prefix_len, a.suffix_len, a.block_size, folder)
    marks: dict[str, float] = {}
    totals: dict[str, float] = defaultdict(float)
    runner = engine.runner
    assert runner.graphs is not None
    runner.graphs.model = StubForward(engine.config.model.hf_config["hidden_size"], marks)
    if a.phases:
        time_phases(engine, totals)
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
    phases: list[dict[str, float]] = []
    for i in range(a.repeats + 3):
        prefix = tokens(a.prefix_len)
        run_one(engine, prefix + tokens(a.suffix_len), None)  # the prefix is cached now
        hit = prefix + tokens(a.suffix_len)
        totals.clear()
        run_one(engine, hit, marks, profiler if i >= 3 else None)
        if i >= 3:  # the first ones warm up
            start = marks["start"]
            timelines.append({k: 1e3 * (v - start) for k, v in marks.items() if k != "start"})
            totals["draw"] -= totals["logits"]  # the LM head: a GEMM's launch on a GPU, not the host's Python
            phases.append({k: 1e3 * totals[k] for k in PHASES})
    order = ["add", "schedule", "flatten", "forward", "launch", "step1", "collect", "token"]
    for t in timelines:
        t["after"] = t["token"] - t["collect"]
        t["critical"] = t["forward"] + t["after"]
    medians = {k: round(statistics.median(t[k] for t in timelines), 4) for k in order + ["after", "critical"]}
    result: dict[str, Any] = {"median_ms": medians, "timelines_ms": timelines,
                              "hit_tokens": engine.block_manager.prefix_cache_hits}
    if a.phases:
        result["phases_ms"] = {k: round(statistics.median(p[k] for p in phases), 4) for k in PHASES}
    if profiler is not None:
        profiler.dump_stats(a.cprofile)
        pstats.Stats(a.cprofile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return result


def report(label: str, a: argparse.Namespace, result: dict[str, Any]) -> None:
    """Print one tree's medians."""
    medians = result["median_ms"]
    order = ["add", "schedule", "flatten", "forward", "launch", "step1", "collect", "token"]
    print(f"{label}: prefix {a.prefix_len} + {a.suffix_len} new tokens, median of {a.repeats} hits, ms ({a.clock}) "
          f"from add_request: " + ", ".join(f"{k} {medians[k]:.3f}" for k in order), flush=True)
    print(f"{label}: host on the critical path {medians['critical']:.3f} ms = before the first kernel (add -> "
          f"forward entered) {medians['forward']:.3f} + after the wait (collect -> token) {medians['after']:.3f}",
          flush=True)
    if "phases_ms" in result:
        print(f"{label}: phases (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in result["phases_ms"].items()),
              flush=True)


def compare(a: argparse.Namespace) -> None:
    """Each tree in its own subprocess, rounds interleaved; the median round per tree."""
    from host_step import tree_rounds

    args = ["--prefix-len", str(a.prefix_len), "--suffix-len", str(a.suffix_len), "--block-size", str(a.block_size),
            "--repeats", str(a.repeats), "--clock", a.clock, *(["--phases"] if a.phases else [])]  # fmt: skip
    rounds = tree_rounds(__file__, a.trees, args, a.rounds, lambda x: f"critical {x['median_ms']['critical']:.3f} ms")
    for rs in rounds.values():
        for result in rs:
            result.pop("timelines_ms")
    summary = {}
    for tree, rs in rounds.items():
        summary[str(tree)] = {part: {k: round(statistics.median(x[part][k] for x in rs), 4) for k in rs[0][part]}
                              for part in ("median_ms", "phases_ms") if part in rs[0]}
        report(str(tree), a, summary[str(tree)])
    if a.json:
        Path(a.json).write_text(json.dumps({"workload": vars(a), "rounds": {str(t): v for t, v in rounds.items()},
                                            "median": summary}, indent=1))


def main() -> None:
    """Time the hits, print the medians (and save them as JSON with --json)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefix-len", type=int, default=2000)
    p.add_argument("--suffix-len", type=int, default=20)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--label", default="host")
    p.add_argument("--phases", action="store_true", help="per-phase times too (wrappers add ~1 us a call)")
    p.add_argument("--clock", default="wall", choices=sorted(_CLOCKS))
    p.add_argument("--trees", nargs="*", default=None, help="source trees to compare, each in a subprocess")
    p.add_argument("--rounds", type=int, default=3, help="with --trees: rounds per tree, interleaved")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a subprocess of --trees: JSON out
    p.add_argument("--cprofile", default=None, help="profile add_request + the first step of every hit")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    global _clock
    _clock = _CLOCKS[a.clock]
    if a.trees:
        compare(a)
        return
    result = run_hits(a)
    if a.one:
        print(json.dumps(result), flush=True)
        return
    report(a.label, a, result)
    print(f"{a.label}: prefix-cache hit tokens {result['hit_tokens']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"label": a.label, "workload": vars(a), **result}, indent=1))


if __name__ == "__main__":
    main()
