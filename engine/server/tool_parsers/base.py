"""What every tool-call parser produces, and the registry `--tool-call-parser` picks from."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    """One call as OpenAI returns it: an id, the function's name, its arguments as JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: "chatcmpl-tool-" + secrets.token_hex(16))

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
        content = text[:index].strip()
        return ParsedOutput(content=content or None, tool_calls=calls)

    def call_start(self, text: str) -> int | None:
        """Where the tool calls begin in `text`, or None."""
        index = text.find(self.start)
        return None if index < 0 else index

    def safe_prefix(self, text: str) -> int:
        """How much of a partial output is surely content (streaming): up to a started marker, or to a
        tail that could still grow into one."""
        index = self.call_start(text)
        if index is not None:
            return index
        for keep in range(min(len(self.start) - 1, len(text)), 0, -1):
            if self.start.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)

    def parse_calls(self, text: str) -> list[ToolCall]:
        """The calls in `text`, which starts at the marker."""
        raise NotImplementedError


def arguments_text(value: Any) -> str:
    """Arguments as JSON text (a model may already have written them as a string)."""
    if isinstance(value, str):
        json.loads(value)  # must be JSON
        return value
    if not isinstance(value, dict):
        raise ValueError("tool arguments must be a JSON object")
    return json.dumps(value, ensure_ascii=False)


def mistral_call_id() -> str:
    """Mistral's tool-call ids: 9 letters and digits (its chat template refuses others)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))
