"""A completions request with several prompts, with the real `openai` client against the real server: as vLLM,
every prompt is submitted before any is waited on (their prefills can share engine steps, and the client's first
byte does not wait for each prompt's first token in turn), the streams merge with choice index = prompt x n + i,
a prompt the engine's rules refuse is a 400 before any prompt is submitted, and a client that leaves aborts every
one of them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.engine.server.conftest import (
    API_KEY,
    Server,
    start_tiny_server,
    stop_server,
    wait_until_engine_idle,
)

# Distinct 40-token prompts (no shared prefix): with a 16-token step budget each prefill takes several steps, so a
# prompt submitted only after another's first token could never be in the engine when that token came.
PROMPTS = [[(7 * k + 3 * j) % 900 + 10 for j in range(40)] for k in range(3)]


@pytest.fixture(scope="module")
def traced(tiny_model_dirs, tmp_path_factory) -> Iterator[tuple[Server, Path]]:
    """The tiny server with chunked prefill on a 16-token step budget, writing the engine's step trace."""
    folder = tmp_path_factory.mktemp("multi-prompt")
    trace = folder / "steps.jsonl"
    s = start_tiny_server(tiny_model_dirs["llama"], folder / "server.log", "--enable-chunked-prefill",
                          "--max-num-batched-tokens", "16", env={"FLOTILLA_STEP_TRACE": str(trace)})
    yield s, trace
    stop_server(s)


@pytest.fixture
def traced_client(traced) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{traced[0].url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def _steps(trace: Path) -> list[dict]:
    """The trace's whole lines (a line being written has no newline yet)."""
    text = trace.read_text() if trace.exists() else ""
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "reply"])
def test_every_prompt_is_in_the_engine_before_the_first_token(traced, traced_client, stream):
    # Was (streamed): prompt k+1 was submitted once prompt k's first output was in, so when the first token came
    # only one request was in the engine (running 1, waiting 0 on that step's trace line). The reply gathers its
    # prompts' requests, submitted together, likewise.
    server, trace = traced
    wait_until_engine_idle(server)
    seen = len(_steps(trace))
    reply = traced_client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=4, seed=3, stream=stream)
    assert len([c for chunk in reply for c in chunk.choices] if stream else reply.choices) >= len(PROMPTS)
    steps = _steps(trace)[seen:]
    first = next(s for s in steps if s.get("first"))
    assert first["running"] + first["waiting"] == len(PROMPTS), first
    assert sum(s.get("adds", 0) for s in steps[:steps.index(first) + 1]) == len(PROMPTS)


@pytest.mark.parametrize("prompt", [PROMPTS, [f"Story number {k} begins" for k in range(3)]],
                         ids=["token-lists", "texts"])
def test_a_multi_prompt_stream_equals_the_reply(traced_client, prompt):
    # Per choice (index = prompt x n + i) the stream's text joined, its finish reason and the usage are the reply's.
    args = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "n": 2, "seed": 5}
    reply = traced_client.completions.create(**args)
    chunks = list(traced_client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                assert c.index not in finish, "a choice finished twice"
                finish[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in reply.choices}
    assert finish == {c.index: c.finish_reason for c in reply.choices}
    assert sorted(texts) == list(range(6))
    assert chunks[-1].usage == reply.usage and not chunks[-1].choices


# A prompt only the engine's rules refuse (engine/prompt_rules.py): empty, no room in the 256-token context for a
# generated token, an id outside the vocabulary.
BAD_PROMPTS = {"empty": ([], "the prompt is empty"), "too-long": (list(range(10, 310)), "300 input tokens"),
               "out-of-vocabulary": ([11, 12, 10**6], "outside the vocabulary")}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "reply"])
@pytest.mark.parametrize("bad", list(BAD_PROMPTS))
def test_a_refused_prompt_among_several_is_a_400_before_any_prompt_runs(traced, traced_client, stream, bad):
    # Was: the engine refused the third prompt only once the first two were queued; they could prefill a step (and
    # take KV blocks) before their abort. Now the server checks every prompt by the engine's rules first: the answer
    # is a 400 before any chunk, and the engine never received a request (the trace's `adds`, up to and including
    # the next request's step, count that one alone), so nothing was prefilled and no KV block was taken.
    server, trace = traced
    wait_until_engine_idle(server)
    seen = len(_steps(trace))
    queries = server.metric("vllm:prefix_cache_queries_total")
    prompt, message = BAD_PROMPTS[bad]
    with pytest.raises(openai.BadRequestError, match=message) as refused:
        traced_client.completions.create(model="tiny", prompt=[PROMPTS[0], PROMPTS[1], prompt], max_tokens=200,
                                         stream=stream, extra_body={"min_tokens": 200})
    assert refused.value.body["param"] == "prompt"
    assert server.metric("vllm:kv_cache_usage_perc") == 0
    assert server.metric("vllm:prefix_cache_queries_total") == queries
    follow_up = [(5 * j) % 700 + 20 for j in range(12)]
    traced_client.completions.create(model="tiny", prompt=follow_up, max_tokens=1)
    steps = _steps(trace)[seen:]
    assert sum(s.get("adds", 0) for s in steps) == 1, steps
    assert sum(s.get("prefill_tokens", 0) for s in steps) <= len(follow_up), steps


def test_a_client_leaving_a_multi_prompt_stream_aborts_every_prompt(traced):
    # The client reads one chunk and closes the connection: every prompt's request is aborted and its KV blocks
    # freed. An aborted request is not counted as finished; one left running would finish ("length", 200 tokens).
    server, _ = traced
    wait_until_engine_idle(server)
    finished = server.metric("vllm:request_success_total")
    generated = server.metric("vllm:generation_tokens_total")
    body = {"model": "tiny", "prompt": PROMPTS, "max_tokens": 200, "min_tokens": 200, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=300,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        assert response.status_code == 200
        next(response.iter_lines())
    wait_until_engine_idle(server)  # the snapshot with nothing running also holds any finish
    assert server.metric("vllm:request_success_total") == finished
    assert server.metric("vllm:generation_tokens_total") - generated < len(PROMPTS) * 200
