"""An output of thousands of tool calls is parsed while the server goes on answering.

The tool-call parse of a finished output (engine/server/tool_calls.py, `parse_values`) read the whole output on the
event loop: many calls in a row cost the parsers 0.1-0.5 us a character, so one output of megabytes of calls held
/health and every stream for as long. The model here has one added token that is 200 hermes calls in a row, and
logit_bias makes it write that token at every step: 200 tokens make an output of 40k calls (2.4 MB). The order is
proven as test_large_replies.py proves it: once the engine's part of the big request is over (its end logged; for a
chat stream, its step before the last read), /health and a small request must be answered before the big reply
reaches its marker (its head; a stream's tool-call chunk or first closing event). Chat (streamed or not) and
Responses (streamed or not); with the parse on the loop, all four fail.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import Server, start_tiny_server, stop_server, tiny_llama_with_markers
from .test_large_replies import SMALL, BigRequest, _answered_before, _until_logged, _until_reached

CALLS_PER_TOKEN = 200
CALLS = '<tool_call>{"name": "f", "arguments": {"i": 1}}</tool_call>' * CALLS_PER_TOKEN
TOKENS = 200
TOOL = {"name": "f", "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}}}


@pytest.fixture(scope="module")
def calls_server(embedded_model_dir, tmp_path_factory):
    """A tiny Llama whose vocabulary has CALLS as one token (its id returned too), served with the hermes parser
    (auto tool choice), logging each engine request's end."""
    path = tmp_path_factory.mktemp("calls-model")
    token = tiny_llama_with_markers(embedded_model_dir, path, [CALLS], seed=36).convert_tokens_to_ids(CALLS)
    server = start_tiny_server(path, path / "server.log", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                               "--enable-log-requests")
    yield server, token
    stop_server(server)


def _big(server: Server, kind: str, token: int, out: Path) -> tuple[BigRequest, Callable[[BigRequest], None]]:
    """The big request of `kind`, and the wait until its engine part is over."""
    tag = f"{'resp_' if kind.startswith('responses') else ''}calls-{kind}-{time.monotonic_ns()}"
    # parallel_tool_calls false: the parse reads every call and the reply holds the first, so the reply's build and
    # encoding (off the loop when large, json_reply.py) are not what the others could be answered during
    steer = {"model": "tiny", "ignore_eos": True, "logit_bias": {str(token): 100}, "request_id": tag,
             "parallel_tool_calls": False}
    chat = {**steer, "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS,
            "tools": [{"type": "function", "function": TOOL}]}
    if kind == "chat-stream":
        # A stream's engine request is logged as finished only once its last step is sent: the wait is for the step
        # before (each step's ids and usage ride on a chunk of their own while the parser holds the text back); the
        # marker is the last step's chunk, the calls'
        body = {**chat, "stream": True, "return_token_ids": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        big = BigRequest(f"{server.url}/v1/chat/completions", body, 'line-with:"tool_calls"', out,
                         watch=f'"completion_tokens": {TOKENS - 1},')
        return big, _until_reached("watched", "its step before the last")
    until = _until_logged(server, rf"Finished request \S*{tag}-")
    if kind.startswith("responses"):
        body = {**steer, "input": "hi", "max_output_tokens": TOKENS, "tools": [{"type": "function", **TOOL}]}
        if kind == "responses-stream":  # logged as finished once its last output is read: its end is built after
            return BigRequest(f"{server.url}/v1/responses", {**body, "stream": True},
                              "line:event: response.output_item.added", out), until
        return BigRequest(f"{server.url}/v1/responses", body, "head", out), until
    return BigRequest(f"{server.url}/v1/chat/completions", chat, "head", out), until


def _calls(kind: str, raw: bytes) -> list[tuple[str, str]]:
    """The big reply's calls, (name, arguments) each."""
    if kind.startswith("responses"):
        response = json.loads(raw) if kind == "responses" else [
            json.loads(line[len("data: "):]) for line in raw.decode().split("\n") if line.startswith("data: ")][-1][
            "response"]
        assert response["status"] == "incomplete"  # max_output_tokens
        return [(i["name"], i["arguments"]) for i in response["output"] if i["type"] == "function_call"]
    if kind == "chat-stream":
        chunks = [json.loads(line[len("data: "):]) for line in raw.decode().split("\n") if line.startswith("data: {")]
        choices = [c for chunk in chunks for c in chunk["choices"]]  # the last chunk (the usage) has none
        assert choices[-1]["finish_reason"] == "length"  # max_tokens: a call's reply keeps it (vLLM)
        return [(c["function"]["name"], c["function"]["arguments"]) for choice in choices
                for c in choice["delta"].get("tool_calls") or []]
    [choice] = json.loads(raw)["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    return [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]]


@pytest.mark.parametrize("kind", ["chat", "chat-stream", "responses", "responses-stream"])
def test_health_and_a_small_request_are_answered_while_thousands_of_tool_calls_are_parsed(calls_server, kind,
                                                                                         tmp_path):
    server, token = calls_server
    big, until = _big(server, kind, token, tmp_path / "reply")
    # From its engine request's end on, the big request is the front end's alone: the parse, the reply's build
    before = _answered_before(server.url, big, until, "/v1/completions", SMALL)
    # On the event loop, each waited for the whole parse: none came before the marker
    assert before == [True] * 4, before
    status, raw = big.finished()
    assert status == 200
    assert _calls(kind, raw) == [("f", '{"i": 1}')]
