"""Whitespace-only text before tool calls on /v1/responses (vLLM's rule, serving_responses' simple stream and its
parser's non-streamed content): no message item, streamed or not, while text that is more than whitespace keeps the
whitespace that led it. The outputs are written in the hermes format and fed to the Responses event stream one
character a step, as the engine would grow them (the tiny models cannot be made to write tool calls)."""

from __future__ import annotations

import asyncio
import json

import pytest

from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.server.reasoning import ReasoningParser
from flotilla.engine.server.responses import ResponsesRequest, ResponsesServing, _reply_items, _response
from flotilla.engine.server.tool_calls import ToolPlan
from flotilla.engine.server.tool_parsers.registry import tool_parser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _outputs(text: str, delta: bool) -> list[RequestOutput]:
    """The completion of `text` one character and token a step: each step's news (`delta`), else the last output."""
    steps = [RequestOutput("r", None, [1, 2, 3], outputs=[CompletionOutput(
        0, text[i - 1] if delta else text[:i], [i - 1] if delta else list(range(i)),
        finish_reason="stop" if i == len(text) else None)], finished=i == len(text)) for i in range(1, len(text) + 1)]
    return steps if delta else steps[-1:]


def _streamed(plan: ToolPlan, reasoning: ReasoningParser | None, text: str) -> list[dict]:
    async def gen():
        for output in _outputs(text, delta=True):
            yield output

    async def collect():
        req = ResponsesRequest(input="hi", stream=True, store=False)
        events = ResponsesServing(None)._events(req, _response(req, "resp_1", "m"), plan, reasoning,  # type: ignore[arg-type]
                                                gen(), [])
        return [e async for e in events]

    return [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(collect())]


def _reply(plan: ToolPlan, reasoning: ReasoningParser | None, text: str) -> list[dict]:
    return _reply_items(plan, reasoning, _outputs(text, delta=False)[0], None)


def _kinds(items: list[dict]) -> list[str]:
    return [item["type"] for item in items]


@pytest.mark.parametrize("reasoning, text, kinds", [
    (None, "\n\n" + CALL, ["function_call"]),
    ("qwen3", "<think>Need the weather.</think>\n\n" + CALL, ["reasoning", "function_call"]),
    ("qwen3", "<think>Need the weather.</think>\n \n" + CALL + "\n" + CALL,
     ["reasoning", "function_call", "function_call"]),
])
def test_whitespace_before_tool_calls_is_no_message_streamed_or_not(reasoning, text, kinds):
    # Was (streamed): the whitespace opened a message item ("\n\n" as its text) before the calls, in the events and
    # in the completed response; the reply had none.
    plan = ToolPlan("auto", [], parser=tool_parser("hermes"))
    parser = ReasoningParser(reasoning) if reasoning else None
    events = _streamed(plan, parser, text)
    completed = events[-1]
    assert completed["type"] == "response.completed"
    assert _kinds(completed["response"]["output"]) == kinds
    assert not [e for e in events if e["type"].startswith("response.output_text")]
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"] == kinds
    assert _kinds(_reply(plan, parser, text)) == kinds
    assert json.loads(completed["response"]["output"][-1]["arguments"]) == {"city": "Paris"}


def test_text_after_leading_whitespace_keeps_it_and_streams_as_it_comes():
    # The held whitespace goes out with the first text that is more than whitespace, before the call's marker.
    plan = ToolPlan("auto", [], parser=tool_parser("hermes"))
    text = "\n\nChecking.\n" + CALL
    events = _streamed(plan, None, text)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas[0] == "\n\nC" and "".join(deltas) == "\n\nChecking.\n"
    assert _kinds(events[-1]["response"]["output"]) == ["message", "function_call"]
    # The reply's message is the same text (it used to be stripped: 'Checking.')
    assert [item["content"][0]["text"] for item in _reply(plan, None, text) if item["type"] == "message"] == [
        "\n\nChecking.\n"]


@pytest.mark.parametrize("plan", [ToolPlan("auto", [], parser=tool_parser("hermes")), ToolPlan("none", [])],
                         ids=["auto", "none"])
def test_a_whitespace_only_answer_without_calls_is_still_its_message(plan):
    # Only calls after it make whitespace no message: alone, it is the answer, streamed (at the end) or not.
    events = _streamed(plan, None, "\n\n")
    assert [item["content"][0]["text"] for item in events[-1]["response"]["output"]] == ["\n\n"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "\n\n"
    assert [item["content"][0]["text"] for item in _reply(plan, None, "\n\n")] == ["\n\n"]
