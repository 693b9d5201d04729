"""`--tool-call-parser` names -> parsers."""

from __future__ import annotations

from typing import Any

from flotilla.engine.server.tool_parsers.base import ToolParser
from flotilla.engine.server.tool_parsers.hermes import HermesToolParser
from flotilla.engine.server.tool_parsers.llama3_json import Llama3JsonToolParser
from flotilla.engine.server.tool_parsers.mistral import MistralToolParser
from flotilla.engine.server.tool_parsers.qwen3_coder import Qwen3CoderToolParser

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, Qwen3CoderToolParser)
}


def tool_parser(name: str, tools: list[dict[str, Any]] | None = None) -> ToolParser:
    """The parser registered as `name` (the flag's choices are PARSERS' keys), for a request with `tools`."""
    return PARSERS[name](tools)
