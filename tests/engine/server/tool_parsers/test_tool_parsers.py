"""Tool-call parsers on outputs written in each family's published format, whole and streamed."""

from __future__ import annotations

import json
import time

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


# qwen3_coder: Qwen3-Coder's and Qwen3.5's XML calls, their values typed by the request's tool schemas.
_QWEN3_TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer"}, "score": {"type": "number"},
    "exact": {"type": "boolean"}, "filters": {"type": "object"}, "tags": {"type": "array"},
    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "since": {"type": ["integer", "null"]},
    "free": {"description": "no type"}}}}}]


def _xml_call(name, params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def _qwen3(text, tools=_QWEN3_TOOLS):
    parsed = tool_parser("qwen3_coder", tools).parse(text)
    return parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


def test_qwen3_coder_types_values_by_the_tool_schema():
    text = "I'll search.\n" + _xml_call("search", [
        ("query", "42"), ("limit", "5"), ("score", "2.5"), ("exact", "True"), ("filters", '{"lang": "en"}'),
        ("tags", "['a', 'b']"), ("note", "None"), ("since", "null"), ("free", "[1, 2]")])
    assert _qwen3(text) == ("I'll search.\n", [("search", {
        "query": "42", "limit": 5, "score": 2.5, "exact": True, "filters": {"lang": "en"}, "tags": ["a", "b"],
        "note": None, "since": None, "free": "[1, 2]"})])


@pytest.mark.parametrize("param, value, expected", [
    ("limit", "five", "five"),  # an integer that is no integer stays the text, as vLLM's
    ("score", "3.0", 3),  # a number with no fraction is an integer
    ("score", "1e999", "1e999"),  # no JSON number: the text
    ("score", "nan", "nan"),
    ("exact", "yes", False),  # a boolean is true only for `true` (any case)
    ("filters", "{'k': 'v'}", {"k": "v"}),  # a Python literal where JSON fails
    ("filters", "{1, 2}", "{1, 2}"),  # a set is no JSON: the text
    ("filters", "[" * 100_000, "[" * 100_000),  # nested past the parsers' depth: the text, no crash
    ("query", "null", "null"),  # a string keeps `null`, unless the schema admits null (note above)
    ("limit", "None", None),
    ("unknown", "7", "7"),  # a parameter the schema does not name stays the text
])
def test_qwen3_coder_value_conversion_edges(param, value, expected):
    assert _qwen3(_xml_call("search", [(param, value)]))[1] == [("search", {param: expected})]


def test_qwen3_coder_trims_one_newline_each_side_and_keeps_the_rest():
    text = ("<tool_call>\n<function=search>\n<parameter=query>\n\n  two\nlines  \n\n</parameter>\n</function>\n"
            "</tool_call>")
    assert _qwen3(text)[1] == [("search", {"query": "\n  two\nlines  \n"})]
    inline = "<tool_call><function=search><parameter=query>x</parameter></function></tool_call>"
    assert _qwen3(inline)[1] == [("search", {"query": "x"})]


def test_qwen3_coder_several_calls_unknown_tools_and_no_tools():
    text = _xml_call("search", [("limit", "3")]) + "\n" + _xml_call("get_time", [("tz", "UTC"), ("n", "4")])
    assert _qwen3(text) == (None, [("search", {"limit": 3}), ("get_time", {"tz": "UTC", "n": "4"})])
    # Without the request's tools every value is text.
    assert _qwen3(text, tools=None)[1] == [("search", {"limit": "3"}), ("get_time", {"tz": "UTC", "n": "4"})]
    assert _qwen3(_xml_call("ping", []))[1] == [("ping", {})]


def test_qwen3_coder_unfinished_output_still_calls():
    # Generation stopped (EOS, max_tokens) before the closing tags: what was written is the call.
    text = "<tool_call>\n<function=search>\n<parameter=query>\nrust\n</parameter>\n<parameter=limit>\n2"
    assert _qwen3(text)[1] == [("search", {"query": "rust", "limit": 2})]
    # A parameter left open ends where the next begins.
    text = "<tool_call>\n<function=search>\n<parameter=query>\nrust\n<parameter=limit>\n2\n</parameter>\n</function>"
    assert _qwen3(text)[1] == [("search", {"query": "rust", "limit": 2})]


@pytest.mark.parametrize("text", [
    "<tool_call>\n</tool_call>",  # no function in it
    "<tool_call>\n<function={{ tool.name }}>\n</function>\n</tool_call>",  # an unrendered template is no name
    "<tool_call>\n<function=>\n</function>\n</tool_call>",
    "<tool_call>\n<function=search",  # the name never ended
    '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>',  # hermes' JSON is not this format
])
def test_qwen3_coder_blocks_without_a_function_stay_content(text):
    assert _qwen3(text) == (text, [])


def test_qwen3_coder_streamed_prefixes_hold_the_calls():
    text = "Let me look.\n" + _xml_call("search", [("query", "a <b> c")])
    parser = tool_parser("qwen3_coder", _QWEN3_TOOLS)
    stream, sent = parser.stream(), ""
    for ch in text:
        sent += stream.feed(ch)
    assert sent == "Let me look.\n" == parser.parse(stream.text).content


@pytest.mark.parametrize("value", [
    "x = '</parameter>'\nprint(x)",  # a closer mid-line, followed by text: not the value's end
    "see </function> and </tool_call> here",  # the function's and the block's closers, mid-line
    "<parameter=inner>\n1\n</parameter>",  # a literal parameter at a line start: nested, its closer its own
    "</parameter> then more",  # a closer at the start of the value, then text
    "# a whole call, as text\n<tool_call>\n<function=other>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
])
def test_qwen3_coder_a_value_may_hold_the_formats_closers_as_vllm(value):
    # vLLM's qwen3_coder reads a closer as the value's end only where the format could put one: followed by the next
    # schema parameter, </function>, </tool_call> or the body's end; the first regex match cut these values short.
    text = "Writing.\n" + _xml_call("search", [("query", value), ("limit", "2")]) + "\n"
    assert _qwen3(text) == ("Writing.\n", [("search", {"query": value, "limit": 2})])
    parser = tool_parser("qwen3_coder", _QWEN3_TOOLS)
    stream, sent = parser.stream(), ""
    for ch in text:  # streamed: the same calls from the whole text, the XML never content
        sent += stream.feed(ch)
    assert sent == "Writing.\n" and _qwen3(stream.text) == _qwen3(text)


def test_qwen3_coder_a_closer_before_the_next_parameter_ends_the_value_as_vllm():
    # Where the value's text itself holds "</parameter>" then a line-start schema parameter, vLLM takes that closer
    # as the value's end (the text cannot say otherwise).
    text = _xml_call("search", [("query", "a\n</parameter>\n<parameter=limit>\n7"), ("exact", "true")])
    assert _qwen3(text)[1] == [("search", {"query": "a", "limit": 7, "exact": True})]
    # A parameter of no schema name after it does not end it: that literal opener pairs with the value's real closer
    # (vLLM counts line-start openers), so the value, left without one, ends at the next schema parameter.
    text = _xml_call("search", [("query", "a\n</parameter>\n<parameter=nope>\n7"), ("exact", "true")])
    assert _qwen3(text)[1] == [("search", {"query": "a\n</parameter>\n<parameter=nope>\n7\n</parameter>",
                                           "exact": True})]
    # Two blocks: the first ends at its </tool_call>, which the next <tool_call> follows.
    two = _xml_call("search", [("limit", "1")]) + "\n" + _xml_call("search", [("limit", "2")])
    assert [args for _, args in _qwen3(two)[1]] == [{"limit": 1}, {"limit": 2}]


@pytest.mark.parametrize("params", [
    # a value holding `</parameter>` 40,000 times (a model asked to repeat it, ~600 kB): ~16 s before, ~0.1 s after
    [("query", "x</parameter>y\n" * 40_000)],
    # 60,000 parameters left open (no `</parameter>` at all, ~830 kB): each one searched the rest for a closer,
    # ~18 s before, ~0.4 s after
    [("query", "v\n<parameter=note>\nw")] * 30_000,
], ids=["closers-in-a-value", "open-parameters"])
def test_qwen3_coder_parses_in_linear_time(params):
    # Each closer is read in place and a body's closers are found once: slicing the rest of the text at each closer,
    # or searching it again for each parameter, made the parse quadratic. The bound sits 5x or more from either.
    body = "".join(f"<parameter={k}>\n{v}\n" + ("</parameter>\n" if "</parameter>" in v else "") for k, v in params)
    text = f"<tool_call>\n<function=search>\n{body}</function>\n</tool_call>"
    started = time.process_time()
    content, calls = _qwen3(text)
    assert time.process_time() - started < 3.0
    assert content is None and len(calls) == 1 and calls[0][0] == "search"
    assert calls[0][1]["query"] == (params[0][1] if len(params) == 1 else "v")  # an open value ends at the next


_NESTED = "<parameter=a>\n" * 4_000  # line-start opens of a function the request lacks: any name nests


@pytest.mark.parametrize("body, value", [
    # generation stopped: the first value holds the other opens, nested, and all but its own closer
    (_NESTED + "</parameter>\n" * 4_000, _NESTED[14:] + "</parameter>\n" * 3_998 + "</parameter>"),
    # closers followed by text end no value at depth 0: each parameter, left open, ends at the next; the last stays
    (_NESTED + "</parameter>x\n" * 4_000 + "</function>\n</tool_call>", ("</parameter>x\n" * 4_000)[:-1]),
    # every parameter closed, then a stray closer with 200 kB of spaces after it: what follows a closer is read once,
    # not once for each parameter before it
    ("<parameter=a>\n</parameter>\n" * 4_000 + "</parameter>" + " " * 200_000 + "x",
     "</parameter>\n</parameter>" + " " * 200_000 + "x"),
], ids=["unfinished", "closers-then-text", "closed-then-spaces"])
def test_qwen3_coder_parses_nested_parameters_in_linear_time(body, value):
    # 4,000 line-start `<parameter=a>` then 4,000 `</parameter>` (~110 kB): each open became a parameter whose value
    # was depth-matched over the rest, ~18 s of CPU (quadratic); the depths are now matched once for the body, under
    # 0.05 s. The bound sits 50x or more from either.
    started = time.process_time()
    content, calls = _qwen3(f"<tool_call>\n<function=nope>\n{body}")
    assert time.process_time() - started < 3.0
    assert content is None and calls == [("nope", {"a": value})]


def _bare_call(name, params):
    return _xml_call(name, params).removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")


@pytest.mark.parametrize("text, expected", [
    # Qwen3-Coder models leave out the <tool_call> wrapper: vLLM's parser then reads every <function= as a call,
    # and the content is the text before the first.
    ("I'll search.\n" + _bare_call("search", [("query", "rust"), ("limit", "3")]),
     ("I'll search.\n", [("search", {"query": "rust", "limit": 3})])),
    (_bare_call("search", [("limit", "1")]) + "\n" + _bare_call("get_time", [("tz", "UTC")]) + "\n",
     (None, [("search", {"limit": 1}), ("get_time", {"tz": "UTC"})])),
    # generation stopped before </function>: what was written is the call
    ("<function=search>\n<parameter=query>\nrust\n</parameter>\n<parameter=limit>\n2",
     (None, [("search", {"query": "rust", "limit": 2})])),
    # a value may hold </function> and <function= as text: a bare function ends only at a </function> that the end
    # of the text, another <function= or a <tool_call> follows
    (_bare_call("search", [("query", "a </function> b\n<function=x> c"), ("limit", "4")]),
     (None, [("search", {"query": "a </function> b\n<function=x> c", "limit": 4})])),
    # bare, then wrapped: both are calls (the stream holds the text from the first opening)
    (_bare_call("search", [("limit", "1")]) + "\n" + _xml_call("search", [("limit", "2")]),
     (None, [("search", {"limit": 1}), ("search", {"limit": 2})])),
    # an unrendered template is no name: no call, all content
    ("Use <function={{ name }}> here.", ("Use <function={{ name }}> here.", [])),
    # two functions in one block are two calls, as vLLM reads every <function= of a block (the second was dropped)
    ("<tool_call>\n" + _bare_call("search", [("limit", "1")]) + "\n" + _bare_call("get_time", [("tz", "UTC")])
     + "\n</tool_call>", (None, [("search", {"limit": 1}), ("get_time", {"tz": "UTC"})])),
])
def test_qwen3_coder_reads_a_call_without_its_wrapper_as_vllm(text, expected):
    assert _qwen3(text) == expected
    parser = tool_parser("qwen3_coder", _QWEN3_TOOLS)
    stream, sent = parser.stream(), ""
    for ch in text:  # streamed: the function's XML is never content, and the content is the whole reply's
        sent += stream.feed(ch)
    # (with no call, the text from the opening on is held, and the stream's end sends it)
    assert sent == (expected[0] or "" if expected[1] else text[: text.find("<function=")])


@pytest.mark.parametrize("text", [
    # 4,000 bare calls in a row (~270 kB, ~0.3 s, as long as the same calls wrapped): each is read within its own
    # text, not the rest of the reply's
    _bare_call("search", [("limit", "1"), ("query", "q")]) * 4_000,
    # the same calls in one <tool_call> block
    "<tool_call>\n" + _bare_call("search", [("limit", "1"), ("query", "q")]) * 4_000 + "\n</tool_call>",
    # one bare call whose value holds 60,000 `</function>` followed by text (~800 kB): each closer is looked at once
    "<function=search>\n<parameter=query>\n" + "</function>x\n" * 60_000,
    # 60,000 bare openings and no closer (~800 kB): one unfinished call whose value holds the rest
    "<function=search>\n<parameter=query>\n" + "<function=search>\n" * 45_000,
], ids=["many-calls", "many-in-one-block", "closers-in-a-value", "openings-without-closers"])
def test_qwen3_coder_parses_bare_calls_in_linear_time(text):
    # Each bare function is cut out first (a </function> that another <function= follows) and parsed within its own
    # text: read against the rest of the reply, as the value ends are worked out, many bare calls would be
    # quadratic. The bound sits far above the linear parse's time.
    started = time.process_time()
    content, calls = _qwen3(text)
    assert time.process_time() - started < 5.0
    assert content is None and {name for name, _ in calls} == {"search"}
    assert len(calls) == text.count("</function><function=") + 1
