"""Reasoning parsers and the streamed shape of tool calls and thinking, on outputs written in each
format, fed one character at a time as the engine would grow them."""

from __future__ import annotations

import asyncio
import json

import pytest

from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.server.reasoning import ReasoningParser
from flotilla.engine.server.sse import ChunkFormat
from flotilla.engine.server.tool_calls import ToolPlan, chat_message
from flotilla.engine.server.tool_parsers.registry import tool_parser
from flotilla.engine.server.tool_stream import stream_tool_chat


@pytest.mark.parametrize("name, text, reasoning, content", [
    ("deepseek_r1", "Paris is in France.\n</think>\n\nParis.", "Paris is in France.\n", "Paris."),
    ("deepseek_r1", "<think>Hmm.</think>Yes.", "Hmm.", "Yes."),
    ("deepseek_r1", "still thinking when max_tokens hit", "still thinking when max_tokens hit", None),
    ("qwen3", "<think>\nLet me see.\n</think>\n\nIt is 4.", "\nLet me see.\n", "It is 4."),
    ("qwen3", "It is 4.", None, "It is 4."),
])
def test_reasoning_parser_splits_thinking_from_answer(name, text, reasoning, content):
    split = ReasoningParser(name).split(text)
    assert (split.reasoning, split.content) == (reasoning, content)


def _deltas(text: str) -> list[RequestOutput]:
    """The delta outputs of the same completion (what chat streams read): one character and token per step."""
    return [RequestOutput("r", None, [1, 2, 3], outputs=[CompletionOutput(
        0, text[i - 1], [i - 1], finish_reason="stop" if i == len(text) else None)], finished=i == len(text))
        for i in range(1, len(text) + 1)]


def _stream(plan, reasoning, text) -> list[dict]:
    async def gen():
        for o in _deltas(text):
            yield o

    async def collect():
        fmt = ChunkFormat("chatcmpl-1", "chat.completion.chunk", 0, "m")
        return [c async for c in stream_tool_chat(plan, reasoning, 1, gen(), fmt, None)]

    chunks = asyncio.run(collect())
    assert chunks[-1] == "data: [DONE]\n\n"
    # a piece holds one step's events (one write), each event `data: {...}\n\n`
    events = [e for c in chunks[:-1] for e in c.split("\n\n") if e]
    return [json.loads(e.removeprefix("data: "))["choices"][0] for e in events]


def test_thinking_then_hermes_call_stream_as_openai_deltas():
    text = ('<think>Need the weather.</think>\nChecking.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    plan = ToolPlan("auto", [], parser=tool_parser("hermes"))
    choices = _stream(plan, ReasoningParser("qwen3"), text)
    deltas = [c["delta"] for c in choices]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    content = "".join(d.get("content", "") for d in deltas)
    assert content == "Checking.\n"  # as written up to the call's marker
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert [(c["index"], c["type"], c["function"]["name"]) for c in calls] == [(0, "function", "get_weather")]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"].startswith("chatcmpl-tool-")
    assert choices[-1]["finish_reason"] == "tool_calls"
    message, finish = chat_message(plan, text, "stop", ReasoningParser("qwen3"))
    assert message["reasoning_content"] == "Need the weather." and message["content"] == content
    assert finish == "tool_calls" and message["tool_calls"][0]["function"]["name"] == "get_weather"


def test_named_function_arguments_stream_incrementally():
    args = '{"city": "Paris", "unit": "celsius"}'
    choices = _stream(ToolPlan("named", [], function="get_weather"), None, args)
    calls = [call for c in choices for call in c["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert all("id" not in c and "name" not in c.get("function", {}) for c in calls[1:])
    assert len(calls) > 5  # one delta per step, not one at the end
    assert "".join(c["function"]["arguments"] for c in calls) == args
    # OpenAI and vLLM: a forced (named) call finishes with "stop"; "tool_calls" is for calls the model chose
    assert choices[-1]["finish_reason"] == "stop"
    message, finish = chat_message(ToolPlan("named", [], function="get_weather"), args, "stop")
    assert finish == "stop" and message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert chat_message(ToolPlan("named", [], function="get_weather"), args, "length")[1] == "length"


def test_plain_answer_with_reasoning_parser_streams_thinking_and_content():
    choices = _stream(ToolPlan("none", []), ReasoningParser("deepseek_r1"), "two plus two</think>\n\n4")
    deltas = [c["delta"] for c in choices]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "two plus two"
    assert "".join(d.get("content", "") for d in deltas) == "4"
    assert choices[-1]["finish_reason"] == "stop"


def test_responses_stream_sends_content_then_each_parsed_call_as_a_function_call_item():
    from flotilla.engine.server.responses import ResponsesRequest, ResponsesServing, _response

    text = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>')
    plan = ToolPlan("auto", [], parser=tool_parser("hermes"))
    req = ResponsesRequest(input="x", stream=True, store=False)

    async def gen():
        for o in _deltas(text):
            yield o

    async def collect():
        serving = ResponsesServing(serving=None)  # type: ignore[arg-type]  # _events needs no engine
        return [e async for e in serving._events(req, _response(req, "resp_1", "m"), plan, None, gen(), [])]

    events = [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(collect())]
    kinds = [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text_deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text_deltas == "Checking.\n" and "<tool" not in text_deltas  # the markup never streams as text
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["message", "function_call", "function_call"]
    assert [(i["name"], json.loads(i["arguments"])) for i in done[1:]] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})]
    arguments = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(a["output_index"], a["arguments"]) for a in arguments] == [(1, done[1]["arguments"]),
                                                                          (2, done[2]["arguments"])]
    assert kinds[-1] == "response.completed" and [i["type"] for i in events[-1]["response"]["output"]] == \
        ["message", "function_call", "function_call"]


@pytest.mark.parametrize("include_reasoning", [True, False])
def test_responses_thinking_then_answer_with_and_without_the_reasoning_item(include_reasoning):
    # include_reasoning false: the thinking is split off the answer as before, but no reasoning event or item is sent,
    # and the message is output 0 (its answer, not the thinking); true: the reasoning item comes first (output 0).
    from flotilla.engine.outputs import CompletionOutput, RequestOutput
    from flotilla.engine.server.responses import ResponsesRequest, ResponsesServing, _reply_items, _response

    text, plan, parser = "two plus two</think>\n\n4", ToolPlan("none", []), ReasoningParser("deepseek_r1")
    req = ResponsesRequest(input="x", stream=True, store=False, include_reasoning=include_reasoning)

    async def gen():
        for o in _deltas(text):
            yield o

    async def collect():
        serving = ResponsesServing(serving=None)  # type: ignore[arg-type]  # _events needs no engine
        return [e async for e in serving._events(req, _response(req, "resp_1", "m"), plan, parser, gen(), [])]

    events = [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(collect())]
    reasoning_events = [e for e in events if "reasoning" in e["type"] or e.get("item", {}).get("type") == "reasoning"]
    output = events[-1]["response"]["output"]
    answer = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    whole = RequestOutput("r", None, [1], outputs=[CompletionOutput(0, text, list(range(len(text))),
                                                                    finish_reason="stop")], finished=True)
    replied = _reply_items(plan, parser, whole, None, include_reasoning)
    assert answer == "4" and [i["type"] for i in replied] == [i["type"] for i in output]
    if include_reasoning:
        assert reasoning_events and [i["type"] for i in output] == ["reasoning", "message"]
        assert [e["output_index"] for e in events if e["type"] == "response.output_text.delta"] == [1]
    else:
        assert not reasoning_events and [i["type"] for i in output] == ["message"]
        assert [e["output_index"] for e in events if e["type"] == "response.output_text.delta"] == [0]
    assert output[-1]["content"][0]["text"] == replied[-1]["content"][0]["text"] == "4"


@pytest.mark.parametrize("name, text, content", [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>', "Sure.\n"),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}', ""),
    ("mistral", 'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]', "Sure. "),
])
def test_each_parsers_calls_stream_as_openai_deltas(name, text, content):
    """`auto` with each family's published format, streamed: content without call text, then one
    delta per call with its index, id, type, name and arguments, and finish_reason tool_calls."""
    choices = _stream(ToolPlan("auto", [], parser=tool_parser(name)), None, text)
    deltas = [c["delta"] for c in choices]
    assert "".join(d.get("content") or "" for d in deltas) == content  # as written before the calls
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert [(c["index"], c["type"], c["function"]["name"]) for c in calls] == [
        (0, "function", "get_weather"), (1, "function", "get_time")]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"tz": "Europe/Paris"}]
    assert len({c["id"] for c in calls}) == 2
    assert choices[-1]["finish_reason"] == "tool_calls"
