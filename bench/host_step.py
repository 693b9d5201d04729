"""Host milliseconds per decode step at a large batch, on the CPU, by phase: the engine core's part of serving
(and of the offline engine) with the model's compute taken out, for one source tree or several side by side.

    python bench/host_step.py --batch 512 --steps 24 --rounds 3                 # this tree
    python bench/host_step.py --trees /tmp/base /work/wt-x --rounds 5           # A/B: each tree's own code

A tiny random Llama (bench/model_dirs.py's `tiny-llama`) decodes `--batch` greedy requests of `--context`
random tokens (ignore_eos, as bench/throughput.py and bench/serve.py send them) with asynchronous scheduling
and the CUDA-graph path's staging (uncaptured `StepGraphs`: the padded buffers, run eagerly), as on a GPU.
Once every prompt is in, `--steps` decode steps are timed, each as the serving core's `EngineCore._step`
runs it: `LLMEngine.step()`, the outputs encoded as deltas (`OutputEncoder`) and the message pickled (what
the core's sender thread writes to the API process). The model's forward and LM head are timed apart and
left out: on a GPU they are a graph replay and a GEMM's launch, not the Python this measures.

Per step (ms, median of the steps): `schedule`, `flatten`, `stage`, `draw` (the rows' logits picked, argmax,
sampling batch; without the LM head), `collect`, `update` (tokens appended, stops), `post`
(detokenization, outputs), `encode`, `pickle`; `host`: the whole step minus forward and LM head. Then the
API process's side of the same message, `api`: unpickled (`api_loads`), each request's cumulative output
rebuilt (`OutputDecoder`) and its /v1/completions SSE chunk formatted (`ChunkFormat.completion`).

`--output-kind cumulative` (default) is a streaming server's step, `final_only` the offline `LLM`'s. Each
tree runs in a subprocess of its own that imports that tree's `flotilla` (a /tmp layout as
bench/results/gpu-env.sh makes: flotilla/*.py copied, engine/ and kernels/ linked; never PYTHONPATH=the
tree), rounds interleaved so that load drift on a shared machine falls on every tree alike; the median of
the rounds' figures is printed per tree. Times are the thread's CPU time unless `--clock wall`: on a
machine shared with other work, the wall clock also counts the waits for a core.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

_CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
_clock = time.thread_time  # --clock: this thread's CPU seconds by default (robust to a loaded shared machine)
PHASES = ("schedule", "flatten", "stage", "draw", "collect", "update", "post", "encode", "pickle")


def _timed(owner: Any, name: str, totals: dict[str, float], phase: str) -> None:
    """Replace `owner.name` by a wrapper that adds its wall seconds to `totals[phase]`."""
    inner: Callable = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = _clock()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[phase] += _clock() - start

    setattr(owner, name, timed)


def _build(batch: int, context: int, steps: int) -> Any:
    import torch
    from model_dirs import make_model_dir

    from flotilla.engine.cuda_graphs import StepGraphs
    from flotilla.engine.llm_engine import LLMEngine

    torch.set_num_threads(1)
    model_dir = make_model_dir("tiny-llama", tempfile.mkdtemp(prefix="host-step-"))
    engine = LLMEngine.from_kwargs(
        str(model_dir), load_format="dummy", max_model_len=context + steps + 256, max_num_seqs=batch,
        max_num_batched_tokens=max(8192, batch), enable_prefix_caching=False, async_scheduling=True,
    )  # fmt: skip
    sched, runner = engine.config.scheduler, engine.runner
    if runner.graphs is None:  # the graph path's staging on the CPU: uncaptured graphs run eagerly
        runner.graphs = StepGraphs(runner.model, sched.max_num_seqs, sched.max_num_batched_tokens,
                                   engine.config.model.max_model_len, runner.block_size, runner.device)
    return engine


def _instrument(engine: Any, totals: dict[str, float]) -> None:
    from flotilla.engine import model_runner

    runner = engine.runner
    _timed(engine.scheduler, "schedule", totals, "schedule")
    _timed(engine.scheduler, "update", totals, "update")
    _timed(engine, "_post_process", totals, "post")
    _timed(model_runner, "flatten", totals, "flatten")
    _timed(runner.graphs, "_stage", totals, "stage")
    _timed(runner, "_draw", totals, "draw")
    _timed(runner, "collect", totals, "collect")
    _timed(runner.model, "forward", totals, "forward")
    _timed(runner.model, "compute_logits", totals, "logits")  # the LM head: a GPU GEMM's launch, not Python


def run_tree(a: argparse.Namespace) -> dict[str, Any]:
    """This process's tree: per-phase medians over `a.steps` timed decode steps (one round)."""
    from flotilla.engine.output_delta import OutputDecoder, OutputEncoder
    from flotilla.engine.sampling_params import SamplingParams
    from flotilla.engine.server.sse import ChunkFormat

    logging.basicConfig(level=logging.WARNING)
    engine = _build(a.batch, a.context, a.steps)
    totals: dict[str, float] = defaultdict(float)
    _instrument(engine, totals)
    rng = random.Random(0)
    vocab = engine.config.model.hf_config["vocab_size"]
    params = SamplingParams(temperature=0.0, max_tokens=a.steps + 64, ignore_eos=True, output_kind=a.output_kind)
    reqs = [engine.add_request([rng.randrange(100, vocab) for _ in range(a.context)], params)
            for _ in range(a.batch)]  # fmt: skip
    while engine.scheduler.waiting or any(r.num_output_tokens == 0 for r in reqs):
        engine.step()
    encoder = OutputEncoder()
    decoders: dict[str, OutputDecoder] = defaultdict(OutputDecoder)
    fmt = ChunkFormat("cmpl-bench", "text_completion", 0, "bench")
    for _ in range(4):  # settle, and give every request's first (head) delta out of the timed steps
        for delta in [encoder.encode(o) for o in engine.step()]:
            decoders[delta[0]].decode(delta)
    per_step: dict[str, list[float]] = defaultdict(list)
    profiler = cProfile.Profile() if a.cprofile else None
    if profiler is not None:
        profiler.enable()
    for _ in range(a.steps):
        totals.clear()
        start = _clock()
        outputs = engine.step()
        t = _clock()
        deltas = [encoder.encode(o) for o in outputs]
        totals["encode"] += _clock() - t
        t = _clock()
        data = pickle.dumps([("step", deltas, [], engine.stats_snapshot())], protocol=pickle.HIGHEST_PROTOCOL)
        totals["pickle"] += _clock() - t
        whole = _clock() - start
        totals["draw"] -= totals["logits"]
        per_step["host"].append(whole - totals["forward"] - totals["logits"])
        for phase in PHASES:
            per_step[phase].append(totals[phase])
        t = _clock()  # the API process's side of the message
        batch = pickle.loads(data)
        per_step["api_loads"].append(_clock() - t)
        for message in batch:
            for delta in message[1]:
                output = decoders[delta[0]].decode(delta)
                for c in output.outputs:
                    fmt.completion(c.index, c.text[-8:], c, None)
        per_step["api"].append(_clock() - t)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(a.cprofile)
    running = sum(1 for r in reqs if not r.status.finished)
    return {"rows": running, "message_bytes": len(data),
            **{k: round(1e3 * statistics.median(v), 3) for k, v in per_step.items()}}


def _layout(tree: Path) -> Path:
    """A /tmp package layout importing `tree`'s own flotilla (bench/results/gpu-env.sh's)."""
    root = Path(tempfile.mkdtemp(prefix="host-step-tree-"))
    pkg = root / "flotilla"
    pkg.mkdir()
    for f in (tree / "flotilla").glob("*.py"):
        (pkg / f.name).write_bytes(f.read_bytes())
    (pkg / "engine").symlink_to(tree / "engine")
    (pkg / "kernels").symlink_to(tree / "kernels")
    return root


def compare(a: argparse.Namespace) -> None:
    """Each tree in its own subprocess, rounds interleaved; the median round per tree and phase."""
    trees = [Path(t).resolve() for t in a.trees]
    layouts = [_layout(t) for t in trees]
    rounds: dict[Path, list[dict[str, Any]]] = {t: [] for t in trees}
    args = ["--batch", str(a.batch), "--context", str(a.context), "--steps", str(a.steps),
            "--output-kind", a.output_kind, "--clock", a.clock]  # fmt: skip
    for r in range(a.rounds):
        for tree, layout in zip(trees, layouts, strict=True):
            # The tree first; what the path held already (e.g. gpu-env.sh's wheels) after it.
            path = ":".join(p for p in (str(layout), str(tree / "bench"), os.environ.get("PYTHONPATH", "")) if p)
            env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", *args], env=env,
                                 cwd="/tmp", capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rounds[tree].append(result)
            print(f"round {r}: {tree}: {result}", flush=True)
    summary = {str(t): {k: round(statistics.median(x[k] for x in rs), 3) for k in rs[0]} for t, rs in rounds.items()}
    for tree, s in summary.items():
        print(f"{tree}: host {s['host']:.2f} ms/step, api {s['api']:.2f} ms/step; "
              + ", ".join(f"{k} {s[k]:.2f}" for k in PHASES), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rounds": {str(t): v for t, v in rounds.items()},
                                            "median": summary}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output-kind", default="cumulative", choices=("cumulative", "final_only"))
    p.add_argument("--trees", nargs="*", default=None, help="source trees to compare (default: this process's)")
    p.add_argument("--clock", default="cpu", choices=sorted(_CLOCKS),
                   help="cpu: the thread's CPU time (default; other processes' load does not count); wall")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a subprocess of --trees: one round
    p.add_argument("--cprofile", default=None, help="with --one: cProfile the timed steps into this file")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    global _clock
    _clock = _CLOCKS[a.clock]
    if a.one:
        print(json.dumps(run_tree(a)), flush=True)
    elif a.trees:
        compare(a)
    else:
        a.trees = [str(Path(__file__).resolve().parent.parent)]
        compare(a)


if __name__ == "__main__":
    main()
