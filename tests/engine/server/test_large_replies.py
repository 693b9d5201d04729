"""A large non-streamed reply (engine/server/json_reply.py) is built and encoded while the server goes on answering.

One legal request (n choices, each echoing a long prompt with its logprobs) asks for a reply of hundreds of
thousands of values. Its choices were built on the event loop and its body encoded there by one json.dumps, so
/health and every other request waited for both (~9 s for 1.4M entries here). The tests prove the order, not a
time: the engine's part of the big request is over once the server logs its end (--enable-log-requests); what
follows is the front end's, and /health and a small request sent from then on must be answered before the big
reply's head comes back (on the event loop, none was: they waited for the whole reply to be built and encoded).
The big request is made and read by a process of its own (BigRequest), so that reading it takes none of the test
process's GIL from the threads that time the others.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from flotilla.engine.server.embeddings import MAX_EMBEDDING_INPUTS

from .conftest import API_KEY, Server, start_server, stop_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "hello " * 400  # ~400 tokens of the 512-token context
N = 32
# The embedding model's hidden size: each vector is WIDE floats, so 2,048 inputs (OpenAI's cap on one request's
# list) make a reply of 1.3M floats
WIDE = 640


@pytest.fixture(scope="module")
def logging_server(tiny_model_dirs, tmp_path_factory):
    """The tiny Llama with a 512-token context, logging each engine request's end, up to 1000 logprobs a token."""
    s = start_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("large-replies") / "server.log",
                     "--served-model-name", "tiny", "--max-model-len", "512", "--enable-log-requests",
                     "--max-logprobs", "1000",
                     "--disable-log-stats", env={"VLLM_API_KEY": API_KEY})
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def logging_pooling_server(tiny_model_dirs, tmp_path_factory):
    """A wide tiny Llama (hidden size WIDE) as an embedding model (--runner pooling), logging each request's end."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = tiny_model_dirs["llama"]
    config = AutoConfig.from_pretrained(source)
    # Heads of 64; tied, so the checkpoint holds the vocabulary's rows once (~126 MB)
    config.update({"hidden_size": WIDE, "num_attention_heads": WIDE // 64, "head_dim": 64,
                   "tie_word_embeddings": True})
    torch.manual_seed(11)
    path = tmp_path_factory.mktemp("wide") / "llama"
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    s = start_server(path, path.parent / "server.log",
                     "--served-model-name", "tiny", "--max-model-len", "512", "--runner", "pooling",
                     "--enable-log-requests", "--disable-log-stats", env={"VLLM_API_KEY": API_KEY})
    yield s
    stop_server(s)


BIG = {
    # 32 choices, each echoing the prompt with 20 logprobs a token and 20 prompt_logprobs: ~540k entries
    "completions": ("/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "n": N, "echo": True,
                                        "logprobs": 20, "prompt_logprobs": 20}),
    # The prompt's 500 most likely tokens at each of its ~400 positions (prompt_logprobs, beside the choices), and
    # 4 choices of 8 tokens with their 20 most likely: ~200k entries
    "chat": ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}],
                                      "max_tokens": 8, "ignore_eos": True, "n": 4, "logprobs": True,
                                      "top_logprobs": 20, "prompt_logprobs": 500}),
}

# 64 choices, each echoing the prompt with 20 logprobs a token, in their first chunks: ~540k entries
STREAMED = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "n": 2 * N, "echo": True, "logprobs": 20}
READER = Path(__file__).with_name("big_reply_reader.py")
SMALL = {"model": "tiny", "prompt": "hi", "max_tokens": 2}  # the small request answered beside a big one


class BigRequest:
    """The big request, made and read by a process of its own (big_reply_reader.py): read on a thread of the test's
    process, a big reply (up to 118 MB of SSE, parsed line by line) held that process's GIL against the threads
    that time the test's other requests, and ate the margin the order is proven by. `marker`: the stage of the big
    reply the others are timed against ("head", "first-chunk", "line:TEXT" or "line-with:TEXT", see
    big_reply_reader.py); `out`: the file its reply is written to; `watch`: a line marker's stage "watched" is reached
    once a line holds this text."""

    def __init__(self, url: str, body: dict, marker: str, out: Path, watch: str | None = None) -> None:
        self.out = out
        self.stages: dict[str, list[str]] = {}  # stage reached: what the reader told of it (its time, ...)
        self._told = b""
        self._lock = threading.Lock()
        self.process = subprocess.Popen([sys.executable, str(READER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps({"url": url, "body": body, "api_key": API_KEY, "marker": marker,
                                             "out": str(out), "watch": watch}).encode())
        self.process.stdin.close()
        # Read without blocking: whether a stage is reached is asked, never waited for, by the threads timed
        os.set_blocking(self.process.stdout.fileno(), False)

    def reached(self, stage: str) -> bool:
        """Whether the reader has told of `stage` by now."""
        with self._lock:
            assert self.process.stdout
            while True:
                try:
                    told = os.read(self.process.stdout.fileno(), 65536)
                except BlockingIOError:
                    break
                if not told:
                    break
                self._told += told
            *lines, self._told = self._told.split(b"\n")
            for line in lines:
                name, *fields = line.decode().split()
                self.stages[name] = fields
            return stage in self.stages

    def alive(self) -> bool:
        """Whether the reader is still reading."""
        return self.process.poll() is None

    def finished(self) -> tuple[int, bytes]:
        """The ended reader's big reply: its status and body."""
        assert self.process.wait() == 0, "the big request's reader failed"
        assert self.reached("head"), "the big request's reader ended before its reply's head"
        return int(self.stages["head"][1]), self.out.read_bytes()


def _until_logged(server: Server, pattern: str) -> Callable[[BigRequest], None]:
    """A wait until the server's log, from its length now (before the big request is sent), matches `pattern`: the
    big request's engine part is over (a wait: the test's clock decides nothing)."""
    since = len(server.log.read_text())

    def wait(big: BigRequest) -> None:
        while not re.search(pattern, server.log.read_text()[since:]):
            assert big.alive(), "the big request ended before its engine request was logged as finished"
            time.sleep(0.01)

    return wait


def _until_reached(stage: str, what: str) -> Callable[[BigRequest], None]:
    """A wait until the big request reaches `stage` with a 200 (`what`: that stage, in words)."""

    def wait(big: BigRequest) -> None:
        while not big.reached(stage):  # a wait: the test's clock decides nothing
            assert big.alive(), f"the big request ended before {what}"
            time.sleep(0.01)
        assert big.stages["head"][1] == "200", big.stages["head"]

    return wait


def _answered_before(url: str, big: BigRequest, until: Callable[[BigRequest], None], path: str,
                     body: dict) -> list[bool]:
    """Wait `until` the big request's engine part is over; then /health three times and one small request to
    `path`, all at once (one after another, a slow answer would leave the next call less of the big reply's build to
    be answered in: the order is what the tests prove, not the sum of four requests' times): for each, in order,
    whether the big reply had not yet reached its marker when its answer (a 200) came. Prints each answer's margin,
    seconds before the marker (negative: after it)."""
    calls = [functools.partial(httpx.get, f"{url}/health", timeout=600)] * 3 + [
        functools.partial(httpx.post, f"{url}{path}", json=body, headers=AUTH, timeout=600)]
    answered: list[tuple[bool, float] | None] = [None] * len(calls)

    def call(i: int) -> None:
        reply = calls[i]()
        at = time.monotonic()
        assert reply.status_code == 200, reply.text
        answered[i] = not big.reached("marker"), at

    try:
        until(big)
        with ThreadPoolExecutor(len(calls)) as pool:
            for future in [pool.submit(call, i) for i in range(len(calls))]:
                future.result()
    finally:
        try:
            big.process.wait(600)
        finally:
            big.process.kill()  # (a no-op once it has ended)
    if big.reached("marker"):
        print("margins (s):", [round(float(big.stages["marker"][0]) - a[1], 3) for a in answered if a])
    return [bool(a and a[0]) for a in answered]


@pytest.mark.parametrize("kind", list(BIG))
def test_health_and_a_small_request_are_answered_while_a_large_reply_is_built(logging_server, kind, tmp_path):
    url = logging_server.url
    path, body = BIG[kind]
    tag = f"big-{kind}-{time.monotonic_ns()}"
    until = _until_logged(logging_server, rf"Finished request \w*cmpl-{tag}-")
    big = BigRequest(f"{url}{path}", {**body, "request_id": tag}, "head", tmp_path / "reply")
    # From its engine request's end on, the big request is the front end's alone: building, encoding
    before_head = _answered_before(url, big, until, "/v1/completions", SMALL)
    # On the event loop, each waited for the big reply to be built and encoded: none came before its head
    assert before_head == [True] * 4, before_head
    status, raw = big.finished()
    assert status == 200
    reply = json.loads(raw)
    assert len(reply["choices"]) == body["n"]
    if kind == "completions":
        prompt_tokens = reply["usage"]["prompt_tokens"]
        assert all(len(c["logprobs"]["tokens"]) == prompt_tokens + 1 for c in reply["choices"])
        assert all(len(c["prompt_logprobs"]) == prompt_tokens for c in reply["choices"])
    else:
        assert all(len(c["logprobs"]["content"]) == 8 for c in reply["choices"])
        assert all(len(t["top_logprobs"]) == 20 for c in reply["choices"] for t in c["logprobs"]["content"])
        assert len(reply["prompt_logprobs"]) == reply["usage"]["prompt_tokens"]
        assert all(len(entry) >= 500 for entry in reply["prompt_logprobs"][1:])


def test_health_and_a_small_request_are_answered_while_a_large_first_stream_chunk_is_built(logging_server, tmp_path):
    # Streamed (without prompt_logprobs, which a stream cannot carry), the same request's first step holds every
    # choice's echoed prompt with its logprobs: the head goes out once the engine's first output is in, and that
    # step is built after it (on the event loop, every other request waited for it).
    url = logging_server.url
    big = BigRequest(f"{url}/v1/completions", {**STREAMED, "stream": True}, "first-chunk", tmp_path / "reply")
    before_first_chunk = _answered_before(url, big, _until_reached("head", "its head came"), "/v1/completions",
                                          SMALL)
    assert before_first_chunk == [True] * 4, before_first_chunk
    status, raw = big.finished()
    assert status == 200
    events = [json.loads(line[len("data: "):]) for line in raw.decode().split("\n\n")
              if line.startswith("data: {")]
    echoed = [e["choices"][0] for e in events if len(e["choices"][0]["logprobs"]["tokens"]) > 1]
    assert sorted(c["index"] for c in echoed) == list(range(2 * N))
    assert all(len(c["logprobs"]["tokens"]) > 400 for c in echoed)


def test_health_and_a_small_request_are_answered_while_many_embeddings_are_encoded(logging_pooling_server,
                                                                                  tmp_path):
    # 2,048 one-token inputs (the most one request may list): 1.3M floats (hidden size 640). FastAPI encoded the
    # reply on the event loop (jsonable_encoder, Python over every float, then json.dumps): /health and every other
    # request waited.
    server = logging_pooling_server
    tag = f"big-embeddings-{time.monotonic_ns()}"
    until = _until_logged(server, rf"Finished request embd-{tag}\.")
    big = BigRequest(f"{server.url}/v1/embeddings",
                     {"model": "tiny", "input": [[5]] * MAX_EMBEDDING_INPUTS, "request_id": tag}, "head",
                     tmp_path / "reply")
    before_head = _answered_before(server.url, big, until, "/v1/embeddings", {"model": "tiny", "input": "hi"})
    assert before_head == [True] * 4, before_head
    status, raw = big.finished()
    assert status == 200
    data = json.loads(raw)["data"]
    assert [d["index"] for d in data] == list(range(MAX_EMBEDDING_INPUTS))
    assert all(len(d["embedding"]) == WIDE for d in data)


def test_enable_log_requests_logs_embedding_requests_too(logging_pooling_server):
    # vLLM's --enable-log-requests (test_vllm_manifest_flags.py's generation lines) on an embeddings request: its
    # Received line names the request and its pooling parameters, its Finished line follows, and the prompt is not
    # logged at INFO. Here, on this module's logging pooling server (a server of its own cost CI a start).
    server = logging_pooling_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    response = client.embeddings.create(model="tiny", input=["a quiet harbour", "two"],
                                        extra_body={"request_id": "manifest-embed-check"})
    assert response.usage.prompt_tokens > 0
    deadline = time.monotonic() + 30  # log lines are flushed as they are written, but not instantly
    while "Finished request embd-manifest-embed-check" not in (log := server.log.read_text()):
        assert time.monotonic() < deadline, "the embeddings request's end was never logged"
        time.sleep(0.2)
    received = [line for line in log.splitlines() if "Received request embd-manifest-embed-check" in line]
    assert len(received) == 1 and "normalize=True" in received[0]
    assert "quiet harbour" not in log  # the prompts only at DEBUG, which this server is not at

def test_health_and_a_small_request_are_answered_while_a_large_responses_streams_end_is_built(logging_server,
                                                                                              tmp_path):
    # A Responses stream's closing events (response.output_text.done, response.output_item.done, response.completed)
    # and its stored copy each carry the whole output's logprobs: 400 tokens of 1000 alternatives, 400k entries. Built
    # and encoded on the event loop once the engine's part was over, they held /health and every other request.
    url = logging_server.url
    tag = f"resp_big-{time.monotonic_ns()}"
    until = _until_logged(logging_server, rf"Finished request {tag}-")
    # The marker: the first closing event came
    big = BigRequest(f"{url}/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 400,
                                             "ignore_eos": True, "include": ["message.output_text.logprobs"],
                                             "top_logprobs": 1000, "stream": True, "request_id": tag},
                     "line:event: response.output_text.done", tmp_path / "reply")
    # From its engine request's end on, the stream is the front end's alone: its end's events and stored copy
    before_end = _answered_before(url, big, until, "/v1/completions", SMALL)
    assert before_end == [True] * 4, before_end
    status, raw = big.finished()
    assert status == 200
    lines = raw.decode().split("\n")
    events = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    streamed = [entry for e in events if e["type"] == "response.output_text.delta" for entry in e["logprobs"]]
    [done] = [e for e in events if e["type"] == "response.output_text.done"]
    part = events[-1]["response"]["output"][0]["content"][0]
    assert events[-1]["type"] == "response.incomplete" and len(part["logprobs"]) == 400
    assert all(len(entry["top_logprobs"]) == 1000 for entry in part["logprobs"])
    assert done["logprobs"] == streamed == [{"token": e["token"], "logprob": e["logprob"], "top_logprobs": [
        {"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]]} for e in part["logprobs"]]
    stored = httpx.get(f"{url}/v1/responses/{tag}", headers=AUTH, timeout=600).json()
    assert stored == events[-1]["response"]
