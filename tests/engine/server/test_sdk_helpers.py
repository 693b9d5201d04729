"""The openai SDK's helper surfaces and the structured-output clients built on them (instructor, LangChain's
`with_structured_output`), as vLLM users point them at the server: the embedded model with the hermes tool parser
(the shared `tool_server`)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.engine.server.conftest import API_KEY

pytest.importorskip("xgrammar")


class Weather(BaseModel):
    city: str = Field(max_length=20)


class Forecast(BaseModel):
    city: str = Field(max_length=12)
    sky: Literal["sunny", "rainy", "cloudy"]


Unit = StrEnum("Unit", ["celsius", "fahrenheit"])


class Place(BaseModel):
    weather: Weather  # a nested model and an enum: pydantic puts both under the tool's `$defs`
    unit: Unit


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def oai(tool_server):
    return openai.OpenAI(base_url=f"{tool_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=600)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "Weather"}}])
def test_a_forced_tool_call_beside_a_response_format_is_served_as_vllm(oai, tool_server, tool_choice):
    """A forced call (required or named) is the whole reply, so the reply's format has nothing left to constrain:
    vLLM's tool parsers drop it (`adjust_request`) and the call is made, as OpenAI serves the pair. The SDK's
    `parse` with a pydantic `response_format` and a pydantic function tool sends both."""
    tool = openai.pydantic_function_tool(Weather)
    whole = oai.chat.completions.parse(model="x", messages=ASK, response_format=Forecast, tools=[tool],
                                       tool_choice=tool_choice, max_tokens=60, temperature=0)
    [call] = whole.choices[0].message.tool_calls
    assert call.function.name == "Weather" and isinstance(call.function.parsed_arguments, Weather)
    with oai.chat.completions.stream(model="x", messages=ASK, response_format=Forecast, tools=[tool],
                                     tool_choice=tool_choice, max_tokens=60, temperature=0) as stream:
        streamed = stream.get_final_completion()
    assert streamed.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    assert "forces a tool call: the request's reply format does not apply" in tool_server.log.read_text()


def test_instructors_responses_tools_request_is_served(oai):
    """instructor's RESPONSES_TOOLS mode sends its model as `text.format` and as the named tool it forces (the body
    below is instructor 1.17's, captured on the wire); the forced call is the reply."""
    schema = {**Weather.model_json_schema(), "additionalProperties": False}
    response = oai.responses.create(
        model="x", input=[{"role": "user", "content": "What is the weather in Paris?"}], max_output_tokens=60,
        temperature=0, text={"format": {"type": "json_schema", "name": "Weather", "strict": True, "schema": schema}},
        tool_choice={"type": "function", "name": "Weather"},
        tools=[{"type": "function", "name": "Weather", "parameters": schema, "strict": True,
                "description": "Correctly extracted `Weather` with all the required parameters with correct types"}])
    [call] = response.output
    assert call.type == "function_call" and call.name == "Weather"
    assert Weather.model_validate(json.loads(call.arguments))


def test_required_tool_calls_whose_parameters_have_defs_are_served_as_vllm(oai):
    """`tool_choice: required` nests each tool's parameters in one list schema; a pydantic tool with a nested model or
    an enum refers to its `$defs` from its root (`#/$defs/Unit`), so vLLM hoists every tool's `$defs` to the list's
    root (a name two tools define differently is a 400). The SDK's `pydantic_function_tool` sends such tools."""
    tools = [openai.pydantic_function_tool(Place), openai.pydantic_function_tool(Weather)]
    answer = oai.chat.completions.parse(model="x", messages=ASK, tools=tools, tool_choice="required", max_tokens=80,
                                        temperature=0)
    calls = answer.choices[0].message.tool_calls
    assert calls
    for call in calls:  # a Place's nested Weather is parsed as one (the grammar followed its $ref)
        arguments = call.function.parsed_arguments
        assert isinstance(arguments.weather if isinstance(arguments, Place) else arguments, Weather)
    clash = {"type": "function", "function": {"name": "other", "parameters": {
        "type": "object", "properties": {"w": {"$ref": "#/$defs/Weather"}}, "$defs": {"Weather": {"type": "string"}}}}}
    with pytest.raises(openai.BadRequestError, match="Weather") as refused:
        oai.chat.completions.create(model="x", messages=ASK, tools=[*tools, clash], tool_choice="required",
                                    max_tokens=8)
    assert refused.value.body["param"] == "tools"
