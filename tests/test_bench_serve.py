"""bench/serve.py's client: one kept-alive connection per concurrency slot, and per-request time marks.

Against a small SSE endpoint served by uvicorn in a thread (no engine: this tests the load generator).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import serve


def _app(client_ports: list[int]) -> Starlette:
    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"data": [{"id": "fake"}]})

    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        assert request.client is not None
        client_ports.append(request.client.port)
        n = body["max_tokens"]

        async def chunks() -> AsyncIterator[str]:
            for _ in range(n):
                await asyncio.sleep(0.005)
                yield "data: " + json.dumps({"choices": [{"index": 0, "text": " a"}]}) + "\n\n"
            yield "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": n}}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])])


@pytest.fixture(scope="module")
def sse_server() -> Iterator[tuple[str, list[int]]]:
    """(base URL, the client port of every completion request so far)."""
    ports: list[int] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app(ports), host="127.0.0.1", port=port, log_level="warning",
                                           loop="asyncio", http="h11"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield f"http://127.0.0.1:{port}", ports
    server.should_exit = True
    thread.join(timeout=10)


def _args(**overrides: object) -> argparse.Namespace:
    args = dict(num_prompts=12, max_concurrency=3, input_len=8, output_len=4, range_ratio=0.0, vocab_size=1000,
                request_rate=float("inf"), model_name=None, api_key=None, goodput=None, random_prefix_len=0, seed=0)
    args.update(overrides)
    return argparse.Namespace(**args)


def test_each_slot_keeps_one_connection_and_requests_carry_time_marks(sse_server: tuple[str, list[int]],
                                                                      tmp_path: Path) -> None:
    url, ports = sse_server
    ports.clear()
    args = _args()
    results, start, end = asyncio.run(serve.run(args, url, seed=0))
    assert [r.ok for r in results] == [True] * 12
    assert all(r.output_tokens == 4 for r in results)
    # 12 requests through 3 slots: each slot's connection is reused, never more connections than slots.
    assert len(ports) == 12 and len(set(ports)) <= 3
    for r in results:
        assert r.t_start <= r.t_sent <= r.t_head <= r.t_end
    summary = serve.summarize(results, end - start, args)
    assert summary["completed"] == 12
    assert 0 <= summary["median_send_delay_ms"] <= summary["max_send_delay_ms"]
    assert summary["median_head_delay_ms"] >= 0
    log = tmp_path / "requests.jsonl"
    serve.write_request_log(results, str(log))
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 12 and all(row["ok"] and row["sent"] >= row["start"] for row in rows)
    assert [row["start"] for row in rows] == sorted(row["start"] for row in rows)


def test_a_random_prefix_is_shared_by_every_prompt_of_every_run():
    """--random-prefix-len: the same leading tokens in the warm-up's and the measured run's prompts, then
    each prompt's own random tokens."""
    args = _args(random_prefix_len=50, input_len=5, num_prompts=4)
    warmup, measured = serve.make_prompts(args, seed=1000), serve.make_prompts(args, seed=0)
    prefix = measured[0][:50]
    assert all(len(p) == 55 and p[:50] == prefix for p in warmup + measured)
    assert len({tuple(p[50:]) for p in warmup + measured}) == 8
    assert serve.make_prompts(_args(seed=1, random_prefix_len=50), seed=0)[0][:50] != prefix
