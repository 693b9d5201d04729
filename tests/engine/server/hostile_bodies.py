"""Hostile request bodies for the server's routes: every declared field of each request model set to each value of a
list of wrong types, extremes and odd text, plus malformed JSON. Raw JSON text, since some of these (NaN, Infinity,
lone surrogates, deep nesting) cannot come out of `json.dumps` of a valid value. Used by test_hostile_bodies.py."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel

from flotilla.engine.server.embeddings import EmbeddingRequest
from flotilla.engine.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from flotilla.engine.server.responses import ResponsesRequest

MESSAGES = [{"role": "user", "content": "Hi"}]
# Each route's smallest valid body, quick to serve (2 tokens), and the model it is validated against.
BASES: dict[str, tuple[type[BaseModel], dict]] = {
    "/v1/completions": (CompletionRequest, {"prompt": "Hi", "max_tokens": 2}),
    "/v1/chat/completions": (ChatCompletionRequest, {"messages": MESSAGES, "max_tokens": 2}),
    "/v1/responses": (ResponsesRequest, {"input": "Hi", "max_output_tokens": 2}),
    "/v1/embeddings": (EmbeddingRequest, {"input": "Hi"}),
    "/tokenize": (TokenizeRequest, {"prompt": "Hi"}),
    "/detokenize": (DetokenizeRequest, {"tokens": [1, 2]}),
}
# Places inside a body that are not top-level fields: a message's and an input item's parts.
NESTED = {
    "/v1/chat/completions": ["messages.0.role", "messages.0.content", "messages.0.name", "messages.0.tool_calls",
                             "messages.0.tool_call_id", "messages.0.content.0.text", "messages.0.content.0.type",
                             "stream_options.include_usage"],
    "/v1/responses": ["input.0.role", "input.0.content", "input.0.type", "input.0.content.0.text", "text.format",
                      "text.format.type", "reasoning.effort", "tools.0", "tools.0.name"],
    "/v1/completions": ["prompt.0", "prompt.0.0", "stream_options.include_usage", "logit_bias.5"],
}
# Values spelled as JSON text: wrong types, extremes, odd text. Lengths (max_tokens...) are only ever given these, so a
# valid one is small or refused.
VALUES = [
    '"x"', '""', "0", "-1", "7", "-7", "1.5", "-0.0", "true", "false", "null", "[]", "{}", "[1]", '["x"]', "[[1]]",
    '[{"x": 1}]', '{"a": 1}', '{"type": "text", "text": 5}',
    str(10**30), str(-(10**30)), str(2**63), str(-(2**63) - 1), str(2**64), "1e308", "-1e308", "1e400", "5e-324",
    "9" * 5000,  # more digits than Python's int() reads by default
    "NaN", "Infinity", "-Infinity", '[NaN]', '{"a": Infinity}',
    '"\\ud800"', '"a\\udfffb"', '["\\ud83d"]', '"\\u0000"', '"\\uffff"', '"\\ud83d\\ude00"', '"\\u202e\\u0301"',
    '"1"', '"1e400"', '"NaN"', '"' + "x" * 100_000 + '"',
    "[" * 5000 + "]" * 5000, '{"a":' * 600 + "1" + "}" * 600,
]
# The length fields: null is a valid value there that generates to the end of the context (a minute at load 10).
LENGTHS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Whole bodies that are not a JSON object, or not JSON.
MALFORMED = ["", " ", "{", "}", "[]", "null", "1", '"x"', "{'a': 1}", '{"a": 1,}', '{"a": 1} x', "\ufeff{}",
             '{"prompt": "Hi", "prompt": 5}', "\x00", "[" * 100_000, '{"a": "\\x"}', '{"a": "\\u12"}',
             "\xff\xfe", '{"messages": [' + '{"role": "user", "content": "Hi"},' * 3 + "]}"]


@dataclass(frozen=True)
class Case:
    """One request: the route, the body's JSON text, and what it sets (for failure messages)."""

    path: str
    raw: str
    what: str
    stream: bool = False


def _with(base: dict, where: str, value: str) -> str:
    """`base` as JSON text with the place `where` (dotted: field, or field.index.key...) holding the JSON text
    `value`, the containers on the way made as needed."""
    marker = "__HOSTILE_VALUE__"
    body = json.loads(json.dumps(base))
    keys = where.split(".")
    node = body
    for key, after in itertools.pairwise(keys):
        nxt: list | dict = [] if after.isdigit() else {}
        if isinstance(node, list):
            index = int(key)
            while len(node) <= index:
                node.append(nxt)
            if not isinstance(node[index], list | dict) or isinstance(node[index], list) != after.isdigit():
                node[index] = nxt
            node = node[index]
        else:
            if not isinstance(node.get(key), list | dict) or isinstance(node.get(key), list) != after.isdigit():
                node[key] = nxt
            node = node[key]
    last = keys[-1]
    if isinstance(node, list):
        while len(node) <= int(last):
            node.append(None)
        node[int(last)] = marker
    else:
        node[last] = marker
    return json.dumps(body).replace(f'"{marker}"', value)


def cases(paths: list[str] | None = None, per_place: int | None = None) -> Iterator[Case]:
    """The hostile cases of `paths` (default: all routes): each field and nested place set to each value, or to
    `per_place` of them, taken in turn so that the places together go through every value; as a stream and not,
    alternately, where the route streams. Then each malformed body."""
    for path in paths or list(BASES):
        model, base = BASES[path]
        places = [name for name in model.model_fields] + NESTED.get(path, [])
        streams = "stream" in model.model_fields
        count = len(VALUES) if per_place is None else per_place
        pairs = [(place, VALUES[(k * count + j) % len(VALUES)]) for k, place in enumerate(places) for j in range(count)]
        for i, (place, value) in enumerate((p, v) for p, v in pairs if not (p in LENGTHS and v == "null")):
            stream = streams and place != "stream" and i % 2 == 1
            body = {**base, "stream": True} if stream else base
            yield Case(path, _with(body, place, value), f"{place}={value[:40]}", stream)
        for raw in MALFORMED:
            yield Case(path, raw, f"body={raw[:40]!r}")
