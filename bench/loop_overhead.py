"""What it costs to run the engine loop beside an HTTP event loop (the server's thread design).

    python bench/loop_overhead.py --num-prompts 8 --input-len 210 --output-len 128

Three runs of the same greedy workload on the same weights, in one call, each in a fresh process
after a warm-up: (1) the offline engine alone (`LLM.generate`), (2) the engine built and stepped on
its own thread (`AsyncEngine.build`) with asyncio consumers and no HTTP, (3) the real server with
streaming HTTP clients (`bench/serve.py --launch`). Output tokens/s
of (2) and (3) against (1) is the price of the thread and of HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from flotilla.engine.async_engine import AsyncEngine
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams


async def _drive(engine: AsyncEngine, prompts: list[list[int]], params: SamplingParams) -> None:
    """Run every prompt through the engine thread at once."""

    async def consume(prompt: list[int]) -> None:
        async for _ in engine.generate(prompt, params, f"loop-{id(prompt)}"):
            pass

    await asyncio.gather(*(consume(p) for p in prompts))


def measure(mode: str, a: argparse.Namespace) -> float:
    """Output tokens/s of one configuration, after a warm-up run on fresh prompts."""
    rng = random.Random(0)

    def fresh_prompts() -> list[list[int]]:  # new tokens each run: no run may hit another's prefix cache
        return [[rng.randrange(100, 49000) for _ in range(a.input_len)] for _ in range(a.num_prompts)]

    params = SamplingParams(temperature=0, max_tokens=a.output_len, ignore_eos=True)
    if mode == "offline":
        llm = LLM()
        run = lambda: llm.generate(fresh_prompts(), params, use_tqdm=False)  # noqa: E731
    else:  # the server's arrangement: the engine is built and stepped on its own thread
        engine = AsyncEngine.build(lambda: LLM().engine)
        run = lambda: asyncio.run(_drive(engine, fresh_prompts(), params))  # noqa: E731
    run()  # warm-up: CPU GEMM kernels are built per shape
    start = time.perf_counter()
    run()
    return a.num_prompts * a.output_len / (time.perf_counter() - start)


def main() -> None:
    """Run the three configurations, each in its own process, and print their output tokens/s."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--input-len", type=int, default=210)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--only", choices=["offline", "thread"], help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.only:
        print(measure(a.only, a))
        return
    workload = ["--num-prompts", str(a.num_prompts), "--input-len", str(a.input_len), "--output-len",
                str(a.output_len)]

    def child(mode: str) -> float:
        out = subprocess.run([sys.executable, __file__, "--only", mode, *workload], check=True,
                             capture_output=True, text=True).stdout
        return float(out.strip().splitlines()[-1])

    offline, threaded = child("offline"), child("thread")
    out = Path("/tmp/loop_overhead_serve.json")
    subprocess.run([sys.executable, str(Path(__file__).with_name("serve.py")), "--launch", *workload,
                    "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
    http = json.loads(out.read_text())["output_throughput"]
    result = {"command": "python bench/loop_overhead.py " + " ".join(sys.argv[1:]),
              "offline_output_tokens_per_s": offline, "engine_thread_output_tokens_per_s": threaded,
              "http_streaming_output_tokens_per_s": http,
              "thread_vs_offline": threaded / offline, "http_vs_offline": http / offline}
    print(json.dumps(result, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
