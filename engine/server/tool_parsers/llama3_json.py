"""Llama 3.1/3.2 JSON format: `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`,
several separated by `;`."""

from __future__ import annotations

import json

from flotilla.engine.server.tool_parsers.base import ContentStream, ToolCall, ToolParser, arguments_text

_PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    """Meta Llama 3.x with the JSON tool-calling template."""

    name = "llama3_json"
    start = "{"

    def call_start(self, text: str) -> int | None:
        """A tool call is the whole output: JSON from the first character (after the python tag)."""
        stripped = text.lstrip()
        offset = len(text) - len(stripped)
        if stripped.startswith(_PYTHON_TAG):
            return offset
        return offset if stripped.startswith("{") else None

    def safe_prefix(self, text: str) -> int:
        """Nothing is content until the output is known not to start with a call."""
        stripped = text.lstrip()
        if not stripped or _PYTHON_TAG.startswith(stripped[: len(_PYTHON_TAG)]) or stripped.startswith("{"):
            return 0
        return len(text)

    def stream(self) -> ContentStream:
        """Held until the output is known not to start with a call, then all content."""
        return _WholeStream()

    def parse_calls(self, text: str) -> list[ToolCall]:
        """Each JSON object in turn (`raw_decode`, so `;` or whitespace may separate them)."""
        text = text.strip().removeprefix(_PYTHON_TAG)
        decoder, calls, pos = json.JSONDecoder(), [], 0
        while pos < len(text):
            while pos < len(text) and text[pos] in " \t\r\n;":
                pos += 1
            if pos == len(text):
                break
            obj, pos = decoder.raw_decode(text, pos)
            args = obj.get("parameters", obj.get("arguments", {}))
            calls.append(ToolCall(name=obj["name"], arguments=arguments_text(args)))
        return calls


class _WholeStream(ContentStream):
    """`safe_prefix`, incrementally: nothing is sent while the output's start (leading whitespace aside) is empty, a
    proper prefix of the python tag, the tag or `{`; once it is anything else, all of it is content."""

    def __init__(self) -> None:
        super().__init__()
        self.head = ""  # the output's first characters after its leading whitespace (at most the tag's length)
        self.decided = False  # the output is content

    def feed(self, new: str) -> str:
        """`new` and all held before it once the output is known to be content, else nothing."""
        self.parts.append(new)
        if self.decided:
            self.sent += len(new)
            return new
        if len(self.head) == len(_PYTHON_TAG) or self.head.startswith("{"):
            return ""  # a call: held for the parse
        self.scanned += len(new)
        self.head = (self.head + new if self.head else new.lstrip())[: len(_PYTHON_TAG)]
        if not self.head or _PYTHON_TAG.startswith(self.head) or self.head.startswith("{"):
            return ""
        self.decided = True
        text = self.text  # once: the leading whitespace held so far, then the rest
        self.scanned += len(text)
        self.sent = len(text)
        return text
