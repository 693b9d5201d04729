"""Function tools and `text.format` in the Responses API, the X-Request-Id header and cached-token usage
(issue 24): the real openai SDK and LangChain against `flotilla serve` on the embedded model with the
hermes tool parser (the shared `tool_server`)."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from tests.engine.server.conftest import API_KEY
from tests.engine.server.structured_tools import TIME, WEATHER

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

# Responses spells tools flat: no `function` wrapper.
TOOLS = [{"type": "function", **t["function"]} for t in (WEATHER, TIME)]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
ASK = "What is the weather in Paris?"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def oai(tool_server):
    return openai.OpenAI(base_url=f"{tool_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=600)


def _validated(call) -> dict:
    args = json.loads(call.arguments)
    jsonschema.validate(args, SCHEMAS[call.name])
    return args


def test_required_tool_choice_returns_function_call_items_that_validate(oai):
    response = oai.responses.create(model="x", input=ASK, tools=TOOLS, tool_choice="required", temperature=0,
                                    max_output_tokens=80)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and len(calls) == len(response.output) and response.status == "completed"
    for call in calls:
        _validated(call)
        assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
    assert [t.name for t in response.tools] == ["get_weather", "get_time"]


def test_named_call_streams_its_arguments_as_the_sdk_parses_them(oai):
    choice = {"type": "function", "name": "get_weather"}
    whole = oai.responses.create(model="x", input=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
                                 max_output_tokens=80)
    events = list(oai.responses.create(model="x", input=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
                                       max_output_tokens=80, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert kinds.count("response.function_call_arguments.delta") > 1  # streamed as generated, not at the end
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done = events[2].item, events[-2].item
    assert added.type == "function_call" and added.name == "get_weather" and added.id == done.id
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == events[-3].arguments == done.arguments == whole.output[0].arguments
    assert _validated(done)["city"]


def test_function_call_output_continues_by_previous_response_id_and_by_full_input(oai):
    first = oai.responses.create(model="x", input=ASK, tools=TOOLS, tool_choice={"type": "function",
                                                                                 "name": "get_weather"},
                                 temperature=0, max_output_tokens=80)
    call = first.output[0]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"}
    follow = oai.responses.create(model="x", previous_response_id=first.id, input=[result], tools=TOOLS,
                                  tool_choice="none", temperature=0, max_output_tokens=10)
    replayed = oai.responses.create(
        model="x", tools=TOOLS, tool_choice="none", temperature=0, max_output_tokens=10,
        input=[{"role": "user", "content": ASK},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               result])
    chat = oai.chat.completions.create(
        model="x", tools=[WEATHER, TIME], tool_choice="none", temperature=0, max_tokens=10,
        messages=[{"role": "user", "content": ASK},
                  {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function",
                                                        "function": {"name": call.name, "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "content": "18 C and sunny"}])
    assert follow.output_text == replayed.output_text == chat.choices[0].message.content
    assert follow.output_text


def test_text_format_json_schema_parses_into_the_pydantic_model(oai):
    from typing import Literal

    from pydantic import BaseModel, Field

    class Forecast(BaseModel):
        city: str = Field(max_length=12)
        sky: Literal["sunny", "rainy", "cloudy"]

    parsed = oai.responses.parse(model="x", input="Weather in Paris?", text_format=Forecast, temperature=0,
                                 max_output_tokens=80)
    assert isinstance(parsed.output_parsed, Forecast)
    assert parsed.text.format.type == "json_schema"
    # json_object bounds nothing (any object, strings of any length): the prompt names a short object
    # and the budget leaves room, so what is checked is that the grammar's output is an object.
    as_object = oai.responses.create(model="x", input='Reply with the JSON object {"city": "Paris"}.',
                                     temperature=0, max_output_tokens=120, text={"format": {"type": "json_object"}})
    assert as_object.status == "completed", as_object.output_text
    assert isinstance(json.loads(as_object.output_text), dict)


def test_tools_and_formats_outside_the_subset_are_400s_that_name_them(oai):
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        oai.responses.create(model="x", input="x", tools=[{"type": "web_search"}])
    # Built-in tools alone under `required`: the tools' 400, before any choice is weighed. (vLLM's non-gpt-oss path
    # renders them as nameless functions, adds no grammar to `required` and parses the whole output as a JSON call
    # list after generating it: free text fails then.)
    with pytest.raises(openai.BadRequestError, match="only function tools") as refused:
        oai.responses.create(model="x", input="x", tools=[{"type": "web_search"}], tool_choice="required")
    assert refused.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError, match="not among the request's tools"):
        oai.responses.create(model="x", input="x", tools=TOOLS, tool_choice={"type": "function", "name": "nope"})
    with pytest.raises(openai.BadRequestError, match="text.format"):
        oai.responses.create(model="x", input="x", text={"format": {"type": "json_schema", "name": "n"}})


def test_x_request_id_names_the_response_and_comes_back_as_a_header(tool_server):
    body = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    given = httpx.post(f"{tool_server.url}/v1/chat/completions", json={**body, "request_id": "from-body"},
                       headers={**HEADERS, "X-Request-Id": "trace-42"}, timeout=120)
    assert given.headers["x-request-id"] == "trace-42" and given.json()["id"] == "chatcmpl-trace-42"
    fresh = httpx.post(f"{tool_server.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    assert re.fullmatch(r"[0-9a-f]{32}", fresh.headers["x-request-id"])
    response = httpx.post(f"{tool_server.url}/v1/responses", json={"model": "x", "input": "Hi",
                                                                   "max_output_tokens": 2},
                          headers={**HEADERS, "X-Request-Id": "trace-43"}, timeout=120)
    assert response.json()["id"].startswith("resp_trace-43-") and response.headers["x-request-id"] == "trace-43"


def test_a_refused_x_request_id_is_not_echoed_back(tool_server):
    """--enable-request-id-headers echoes the request's X-Request-Id; one refused for a control byte (a 400) gets a
    random id instead, its bytes not sent back in the response head."""
    body = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    refused = httpx.post(f"{tool_server.url}/v1/chat/completions", json=body,
                         headers={**HEADERS, "X-Request-Id": b"trace\x1b[2J"}, timeout=120)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "X-Request-Id"
    assert re.fullmatch(r"[0-9a-f]{32}", refused.headers["x-request-id"])


def test_the_x_request_id_header_never_echoes_the_bodys_request_id_as_vllm(oai):
    """vLLM's XRequestIdMiddleware echoes the request's own X-Request-Id header, else a random uuid4 hex: the body's
    `request_id` names the response (`chatcmpl-<id>`, `cmpl-<id>`, a Responses id as given) and the engine's request,
    never the header."""
    raw = oai.chat.completions.with_raw_response.create(
        model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, extra_body={"request_id": "from-body"})
    assert raw.parse().id == "chatcmpl-from-body"
    assert re.fullmatch(r"[0-9a-f]{32}", raw.headers["x-request-id"])
    raw = oai.completions.with_raw_response.create(model="x", prompt="Hi", max_tokens=2,
                                                   extra_body={"request_id": "from-body"})
    assert raw.parse().id == "cmpl-from-body" and re.fullmatch(r"[0-9a-f]{32}", raw.headers["x-request-id"])
    raw = oai.responses.with_raw_response.create(model="x", input="Hi", max_output_tokens=2, store=False,
                                                 extra_body={"request_id": "from-body"})
    assert raw.parse().id == "from-body" and re.fullmatch(r"[0-9a-f]{32}", raw.headers["x-request-id"])


def test_cached_prompt_tokens_are_reported_in_usage(oai):
    prompt = "Harbours of the Baltic: " + ", ".join(f"harbour number {i}" for i in range(16))
    chat = [oai.chat.completions.create(model="x", messages=[{"role": "user", "content": prompt}], max_tokens=1)
            for _ in range(2)]
    # The first request finds at most the template's system prefix cached (earlier tests rendered it); the
    # second finds every whole block of its prompt but the last token's (default block size 16).
    first = chat[0].usage.prompt_tokens_details
    cached = chat[1].usage.prompt_tokens_details.cached_tokens
    assert cached == (chat[1].usage.prompt_tokens - 1) // 16 * 16
    assert first is None or first.cached_tokens < cached  # left out when 0, as vLLM
    response = oai.responses.create(model="x", input=prompt, max_output_tokens=1)
    assert response.usage.input_tokens_details.cached_tokens == cached


def test_langchain_responses_api_binds_tools_and_continues_with_the_result(tool_server):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage

    model = langchain_openai.ChatOpenAI(model="x", base_url=f"{tool_server.url}/v1", api_key=API_KEY,
                                        temperature=0, max_tokens=80, max_retries=0, timeout=600,
                                        use_responses_api=True)
    tooled = model.bind_tools([WEATHER, TIME], tool_choice="get_weather")
    question = HumanMessage(ASK)
    message = tooled.invoke([question])
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    jsonschema.validate(message.tool_calls[0]["args"], SCHEMAS["get_weather"])
    answer = model.bind_tools([WEATHER, TIME], tool_choice="none").invoke(
        [question, message, ToolMessage("18 C and sunny", tool_call_id=message.tool_calls[0]["id"])])
    assert answer.text and not answer.tool_calls


def test_streamed_usage_reports_cached_prompt_tokens_as_the_whole_reply_does(oai):
    prompt = "Lighthouses of the North Sea: " + ", ".join(f"lighthouse number {i}" for i in range(16))
    oai.completions.create(model="x", prompt=prompt, max_tokens=1)  # fills the prefix cache
    cached = oai.completions.create(model="x", prompt=prompt, max_tokens=1).usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    stream = oai.completions.create(model="x", prompt=prompt, max_tokens=1, stream=True,
                                    stream_options={"include_usage": True})
    usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == cached
    # A chat stream that may call tools (its own streaming path) reports them too.
    chat = {"model": "x", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "tools": [WEATHER]}
    oai.chat.completions.create(**chat)
    cached = oai.chat.completions.create(**chat).usage.prompt_tokens_details.cached_tokens
    stream = oai.chat.completions.create(**chat, stream=True, stream_options={"include_usage": True})
    usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == cached


def test_a_forced_call_named_by_a_number_is_text_not_a_tool_call(oai):
    """The model writes a hermes call whose name is 5 (a regex forces it): chat and a Responses stream answer it as
    text, as vLLM's parsers do, not as a call named 5 (before: `"name": 5` in both, which OpenAI's schema and typed
    clients refuse)."""
    text = '<tool_call>{"name": 5, "arguments": {}}</tool_call>'
    forced = {"structured_outputs": {"regex": re.escape(text)}}
    chat = oai.chat.completions.create(model="x", messages=[{"role": "user", "content": ASK}],
                                       tools=[WEATHER],
                                       max_tokens=60, extra_body=forced)
    assert chat.choices[0].message.tool_calls is None and chat.choices[0].message.content == text
    events = list(oai.responses.create(model="x", input=ASK, tools=TOOLS, max_output_tokens=60, stream=True,
                                       extra_body=forced))
    output = events[-1].response.output
    assert [item.type for item in output] == ["message"] and output[0].content[0].text == text


def test_text_before_a_hermes_call_is_the_same_streamed_and_whole(oai):
    """The model writes text and then a hermes call (a regex forces it). The chat reply and the chat stream give the
    same content: the text before `<tool_call>` as written, as vLLM's hermes parser gives it. Before: the reply
    stripped it ('Ok.') while the stream sent it as written ('Ok.\\n'). Responses, and whitespace alone (no content):
    test_incremental_parsers.py and test_responses_whitespace.py (the tiny model writes ~1 token/s under CI load)."""
    before = "Ok.\n"
    forced = {"structured_outputs": {"regex": re.escape(before + '<tool_call>{"name": "get_time", "arguments": {}}'
                                                        "</tool_call>")}}
    chat = {"model": "x", "messages": [{"role": "user", "content": ASK}], "tools": [WEATHER, TIME], "max_tokens": 100,
            "extra_body": forced}
    whole = oai.chat.completions.create(**chat).choices[0]
    assert [c.function.name for c in whole.message.tool_calls] == ["get_time"]
    assert whole.message.content == before
    chunks = list(oai.chat.completions.create(**chat, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == before
    assert [t.function.name for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []] == ["get_time"]
