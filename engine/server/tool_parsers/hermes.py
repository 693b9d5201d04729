"""Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, repeated."""

from __future__ import annotations

import json
import re

from flotilla.engine.server.tool_parsers.base import ToolCall, ToolParser, arguments_text

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class HermesToolParser(ToolParser):
    """Qwen2.5/Qwen3 and NousResearch Hermes models."""

    name = "hermes"
    start = "<tool_call>"

    def parse_calls(self, text: str) -> list[ToolCall]:
        """Every `<tool_call>` block (the last may lack its closing tag when generation stopped on EOS)."""
        calls = []
        for body in _CALL.findall(text):
            obj = json.loads(body)
            calls.append(ToolCall(name=obj["name"], arguments=arguments_text(obj.get("arguments", {}))))
        return calls
