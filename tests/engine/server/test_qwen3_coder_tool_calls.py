"""`--tool-call-parser qwen3_coder` on a real server over the real openai client: the tiny Llama is forced (a
structured_outputs regex) to write Qwen3-Coder's XML call, and the reply's call has its values typed by the
request's tool schema (`days` an integer, `metric` a boolean, `city` a string), whole and streamed, in chat and in a
Responses reply (which plans its tools through the same path)."""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.engine.server.conftest import API_KEY, start_server, stop_server

pytest.importorskip("xgrammar")

FORECAST = {"type": "function", "function": {"name": "forecast", "description": "The weather for some days.",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}, "days": {"type": "integer"},
                                                 "metric": {"type": "boolean"}}}}}
BEFORE = "Ok.\n"
CALL = ("<tool_call>\n<function=forecast>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>")
# Qwen3-Coder models also leave the <tool_call> wrapper out: vLLM's parser reads the bare function as the call
BARE = CALL.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
ARGUMENTS = {"city": "42", "days": 3, "metric": True}
FORCED = {"structured_outputs": {"regex": re.escape(BEFORE + CALL)}}
ASK = "What will the weather be in Paris?"


@pytest.fixture(scope="module")
def oai(tiny_model_dirs, tmp_path_factory):
    # The tiny Llama (the embedded model's tokenizer and chat template): every reply here is forced by a regex, so
    # the model's weights choose nothing the tests read, and its steps cost a fraction of the embedded model's.
    server = start_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("qwen3-coder") / "server.log",
                          "--max-model-len", "512", "--disable-log-stats", "--served-model-name", "x",
                          "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
                          env={"VLLM_API_KEY": API_KEY})
    yield openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=600)
    stop_server(server)


@pytest.mark.parametrize("call", [CALL, BARE], ids=["wrapped", "bare"])
def test_an_xml_call_becomes_a_typed_tool_call_whole_and_streamed(oai, call):
    chat = {"model": "x", "messages": [{"role": "user", "content": ASK}], "tools": [FORECAST], "max_tokens": 120,
            "temperature": 0, "extra_body": {"structured_outputs": {"regex": re.escape(BEFORE + call)}}}
    whole = oai.chat.completions.create(**chat).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content == BEFORE
    [call] = whole.message.tool_calls
    assert call.function.name == "forecast" and json.loads(call.function.arguments) == ARGUMENTS

    chunks = [c for c in oai.chat.completions.create(**chat, stream=True) if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == BEFORE  # the XML is never content
    [streamed] = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert streamed.function.name == "forecast" and json.loads(streamed.function.arguments) == ARGUMENTS
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_responses_reply_types_the_call_too(oai):
    tools = [{"type": "function", **FORECAST["function"]}]
    response = oai.responses.create(model="x", input=ASK, tools=tools, max_output_tokens=120, temperature=0,
                                    extra_body=FORCED)
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "forecast" and json.loads(call.arguments) == ARGUMENTS


def test_a_value_holding_the_formats_closers_is_the_whole_value(oai):
    # A string value with the format's own closers mid-line (code that writes XML): vLLM's qwen3_coder reads a closer
    # as structural only where the format could put one, so the value is whole; the first regex match cut it at the
    # literal </parameter> (and a literal </function> cut the call's body before its later parameters).
    city = "x = '</parameter>' + '</function>'"
    call = (f"<tool_call>\n<function=forecast>\n<parameter=city>\n{city}\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>")
    chat = {"model": "x", "messages": [{"role": "user", "content": ASK}], "tools": [FORECAST], "max_tokens": 120,
            "temperature": 0, "extra_body": {"structured_outputs": {"regex": re.escape(BEFORE + call)}}}
    whole = oai.chat.completions.create(**chat).choices[0]
    [made] = whole.message.tool_calls
    assert json.loads(made.function.arguments) == {"city": city, "days": 3} and whole.message.content == BEFORE
    chunks = [c for c in oai.chat.completions.create(**chat, stream=True) if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == BEFORE
    [streamed] = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert json.loads(streamed.function.arguments) == {"city": city, "days": 3}
