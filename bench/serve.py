"""Online serving benchmark, like `vllm bench serve`: streaming requests against an OpenAI server.

    python bench/serve.py --launch --num-prompts 8 --max-concurrency 8 --input-len 210 --output-len 128

`--launch` starts `flotilla serve` (the embedded model unless --model, plus --serve-args) on a free
loopback port and stops it afterwards; without it, `--base-url` names a running server. Prompts are
random token ids (`--dataset random`), sent to /v1/completions with ignore_eos so every request
generates exactly --output-len tokens. --warmups runs of the same workload go first, unmeasured.
Arrivals: all at once (--request-rate inf) or Poisson at the
given rate; --max-concurrency caps requests in flight. Reports request throughput, output and total
tokens/s, TTFT/TPOT/ITL mean, median and p99 in ms, and goodput under --goodput SLOs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shlex
import socket
import ssl
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Result:
    """One request's measurements."""

    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    # time.monotonic() (one clock for every process, as the server's FLOTILLA_STEP_TRACE): the slot was
    # taken (concurrency semaphore acquired), the request head went onto the socket, its response head
    # came back, the stream ended. sent - start is the client's own delay (its connection pool).
    t_start: float = 0.0
    t_sent: float = 0.0
    t_head: float = 0.0
    t_end: float = 0.0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank on the sorted values); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: list[int] | str, output_len: int,
                      api_key: str | None, extra_body: dict | None = None) -> Result:
    """Stream one completion and time its tokens. `extra_body` adds or overrides request fields (another
    server's sampling options). A server that streams no usage (llama-cpp-python) is credited with
    `output_len` tokens when the stream ends with finish_reason "length" (min_tokens = max_tokens)."""
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "min_tokens": output_len,
            "ignore_eos": True, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            **(extra_body or {})}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.perf_counter()
    last = start
    result = Result(ok=False, prompt_len=len(prompt) if isinstance(prompt, list) else 0, t_start=time.monotonic())

    async def trace(event: str, info: dict) -> None:  # httpcore's per-request trace hook
        if event == "http11.send_request_headers.started" and not result.t_sent:
            result.t_sent = time.monotonic()
        elif event == "http11.receive_response_headers.complete":
            result.t_head = time.monotonic()

    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                                 extensions={"trace": trace}) as response:
            if response.status_code != 200:
                result.error = (await response.aread()).decode()[:200]
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if chunk.get("choices"):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    if chunk["choices"][0].get("finish_reason") == "length" and not result.output_tokens:
                        result.output_tokens = output_len
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
        result.latency = time.perf_counter() - start
        result.t_end = time.monotonic()
        result.ok = True
    except httpx.HTTPError as exc:
        result.error = repr(exc)
    return result


def make_prompts(args: argparse.Namespace, seed: int) -> list[list[int]]:
    """The run's random token-id prompts, drawn from `seed`, each after the `--random-prefix-len` tokens
    every prompt of every run shares (drawn from `--seed` alone, so a warm-up caches them)."""
    shared = random.Random(f"prefix-{args.seed}")
    prefix = [shared.randrange(100, args.vocab_size) for _ in range(args.random_prefix_len)]
    rng = random.Random(seed)
    low, high = int(args.input_len * (1 - args.range_ratio)), int(args.input_len * (1 + args.range_ratio))
    return [prefix + [rng.randrange(100, args.vocab_size) for _ in range(rng.randint(low, high))]
            for _ in range(args.num_prompts)]


async def run(args: argparse.Namespace, url: str, seed: int, client: int = 0,
              clients: int = 1) -> tuple[list[Result], float, float]:
    """Send this client's share of the requests (every `clients`-th prompt from `client` on) with the
    arrival process and its share of the concurrency cap; returns results, start and end (wall clock).

    Each run draws its own prompts from `seed`, so a warm-up never leaves the measured prompts in the
    prefix cache.
    """
    rng = random.Random(seed + 7 * client)
    prompts = make_prompts(args, seed)[client::clients]
    slots = -(-(args.max_concurrency or args.num_prompts) // clients) or 1
    # One AsyncClient (so one kept-alive connection) per concurrency slot, not one pool for all: httpcore's
    # shared pool scans every connection for every queued request, and with hundreds of streams ending at
    # once it hands one idle connection to several requests and opens new ones for the rest, so requests
    # waited seconds in the client before their head was written (a 512-stream run: send delay p50 4.3 s).
    ssl_context = ssl.create_default_context()  # built once: httpx would load the CA bundle per client
    free: asyncio.LifoQueue[httpx.AsyncClient] = asyncio.LifoQueue()  # the warmest connection first
    every = [httpx.AsyncClient(timeout=httpx.Timeout(3600), verify=ssl_context) for _ in range(slots)]
    for http in every:
        free.put_nowait(http)
    try:
        model = args.model_name or (await every[0].get(f"{url}/v1/models", headers=_auth(args))).json()["data"][0]["id"]

        async def limited(prompt: list[int]) -> Result:
            http = await free.get()
            try:
                return await one_request(http, url, model, prompt, args.output_len, args.api_key)
            finally:
                free.put_nowait(http)

        start = time.time()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(prompt)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate / clients))
        results = await asyncio.gather(*tasks)
        return list(results), start, time.time()
    finally:
        await asyncio.gather(*(http.aclose() for http in every))


def client_process(args: argparse.Namespace, url: str, seed: int, client: int,
                   clients: int) -> tuple[list[Result], float, float, float]:
    """One client process's run, with the CPU seconds it used (to show the client is not the bottleneck)."""
    cpu = time.process_time()
    results, start, end = asyncio.run(run(args, url, seed, client, clients))
    return results, start, end, time.process_time() - cpu


def run_clients(args: argparse.Namespace, url: str, seed: int) -> tuple[list[Result], float, list[float]]:
    """The whole load from --clients processes at once; returns results, wall seconds and each client's
    CPU seconds. One client runs in this process."""
    if args.clients == 1:
        results, start, end, cpu = client_process(args, url, seed, 0, 1)
        return results, end - start, [cpu]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.clients) as pool:
        parts = pool.starmap(client_process, [(args, url, seed, k, args.clients) for k in range(args.clients)])
    results = [r for part in parts for r in part[0]]
    return results, max(p[2] for p in parts) - min(p[1] for p in parts), [p[3] for p in parts]


def _auth(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def summarize(results: list[Result], wall: float, args: argparse.Namespace) -> dict:
    """vllm-bench-serve-style summary."""
    ok = [r for r in results if r.ok]
    ms = 1000.0
    ttft = [r.ttft * ms for r in ok]
    # The client's own delay (slot taken -> request head written) and the server's (written -> response head).
    send = [(r.t_sent - r.t_start) * ms for r in ok if r.t_sent]
    head = [(r.t_head - r.t_sent) * ms for r in ok if r.t_head and r.t_sent]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) * ms for r in ok if r.output_tokens > 1]
    itl = [x * ms for r in ok for x in r.itl]
    output = sum(r.output_tokens for r in ok)
    summary = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": wall,
        "request_throughput": len(ok) / wall, "output_throughput": output / wall,
        "total_token_throughput": (output + sum(r.prompt_len for r in ok)) / wall,
        "total_output_tokens": output,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("send_delay", send), ("head_delay", head)):
        summary[f"mean_{name}_ms"] = statistics.fmean(values) if values else 0.0
        summary[f"median_{name}_ms"] = percentile(values, 50)
        summary[f"p99_{name}_ms"] = percentile(values, 99)
        summary[f"max_{name}_ms"] = max(values) if values else 0.0
    if args.goodput:
        slo = dict(item.split(":") for item in args.goodput)
        good = [r for r in ok if r.ttft * ms <= float(slo.get("ttft", "inf"))
                and (r.output_tokens <= 1 or (r.latency - r.ttft) / (r.output_tokens - 1) * ms
                     <= float(slo.get("tpot", "inf")))]
        summary["goodput_req_s"] = len(good) / wall
    if len(ok) < len(results):
        summary["first_error"] = next(r.error for r in results if not r.ok)
    return summary


def launch(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """Start `flotilla serve` on a free loopback port and wait for /health."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, *shlex.split(args.server_python_args), "-m", "flotilla.engine.server",
           *([args.model] if args.model else []), "--host", "127.0.0.1", "--port", str(port),
           "--uvicorn-log-level", "warning", *shlex.split(args.serve_args)]
    log = open(args.server_log, "ab") if args.server_log else subprocess.DEVNULL  # noqa: SIM115 (the server's lifetime)
    process = subprocess.Popen(cmd, stdout=log, stderr=log, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}: {' '.join(cmd)}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("server did not become healthy")


def _cpu_seconds(process: subprocess.Popen | None) -> tuple[float, float, float]:
    """CPU seconds (user plus system) of a launched server so far: its main thread (the event loop),
    the whole process, and its live child processes (the engine core, its tp/pp workers) (Linux /proc);
    zeros without one."""
    if process is None:
        return 0.0, 0.0, 0.0
    children = _descendants(process.pid)
    return (_read_cpu(f"/proc/{process.pid}/task/{process.pid}/stat"), _read_cpu(f"/proc/{process.pid}/stat"),
            sum(_read_cpu(f"/proc/{pid}/stat") for pid in children))


def _read_cpu(path: str) -> float:
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    """Live descendant processes of `pid` (Linux /proc)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found += kids
            stack += kids
    return found


def main() -> None:
    """Parse arguments, run the load, print a table and write JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--launch", action="store_true", help="start flotilla serve for the run")
    p.add_argument("--model", default=None, help="model directory for --launch (default: embedded)")
    p.add_argument("--serve-args", default="", help="extra flotilla serve flags for --launch")
    p.add_argument("--server-log", default=None, help="append the launched server's output here")
    p.add_argument("--server-python-args", default="",
                   help="interpreter flags for --launch, e.g. '-m cProfile -o server.prof'")
    p.add_argument("--model-name", default=None, help="served model name (default: the first listed)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--dataset", choices=["random"], default="random")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=210)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.0, help="input lengths uniform in len*(1±ratio)")
    p.add_argument("--random-prefix-len", type=int, default=0,
                   help="tokens every prompt starts with (as vLLM's): a cached prefix after the warm-up")
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--goodput", nargs="*", default=None, help="SLOs like ttft:3000 tpot:100 (ms)")
    p.add_argument("--warmups", type=int, default=1,
                   help="unmeasured runs of the same workload first (CPU GEMM kernels are built per shape)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clients", type=int, default=1, help="client processes sharing the load")
    p.add_argument("--json", default=None)
    p.add_argument("--request-log", default=None,
                   help="write each measured request's time.monotonic() marks here (JSON lines)")
    args = p.parse_args()
    process = None
    url = args.base_url
    if args.launch:
        process, url = launch(args)
    try:
        for i in range(args.warmups):
            run_clients(args, url, seed=args.seed + 1000 + i)
        cpu_before = _cpu_seconds(process)
        results, wall, client_cpu = run_clients(args, url, seed=args.seed)
        main_cpu, server_cpu, child_cpu = (after - before for after, before in zip(_cpu_seconds(process), cpu_before,
                                                                                    strict=True))
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=60)
    summary = summarize(results, wall, args)
    summary["command"] = "python bench/serve.py " + shlex.join(sys.argv[1:])
    # Busy fraction of one core over the measured run: a client near 1.0 is the bottleneck itself.
    summary["client_cpu_busy"] = [c / wall for c in client_cpu]
    if process is not None:
        # CPU per output token is what a loaded machine changes least: the event loop's (main thread)
        # share is the server's per-token host path; the rest is the engine thread (and torch's workers).
        tokens = max(summary["total_output_tokens"], 1)
        summary["server_cpu_busy"] = server_cpu / wall
        summary["server_main_thread_cpu_ms_per_token"] = main_cpu / tokens * 1000
        summary["server_other_threads_cpu_ms_per_token"] = (server_cpu - main_cpu) / tokens * 1000
        # The engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=1) and any workers: 0 with the engine on a thread.
        summary["server_children_cpu_busy"] = child_cpu / wall
        summary["server_children_cpu_ms_per_token"] = child_cpu / tokens * 1000
        summary["server_total_cpu_ms_per_token"] = (server_cpu + child_cpu) / tokens * 1000
    for key in ("completed", "failed", "duration_s", "request_throughput", "output_throughput",
                "total_token_throughput", "median_ttft_ms", "p99_ttft_ms", "max_ttft_ms", "median_tpot_ms",
                "median_itl_ms", "p99_itl_ms", "median_send_delay_ms", "p99_send_delay_ms", "max_send_delay_ms",
                "median_head_delay_ms", "p99_head_delay_ms", "client_cpu_busy", "server_cpu_busy",
                "server_main_thread_cpu_ms_per_token", "server_other_threads_cpu_ms_per_token",
                "server_children_cpu_busy", "server_children_cpu_ms_per_token", "server_total_cpu_ms_per_token"):
        if key not in summary:
            continue
        value = summary[key]
        print(f"{key:<24} {value:.2f}" if isinstance(value, float) else f"{key:<24} {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    if args.request_log:
        write_request_log(results, args.request_log)


def write_request_log(results: list[Result], path: str) -> None:
    """One JSON line per request of the measured run, by slot time: its time.monotonic() marks (start, sent,
    head, end), to line up with the server's FLOTILLA_STEP_TRACE."""
    with open(path, "w") as f:
        for r in sorted(results, key=lambda r: r.t_start):
            row = {"start": r.t_start, "sent": r.t_sent, "head": r.t_head, "ttft": r.ttft, "end": r.t_end, "ok": r.ok}
            f.write(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}) + "\n")


if __name__ == "__main__":
    main()
