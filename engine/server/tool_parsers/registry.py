"""`--tool-call-parser` names -> parsers."""

from __future__ import annotations

from flotilla.engine.server.tool_parsers.base import ToolParser
from flotilla.engine.server.tool_parsers.hermes import HermesToolParser
from flotilla.engine.server.tool_parsers.llama3_json import Llama3JsonToolParser
from flotilla.engine.server.tool_parsers.mistral import MistralToolParser

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser)
}


def tool_parser(name: str) -> ToolParser:
    """The parser registered as `name` (the flag's choices are PARSERS' keys)."""
    return PARSERS[name]()
