"""The server with asynchronous scheduling (the CUDA default, forced on here on the CPU): concurrent
streams, stop strings and n > 1 give the synchronous server's outputs; a disconnect frees everything.
This module's server runs its engine on a thread (VLLM_ENABLE_V1_MULTIPROCESSING=0), the shared one in
an engine-core process: the two paths are held to the same outputs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from .conftest import API_KEY, Server, start_tiny_server, stop_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def async_server(tiny_model_dirs, tmp_path_factory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("async-server") / "server.log"
    # The engine on a thread of the server (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that the in-process path
    # keeps a test: its streams must equal the shared server's, whose engine core runs in its own process.
    s = start_tiny_server(tiny_model_dirs["llama"], log, "--async-scheduling",
                          env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    yield s
    stop_server(s)


def _streams(server: Server, requests: list[dict]) -> list[list[tuple[str, str | None]]]:
    """Each request streamed at once; per request, (text, finish_reason) of every choice index."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)

    async def one(body: dict) -> list[tuple[str, str | None]]:
        stream = await client.completions.create(model="tiny", stream=True, **body)
        texts: dict[int, str] = {}
        reasons: dict[int, str | None] = {}
        async for chunk in stream:
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
                reasons[c.index] = c.finish_reason or reasons.get(c.index)
        return [(texts[i], reasons[i]) for i in sorted(texts)]

    async def all_of_them():
        return await asyncio.gather(*(one(b) for b in requests))

    return asyncio.run(all_of_them())


def test_concurrent_streams_match_the_synchronous_server(server, async_server):
    base = [{"prompt": f"Harbour log {i}: the tide", "max_tokens": 14, "temperature": 0} for i in range(12)]
    reference = _streams(server, base[:2])
    stop = reference[1][0][0][5:8]  # a piece of one output, so the stop string fires mid-stream
    requests = [
        *base,
        {**base[1], "stop": [stop]},
        {**base[2], "n": 2, "temperature": 0.8, "seed": 11},
        {**base[3], "max_tokens": 1},
    ]
    sync = _streams(server, requests)
    overlapped = _streams(async_server, requests)
    assert overlapped == sync
    assert sync[12][0][1] == "stop" and len(sync[13]) == 2


def test_a_disconnect_mid_stream_frees_everything(async_server):
    body = {"model": "tiny", "prompt": "A long story", "max_tokens": 200, "min_tokens": 200, "stream": True}
    with httpx.stream("POST", f"{async_server.url}/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        lines = r.iter_lines()
        assert any(next(lines).startswith("data: ") for _ in range(6))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (
            async_server.metric("vllm:num_requests_running") == 0
            and async_server.metric("vllm:kv_cache_usage_perc") == 0
        ):
            return
        time.sleep(0.1)
    raise AssertionError("the aborted request still holds the engine")
