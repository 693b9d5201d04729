"""Tool-call parsers on outputs written in each family's published format, whole and streamed."""

from __future__ import annotations

import json

import pytest

from flotilla.engine.server.tool_parsers.registry import tool_parser

WEATHER_ARGS = {"city": "Paris", "unit": "celsius"}

# (parser, model output, expected content, expected [(name, arguments)])
CASES = [
    ("hermes",
     'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
     '</tool_call>',
     "Let me check.\n", [("get_weather", WEATHER_ARGS)]),
    ("hermes",
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>',
     None, [("get_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})]),
    ("hermes",  # generation stopped on EOS before the closing tag
     '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Asia/Tokyo"}}\n',
     None, [("get_time", {"tz": "Asia/Tokyo"})]),
    ("hermes", "The weather is fine.", "The weather is fine.", []),
    ("hermes",  # whitespace alone before the call is no content (vLLM drops it)
     '\n\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Asia/Tokyo"}}\n</tool_call>',
     None, [("get_time", {"tz": "Asia/Tokyo"})]),
    ("hermes", "  \n", "  \n", []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
     None, [("get_weather", WEATHER_ARGS)]),
    ("llama3_json",
     '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
     '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}',
     None, [("get_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})]),
    ("llama3_json", "It is sunny in Paris.", "It is sunny in Paris.", []),
    ("mistral",
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
     '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]',
     None, [("get_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})]),
    ("mistral", 'Sure. [TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]',
     "Sure. ", [("get_time", {"tz": "Europe/Paris"})]),
    ("mistral", "No tools needed.", "No tools needed.", []),
]


@pytest.mark.parametrize("name, text, content, calls", CASES)
def test_parser_splits_content_and_calls(name, text, content, calls):
    parsed = tool_parser(name).parse(text)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == calls
    assert len({c.id for c in parsed.tool_calls}) == len(calls)
    if name == "mistral":
        assert all(len(c.id) == 9 and c.id.isalnum() for c in parsed.tool_calls)


@pytest.mark.parametrize("name, text, content, calls", CASES)
def test_streamed_prefixes_never_leak_call_text_as_content(name, text, content, calls):
    parser = tool_parser(name)
    sent = ""
    for end in range(1, len(text) + 1):  # one character at a time, the hardest split
        safe = parser.safe_prefix(text[:end])
        assert safe >= len(sent), "content once sent is never taken back"
        sent = text[:safe]
    if calls:
        assert parser.start not in sent and "{" not in sent
        assert sent == (content or "")  # the whole reply's content, as written (not stripped)
    else:  # whitespace alone is held until the output ends (the stream's end sends what is left)
        assert sent == (text if text.strip() else "")


def test_broken_call_json_stays_content():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
    parsed = tool_parser("hermes").parse(text)
    assert parsed.content == text and not parsed.tool_calls


# A call whose name is not a string, or whose arguments are not a JSON object, as a model can write it: each
# family's format around the bad call. OpenAI's `name` is a string and its `arguments` an object's JSON text.
_BAD_CALLS = ['{"name": 5, "arguments": {}}', '{"name": null, "arguments": {}}', '{"name": {"x": 1}, "arguments": {}}',
              '{"name": ["get_time"], "arguments": {}}', '{"name": "get_time", "arguments": "5"}',
              '{"name": "get_time", "arguments": "[1, 2]"}', '{"name": "get_time", "arguments": "null"}']
_WRAPPED = {"hermes": "<tool_call>{}</tool_call>", "llama3_json": "{}", "mistral": "[TOOL_CALLS][{}]"}


@pytest.mark.parametrize("call", _BAD_CALLS)
@pytest.mark.parametrize("name", sorted(_WRAPPED))
def test_a_call_named_by_a_non_string_or_with_non_object_arguments_stays_content(name, call):
    text = _WRAPPED[name].replace("{}", call)
    parsed = tool_parser(name).parse(text)
    assert parsed.content == text and not parsed.tool_calls
