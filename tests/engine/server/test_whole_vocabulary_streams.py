"""Streams of the whole vocabulary's logprobs (--max-logprobs -1, top_logprobs -1): 49k alternatives a token.

A chat stream's chunk, or a Responses stream's `output_text.delta`, carries its step's logprobs. Built on the event
loop (49k alternative objects a token, each named by a tokenizer decode), each step held /health and every other
request; steps the engine had queued meanwhile were built back to back, so the loop stayed held for most of the stream
(/health waited 116 s here, bench/reply_stall.py). A large step is now built on a large replies' thread and encoded in
pieces (json_reply.py), and a large Responses stream's end is built, encoded and sent a piece at a time. The tests
prove that /health is answered within a bound meanwhile, and that the stream's bytes are those the event loop wrote.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from .conftest import API_KEY, start_server, stop_server

VOCAB = 49152  # the embedded model's
DISTINCT_TEXTS = 48843  # its tokens' distinct decoded texts

FLAGS = ("--served-model-name", "m", "--max-model-len", "512", "--max-logprobs", "-1", "--disable-log-stats")


@pytest.fixture(scope="module")
def vocab_server(embedded_model_dir, tmp_path_factory):
    """The embedded model, any number of logprobs a token (the whole vocabulary with -1). (The tiny models' steps are
    so fast that the core process sends many at once, and their outputs' unpickling, one C call holding the GIL,
    ~0.1 s a token of 49k alternatives here, is then the longest stall: not what these tests measure.)"""
    s = start_server(embedded_model_dir, tmp_path_factory.mktemp("vocab-streams") / "server.log", *FLAGS,
                     env={"VLLM_API_KEY": API_KEY})
    yield s
    stop_server(s)


# The longest /health wait allowed while a whole-vocabulary stream runs. On the loaded 2-core test machine (load ~6-8):
# chat's steps built on the loop held it 14.1 s, off it 0.28 s. The Responses stream held it 4.8 s on the loop, 2.5 s
# off it with the openai client here, which reads slower than the server writes: no test of that could tell the two
# apart, so none is kept (a few minutes of CI); that its steps went off the loop is proven by the byte test's count
# below, and bench/reply_stall.py shows the stall (39-51 s before, 1.5-2.2 s after).
HEALTH_BOUND_S = 10.0
TOKENS = 32


# /health asked every 20 ms until stdin closes, then the longest wait and the count of answers printed. In a process
# of its own: the openai client's parse of a large event (json.loads, pydantic) holds this process's GIL for seconds,
# and a thread here would count that as the server's.
TICKER = """
import sys, threading, time
import httpx
done, waits = threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
with httpx.Client(timeout=600) as client:
    while not done.is_set():
        asked = time.monotonic()
        while True:
            try:
                assert client.get(sys.argv[1] + "/health").status_code == 200
                break
            except httpx.TransportError:  # the keep-alive connection closed during a stall: ask again
                pass
        waits.append(time.monotonic() - asked)
        time.sleep(0.02)
print(max(waits, default=0.0), len(waits))
"""


def _longest_health_wait(url: str, stream: object, read: object) -> tuple[float, int, object]:
    """`read(stream)` while /health is asked every 20 ms (from another process): the longest wait for an answer, how
    many were answered, and what `read` returned."""
    ticker = subprocess.Popen([sys.executable, "-c", TICKER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        result = read(stream)  # type: ignore[operator]
    finally:
        out, _ = ticker.communicate("", timeout=600)
    longest, answers = out.split()
    return float(longest), int(answers), result


def test_health_is_answered_within_a_bound_while_a_whole_vocabulary_chat_stream_runs(vocab_server):
    client = openai.OpenAI(base_url=f"{vocab_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=600)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=TOKENS, logprobs=True,
        top_logprobs=-1, stream=True, extra_body={"ignore_eos": True})

    def read(chunks):
        return [t for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                for t in chunk.choices[0].logprobs.content]

    longest, answers, tokens = _longest_health_wait(vocab_server.url, stream, read)
    assert len(tokens) == TOKENS and all(len(t.top_logprobs) == VOCAB for t in tokens)
    print(f"/health waited at most {longest:.2f} s ({answers} answers)")
    assert longest < HEALTH_BOUND_S, f"/health waited {longest:.1f} s ({answers} answers)"


# Completions choices of one token each, their whole vocabulary's logprobs in the stream's one step: ~0.8 s of building
# and encoding a choice here
WIDE_N = 4


def test_health_is_answered_before_a_whole_vocabulary_completions_streams_first_chunk(vocab_server):
    # Order, not time: the stream's head goes out once the engine's one output (its last: max_tokens 1) is in, and its
    # step is built after it. Built on the event loop, /health asked from then on was answered only after that step.
    client = openai.OpenAI(base_url=f"{vocab_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=600)
    head, first_chunk = threading.Event(), threading.Event()
    body: list[bytes] = []

    def big() -> None:
        with client.completions.with_streaming_response.create(model="m", prompt="hello", max_tokens=1, n=WIDE_N,
                                                               logprobs=VOCAB, stream=True) as response:
            head.set()
            for chunk in response.iter_bytes():
                first_chunk.set()
                body.append(chunk)

    thread = threading.Thread(target=big)
    thread.start()
    try:
        while not head.is_set():  # a wait: the test's clock decides nothing
            assert thread.is_alive(), "the stream ended before its head came"
            time.sleep(0.01)
        answered = []
        for _ in range(3):
            assert httpx.get(f"{vocab_server.url}/health", timeout=600).status_code == 200
            answered.append(not first_chunk.is_set())
    finally:
        thread.join(600)
    assert answered == [True] * 3, answered
    events = [json.loads(e[len("data: "):]) for e in b"".join(body).decode().split("\n\n") if e.startswith("data: {")]
    choices = [e["choices"][0] for e in events]
    assert sorted(c["index"] for c in choices) == list(range(WIDE_N))
    # keyed by their texts: the vocabulary's 48,843 distinct ones (some tokens decode alike)
    assert all(len(c["logprobs"]["top_logprobs"][0]) == DISTINCT_TEXTS for c in choices)


# --- the bytes: the same engine outputs streamed with large steps built off the loop, and all on it -----------------

STEPS = 8
TOP = 5000  # a step past the 4,096 values that go off the loop; the Responses end (40k entries an event) in pieces


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


def _outputs(tokenizer, seed: int) -> list:
    """A choice's delta outputs, one token a step, each with `TOP` alternatives' logprobs (the engine's shape)."""
    from flotilla.engine.outputs import CompletionOutput, RequestOutput

    rng = random.Random(seed)
    outputs = []
    for step in range(STEPS):
        alternatives = rng.sample(range(VOCAB), TOP)
        token = alternatives[rng.randrange(TOP)]
        entry = {t: (-rng.random() * 20 - rank * 1e-3, rank + 1) for rank, t in enumerate(alternatives)}
        last = step == STEPS - 1
        outputs.append(RequestOutput("r", None, [1, 2, 3], outputs=[CompletionOutput(
            0, tokenizer.decode([token]), [token], finish_reason="length" if last else None, logprobs=[entry])],
            finished=last))
    return outputs


async def _replayed(outputs: list):
    for output in outputs:
        yield output


def _collected(stream) -> list[str]:
    async def collect() -> list[str]:
        return [piece async for piece in stream]

    return asyncio.run(collect())


def _on_loop(monkeypatch) -> None:
    """Every step and stream end built on the event loop, whatever its size (the server as it was)."""
    from flotilla.engine.server import json_reply, responses, serving, tool_stream

    for module in (json_reply, responses, serving, tool_stream):
        monkeypatch.setattr(module, "OFF_LOOP_VALUES", 10**15, raising=False)  # (tool_stream had none)


def _counting_off_loop(monkeypatch) -> list[int]:
    """How many pieces of work run on a large replies' thread, counted from now."""
    from flotilla.engine.server import json_reply

    runs: list[int] = []
    without_gc = json_reply._without_gc

    def counted(work):
        runs.append(1)
        return without_gc(work)

    monkeypatch.setattr(json_reply, "_without_gc", counted)
    return runs


def _same_ids(text: str) -> str:
    """`text` with its random ids (a tool call's, a Responses message's) made one."""
    return re.sub(r"[0-9a-f]{32}", "x", text)


def _serving(tokenizer):
    from flotilla.engine.server.serving import OpenAIServing

    return OpenAIServing(None, tokenizer, 512, VOCAB)  # the streams read no engine


def _chat_stream(tokenizer, tools: bool) -> list[str]:
    from flotilla.engine.server.protocol import ChatCompletionRequest
    from flotilla.engine.server.sse import ChunkFormat
    from flotilla.engine.server.tool_calls import ToolPlan
    from flotilla.engine.server.tool_stream import stream_tool_chat

    serving = _serving(tokenizer)
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hello"}], logprobs=True, top_logprobs=TOP,
                                stream=True)
    outputs = _replayed(_outputs(tokenizer, seed=1))
    if not tools:
        return _collected(serving._stream_chat(req, outputs, "chatcmpl-1", 0, "m"))
    head = ChunkFormat("chatcmpl-1", "chat.completion.chunk", 0, "m")
    return _collected(stream_tool_chat(ToolPlan("named", [], function="f"), None, 1, outputs, head, None,
                                       logprobs_of=serving.logprobs_of(req)))


@pytest.mark.parametrize("tools", [False, True], ids=["chat", "tools-stream"])
def test_a_chat_streams_large_steps_are_the_loops_to_the_byte(tokenizer, monkeypatch, tools):
    with monkeypatch.context() as on_loop:
        _on_loop(on_loop)
        before = _chat_stream(tokenizer, tools)
    runs = _counting_off_loop(monkeypatch)
    after = _chat_stream(tokenizer, tools)
    assert len(runs) == STEPS  # each step built off the loop
    assert [_same_ids(c) for c in after] == [_same_ids(c) for c in before]  # chunk by chunk
    assert sum(piece.count('"top_logprobs": [{') for piece in after) == STEPS


def _completion_stream(tokenizer) -> list[str]:
    from flotilla.engine.server.protocol import CompletionRequest
    from flotilla.engine.server.serving import Prompt

    req = CompletionRequest(model="m", prompt="hello", logprobs=TOP, stream=True)  # no echo: each step its token's
    return _collected(_serving(tokenizer)._stream_completions(req, [Prompt([1, 2, 3], "hello")],
                                                              [_replayed(_outputs(tokenizer, seed=3))],
                                                              "cmpl-1", 0, "m"))


def test_a_completions_streams_large_steps_are_the_loops_to_the_byte(tokenizer, monkeypatch):
    # Without echo, a step carries only its tokens' logprobs; counted as a large step only with echo's prompt, every
    # step of the whole vocabulary's was built on the loop
    with monkeypatch.context() as on_loop:
        _on_loop(on_loop)
        before = _completion_stream(tokenizer)
    runs = _counting_off_loop(monkeypatch)
    after = _completion_stream(tokenizer)
    assert len(runs) == STEPS  # each step built off the loop
    assert after == before  # chunk by chunk
    assert sum(piece.count('"top_logprobs": [{') for piece in after) == STEPS


def _responses_stream(tokenizer) -> tuple[list[str], bytes]:
    from flotilla.engine.server.protocol import ChatCompletionRequest
    from flotilla.engine.server.responses import ResponsesRequest, ResponsesServing, _response
    from flotilla.engine.server.serving import Prompt
    from flotilla.engine.server.tool_calls import ToolPlan

    serving = _serving(tokenizer)
    responses = ResponsesServing(serving)
    req = ResponsesRequest(model="m", input="hello", include=["message.output_text.logprobs"], top_logprobs=TOP,
                           stream=True)
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hello"}], logprobs=True, top_logprobs=TOP)
    base = {**_response(req, "resp_1", "m"), "created_at": 0}
    events = _collected(responses._events(req, base, ToolPlan("none", []), None,
                                          _replayed(_outputs(tokenizer, seed=2)), [], serving.logprobs_of(chat),
                                          Prompt([1, 2, 3], "hello")))
    return events, responses.get("resp_1")


def test_a_responses_streams_large_steps_and_end_are_the_loops_to_the_byte(tokenizer, monkeypatch):
    with monkeypatch.context() as on_loop:
        _on_loop(on_loop)
        before, stored_before = _responses_stream(tokenizer)
    runs = _counting_off_loop(monkeypatch)
    after, stored_after = _responses_stream(tokenizer)

    assert _same_ids("".join(after)) == _same_ids("".join(before))
    assert _same_ids(stored_after.decode()) == _same_ids(stored_before.decode())
    # created, in_progress, the message's two opening events and its deltas: event by event
    opened = 4 + STEPS
    assert [_same_ids(e) for e in after[:opened]] == [_same_ids(e) for e in before[:opened]]
    assert sum(e.startswith("event: response.output_text.delta") for e in after[:opened]) == STEPS
    # the end: 4 events (3 of 40k entries each), sent in pieces of about 1 MiB
    end = after[opened:]
    assert len(before) == opened + 4 and len(end) > 4 and max(map(len, end)) < 2 * 2**20
    # each step's conversion and its delta; the stored copy; then the end's pieces (one more call finds none left)
    assert len(runs) == 2 * STEPS + 1 + len(end) + 1


def test_minus_one_logprobs_with_max_logprobs_minus_one_return_the_whole_vocabulary(vocab_server):
    # vLLM's -1 (every vocabulary entry) for chat's and the Responses API's top_logprobs and for prompt_logprobs,
    # not streamed, served under --max-logprobs -1 (this module's server: a server of its own cost CI a start).
    client = openai.OpenAI(base_url=f"{vocab_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                                          logprobs=True, top_logprobs=-1)
    [token] = chat.choices[0].logprobs.content
    assert len(token.top_logprobs) == VOCAB
    completion = client.completions.create(model="m", prompt="Hello there", max_tokens=1,
                                           extra_body={"prompt_logprobs": -1})
    entries = completion.choices[0].model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) > 1
    assert all(len(entry) == VOCAB for entry in entries[1:])
    response = client.responses.create(model="m", input="Hi", max_output_tokens=1, top_logprobs=-1,
                                       include=["message.output_text.logprobs"])
    [token] = response.output[0].content[0].logprobs
    assert len(token.top_logprobs) == VOCAB and response.top_logprobs == -1
