"""Concurrency, client disconnects and SIGTERM drain on the real server."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import struct
import threading
import time

import httpx
import pytest

from flotilla.engine.config import ServerConfig

from .conftest import API_KEY, start_server, stop_server, wait_until_engine_idle

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _wait_until(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_64_concurrent_streams_match_their_solo_runs(client, async_client):
    prompts = [f"Voyage number {i}: the ship" for i in range(64)]
    solo = {
        p: client.completions.create(model="tiny", prompt=p, max_tokens=10, temperature=0).choices[0].text
        for p in prompts[:8]
    }

    async def one(prompt: str) -> str:
        stream = await async_client.completions.create(
            model="tiny", prompt=prompt, max_tokens=10, temperature=0, stream=True
        )
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_of_them() -> list[str]:
        return await asyncio.gather(*(one(p) for p in prompts))

    texts = asyncio.run(all_of_them())
    assert all(texts)
    assert {p: t for p, t in zip(prompts, texts, strict=True) if p in solo} == solo
    assert len(set(texts)) > 1


def test_a_client_disconnect_mid_stream_frees_its_blocks(server):
    body = {
        "model": "tiny",
        "prompt": "A long story",
        "max_tokens": 200,
        "min_tokens": 200,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=60) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in received)
        assert server.metric("vllm:num_requests_running") >= 1 or server.metric("vllm:kv_cache_usage_perc") > 0
    # Closing the stream aborts the request: the running gauge and KV usage return to zero quickly,
    # long before 200 tokens could have been generated.
    assert _wait_until(
        lambda: server.metric("vllm:num_requests_running") == 0 and server.metric("vllm:kv_cache_usage_perc") == 0,
        timeout=10,
    )


@pytest.mark.parametrize(("path", "stream"), [("/v1/chat/completions", True), ("/v1/chat/completions", False),
                                              ("/v1/responses", True), ("/v1/responses", False)])
def test_a_client_that_leaves_chat_or_responses_mid_generation_frees_the_engine(server, path, stream):
    """The completions stream's disconnect is tested above; chat and Responses, streamed or not, have their own
    routes to the engine. A client that hangs up while its 200 tokens generate: the engine ends idle, no KV block held,
    and the request did not end at its length (a disconnect not heard ends it there, `min_tokens` forbidding a stop;
    an aborted request is not counted in vllm:request_success_total)."""
    wait_until_engine_idle(server)
    length = {"max_output_tokens": 200} if path == "/v1/responses" else {"max_tokens": 200}
    prompt = {"input": "A long story"} if path == "/v1/responses" else {
        "messages": [{"role": "user", "content": "A long story"}]}
    body = json.dumps({"model": "tiny", **prompt, **length, "min_tokens": 200, "temperature": 0,
                       "stream": stream}).encode()
    finished = _finished(server, "length")
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.sendall(head + body)
        assert _wait_until(lambda: server.metric("vllm:num_requests_running") >= 1, timeout=120)
        if stream:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    wait_until_engine_idle(server)  # a wait: nothing running or waiting, no KV block held
    assert _finished(server, "length") == finished


def _finished(server, reason: str) -> float:
    """Requests finished for `reason` so far (vllm:request_success_total's finished_reason)."""
    return sum(value for key, value in server.metrics().items()
               if key.startswith("vllm:request_success_total{") and f'finished_reason="{reason}"' in key)


def _drop_mid_burst(server, body: bytes, events: int, reset: bool) -> None:
    """Stream `body` over a raw socket and hang up (a reset or a FIN) as soon as `events` SSE events came: with n
    choices a step, the server is then part-way through writing that step's burst of chunks."""
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.sendall(head + body)
        seen = 0
        while seen < events:
            data = sock.recv(65536)
            assert data, "the stream ended before the hang-up"
            seen += data.count(b"data: ")
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_streams_dropped_mid_burst_stop_writing_and_free_their_blocks(server):
    # A stream with n=32 writes 32 chunks a step. Written in one turn of the event loop, the chunks after a write
    # that found the client gone went to the dead socket (uvicorn hears of the loss a turn later), each past the
    # fifth logging asyncio's "socket.send() raised exception." (16 such hang-ups: hundreds of lines). Now the stream
    # writes one chunk a turn, stops once the loss is heard and aborts its request.
    log_before = server.log.read_text()
    n = 32
    # (logprobs make each chunk slower to write, so that more hang-ups land inside a burst)
    body = json.dumps({"model": "tiny", "prompt": "A long story", "max_tokens": 200, "min_tokens": 200,
                       "stream": True, "n": n, "logprobs": 5}).encode()
    # Each client hangs up inside a later step's burst (past the role chunk and the first step).
    clients = [threading.Thread(target=_drop_mid_burst, args=(server, body, n + 2 + 2 * i, i % 2 == 0))
               for i in range(16)]
    for client in clients:
        client.start()
    for client in clients:
        client.join(timeout=300)
    assert _wait_until(
        lambda: server.metric("vllm:num_requests_running") == 0 and server.metric("vllm:num_requests_waiting") == 0
        and server.metric("vllm:kv_cache_usage_perc") == 0,
        timeout=120,
    )
    new_log = server.log.read_text()[len(log_before):]
    assert "socket.send() raised exception" not in new_log, new_log[-2000:]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_sigterm_drains_in_flight_streams_then_exits_zero(tiny_model_dirs, tmp_path):
    server = start_server(
        tiny_model_dirs["llama"],
        tmp_path / "drain.log",
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "512",
        "--shutdown-timeout",
        "60",
    )
    try:
        body = {
            "model": "tiny",
            "prompt": "Drain me",
            "max_tokens": 450,  # long enough to be in flight when SIGTERM lands, even on an idle machine
            "min_tokens": 450,
            "temperature": 0,
            "stream": True,
        }
        chunks: list[str] = []

        def consume() -> None:
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as response:
                chunks.extend(line for line in response.iter_lines() if line.startswith("data: "))

        reader = threading.Thread(target=consume)
        reader.start()
        assert _wait_until(lambda: len(chunks) >= 3)
        server.process.send_signal(signal.SIGTERM)
        assert _wait_until(lambda: httpx.get(f"{server.url}/health").status_code == 503, timeout=5)
        refused = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "x"})
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        reader.join(timeout=120)
        assert chunks[-1] == "data: [DONE]"
        assert '"finish_reason": "length"' in chunks[-2]
        assert server.process.wait(timeout=30) == 0
    finally:
        stop_server(server)


def test_at_the_shutdown_timeout_requests_are_aborted_with_an_error_then_exit_zero(tiny_model_dirs, tmp_path):
    log = tmp_path / "abort.log"
    server = start_server(tiny_model_dirs["llama"], log, "--served-model-name", "tiny", "--max-model-len", "512",
                          "--shutdown-timeout", "0.5")
    try:
        body = {"model": "tiny", "prompt": "Never ending", "max_tokens": 500, "min_tokens": 500, "temperature": 0}
        streamed: list[str] = []
        answers: list[httpx.Response] = []

        def stream() -> None:
            with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True},
                              timeout=120) as response:
                streamed.extend(line for line in response.iter_lines() if line.startswith("data: "))

        def whole() -> None:
            answers.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=120))

        clients = [threading.Thread(target=stream), threading.Thread(target=whole)]
        for c in clients:
            c.start()
        assert _wait_until(lambda: len(streamed) >= 3 and server.metric("vllm:num_requests_running") == 2)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        for c in clients:
            c.join(timeout=60)
        assert server.process.wait(timeout=120) == 0  # a wait: a hang fails here
        # The drain waited its 0.5 s once, aborted, and the process left: well before the default drain (30 s)
        # would have ended, with room for a loaded machine's slow exit (torch, the engine core's process).
        assert time.monotonic() - signalled < ServerConfig().shutdown_timeout / 2
        # The stream ends with an OpenAI error event and [DONE], not a cut connection.
        assert streamed[-1] == "data: [DONE]"
        error = json.loads(streamed[-2].removeprefix("data: "))["error"]
        assert error["type"] == "ServiceUnavailableError" and "shutting down" in error["message"]
        # Cut short: fewer than the 500 tokens asked for came before the error and [DONE] (an idle machine
        # streamed 416 in the drain's 0.5 s, so no tighter bound holds everywhere).
        assert len(streamed) - 2 < 500
        # The non-streaming request gets a 503 with OpenAI's error JSON.
        assert answers[0].status_code == 503 and "shutting down" in answers[0].json()["error"]["message"]
        text = log.read_text()
        assert "drain timeout (0.5 s): aborting 2 requests" in text
        assert "Traceback" not in text
        assert "no API key" in text
    finally:
        stop_server(server)


def test_sigterm_drains_embeddings_and_a_rerank_in_flight_and_refuses_new_scores(tiny_model_dirs, tmp_path):
    """Embeddings and /rerank run as engine calls, not engine requests: the drain must wait for them too. The score
    routes sit outside /v1, where the Gate refused requests while draining and counted those in flight: a rerank in
    flight was cut when the engine looked idle, and a new score was let in. Now the drain waits for all three
    requests here and refuses a new score with a 503. (One server for both routes: a start costs CI ~10 s.)

    The work: two embeddings requests of 1,000 inputs of 200 tokens (within OpenAI's 2,048 a request) and a rerank of
    600 documents of ~200 tokens, tens of seconds, more than uvicorn's own 5 s grace after the drain. The drain may
    take its time: on a loaded 2-core machine the embeddings alone took over 120 s, and the drain's own timeout then
    answered 503 (a wait, not a timing assertion: 5 s is what it must outlast)."""
    server = start_server(tiny_model_dirs["llama"], tmp_path / "drain.log", "--served-model-name", "tiny",
                          "--max-model-len", "256", "--runner", "pooling", "--shutdown-timeout", "540",
                          "--enable-server-load-tracking")
    try:
        embeddings = [[[5 + (i + 1000 * r) % 100] * 200 for i in range(1000)] for r in range(2)]
        documents = [f"{i} " + "harbour " * 190 for i in range(600)]
        answers: dict[str, list[httpx.Response | Exception]] = {"embeddings": [], "rerank": []}

        def send(kind: str, path: str, body: dict) -> None:
            try:
                answers[kind].append(httpx.post(f"{server.url}{path}", json=body, timeout=600))
            except httpx.HTTPError as exc:
                answers[kind].append(exc)

        clients = [threading.Thread(target=send, args=("embeddings", "/v1/embeddings",
                                                       {"model": "tiny", "input": prompts}))
                   for prompts in embeddings]
        clients.append(threading.Thread(target=send, args=("rerank", "/rerank",
                                                           {"query": "boats", "documents": documents})))
        started = time.monotonic()
        for client in clients:
            client.start()
        # SIGTERM once the server holds the three requests (/load counts each from its first byte on, vLLM's
        # load_aware_call; a fixed 1.5 s sleep could signal before a loaded machine's client had even sent it, and
        # the refused connection failed this)
        assert _wait_until(lambda: httpx.get(f"{server.url}/load").json()["server_load"] == 3, timeout=60)
        time.sleep(0.5)  # the lists are being parsed, tokenized and embedded
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while (refused := httpx.post(f"{server.url}/score", json={"text_1": "a", "text_2": "b"})).status_code == 200:
            assert time.monotonic() < deadline, "a new score was still served a minute after SIGTERM"
            time.sleep(0.05)
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"], refused.text
        for client in clients:
            client.join(timeout=600)
        assert len(answers["embeddings"]) == 2, answers
        for answer in answers["embeddings"]:
            assert isinstance(answer, httpx.Response), answer
            assert answer.status_code == 200, (answer.status_code, answer.text[:200], time.monotonic() - started)
            assert len(answer.json()["data"]) == 1000
        (answer,) = answers["rerank"]
        assert isinstance(answer, httpx.Response), answer
        assert answer.status_code == 200, answer.text[:200]
        assert sorted(r["index"] for r in answer.json()["results"]) == list(range(600))
        assert server.process.wait(timeout=30) == 0
    finally:
        stop_server(server)
