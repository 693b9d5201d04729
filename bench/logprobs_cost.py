"""What logprobs cost a generation (CPU, embedded model): the same requests with and without them.

Offline (`LLM.generate`, in this process) and/or over a server (`openai` client, the requests at once): 16
prompts x 64 tokens with no logprobs, `logprobs` 0 / 5 / 20, and `prompt_logprobs`; each case run `--repeat`
times, the cases interleaved (load on a shared machine drifts), reporting each case's median wall seconds and
CPU seconds (this process offline; the server's processes summed over the server) and their ratios to the
no-logprobs case. CPU seconds are the steadier figure on a loaded machine; offline, the CPU milliseconds a step
spends in the sampler (`sample()` as the runner calls it: the pipeline and the logprobs, not the argmax-only path
that rows without logprobs take) isolate the engine's logprobs work from the forward's noise.

    OMP_NUM_THREADS=1 .venv/bin/python bench/logprobs_cost.py [--mode offline,server] [--out FILE.json]

`--baseline-ref REF` (offline): each logprobs case also as `<case>@REF`, the sampler's `add_logprobs` of that git
revision swapped in, in the same process and rounds: a before/after of the sampler's logprobs on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import types
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from local_server import free_port, wait_until_serving

from flotilla.engine.embedded_model import embedded_model_dir

# case name -> (logprobs, prompt_logprobs): the engine's SamplingParams fields
CASES: dict[str, tuple[int | None, int | None]] = {
    "none": (None, None),
    "logprobs0": (0, None),
    "logprobs5": (5, None),
    "logprobs20": (20, None),
    "prompt_logprobs5": (None, 5),
}


def prompts(count: int) -> list[str]:
    """Distinct prompts of a few dozen tokens (no shared prefix beyond the first words)."""
    return [f"Story {i}: write a short tale about a cat called {i * 7919 % 1000} who lives by the sea."
            for i in range(count)]


def offline_runner(args: argparse.Namespace) -> tuple[Callable[[str], None], Callable[[], float], Callable[[], None]]:
    """(run one case, CPU seconds so far, close) for the offline API."""
    from flotilla.engine import model_runner, sampler
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams

    llm = LLM(str(embedded_model_dir()), max_model_len=512, dtype=args.dtype)
    spent = [0.0, 0]  # CPU seconds in sample(), steps that drew with it

    def timed_sample(*call: Any) -> Any:
        started = time.process_time()
        try:
            return sample(*call)
        finally:
            spent[0] += time.process_time() - started
            spent[1] += 1

    sample = model_runner.sample
    model_runner.sample = timed_sample
    texts = prompts(args.prompts)

    variants = {None: sampler.add_logprobs}
    if args.baseline_ref:
        variants[args.baseline_ref] = sampler_at(args.baseline_ref).add_logprobs

    def run(case: str) -> None:
        name, _, ref = case.partition("@")
        logprobs, prompt_logprobs = CASES[name]
        params = SamplingParams(max_tokens=args.tokens, temperature=args.temperature, seed=0, ignore_eos=True,
                                logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        sampler.add_logprobs = variants[ref or None]  # sample() looks it up in its module at each call
        spent[:] = [0.0, 0]
        try:
            outputs = llm.generate(texts, params, use_tqdm=False)
        finally:
            sampler.add_logprobs = variants[None]
        assert all(len(o.outputs[0].token_ids) == args.tokens for o in outputs)
        sampler_ms[case].append(1e3 * spent[0] / args.tokens)  # per step (a step draws each prompt's token)

    sampler_ms: dict[str, list[float]] = defaultdict(list)
    run.sampler_ms = sampler_ms  # type: ignore[attr-defined]
    return run, time.process_time, lambda: None


def sampler_at(ref: str) -> types.ModuleType:
    """engine/sampler.py as git revision `ref` defines it, as its own module (bench/sampling_cost.py uses it too)."""
    source = subprocess.run(["git", "show", f"{ref}:engine/sampler.py"], check=True, capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1]).stdout
    module = types.ModuleType(f"sampler_at_{ref}")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(source, f"{ref}:engine/sampler.py", "exec"), module.__dict__)  # the project's own source
    return module


def server_runner(args: argparse.Namespace) -> tuple[Callable[[str], None], Callable[[], float], Callable[[], None]]:
    """(run one case, the server's CPU seconds so far, stop it) over a server and the `openai` client."""
    import openai

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "flotilla.engine.server", str(embedded_model_dir()),
                                "--port", str(port), "--max-model-len", "512", "--served-model-name", "m",
                                "--dtype", args.dtype, "--disable-log-stats", "--uvicorn-log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(process, url)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600)
    texts = prompts(args.prompts)
    pool = ThreadPoolExecutor(args.prompts)
    server = psutil.Process(process.pid)

    def one(text: str, case: str) -> None:
        logprobs, prompt_logprobs = CASES[case]
        extra: dict[str, Any] = {"ignore_eos": True, "seed": 0}
        if prompt_logprobs is not None:
            extra["prompt_logprobs"] = prompt_logprobs
        if args.api == "chat":
            chat = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": text}], max_tokens=args.tokens,
                temperature=args.temperature, logprobs=logprobs is not None or None,
                top_logprobs=logprobs if logprobs else None, extra_body=extra)
            assert chat.usage is not None and chat.usage.completion_tokens == args.tokens
        else:
            done = client.completions.create(model="m", prompt=text, max_tokens=args.tokens,
                                             temperature=args.temperature, logprobs=logprobs, extra_body=extra)
            assert done.usage is not None and done.usage.completion_tokens == args.tokens

    def run(case: str) -> None:
        list(pool.map(lambda text: one(text, case), texts))

    def cpu() -> float:
        processes = [server, *server.children(recursive=True)]
        return sum(p.cpu_times().user + p.cpu_times().system for p in processes)

    def close() -> None:
        pool.shutdown()
        process.terminate()
        process.wait(60)

    return run, cpu, close


def measure(run: Callable[[str], None], cpu: Callable[[], float], cases: list[str], repeat: int) -> dict[str, Any]:
    """Each case's median wall and CPU seconds over `repeat` interleaved rounds (after one warm-up round)."""
    for case in cases:
        run(case)
    walls: dict[str, list[float]] = {c: [] for c in cases}
    cpus: dict[str, list[float]] = {c: [] for c in cases}
    for _ in range(repeat):
        for case in cases:
            wall, used = time.perf_counter(), cpu()
            run(case)
            walls[case].append(time.perf_counter() - wall)
            cpus[case].append(cpu() - used)
    base_wall, base_cpu = statistics.median(walls["none"]), statistics.median(cpus["none"])
    report = {}
    sampler_ms = getattr(run, "sampler_ms", None)
    for case in cases:
        wall, used = statistics.median(walls[case]), statistics.median(cpus[case])
        if sampler_ms is not None:
            in_sampler = statistics.median(sampler_ms[case][1:])  # the rounds after the warm-up
            report.setdefault("sampler_cpu_ms_per_step", {})[case] = round(in_sampler, 2)
            print(f"{case:18s} sampler {in_sampler:6.2f} CPU ms a step", flush=True)
        report[case] = {"wall_s": round(wall, 3), "cpu_s": round(used, 3), "wall_x": round(wall / base_wall, 3),
                        "cpu_x": round(used / base_cpu, 3), "walls": [round(w, 3) for w in walls[case]],
                        "cpus": [round(c, 3) for c in cpus[case]]}
        print(f"{case:18s} wall {wall:7.2f} s ({wall / base_wall:5.2f}x)  cpu {used:7.2f} s ({used / base_cpu:5.2f}x)",
              flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="offline,server", help="offline and/or server, comma-separated")
    parser.add_argument("--api", default="completions", choices=["completions", "chat"], help="the server's API")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-ref", help="offline: also each logprobs case with this revision's add_logprobs")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    cases = args.cases.split(",")
    assert cases[0] == "none", "the first case is the baseline"
    if args.baseline_ref:
        cases += [f"{c}@{args.baseline_ref}" for c in cases if CASES[c][0] is not None]
    results: dict[str, Any] = {"command": " ".join(sys.argv), "args": vars(args)}
    for mode in args.mode.split(","):
        print(f"--- {mode}", flush=True)
        if mode == "server" and args.baseline_ref:
            raise SystemExit("--baseline-ref is for the offline mode (the server runs the checkout's sampler)")
        run, cpu, close = (offline_runner if mode == "offline" else server_runner)(args)
        try:
            results[mode] = measure(run, cpu, cases, args.repeat)
        finally:
            close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
