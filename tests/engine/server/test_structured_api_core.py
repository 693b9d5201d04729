"""The structured-output API's core, in CI: the real openai client against `flotilla serve` on the
embedded model, every request of the round sent at once (the engine batches them). Twenty JSON
schemas validate with jsonschema and stop on their own, regex and choice outputs match, `required` and
named tool calls parse and validate against their parameters' schema; invalid constraints are 400s
with the reason; LangChain's ChatOpenAI gets structured output and tool calls. Streams, history
rendering and `auto` stay in the opt-in module (test_structured_output_api.py)."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import openai
import pytest

from tests.engine.server.conftest import API_KEY
from tests.engine.server.structured_schemas import SCHEMAS, unbounded_keywords
from tests.engine.server.structured_tools import ASK, TIME, WEATHER

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

REGEX = r"[A-Z][a-z]{2,8}, [0-9]{1,2}C"
UNIQUE_TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2,
                                                         "uniqueItems": True}}}
CHOICES = ["sunny", "rainy"]


async def _schema_reply(client, name, schema):
    # OpenAI's response_format. Compact (the server's flag) and bounded, a schema has finitely many
    # outputs, all far shorter than max_tokens: each output must close on its own.
    reply = await client.chat.completions.create(
        model="x", temperature=0, max_tokens=256,
        messages=[{"role": "user", "content": f"Give me an example {name.replace('_', ' ')} as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}})
    return reply.choices[0]


async def _regex_and_choice(client):
    texts = []
    for body in ({"structured_outputs": {"regex": REGEX}}, {"guided_regex": REGEX}):
        reply = await client.chat.completions.create(model="x", temperature=0, max_tokens=20, messages=ASK,
                                                     extra_body=body)
        texts.append(("regex", reply.choices[0].message.content))
    for body in ({"structured_outputs": {"choice": CHOICES}}, {"guided_choice": CHOICES}):
        reply = await client.completions.create(model="x", prompt="The weather today is", max_tokens=6,
                                                temperature=1, n=2, seed=1, extra_body=body)
        texts += [("choice", c.text) for c in reply.choices]
    return texts


async def _tool_reply(client, choice, parallel):
    reply = await client.chat.completions.create(model="x", temperature=0.7, seed=5, n=2, max_tokens=160,
                                                 messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                                 parallel_tool_calls=parallel)
    return choice, parallel, reply.choices


def test_schemas_regex_choice_and_tool_calls_validate(tool_server):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{tool_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=600)
    named = {"type": "function", "function": {"name": "get_time"}}

    async def everything():
        return await asyncio.gather(
            asyncio.gather(*(_schema_reply(client, name, schema) for name, schema in SCHEMAS)),
            _regex_and_choice(client),
            asyncio.gather(*(_tool_reply(client, c, p) for c, p in (("required", True), ("required", False),
                                                                     (named, True)))))

    assert len(SCHEMAS) >= 20
    assert {name: unbounded_keywords(schema) for name, schema in SCHEMAS if unbounded_keywords(schema)} == {}
    schema_choices, texts, tool_replies = asyncio.run(everything())
    for (name, schema), choice in zip(SCHEMAS, schema_choices, strict=True):
        assert choice.finish_reason == "stop", (name, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)
    for kind, text in texts:
        assert re.fullmatch(REGEX, text) if kind == "regex" else text in CHOICES, (kind, text)
    for choice, parallel, choices in tool_replies:
        for c in choices:
            assert c.finish_reason == ("stop" if choice == named else "tool_calls") and c.message.tool_calls, c.message
            assert c.message.content == ""  # vLLM's for a forced call (required, named); null only under auto
            if not parallel:
                assert len(c.message.tool_calls) == 1
            if choice == named:
                assert [t.function.name for t in c.message.tool_calls] == ["get_time"]
            for call in c.message.tool_calls:
                tool = next(t for t in (WEATHER, TIME) if t["function"]["name"] == call.function.name)
                jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("body, reason", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "json"),
    ({"guided_regex": "(unclosed"}, "regex"),
    ({"response_format": {"type": "xml"}}, "xml"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "one output constraint"),
    ({"tool_choice": {"type": "function", "function": {"name": "missing"}}, "tools": [WEATHER]}, "missing"),
    # keywords xgrammar drops (the backend is xgrammar here, as vLLM, which refuses them for it)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": UNIQUE_TAGS}}},
     "'uniqueItems' at /properties/tags is not enforced"),
    ({"guided_json": {"type": "string", "pattern": "[a-z]+", "maxLength": 4}}, "'maxLength' at / is not enforced"),
    ({"tool_choice": {"type": "function", "function": {"name": "tag"}}, "tools": [{"type": "function", "function": {
        "name": "tag", "parameters": UNIQUE_TAGS}}]}, "'uniqueItems' at /properties/tags is not enforced"),
])
def test_invalid_constraints_are_400_with_the_reason(tool_server, body, reason):
    r = httpx.post(f"{tool_server.url}/v1/chat/completions", timeout=60,
                   headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"messages": ASK, "max_tokens": 5, **body})
    assert r.status_code == 400, r.text
    assert reason in r.json()["error"]["message"]


def test_auto_backend_refuses_a_keyword_xgrammar_drops(client):
    # The shared server's backend is auto: vLLM would fall back to another backend, Flotilla has none.
    with pytest.raises(openai.BadRequestError, match="'uniqueItems' at /properties/tags is not enforced"):
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": UNIQUE_TAGS}})


def test_langchain_with_structured_output_and_bind_tools(tool_server):
    """langchain-openai's ChatOpenAI as users run it: a pydantic schema by json_schema, tools by bind_tools."""
    langchain_openai = pytest.importorskip("langchain_openai")
    from typing import Literal

    from pydantic import BaseModel, Field

    class Forecast(BaseModel):
        """A weather forecast."""

        city: str = Field(max_length=12)
        sky: Literal["sunny", "rainy", "cloudy"]
        warm: bool

    model = langchain_openai.ChatOpenAI(model="x", base_url=f"{tool_server.url}/v1", api_key=API_KEY,
                                        temperature=0, max_tokens=80, max_retries=0, timeout=600)
    forecast = model.with_structured_output(Forecast, method="json_schema").invoke("Weather in Paris?")
    assert isinstance(forecast, Forecast)
    for choice in ("get_weather", "any"):  # named, and OpenAI's `required`
        tooled = model.bind_tools([WEATHER, TIME], tool_choice=choice)
        message = tooled.invoke(ASK[0]["content"])
        assert message.tool_calls, message
        for call in message.tool_calls:
            tool = next(t for t in (WEATHER, TIME) if t["function"]["name"] == call["name"])
            jsonschema.validate(call["args"], tool["function"]["parameters"])
        if choice == "get_weather":
            assert [c["name"] for c in message.tool_calls] == ["get_weather"]
