"""What every tool-call parser produces, and the registry `--tool-call-parser` picks from."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from flotilla.engine.server.marker_tail import safe_len


@dataclass
class ToolCall:
    """One call as OpenAI returns it: an id, the function's name, its arguments as JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: "chatcmpl-tool-" + secrets.token_hex(16))

    def __post_init__(self) -> None:
        # A model can write any JSON as the name (`"name": 5`, null, an object); OpenAI's is a string, and a reply
        # carrying another type breaks typed clients. The parsers' callers read the TypeError as "no call".
        if not isinstance(self.name, str):
            raise TypeError(f"a tool call's name must be a string, not {type(self.name).__name__}")

    def as_openai(self) -> dict[str, Any]:
        """`{"id", "type": "function", "function": {"name", "arguments"}}`."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedOutput:
    """A model's text split into ordinary content and tool calls (none when it called nothing)."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


class ToolParser:
    """Splits a model's output in one family's tool-call format. Subclasses set `start` (the text that
    opens the tool calls) and implement `parse_calls` on the text from there on."""

    name = ""
    start = ""
    # The start marker is a special token that must survive detokenization (Mistral's [TOOL_CALLS]).
    keeps_special_tokens = False

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        # The request's tools: a format that writes arguments as text (qwen3_coder) types them by their schemas.
        self.tools = tools or []

    def parse(self, text: str) -> ParsedOutput:
        """Content before the calls, and the calls; text that does not parse stays content."""
        index = self.call_start(text)
        if index is None:
            return ParsedOutput(content=text)
        try:
            calls = self.parse_calls(text[index:])
        # RecursionError: JSON nested past json's depth limit, which a model can be made to write.
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return ParsedOutput(content=text)
        if not calls:
            return ParsedOutput(content=text)
        # The text before the calls as written, as vLLM's parsers give it (stripping it here made the whole reply
        # differ from the stream, which sends it as it comes); whitespace alone is no content (vLLM's rule).
        content = text[:index]
        return ParsedOutput(content=content if content.strip() else None, tool_calls=calls)

    @property
    def markers(self) -> tuple[str, ...]:
        """The texts that open the calls, the first found beginning them: `start` alone unless a format has more."""
        return (self.start,)

    def call_start(self, text: str) -> int | None:
        """Where the tool calls begin in `text` (its first marker), or None."""
        return first_marker(text, self.markers)

    def safe_prefix(self, text: str) -> int:
        """How much of a partial output is surely content (streaming): up to a started marker, or to a
        tail that could still grow into one; nothing while that is only whitespace (calls may follow it, and then it
        is no content)."""
        index = self.call_start(text)
        keep = index if index is not None else min(safe_len(text, marker) for marker in self.markers)
        return keep if text[:keep].strip() else 0

    def parse_calls(self, text: str) -> list[ToolCall]:
        """The calls in `text`, which starts at the marker."""
        raise NotImplementedError

    def stream(self) -> ContentStream:
        """A choice's streamed answer, sending what `safe_prefix` allows, incrementally."""
        return MarkerStream(self.markers)


class ContentStream:
    """One streamed choice's answer: `feed` takes each step's new text and returns the part of it (and of what was
    held back) that is surely content, so that the text sent after each step is `safe_prefix` of the text so far.
    `scanned` counts the characters read: a tail shorter than the marker plus the new text, so that a step's work
    does not grow with the output. `text` is the whole answer (joined once, when it is parsed)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.sent = 0  # characters sent as content
        self.scanned = 0

    @property
    def text(self) -> str:
        """The answer so far."""
        return "".join(self.parts)

    def feed(self, new: str) -> str:
        """Content to send after `new`: everything (no parser, tool_choice none)."""
        self.parts.append(new)
        self.scanned += len(new)
        self.sent += len(new)
        return new


class HeldStream(ContentStream):
    """An answer that is not content until it is parsed whole (tool_choice required): nothing streams."""

    def feed(self, new: str) -> str:
        """Nothing."""
        self.parts.append(new)
        return ""


class MarkerStream(ContentStream):
    """Content up to the first of the markers that open the calls (it and all after it are held for the parse).
    Whitespace that opens the answer is held too, until text that is more than whitespace comes (it goes out with
    it): if only calls follow it, the parse makes it no content."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        super().__init__()
        self.markers = markers
        self.held = ""  # unsent text before the marker is found: a tail that may grow into it
        self.blank: list[str] = []  # the whitespace that opened the answer, while nothing is sent
        self.found = False

    def feed(self, new: str) -> str:
        """`new`, or the part of it before the marker (or before a tail that may become one)."""
        self.parts.append(new)
        if self.found:
            return ""
        window = self.held + new
        self.scanned += len(window)
        index = first_marker(window, self.markers)
        keep = index if index is not None else min(safe_len(window, marker) for marker in self.markers)
        self.found = index is not None
        self.held = "" if self.found else window[keep:]
        out = window[:keep]
        if not self.sent and not out.strip():
            self.blank.append(out)
            return ""
        out, self.blank = "".join(self.blank) + out, []
        self.sent += len(out)
        return out


def first_marker(text: str, markers: tuple[str, ...]) -> int | None:
    """Index of the first of `markers` in `text`, or None when none is there."""
    found = [index for marker in markers if (index := text.find(marker)) >= 0]
    return min(found, default=None)


def arguments_text(value: Any) -> str:
    """Arguments as JSON text (a model may already have written them as a string): a JSON object's, as OpenAI's
    `arguments` always is (a client reads them with `json.loads(...)` into keyword arguments)."""
    if isinstance(value, str):
        if not isinstance(json.loads(value), dict):
            raise ValueError("tool arguments must be a JSON object")
        return value
    if not isinstance(value, dict):
        raise ValueError("tool arguments must be a JSON object")
    return json.dumps(value, ensure_ascii=False)


def mistral_call_id() -> str:
    """Mistral's tool-call ids: 9 letters and digits (its chat template refuses others)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))
