"""Qwen3-Coder / Qwen3.5 XML format: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
</function>\n</tool_call>`, repeated.

Values are text; each becomes JSON by the type its parameter has in the request's tool schema, as vLLM's
`qwen3_coder` parser converts them: string types stay strings, integers and numbers are parsed (a number with no
fraction becomes an integer), booleans are `true` (any other text is false), objects and arrays are read as JSON
and then as a Python literal; `null`/`None` is null for a non-string or a nullable parameter. A value that does not
convert, and a parameter the schema does not name (or a tool the request does not have), stays the text.

A model may leave out the `<tool_call>` wrapper (Qwen3-Coder models do): as vLLM's parser, a bare
`<function=NAME>...</function>` is a call too, several in a row are several calls (as several functions in one
block are), and the content is the text before the first. One difference: a bare function written before a
`<tool_call>` block is a call here, where vLLM (which reads bare functions only when the output has no block)
leaves it in the content; a stream sends content up to the first of the two openings, and cannot take back the text
after it.
"""

from __future__ import annotations

import ast
import itertools
import json
from typing import Any

from flotilla.engine.server.tool_parsers.base import ToolCall, ToolParser
from flotilla.engine.server.tool_parsers.qwen3_coder_xml import (
    CALL_OPEN,
    FUNCTION_OPEN,
    call_blocks,
    function_body,
    function_open,
    functions,
    parameters,
)

# Characters no function name has: a model that writes an unrendered template (`<function={{ name }}>`) calls nothing.
_NOT_IN_NAMES = set("{}<>\"' \t\n\r")
_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")


class Qwen3CoderToolParser(ToolParser):
    """Qwen3-Coder and Qwen3.5 models (vLLM's `qwen3_coder`)."""

    name = "qwen3_coder"
    start = CALL_OPEN

    @property
    def markers(self) -> tuple[str, ...]:
        """`<tool_call>`, or a bare `<function=` (the model left the wrapper out)."""
        return (CALL_OPEN, FUNCTION_OPEN)

    def parse_calls(self, text: str) -> list[ToolCall]:
        """Every bare function before the first `<tool_call>`, then every function of each `<tool_call>` block (the
        last may lack its closing tags when generation stopped); a block with no `<function=NAME>`, or whose name is
        no name, is no call. The tags in a value's text are found as vLLM finds them (qwen3_coder_xml.py), so a value
        may hold `</parameter>` or `</function>`."""
        wrapped = text.find(CALL_OPEN)
        bare = text if wrapped < 0 else text[:wrapped]
        calls = []
        blocks = itertools.chain([bare], call_blocks(text[len(bare):]))
        for function in (each for block in blocks for each in functions(block)):
            opened = function_open(function)
            if opened is None or not _is_name(opened[0]):
                continue
            name, after_name = opened
            properties = self.properties(name)
            names = set(properties) or None  # vLLM's: no schema names, no name check
            arguments = {param: _json_or_text(convert(_trimmed(value), properties.get(param)), _trimmed(value))
                         for param, value in parameters(function_body(after_name, names), names)}
            calls.append(ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
        return calls

    def properties(self, function: str) -> dict[str, Any]:
        """The request's schema for each parameter of `function` (none for a tool it does not have)."""
        for tool in self.tools:
            spec = tool.get("function", {})
            if spec.get("name") == function:
                properties = spec.get("parameters", {}).get("properties", {})
                return properties if isinstance(properties, dict) else {}
        return {}


def _is_name(name: str) -> bool:
    return bool(name) and not any(c in _NOT_IN_NAMES for c in name)


def _trimmed(value: str) -> str:
    """The value without the one newline the format puts after `<parameter=P>` and before `</parameter>`."""
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


def _schema_type(schema: Any) -> tuple[str, bool]:
    """A parameter's type (its first non-null one; string when it names none) and whether it admits null."""
    if not isinstance(schema, dict):
        return "string", False
    types = schema.get("type")
    if types is None and isinstance(schema.get("anyOf"), list):
        types = [o.get("type") for o in schema["anyOf"] if isinstance(o, dict) and "type" in o]
    if types is None:
        return "string", False
    names = [str(t).strip().lower() for t in (types if isinstance(types, list) else [types])]
    real = [t for t in names if t != "null"]
    return (real[0] if real else "null"), len(real) < len(names)


def convert(value: str, schema: Any) -> Any:
    """A parameter's text as the JSON value its schema's type makes of it (the text itself when it does not convert
    or the parameter has no schema)."""
    if schema is None:
        return value
    kind, nullable = _schema_type(schema)
    if nullable and value.lower() in ("null", "none"):
        return None
    if kind in _STRING_TYPES:
        return value
    if value.lower() in ("null", "none"):
        return None
    if kind.startswith(_INT_PREFIXES):
        return _or_text(int, value)
    if kind.startswith(("num", "float")):
        number = _or_text(float, value)
        return int(number) if isinstance(number, float) and number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # RecursionError: nested past json's depth limit
            pass
    return _or_text(ast.literal_eval, value)


def _json_or_text(value: Any, text: str) -> Any:
    """`value` where JSON can hold it, else the text it came from (a Python literal can be a set, bytes, or a
    number too large for JSON's, such as `1e999`)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return text
    return value


def _or_text(read: Any, value: str) -> Any:
    try:
        return read(value)
    # RecursionError/MemoryError: literal_eval on text nested deeper than the parser goes, which a model can write.
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return value
