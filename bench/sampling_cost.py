"""What drawing at temperature > 0 costs on the CPU: the sampler alone, and a whole offline generation.

`micro`: `sample()` on `[B, V]` fp32 logits (default 16 x 49,152, the embedded model's vocabulary) at temperature
0.8, seeded rows, unseeded rows, and with top-p 0.9, top-k 50 and both, at temperature 0.1 (`cold`) and with every
other row greedy (`half_greedy`); CPU milliseconds and minor page faults a call (medians). `--bf16-logits` rounds
the logits to bf16 values, so that they tie as a bf16 model's do (top-p cuts through tied tokens then).
`engine`: the embedded model offline (`LLM`, `--quantization gguf` by default), --prompts prompts x --tokens tokens
at --temperature (0.8; with --top-p / --top-k when given), seeded; the run's CPU seconds, its output tok/s, the CPU
milliseconds a step spent in `sample()` and their share of the run's CPU; `--profile FILE` adds a cProfile of one
more run (--prompts 1 and 8: the sampler's share of a decode step at batch 1 and 8).

`--baseline-ref REF` runs everything twice, rounds interleaved in one process: with this checkout's `sample()` and
with engine/sampler.py of git revision REF (its own helpers and noise), so a before/after on a loaded machine is
one run. It also checks that both draw the same tokens (the same seeds give the same noise).

    OMP_NUM_THREADS=1 .venv/bin/python bench/sampling_cost.py --baseline-ref HEAD~1 [--out FILE.json]

On a GPU, `--device cuda` runs the micro part there (CUDA-synchronised wall milliseconds instead of CPU ones).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from flotilla.engine import model_runner, sampler
from flotilla.engine.request import Request
from flotilla.engine.sampling_metadata import SamplingRow, build_sampling_batch
from flotilla.engine.sampling_params import SamplingParams

Sample = Callable[[torch.Tensor, sampler.SamplingBatch], sampler.SamplerOutput]
MICRO_CASES: dict[str, dict[str, Any]] = {
    "seeded": {"temperature": 0.8},
    "unseeded": {"temperature": 0.8},
    "top_p0.9": {"temperature": 0.8, "top_p": 0.9},
    "top_k50": {"temperature": 0.8, "top_k": 50},
    "top_k50_top_p0.9": {"temperature": 0.8, "top_k": 50, "top_p": 0.9},
    "cold": {"temperature": 0.1},  # most probabilities underflow to 0
    "half_greedy": {"temperature": 0.8},  # every other row at temperature 0
}


def micro_batch(case: str, rows: int, vocab: int, device: torch.device) -> sampler.SamplingBatch:
    """A batch of `rows` requests with the case's parameters (seeded: seed = row, at output position 40)."""
    requests = []
    for i in range(rows):
        seed = i if case != "unseeded" else None
        fields = {**MICRO_CASES[case], **({"temperature": 0.0} if case == "half_greedy" and i % 2 else {})}
        r = Request(str(i), [1, 2, 3], SamplingParams(seed=seed, **fields), eos_token_ids=frozenset({2}))
        requests.append(SamplingRow(r, i, 40))
    return build_sampling_batch(requests, vocab, device, torch.Generator().manual_seed(0))


def _call(fn: Sample, logits: torch.Tensor, batch: sampler.SamplingBatch) -> tuple[float, int, list[int]]:
    """(milliseconds, minor page faults, tokens) of one call: CPU time on the CPU, synchronised wall on CUDA."""
    cuda = logits.is_cuda
    if cuda:
        torch.cuda.synchronize()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    started = time.perf_counter() if cuda else time.process_time()
    tokens = fn(logits, batch).token_ids
    if cuda:
        torch.cuda.synchronize()
    spent = (time.perf_counter() if cuda else time.process_time()) - started
    return 1e3 * spent, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, tokens.tolist()


def micro(args: argparse.Namespace, variants: dict[str, Sample]) -> dict[str, Any]:
    """Each (case, variant)'s median ms and page faults a `sample()` call, rounds interleaved."""
    device = torch.device(args.device)
    logits = torch.randn(args.rows, args.vocab, generator=torch.Generator().manual_seed(0)) * 3
    if args.bf16_logits:
        logits = logits.bfloat16().float()
    logits = logits.to(device)
    batches = {case: micro_batch(case, args.rows, args.vocab, device) for case in MICRO_CASES}
    ms: dict[str, list[float]] = defaultdict(list)
    faults: dict[str, list[int]] = defaultdict(list)
    tokens: dict[str, list[int]] = {}
    for round_ in range(args.calls + 1):  # round 0 warms up
        for case, batch in batches.items():
            for name, fn in variants.items():
                spent, flt, drawn = _call(fn, logits.clone(), batch)
                if round_:
                    ms[f"{case}/{name}"].append(spent)
                    faults[f"{case}/{name}"].append(flt)
                tokens.setdefault(f"{case}/{name}", drawn)
    report: dict[str, Any] = {}
    for key in ms:
        report[key] = {"ms": round(statistics.median(ms[key]), 3), "minor_faults": statistics.median(faults[key])}
        print(f"micro {key:28s} {report[key]['ms']:8.3f} ms  {report[key]['minor_faults']:6.0f} faults", flush=True)
    for case in (c for c in MICRO_CASES if c != "unseeded"):  # unseeded rows draw fresh seeds: same here too
        names = [f"{case}/{name}" for name in variants]
        report[f"{case}_same_tokens"] = all(tokens[n] == tokens[names[0]] for n in names)
    return report


def engine(args: argparse.Namespace, variants: dict[str, Sample]) -> dict[str, Any]:
    """Each variant's median CPU seconds, output tok/s and sampler CPU ms a step over interleaved rounds."""
    from flotilla.engine.embedded_model import embedded_model_dir
    from flotilla.engine.llm import LLM

    # --quantization gguf serves the embedded model's own GGUF when no model is named; else its bf16 HF directory.
    model, extra = (None, {"quantization": "gguf"}) if args.quantization == "gguf" else (str(embedded_model_dir()), {})
    llm = LLM(model, max_model_len=512, enable_prefix_caching=False, **extra)
    texts = [f"Story {i}: write a short tale about a cat called {i * 7919 % 1000} who lives by the sea."
             for i in range(args.prompts)]
    params = [SamplingParams(max_tokens=args.tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                             seed=i, ignore_eos=True) for i in range(args.prompts)]
    spent = [0.0]

    def timed(fn: Sample) -> Sample:
        def call(logits: torch.Tensor, batch: sampler.SamplingBatch) -> sampler.SamplerOutput:
            started = time.process_time()
            try:
                return fn(logits, batch)
            finally:
                spent[0] += time.process_time() - started
        return call

    runs: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    outputs: dict[str, list[list[int]]] = {}
    original = model_runner.sample
    try:
        for round_ in range(args.rounds + 1):  # round 0 warms up
            for name, fn in variants.items():
                model_runner.sample = timed(fn)
                spent[0] = 0.0
                cpu, wall = time.process_time(), time.perf_counter()
                done = llm.generate(texts, params, use_tqdm=False)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                outputs.setdefault(name, [list(o.outputs[0].token_ids) for o in done])
                if round_:
                    runs[name].append((cpu, args.prompts * args.tokens / wall, 1e3 * spent[0] / args.tokens,
                                       spent[0] / cpu))
        if args.profile:
            model_runner.sample = sampler.sample
            _profile(lambda: llm.generate(texts, params, use_tqdm=False), args.profile)
    finally:
        model_runner.sample = original
    report: dict[str, Any] = {}
    for name, rows in runs.items():
        cpu, tok_s, in_sampler, share = (statistics.median(column) for column in zip(*rows, strict=True))
        report[name] = {"cpu_s": round(cpu, 3), "tok_s": round(tok_s, 2),
                        "sampler_cpu_ms_per_step": round(in_sampler, 3), "sampler_share_of_run_cpu": round(share, 4),
                        "rounds": [[round(x, 4) for x in row] for row in rows]}
        print(f"engine {name:10s} cpu {cpu:7.2f} s  {tok_s:7.2f} tok/s  sampler {in_sampler:7.2f} CPU ms a step "
              f"({100 * share:.1f}% of the run's CPU)", flush=True)
    report["same_tokens"] = all(o == outputs["current"] for o in outputs.values())
    return report


def _profile(run: Callable[[], object], path: str) -> None:
    """cProfile (CPU time) of one more run with this checkout's sampler: the functions by cumulative time, as text."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile(time.process_time)
    profiler.runcall(run)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
    with open(path, "w") as f:
        f.write(text.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="micro,engine", help="micro and/or engine, comma-separated")
    parser.add_argument("--baseline-ref", help="also run engine/sampler.py's sample() of this git revision")
    parser.add_argument("--device", default="cpu", help="micro part's device")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--calls", type=int, default=20, help="micro: timed calls per case and variant")
    parser.add_argument("--prompts", type=int, default=8, help="engine: requests at once (streams)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bf16-logits", action="store_true", help="micro: logits rounded to bf16 values (ties)")
    parser.add_argument("--temperature", type=float, default=0.8, help="engine: temperature of every request")
    parser.add_argument("--top-p", type=float, default=1.0, help="engine: top_p of every request")
    parser.add_argument("--top-k", type=int, default=0, help="engine: top_k of every request (0 = off)")
    parser.add_argument("--quantization", default="gguf", help="engine: 'gguf' (the embedded GGUF) or '' (bf16)")
    parser.add_argument("--profile", help="engine: write a cProfile of one more run (this checkout's sampler) here")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    variants: dict[str, Sample] = {"current": sampler.sample}
    if args.baseline_ref:
        from logprobs_cost import sampler_at  # needs git (and httpx/psutil): only here, not on a device machine

        variants[args.baseline_ref] = sampler_at(args.baseline_ref).sample
    results: dict[str, Any] = {"command": " ".join(sys.argv), "args": vars(args),
                               "threads": torch.get_num_threads()}
    parts = args.parts.split(",")
    for part in parts:
        results[part] = (micro if part == "micro" else engine)(args, variants)
    print(json.dumps({part: {k: v for k, v in results[part].items() if k.endswith("tokens")} for part in parts}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
