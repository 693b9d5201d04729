"""Cost of the operator's serving reader at scale: 50 InferenceServices x 4 engine pods.

    .venv/bin/python bench/serving_reader_scale.py [--services 50] [--pods 4] [--period 10] [--periods 6]

Fake engine pods (a separate process, so its CPU is not counted) each serve an engine-sized
/metrics body on their own loopback address, 127.77.x.y, at the engine's port (names.HTTP_PORT, the
only one the reader scrapes; Linux routes all of 127/8 to lo): every vLLM histogram with its buckets,
counters that grow and a `vllm:num_requests_waiting` that changes every period. The reader
(operator/serving_reader.py, unchanged) lists the 200 pods and their ReplicaSets from a stand-in for
the API server, keeps the pods its rule keeps (engine_pods.py: each pod controlled by a ReplicaSet
controlled by its InferenceService's own Deployment, by uid), scrapes, computes and writes; writes
are counted, not sent. Reported: the reader's CPU (user + system of this process) per
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

from flotilla.operator.names import HTTP_PORT, INFERENCESERVICE_LABEL
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


def address(index: int) -> str:
    """Pod `index`'s own loopback address (away from 127.0.0.x, where other servers of the box listen)."""
    return f"127.77.{index // 250}.{index % 250 + 1}"


def serve(addresses: list[str], period: float, ready: Any) -> None:
    """The fake engine pods: one listener per pod at address:HTTP_PORT, 200 more requests counted every
    period. Bodies are made once per pod and period, so the server's own CPU stays small next to the
    reader's."""
    cache: dict[tuple[int, int], bytes] = {}

    async def main() -> None:
        runners = []
        for i, host in enumerate(addresses):
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
            await web.TCPSite(runner, host, HTTP_PORT).start()
            runners.append(runner)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


class CountingKube:
    """The API server's part: the pods and ReplicaSets listed, status writes counted (not sent)."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]):
        self.objects, self.writes = objects, []

    def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        plural = path.rsplit("/", 1)[-1]
        return json.loads(json.dumps(self.objects[plural]))  # a fresh copy, as from the wire

    def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((time.time(), path, status))
        return {}


def _controller(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def cluster(services: int, per_service: int) -> tuple[dict[str, list[dict[str, Any]]], dict[tuple[str, str], str]]:
    """What the API server holds: each InferenceService's engine pods, made through one ReplicaSet of its
    Deployment, as the Deployment and ReplicaSet controllers write them; and the Deployments' uids by
    (namespace, InferenceService), as the reconciler records them."""
    pods, replicasets, deployments = [], [], {}
    for s in range(services):
        name, labels = f"svc{s}", {INFERENCESERVICE_LABEL: f"svc{s}"}
        deployments[("bench", name)] = f"deploy-uid-{s}"
        replicasets.append({"metadata": {"name": f"{name}-5d8f", "namespace": "bench", "uid": f"rs-uid-{s}",
                                         "labels": labels,
                                         "ownerReferences": [_controller("Deployment", name, f"deploy-uid-{s}")]}})
        for p in range(per_service):
            pods.append({"metadata": {"name": f"{name}-5d8f-{p}", "namespace": "bench", "labels": labels,
                                      "ownerReferences": [_controller("ReplicaSet", f"{name}-5d8f", f"rs-uid-{s}")]},
                         "spec": {"containers": [{"name": "engine",
                                                  "ports": [{"name": "http", "containerPort": HTTP_PORT}]}]},
                         "status": {"phase": "Running", "podIP": address(s * per_service + p)}})
    return {"pods": pods, "replicasets": replicasets}, deployments


async def measure(reader: ServingReader, kube: CountingKube, periods: int, period: float,
                  per_service: int) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=reader.settings.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=reader.settings.concurrency)) as session:
        await reader.read_once(session)  # warm-up: the first scrape of every pod opens the windows
        await asyncio.sleep(period)  # as the reader does: the next read is a period later, with counters moved
        usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        reads, staleness, complete, unreachable = [], [], True, 0
        for _ in range(periods):
            started = time.monotonic()
            blocks = await reader.read_once(session)
            reads.append(time.monotonic() - started)
            step = int(time.time() / period)
            for block in blocks.values():
                complete &= block["scraped"] == per_service and "ttftP95Seconds" in block
                unreachable += block["unreachable"]
            # Each pod's queue is `step % 7`: what the written block says tells which step it saw.
            latest = {}
            for _, path, status in kube.writes:
                latest[path] = status["serving"]["waiting"] // per_service
            staleness += [(step - seen) % 7 for seen in latest.values()]
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))
        usage1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    return {"cpu_cores": cpu / (wall1 - wall0), "cpu_s_per_period": cpu / periods,
            "read_s_median": statistics.median(reads), "read_s_max": max(reads),
            "max_staleness_periods": max(staleness), "all_figures_present": complete,
            "unreachable_scrapes": unreachable,
            "writes_per_period": len(kube.writes) / (periods + 1)}


def main(argv: list[str] | None = None) -> None:
    """Run the bench with the command line's (or `argv`'s) settings; print the figures as JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--services", type=int, default=50)
    p.add_argument("--pods", type=int, default=4)
    p.add_argument("--period", type=float, default=10.0)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--periods", type=int, default=6)
    args = p.parse_args(argv)
    n = args.services * args.pods
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=([address(i) for i in range(n)], args.period, ready),
                                     daemon=True)
    server.start()
    try:
        if not ready.wait(60):
            raise SystemExit(f"the fake engine pods did not start (exit code {server.exitcode})")
        objects, deployments = cluster(args.services, args.pods)
        kube = CountingKube(objects)
        reader = ServingReader(kube, [], ReaderSettings(period_s=args.period, window_s=args.window),  # type: ignore[arg-type]  # a stand-in Kube
                               deployments=lambda: deployments)
        result = asyncio.run(measure(reader, kube, args.periods, args.period, args.pods))
    finally:
        server.terminate()
        server.join(10)
    print(json.dumps({"services": args.services, "pods": n, "period_s": args.period, "window_s": args.window,
                      "body_bytes": len(body(0, 10_000, 0)), **{k: round(v, 4) if isinstance(v, float) else v
                                                                 for k, v in result.items()}}, indent=2))


if __name__ == "__main__":
    main()
