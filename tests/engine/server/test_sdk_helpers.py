"""The openai SDK's helper surfaces and the structured-output clients built on them (instructor, LangChain's
`with_structured_output`), as vLLM users point them at the server: the embedded model with the hermes tool parser
(the shared `tool_server`)."""

from __future__ import annotations

import json
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
