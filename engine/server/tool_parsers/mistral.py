"""Mistral format: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`."""

from __future__ import annotations

import json

from flotilla.engine.server.tool_parsers.base import ToolCall, ToolParser, arguments_text, mistral_call_id


class MistralToolParser(ToolParser):
    """Mistral and Mixtral instruct models (v3 tokenizer and later)."""

    name = "mistral"
    start = "[TOOL_CALLS]"
    keeps_special_tokens = True

    def parse_calls(self, text: str) -> list[ToolCall]:
        """The JSON list after the marker (a single object is accepted too)."""
        body = text[len(self.start) :].strip()
        value, _ = json.JSONDecoder().raw_decode(body)
        items = value if isinstance(value, list) else [value]
        return [ToolCall(name=o["name"], arguments=arguments_text(o.get("arguments", {})), id=mistral_call_id())
                for o in items]
