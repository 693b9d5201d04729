"""Cost of the operator's serving reader at scale: 50 InferenceServices x 4 engine pods.

    .venv/bin/python bench/serving_reader_scale.py [--services 50] [--pods 4] [--period 10] [--periods 6]

Fake engine pods (a separate process, so its CPU is not counted) each serve an engine-sized
/metrics body on their own port: every vLLM histogram with its buckets, counters that grow and a
`vllm:num_requests_waiting` that changes every period. The reader (operator/serving_reader.py,
unchanged) lists the 200 pods from a stand-in for the API server, scrapes, computes and writes;
writes are counted, not sent. Reported: the reader's CPU (user + system of this process) per
second of wall time, each period's read time, and how stale the written figures are, in periods.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import resource
import statistics
import time
from typing import Any

import aiohttp
from aiohttp import web

from flotilla.operator.serving_reader import ReaderSettings, ServingReader

BUCKETS = {
    "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                         2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    **{name: [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
              480.0, 960.0, 1920.0, 7680.0]
       for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                    "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds")},
    **{name: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
       for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:iteration_tokens_total")},
}


def body(pod: int, requests: int, step: int) -> str:
    """An engine's /metrics after `requests` requests, its queue at `step`'s value."""
    lab = 'model_name="m"'
    lines = [f"vllm:num_requests_running{{{lab}}} 8", f"vllm:num_requests_waiting{{{lab}}} {step % 7}",
             f"vllm:kv_cache_usage_perc{{{lab}}} {0.1 + (step % 5) / 10}",
             'vllm:cache_config_info{block_size="16",cache_dtype="auto"} 1',
             f"vllm:prompt_tokens_total{{{lab}}} {requests * 500}",
             f"vllm:generation_tokens_total{{{lab}}} {requests * 128}",
             f"vllm:prefix_cache_queries_total{{{lab}}} {requests * 500}",
             f"vllm:prefix_cache_hits_total{{{lab}}} {requests * 200}",
             f"vllm:num_preemptions_total{{{lab}}} 0"]
    for reason in ("stop", "length", "abort"):
        lines.append(f'vllm:request_success_total{{{lab},finished_reason="{reason}"}} {requests // 3}')
    rng = random.Random(pod)
    for name, bounds in BUCKETS.items():
        lines.append(f"# TYPE {name} histogram")
        for i, le in enumerate(bounds):
            share = min(1.0, (i + 1) / len(bounds) + rng.random() * 0.05)
            lines.append(f'{name}_bucket{{{lab},le="{float(le)}"}} {int(requests * share)}')
        lines += [f'{name}_bucket{{{lab},le="+Inf"}} {requests}', f"{name}_count{{{lab}}} {requests}",
                  f"{name}_sum{{{lab}}} {requests * 0.3}"]
    return "\n".join(lines) + "\n"


def serve(ports: list[int], period: float, ready: Any) -> None:
    """The fake engine pods: one listener per pod, 200 more requests counted every period. Bodies are
    made once per pod and period, so the server's own CPU stays small next to the reader's."""
    cache: dict[tuple[int, int], bytes] = {}

    async def main() -> None:
        runners = []
        for i, port in enumerate(ports):
            async def handler(_: web.Request, i: int = i) -> web.Response:
                step = int(time.time() / period)
                if (i, step) not in cache:
                    cache[(i, step)] = body(i, 200 * step, step).encode()
                    cache.pop((i, step - 2), None)
                return web.Response(body=cache[(i, step)], content_type="text/plain")
            app = web.Application()
            app.router.add_get("/metrics", handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


class CountingKube:
    """The API server's part: the pods listed, status writes counted (not sent)."""

    def __init__(self, pods: list[dict[str, Any]]):
        self.pods, self.writes = pods, []

    def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        return json.loads(json.dumps(self.pods))  # a fresh copy, as from the wire

    def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((time.time(), path, status))
        return {}


def pods(services: int, per_service: int, first_port: int) -> list[dict[str, Any]]:
    out = []
    for s in range(services):
        for p in range(per_service):
            port = first_port + s * per_service + p
            out.append({"metadata": {"name": f"svc{s}-{p}", "namespace": "bench",
                                     "labels": {"serving.flotilla.dev/inferenceservice": f"svc{s}"}},
                        "spec": {"containers": [{"name": "engine",
                                                 "ports": [{"name": "http", "containerPort": port}]}]},
                        "status": {"phase": "Running", "podIP": "127.0.0.1"}})
    return out


async def measure(reader: ServingReader, kube: CountingKube, periods: int, period: float) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=reader.settings.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=reader.settings.concurrency)) as session:
        await reader.read_once(session)  # warm-up: the first scrape of every pod opens the windows
        usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        reads, staleness, complete, unreachable = [], [], True, 0
        for _ in range(periods):
            started = time.monotonic()
            blocks = await reader.read_once(session)
            reads.append(time.monotonic() - started)
            step = int(time.time() / period)
            for block in blocks.values():
                complete &= block["scraped"] == 4 and "ttftP95Seconds" in block
                unreachable += block["unreachable"]
            # Each pod's queue is `step % 7`: what the written block says tells which step it saw.
            latest = {}
            for _, path, status in kube.writes:
                latest[path] = status["serving"]["waiting"] // 4
            staleness += [(step - seen) % 7 for seen in latest.values()]
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))
        usage1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    return {"cpu_cores": cpu / (wall1 - wall0), "cpu_s_per_period": cpu / periods,
            "read_s_median": statistics.median(reads), "read_s_max": max(reads),
            "max_staleness_periods": max(staleness), "all_figures_present": complete,
            "unreachable_scrapes": unreachable,
            "writes_per_period": len(kube.writes) / (periods + 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--services", type=int, default=50)
    p.add_argument("--pods", type=int, default=4)
    p.add_argument("--period", type=float, default=10.0)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--periods", type=int, default=6)
    p.add_argument("--first-port", type=int, default=24000)
    args = p.parse_args()
    n = args.services * args.pods
    ports = list(range(args.first_port, args.first_port + n))
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(ports, args.period, ready), daemon=True)
    server.start()
    ready.wait(60)
    kube = CountingKube(pods(args.services, args.pods, args.first_port))
    reader = ServingReader(kube, [], ReaderSettings(period_s=args.period, window_s=args.window))  # type: ignore[arg-type]  # a stand-in Kube
    result = asyncio.run(measure(reader, kube, args.periods, args.period))
    server.terminate()
    print(json.dumps({"services": args.services, "pods": n, "period_s": args.period, "window_s": args.window,
                      "body_bytes": len(body(0, 10_000, 0)), **{k: round(v, 4) if isinstance(v, float) else v
                                                                 for k, v in result.items()}}, indent=2))


if __name__ == "__main__":
    main()
