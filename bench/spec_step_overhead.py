"""Where a speculating step's time goes against a plain decode step, phase by phase, batch 1.

    # CPU, tiny random Llama (the forward is cheap, so the host's work shows):
    python bench/spec_step_overhead.py --json out.json
    # GPU, Llama-3.1-8B shape (bench/model_dirs.py), random bf16 weights:
    python bench/spec_step_overhead.py --model /tmp/llama8b --load-format dummy --device cuda

One engine, one request at a time (batch 1), greedy with ignore_eos, `--k` draft slots. The modes
are bench/spec_decode.py's: `none` (no speculation), `oracle-wrong` (every draft rejected) and
`oracle-right` (every draft accepted through the benchmark-only hook). Each mode first runs an untimed
request, then `--requests` timed ones; the timed window of a request starts at its first token (the
prefill is left out). Every phase is timed by wrapping the engine's own methods (inclusive times on
the clock below, summed over the window, divided by the steps launched in it):

- schedule: `Scheduler.schedule` (the plan, block allocation); propose: `Speculator.propose`;
- launch: `ModelRunner.launch` (flatten, decode-row layout, staging, the forward or the graph replay,
  the draw and its copy to the host); inside launch: stage (the inputs into the graphs' buffers),
  forward (the model's compute; real on the CPU and left out of host time there, not called when a
  GPU replays a graph), draw (logits, argmax, the ids' copy: queued behind the forward on a GPU)
  and logits inside it (compute on the CPU, left out of host time there);
- wait: the host blocked on the step's drawn ids (`collect`'s event; 0 on the CPU);
- collect: `ModelRunner.collect` without the wait (ids to a list, judging the drafts);
- update: `Scheduler.update` (tokens in, roll-back of rejected drafts' blocks);
- post: the step's post-processing after the update (detokenization, stop strings, outputs, stats:
  `LLMEngine._post_process`, or `_finish_step` less the update in engines before it);
- step: the whole `engine.step()` calls; host = step - wait (- forward - logits on the CPU);
- idle: the host's work while the device has nothing queued: from a step's ids being in (the end
  of `collect`'s wait) to the next step's inputs being staged (the end of `StepGraphs._stage`, right
  before its forward or graph replay), counted when no other step was in flight meanwhile. A step
  whose successor cannot be planned before its tokens are in (speculation) pays it every step;
  asynchronous plain decode stages the next step before collecting, so its idle time is ~0.

Phases are timed on this thread's CPU time by default on the CPU (`--clock cpu`; with
OMP_NUM_THREADS=1 the forward runs on this thread too), so that time spent waiting for a core on a
loaded machine drops out; on the GPU on wall time. tok/s is always wall time.

On the CPU an uncaptured `StepGraphs` is attached (as the GPU tests do), so inputs go through the
GPU's staging path (persistent buffers, decode graph sizes) rather than the eager tensor path.
`--profile N` prints cProfile's top N functions of each mode's timed window. `--kernel-profile` (GPU)
runs one more request per mode (up to 40 tokens) after the timed ones, its decode steps under
torch.profiler, and reports the device time per launched step by kernel (`kernels_us_per_step`, the
largest first) and in all (`gpu_busy_us_per_step`): where a verification pass's extra device time goes
against a decode step's.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from model_dirs import make_model_dir
from spec_decode import OracleProposer, force_acceptance

from flotilla.engine.cuda_graphs import StepGraphs
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.model_runner import LaunchedStep, ModelRunner
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.spec_decode.config import SpeculativeConfig
from flotilla.engine.spec_decode.speculator import Speculator

PHASES = ("step", "schedule", "propose", "launch", "stage", "forward", "draw", "logits", "wait", "collect", "update",
          "post", "idle")


class PhaseTimer:
    """Inclusive time per phase name on `clock`, and how many steps were launched."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self.launches = 0
        self.in_flight = 0  # steps launched and not collected
        self.ids_in: float | None = None  # when the last collected step's ids were in, if none is in flight

    def reset(self) -> None:
        """Forget everything measured so far."""
        self.seconds.clear()
        self.launches = 0
        self.ids_in = None

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        """Replace `owner.name` (an instance attribute) by a timed call of the original."""
        real = getattr(owner, name)
        seconds, clock = self.seconds, self.clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return real(*args, **kwargs)
            finally:
                seconds[phase] += clock() - start

        setattr(owner, name, timed)


def instrument(engine: LLMEngine, timer: PhaseTimer) -> None:
    """Time the engine's phases (see the module docstring)."""
    runner = engine.runner
    assert isinstance(runner, ModelRunner), "batch-1 benchmark: one process, no tp/pp workers"
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(engine.scheduler, "update", "update")
    # Post-processing (detokenization, stop strings, outputs, stats): its own method since the
    # speculating steps overlap it with the device; before that, `_finish_step` less the update.
    timer.wrap(engine, "_post_process" if hasattr(engine, "_post_process") else "_finish_step", "post")
    timer.wrap(runner.model, "forward", "forward")
    timer.wrap(runner.model, "compute_logits", "logits")
    timer.wrap(runner, "_draw", "draw")
    assert runner.graphs is not None, "the idle phase ends at the graphs' staging (CUDA graphs, or uncaptured ones)"
    timer.wrap(runner.graphs, "_stage", "stage")
    graphs, clock = runner.graphs, timer.clock
    real_launch, real_collect, real_stage = runner.launch, runner.collect, graphs._stage

    def stage(*args: Any, **kwargs: Any) -> None:
        real_stage(*args, **kwargs)
        if timer.in_flight == 0 and timer.ids_in is not None:  # the device had nothing to do meanwhile
            timer.seconds["idle"] += clock() - timer.ids_in
        timer.ids_in = None

    def launch(plan: Any) -> LaunchedStep:
        start = clock()
        step = real_launch(plan)
        timer.seconds["launch"] += clock() - start
        timer.launches += 1
        timer.in_flight += 1
        return step

    def collect(step: LaunchedStep) -> Any:
        start = clock()
        if step.copied is not None:
            step.copied.synchronize()  # the wait, apart; collect's own synchronize then returns at once
        waited = clock()
        timer.seconds["wait"] += waited - start
        timer.in_flight -= 1
        timer.ids_in = waited if timer.in_flight == 0 else None
        try:
            return real_collect(step)
        finally:
            timer.seconds["collect"] += clock() - waited

    graphs._stage = stage  # type: ignore[method-assign]
    runner.launch, runner.collect = launch, collect  # type: ignore[method-assign]


def speculator(mode: str, k: int, reference: dict[str, list[int]], vocab_size: int) -> Speculator | None:
    """The engine's speculator for `mode` (None: no speculation), its proposal timed as `propose`."""
    if mode == "none":
        return None
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k)
    return Speculator(spec, OracleProposer(reference, mode == "oracle-right", vocab_size))


def run_request(engine: LLMEngine, prompt: list[int], params: SamplingParams, rid: str, timer: PhaseTimer,
                profiler: cProfile.Profile | None) -> tuple[list[int], float]:
    """Run one request to its end; the phases and the wall time count from its first token on."""
    engine.add_request(prompt, params, rid)
    started: float | None = None
    tokens: list[int] = []
    step: Callable[[], list] = engine.step
    while engine.has_unfinished_requests():
        t0 = timer.clock()
        outs = step()
        timer.seconds["step"] += timer.clock() - t0
        for out in outs:
            tokens = list(out.outputs[0].token_ids)
        if started is None and tokens:
            timer.reset()  # the window starts once the prefill's token is out
            started = time.perf_counter()
            if profiler is not None:
                profiler.enable()
    if profiler is not None:
        profiler.disable()
    return tokens, time.perf_counter() - (started or time.perf_counter())


def measure(engine: LLMEngine, mode: str, a: argparse.Namespace, prompts: list[list[int]],
            reference: dict[str, list[int]], timer: PhaseTimer) -> tuple[dict, dict[str, list[int]]]:
    """One mode's per-step phase times (ms) over its timed requests, and its outputs by request id."""
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
    profiler = cProfile.Profile() if a.profile else None
    sums: dict[str, float] = defaultdict(float)
    launches, wall, out_tokens = 0, 0.0, 0
    outputs: dict[str, list[int]] = {}
    with force_acceptance(mode == "oracle-right"):
        for i, prompt in enumerate(prompts):
            engine.speculator = speculator(mode, a.k, reference, engine.vocab_size)
            if engine.speculator is not None:
                timer.wrap(engine.speculator, "propose", "propose")
            tokens, seconds = run_request(engine, prompt, params, str(i), timer, profiler if i else None)
            outputs[str(i)] = tokens
            if i == 0:  # untimed warm-up request
                continue
            for phase, s in timer.seconds.items():
                sums[phase] += s
            launches += timer.launches
            wall += seconds
            out_tokens += len(tokens) - 1
        if a.kernel_profile:
            kernels = kernel_profile(engine, prompts[0], min(a.max_tokens, 40), timer)
    if not hasattr(engine, "_post_process"):
        sums["post"] -= sums["update"]
    ms = {p: round(1e3 * sums.get(p, 0.0) / max(launches, 1), 4) for p in PHASES}
    host = sums["step"] - sums["wait"]
    if a.device == "cpu":  # the forward and the logits are the CPU's compute, not host overhead
        host -= sums["forward"] + sums["logits"]
    row = {"steps": launches, "output_tokens": out_tokens, "tokens_per_step": round(out_tokens / max(launches, 1), 3),
           "tok_per_s": round(out_tokens / max(wall, 1e-9), 2), "phase_ms_per_step": ms,
           "host_ms_per_step": round(1e3 * host / max(launches, 1), 4),
           "idle_host_ms_per_step": round(1e3 * sums["idle"] / max(launches, 1), 4)}
    if a.kernel_profile:
        row |= kernels
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(a.profile)
        print(f"--- profile: {mode} ---\n{text.getvalue()}", file=sys.stderr)
    return row, outputs


def kernel_profile(engine: LLMEngine, prompt: list[int], max_tokens: int, timer: PhaseTimer) -> dict:
    """One more request, its decode steps under torch.profiler (device activity): kernel time per launched
    step. It reruns request "0" (the oracles look their drafts up by request id); its prefill runs before
    the profile starts, and `max_tokens` stays small (the profiler's events cost host time to read)."""
    import torch
    from decode_profile import kernel_times

    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True), "0")
    while engine.has_unfinished_requests() and not engine.step():
        pass  # up to the prefill's token
    timer.reset()
    activity = torch.profiler.ProfilerActivity
    # On a CPU the profile runs (so the option is checked there) and finds no device kernels.
    with torch.profiler.profile(activities=[activity.CUDA if torch.cuda.is_available() else activity.CPU]) as prof:
        while engine.has_unfinished_requests():
            engine.step()
    steps = max(timer.launches, 1)
    totals: dict[str, float] = defaultdict(float)  # by the name's first 100 characters, as reported
    for name, (us, _) in kernel_times(prof).items():
        totals[name[:100]] += us
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:20]
    return {"kernel_profile_steps": timer.launches, "gpu_busy_us_per_step": round(sum(totals.values()) / steps, 1),
            "kernels_us_per_step": {name: round(us / steps, 1) for name, us in top}}


def build_engine(a: argparse.Namespace, model_dir: str) -> LLMEngine:
    """The engine with speculation configured (k slots), async scheduling as asked."""
    spec = {"method": "ngram", "num_speculative_tokens": a.k}
    engine = LLMEngine.from_kwargs(
        model_dir, device=a.device, load_format=a.load_format, dtype=a.dtype, max_model_len=a.max_model_len,
        max_num_seqs=1, speculative_config=spec, async_scheduling=a.async_scheduling,
    )
    runner = engine.runner
    if a.device == "cpu" and isinstance(runner, ModelRunner) and runner.graphs is None:
        cfg = engine.config.scheduler
        runner.graphs = StepGraphs(runner.model, 1, cfg.max_num_batched_tokens, a.max_model_len,
                                   engine.config.cache.block_size, runner.device, max_decode_rows=1 + a.k)
    return engine


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF directory (default: bench/model_dirs.py's tiny-llama)")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--modes", default="none,oracle-wrong,oracle-right")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--requests", type=int, default=3, help="timed requests per mode (after one untimed)")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false")
    p.add_argument("--clock", choices=["cpu", "wall"], default=None,
                   help="phase clock: this thread's CPU time (default on the CPU: a loaded machine's waits for a "
                        "core drop out) or wall time (default on the GPU, where the host waits for the device)")
    p.add_argument("--profile", type=int, default=0, metavar="N")
    p.add_argument("--kernel-profile", action="store_true", help="device time by kernel per step (GPU)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    a.clock = a.clock or ("cpu" if a.device == "cpu" else "wall")
    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = a.model or str(make_model_dir("tiny-llama", Path(tmp) / "tiny-llama", weights_seed=0))
        engine = build_engine(a, model_dir)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, engine.vocab_size) for _ in range(a.input_len)] for _ in range(a.requests + 1)]
    timer = PhaseTimer(time.thread_time if a.clock == "cpu" else time.perf_counter)
    instrument(engine, timer)
    results: dict[str, dict] = {}
    reference: dict[str, list[int]] = {}
    for mode in a.modes.split(","):
        row, outputs = measure(engine, mode, a, prompts, reference, timer)
        if mode == "none":
            reference = outputs
        elif mode == "oracle-wrong":
            row["same_tokens_as_none"] = outputs == reference
        results[mode] = row
        print(mode, json.dumps(row), file=sys.stderr, flush=True)
    base = results.get("none")
    for row in results.values():
        if base:
            row["host_ms_more_than_none"] = round(row["host_ms_per_step"] - base["host_ms_per_step"], 4)
            row["idle_host_ms_more_than_none"] = round(row["idle_host_ms_per_step"] - base["idle_host_ms_per_step"], 4)
    report = {"command": "python bench/spec_step_overhead.py " + " ".join(sys.argv[1:]),
              "load_average": os.getloadavg(), "args": vars(a), "results": results}
    print(json.dumps(report, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
