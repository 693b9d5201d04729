"""Where a decode step's wall time goes: the GPU's part (a CUDA graph replayed alone) against the host's
phases (scheduling, input flattening and staging, launches, waiting for the tokens, post-processing),
and the garbage collector's pauses.

    python bench/host_phases.py --shape llama-3.1-8b --batch 512 --context 576 --steps 32 --json out.json
    python bench/host_phases.py --shape tiny-llama --batch 512 --context 32 --steps 32   # CPU: host phases

Measures, once `--batch` requests of `--context` random tokens decode (bench/decode_steps.py):
- `steps`: whole engine steps (`LLMEngine.step`, as bench/latency.py's `step_latency`): ms per step;
- `phases`: each step's host phases, timed by wrapping the engine's methods (ms per step, mean):
  `schedule` (Scheduler.schedule), `launch` (ModelRunner.launch; inside it `flatten`, `stage` (the graph's
  input staging), `replay` (CUDA graph launch, or the eager forward on the CPU), `draw` (logits, sampler
  launches, the ids' copy)), `collect` (ModelRunner.collect; `sync` its wait for the device),
  `update` (Scheduler.update: tokens appended, stops) and `post` (detokenization, outputs, stats);
  `other` is the step's wall time outside these;
- `gc`: the collections Python's cyclic garbage collector ran during the timed steps, by generation
  (count, total and longest ms);
- on a GPU, `replay`: the step's CUDA graph replayed `--steps` times back to back with no host work
  between (CUDA events: the GPU's time per step for the forward alone), and `replay_draw`: the same
  with the draw (LM head + argmax) after each replay.
If the steps' ms/step is near `replay_draw`, the GPU bounds the step; if it is near the host phases'
sum (schedule + launch + collect-minus-sync + update + post), the host does.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import logging
import random
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from decode_profile import grouped, kernel_times
from decode_steps import start_decoding
from model_dirs import SHAPES, make_model_dir

from flotilla.engine import model_runner as model_runner_module
from flotilla.engine.cuda_graphs import StepGraphs
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams

LAST_KEY: list[Any] = [None]  # the graph key the last step picked (`instrument`)


class PhaseClock:
    """Wall seconds spent in wrapped callables, summed per phase name since the last `reset`."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        """Replace `owner.name` by a timed wrapper that adds its duration to `phase`."""
        inner: Callable = getattr(owner, name)
        totals = self.totals

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                totals[phase] += time.perf_counter() - start

        setattr(owner, name, timed)

    def reset(self) -> dict[str, float]:
        """The totals so far (then zeroed)."""
        out = dict(self.totals)
        self.totals.clear()
        return out


class GcClock:
    """Durations of the cyclic garbage collector's runs, by generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, float]] = []
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.runs.append((info["generation"], time.perf_counter() - self._start))

    def summary(self) -> dict:
        """Per generation: collections, total ms, longest ms."""
        by_gen: dict[int, list[float]] = defaultdict(list)
        for gen, seconds in self.runs:
            by_gen[gen].append(seconds * 1e3)
        return {f"gen{g}": {"count": len(v), "total_ms": round(sum(v), 2), "max_ms": round(max(v), 2)}
                for g, v in sorted(by_gen.items())}


def instrument(engine: LLMEngine, clock: PhaseClock) -> None:
    """Time the engine's step phases (the runner must be in this process)."""
    runner = engine.runner
    clock.wrap(engine.scheduler, "schedule", "schedule")
    clock.wrap(engine.scheduler, "update", "update")
    clock.wrap(engine, "_post_process", "post")
    clock.wrap(runner, "launch", "launch")
    clock.wrap(runner, "collect", "collect")
    clock.wrap(runner, "_draw", "draw")
    clock.wrap(model_runner_module, "flatten", "flatten")
    if runner.graphs is not None:
        graphs, pick = runner.graphs, runner.graphs.pick

        def remembered_pick(*args: Any, **kwargs: Any) -> Any:
            LAST_KEY[0] = key = pick(*args, **kwargs)
            return key

        graphs.pick = remembered_pick  # type: ignore[method-assign]  # the bench's own probe
        clock.wrap(runner.graphs, "_stage", "stage")
        clock.wrap(runner.graphs, "run", "graph_run")
    clock.wrap(runner.model, "forward", "forward")  # eager forwards (the CPU; uncaptured graphs run eagerly)


def replay_alone(engine: LLMEngine, batch: int, steps: int) -> dict:
    """The last step's CUDA graph replayed `steps` times back to back (CUDA events), with and without the
    draw (LM head + greedy argmax) after each replay; then a few replays under torch.profiler, kernel time
    by group (bench/decode_profile.py's groups) at the real batch."""
    graphs = engine.runner.graphs
    assert graphs is not None and graphs._graphs, "needs captured graphs (a GPU, not --enforce-eager)"
    key = LAST_KEY[0]  # the graph the timed steps replayed
    assert key is not None and key.decode, f"the timed steps ran no decode graph ({key})"
    graph, out = graphs._graphs[key]
    model = engine.runner.model
    result: dict[str, Any] = {"graph_tokens": key.tokens, "graph_width_blocks": key.width}

    def once(draw: bool) -> None:
        graph.replay()
        if draw:
            with torch.inference_mode():
                model.compute_logits(out[:batch]).argmax(dim=-1)

    for label, draw in (("replay", False), ("replay_draw", True)):
        for _ in range(3):  # warm
            once(draw)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            once(draw)
        end.record()
        end.synchronize()
        result[f"{label}_ms"] = start.elapsed_time(end) / steps
    try:  # the kernel split is an extra: the timings above stand without it
        profiled = 4
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(profiled):
                once(True)
            torch.cuda.synchronize()
        kernels = kernel_times(prof)
        groups = {g: us / profiled for g, us in grouped(kernels).items()}
        result["profile_busy_us"] = round(sum(v[0] for v in kernels.values()) / profiled, 1)
        result["profile_groups_us"] = {g: round(us, 1) for g, us in sorted(groups.items(), key=lambda kv: -kv[1])}
        top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:12]
        result["profile_top"] = [[name[:90], round(us / profiled, 1), n / profiled] for name, (us, n) in top]
    except Exception as exc:
        result["profile_error"] = repr(exc)[:300]
    return result


def profile_mixed(engine: LLMEngine, batch: int, context: int, rng: random.Random, warm: int = 2,
                  steps: int = 3) -> dict:
    """Kernel time by group of `steps` eager prompt-chunk steps (mixed with the decode rows of prompts done
    before) of `batch` new requests of `context` tokens, after `warm` steps: where a ~16k-token step's GPU time
    goes, and the GEMMs' FLOP rate. Run after the decode timings (the profiler is left out of those)."""
    vocab = engine.config.model.hf_config["vocab_size"]
    params = SamplingParams(temperature=0.0, max_tokens=warm + steps + 8, ignore_eos=True, output_kind="final_only")
    reqs = [engine.add_request([rng.randrange(100, vocab) for _ in range(context)], params) for _ in range(batch)]
    for _ in range(warm):
        engine.step()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()  # the step in flight finishes outside the profile: only the next `steps` count
    fed = engine.runner.num_tokens_fed
    start = time.perf_counter()
    kinds = torch.profiler.ProfilerActivity
    activity = kinds.CUDA if torch.cuda.is_available() else kinds.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(steps):
            engine.step()
        sync()
    wall = time.perf_counter() - start
    tokens = engine.runner.num_tokens_fed - fed
    kernels = kernel_times(prof)  # CUDA kernels only: none on the CPU
    groups = {g: us / 1e3 / steps for g, us in grouped(kernels).items()}
    launches = sum(n for _, n in kernels.values())
    cfg = engine.config.model.hf_config
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    n_params = layers * (h * (heads + 2 * kv) * d + heads * d * h + 3 * h * inter)  # the LM head sees few rows
    gemm_ms = groups.get("gemm", 0.0)
    engine.abort([r.request_id for r in reqs])
    while engine.has_unfinished_requests():
        engine.step()
    return {"steps": steps, "tokens_per_step": tokens / steps, "wall_ms_per_step": round(1e3 * wall / steps, 2),
            "busy_ms_per_step": round(sum(groups.values()), 2), "launches_per_step": launches / steps,
            "groups_ms_per_step": {g: round(v, 2) for g, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            "gemm_tflops": round(2 * n_params * tokens / steps / (gemm_ms / 1e3) / 1e12, 1) if gemm_ms else None}


def measure(engine: LLMEngine, batch: int, context: int, steps: int, rng: random.Random, clock: PhaseClock,
            gc_clock: GcClock, output_kind: str = "final_only", profile: str | None = None,
            report: Callable[[dict], None] | None = None) -> dict:
    """Decode `batch` x `context` for `steps` timed steps: ms/step and the host phases per step, handed to
    `report` before the GPU's replay-alone timings (which `report` gets again with them)."""
    vocab = engine.config.model.hf_config["vocab_size"]
    # Enough tokens for the prefill steps (early requests decode meanwhile) and the timed steps: none may
    # finish before the end (bench/decode_profile.py's steps + 16 let early ones finish at large batches).
    prefill_steps = -(-batch * context // engine.config.scheduler.max_num_batched_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=steps + prefill_steps + 64, ignore_eos=True,
                            output_kind=output_kind)
    reqs = [engine.add_request([rng.randrange(100, vocab) for _ in range(context)], params) for _ in range(batch)]
    start_decoding(engine, reqs)
    clock.reset()
    gc_clock.runs.clear()
    times, syncs = [], []
    profiler = cProfile.Profile() if profile else None
    for _ in range(steps):
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        engine.step()
        if profiler is not None:
            profiler.disable()
        times.append(time.perf_counter() - start)
        syncs.append(engine.runner.last_step.sync_s)
    if profiler is not None and profile is not None:
        profiler.dump_stats(profile)
    phases = {k: round(1e3 * v / steps, 3) for k, v in clock.reset().items()}
    phases["sync"] = round(1e3 * statistics.fmean(syncs), 3)
    ms = 1e3 * statistics.fmean(times)
    outside = ms - sum(phases.get(k, 0.0) for k in ("schedule", "launch", "collect", "update", "post"))
    phases["other"] = round(outside, 3)
    host = ms - phases["sync"]
    running = sum(1 for r in reqs if not r.status.finished)
    out = {"batch": batch, "context": context, "steps": steps, "running_at_end": running,
           "ms_per_step": round(ms, 3), "ms_per_step_median": round(1e3 * statistics.median(times), 3),
           "host_ms_per_step": round(host, 3), "phases_ms": phases, "gc": gc_clock.summary()}
    if report is not None:
        report(out)
    if torch.cuda.is_available() and engine.runner.graphs is not None and engine.runner.graphs._graphs:
        out.update(replay_alone(engine, batch, steps))
        if report is not None:
            report(out)
    engine.abort([r.request_id for r in reqs])
    while engine.has_unfinished_requests():
        engine.step()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, nargs="+", default=[512])
    p.add_argument("--context", type=int, default=576)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--label", default="host")
    p.add_argument("--output-kind", default="final_only", choices=("final_only", "cumulative"),
                   help="final_only: as the offline LLM.generate; cumulative: as streaming and bench/latency.py")
    p.add_argument("--cprofile", default=None, help="cProfile the timed steps into this file")
    p.add_argument("--cpu-graphs", action="store_true", help="CPU: stage through uncaptured StepGraphs")
    p.add_argument("--mixed-profile", action=argparse.BooleanOptionalAction, default=None,
                   help="after the decode figures, profile eager prompt-chunk steps (default: on a GPU)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.mixed_profile is None:
        a.mixed_profile = torch.cuda.is_available()
    logging.basicConfig(level=logging.WARNING)
    model_dir = make_model_dir(a.shape, tempfile.mkdtemp(prefix=a.shape))
    engine = LLMEngine.from_kwargs(
        str(model_dir), load_format="dummy", max_model_len=a.context + 2 * a.steps + 256, max_num_seqs=max(a.batch),
        max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=False,
    )  # fmt: skip
    if a.cpu_graphs and engine.runner.graphs is None:
        # The graph path's staging on the CPU: uncaptured graphs run the model eagerly on padded buffers.
        sched, runner = engine.config.scheduler, engine.runner
        runner.graphs = StepGraphs(runner.model, sched.max_num_seqs, sched.max_num_batched_tokens,
                                   engine.config.model.max_model_len, runner.block_size, runner.device)
    clock, gc_clock = PhaseClock(), GcClock()
    instrument(engine, clock)
    rng = random.Random(0)
    results: list[dict] = []
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"

    def report(r: dict) -> None:  # printed and saved as soon as measured: a run cut short keeps its figures
        extra = "".join(f", {k} {r[k]:.3f} ms" for k in ("replay_ms", "replay_draw_ms") if k in r)
        print(f"{a.label}: batch {r['batch']} ctx {a.context}: step {r['ms_per_step']:.3f} ms "
              f"(host {r['host_ms_per_step']:.3f}{extra}); phases "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["phases_ms"].items()) + f"; gc {r['gc']}", flush=True)
        if "profile_groups_us" in r:
            print(f"{a.label}: replay kernel profile (us per step, busy {r['profile_busy_us']}): "
                  f"{r['profile_groups_us']}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"label": a.label, "shape": a.shape, "device": device,
                           "results": [x for x in results if x is not r] + [r]}, f, indent=1)

    for batch in a.batch:
        results.append(measure(engine, batch, a.context, a.steps, rng, clock, gc_clock, a.output_kind, a.cprofile,
                               report))
    if a.mixed_profile:
        try:  # an extra: the figures above are saved already
            mixed = profile_mixed(engine, max(a.batch), a.context, rng)
        except Exception as exc:
            mixed = {"error": repr(exc)[:300]}
        print(f"{a.label}: mixed-step kernel profile: {mixed}", flush=True)
        results[-1]["mixed_profile"] = mixed
        report(results.pop())

if __name__ == "__main__":
    main()
