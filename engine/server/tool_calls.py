"""Tool calling in chat completions: which tools the template sees, which grammar constrains the
output, and how the output becomes OpenAI `tool_calls`.

`tool_choice`:
- `none`: the model answers in text; the template still gets the tools, as vLLM's (which
  `--exclude-tools-when-tool-choice-none` leaves out).
- `auto` (the default when tools are given, as vLLM): the model decides; its text is split by the
  `--tool-call-parser` (needs `--enable-auto-tool-choice`); with `parallel_tool_calls` false only the first
  call is returned (vLLM's rule; the model is not constrained to one).
- `required`: the output is constrained to a JSON list of `{"name", "parameters"}` calls (one call
  when `parallel_tool_calls` is false), so it always parses and matches the tools' schemas.
- `{"type": "function", "function": {"name": ...}}`: the output is constrained to that function's
  parameters schema, and is the call's arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from flotilla.engine.server.errors import APIError
from flotilla.engine.server.reasoning import ReasoningParser
from flotilla.engine.server.tool_parsers.base import ContentStream, HeldStream, ParsedOutput, ToolCall, ToolParser
from flotilla.engine.server.tool_parsers.registry import tool_parser
from flotilla.engine.structured_output.params import StructuredOutputsParams

Mode = Literal["none", "auto", "required", "named"]
# vLLM's message content beside a forced call (required, named): "", where `auto` gives the parser's null.
FORCED_CALL_CONTENT = ""


@dataclass
class ToolPlan:
    """How one chat request uses its tools."""

    mode: Mode
    tools: list[dict[str, Any]]
    parser: ToolParser | None = None
    function: str | None = None  # the named function
    constraint: StructuredOutputsParams | None = None
    parallel: bool = True  # the request's parallel_tool_calls is not false

    @property
    def parses(self) -> bool:
        """Whether a finished output is parsed for calls (auto with a parser; required's JSON list)."""
        return self.mode == "required" or (self.mode == "auto" and self.parser is not None)

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the chat template renders (None for none)."""
        return self.tools or None

    def stream(self) -> ContentStream:
        """A streamed choice's answer: all of it streams (none; a named call's arguments), up to the parser's marker
        (auto), or none of it until the parse (required)."""
        if self.mode == "required":
            return HeldStream()
        if self.mode == "auto" and self.parser is not None:
            return self.parser.stream()
        return ContentStream()

    def parse(self, text: str) -> ParsedOutput:
        """Split a finished output into content and tool calls."""
        if self.mode == "named":
            assert self.function is not None
            return ParsedOutput(content=FORCED_CALL_CONTENT, tool_calls=[ToolCall(name=self.function, arguments=text)])
        if self.mode == "required":
            try:  # the grammar guarantees the shape unless max_tokens cut it short
                calls = json.loads(text)
                return ParsedOutput(content=FORCED_CALL_CONTENT, tool_calls=[
                    ToolCall(name=c["name"], arguments=json.dumps(c["parameters"], ensure_ascii=False))
                    for c in calls])
            # RecursionError: an output nested past json's depth limit (logit_bias can force one): content.
            except (ValueError, KeyError, TypeError, RecursionError):
                return ParsedOutput(content=text)
        if self.mode == "auto" and self.parser is not None:
            parsed = self.parser.parse(text)
            if not self.parallel:  # vLLM's maybe_filter_parallel_tool_calls: the first call only
                parsed.tool_calls = parsed.tool_calls[:1]
            return parsed
        return ParsedOutput(content=text)


def parse_values(plan: ToolPlan, reasoning: ReasoningParser | None, chars: int) -> int:
    """The work of splitting a finished output of `chars` characters into thinking, content and calls, counted as
    `json_reply.built` counts a reply's (JSON values): a character each when anything parses it, else none. The
    parsers' dearest texts cost 0.1-0.5 us a character (many calls in a row; qwen3_coder's parameters), about what
    encoding a value costs, and a reply holds at most a few values a call: an output of thousands of calls (a
    parallel-calls reply, 100k tokens of arguments) is parsed and built on a worker thread, not on the event loop,
    where /health and every stream waited for it. A short output (nearly every one) is parsed on the loop: the
    thread hop would cost more than its parse."""
    return chars if reasoning is not None or plan.parses else 0


def plan_tools(req: Any, auto_tool_choice: bool, parser_name: str | None,
               exclude_tools_when_tool_choice_none: bool = False) -> ToolPlan:
    """Validate `tools` and `tool_choice` and decide the request's ToolPlan (400s name the field); with
    `exclude_tools_when_tool_choice_none` (vLLM's flag) a `none` request's template gets no tools."""
    tools = [_checked_tool(t, i) for i, t in enumerate(req.tools or [])]
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, dict):
        return _named(choice, tools)
    if choice not in ("none", "auto", "required"):
        raise APIError(400, f"tool_choice {choice!r} is not one of none, auto, required or a named function",
                       param="tool_choice")
    if choice != "none" and not tools:
        raise APIError(400, f"tool_choice {choice!r} needs tools", param="tool_choice")
    if choice == "none":
        return ToolPlan("none", [] if exclude_tools_when_tool_choice_none else tools)
    if choice == "required":
        return ToolPlan("required", tools, constraint=StructuredOutputsParams(
            json_schema=_required_schema(tools, req.parallel_tool_calls is not False)))
    if not auto_tool_choice or parser_name is None:
        raise APIError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                       param="tool_choice")
    return ToolPlan("auto", tools, parser=tool_parser(parser_name, tools),
                    parallel=req.parallel_tool_calls is not False)


def _checked_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise APIError(400, f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                       param="tools")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise APIError(400, f"tools[{index}].function.parameters must be a JSON schema object", param="tools")
    return {**tool, "function": {**function, "parameters": parameters}}


def _named(choice: dict[str, Any], tools: list[dict[str, Any]]) -> ToolPlan:
    function = choice.get("function") if choice.get("type") == "function" else None
    if not isinstance(function, dict):  # e.g. {"function": 5}: read as a dict, it was a 500
        raise APIError(400, 'a named tool_choice is {"type": "function", "function": {"name": ...}}',
                       param="tool_choice")
    name = function.get("name")
    match = [t for t in tools if t["function"]["name"] == name]
    if not match:
        raise APIError(400, f"tool_choice names function {name!r}, which is not among the request's tools",
                       param="tool_choice")
    schema = match[0]["function"]["parameters"]
    return ToolPlan("named", tools, function=name, constraint=StructuredOutputsParams(json_schema=schema))


# Where a schema keeps the subschemas its `$ref`s name from its root (`#/$defs/X`; `definitions` before draft 2019).
_DEFS_KEYS = ("$defs", "definitions")


def _required_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """A list of at least one `{"name": <a tool>, "parameters": <its schema>}` (at most one if not parallel). Each
    tool's `$defs` move to the list's root, where its `#/$defs/...` references now point, as vLLM's."""
    calls = [{"type": "object", "properties": {"name": {"enum": [t["function"]["name"]]},
                                               "parameters": _without_defs(t["function"]["parameters"])},
              "required": ["name", "parameters"]} for t in tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}, **_merged_defs(tools)}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _without_defs(parameters: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in parameters.items() if key not in _DEFS_KEYS or not isinstance(value, dict)}


def _merged_defs(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every tool's `$defs` (and `definitions`) in one table each; a name two tools define differently is a 400,
    as vLLM's (one root cannot hold both)."""
    merged: dict[str, dict[str, Any]] = {}
    for tool in tools:
        for key in _DEFS_KEYS:
            defs = tool["function"]["parameters"].get(key)
            if not isinstance(defs, dict):
                continue
            table = merged.setdefault(key, {})
            for name, definition in defs.items():
                if table.setdefault(name, definition) != definition:
                    raise APIError(400, f"tool_choice 'required': tools define {key} {name!r} differently; one "
                                        "list of calls cannot hold both", param="tools")
    return merged


def thinking(text: str | None) -> dict[str, str | None]:
    """A reply's (or a delta's) thinking under both names vLLM has used: `reasoning` (its name since late 2025)
    and `reasoning_content` (the older one, DeepSeek's, which clients of earlier vLLM versions read)."""
    return {"reasoning": text, "reasoning_content": text}


def chat_message(plan: ToolPlan, text: str, finish_reason: str | None,
                 reasoning: ReasoningParser | None = None) -> tuple[dict[str, Any], str | None]:
    """The assistant message for a finished choice and its finish_reason (`tool_calls_finish` when it called);
    with a reasoning parser, the thinking goes to `reasoning` and `reasoning_content` and the rest is parsed."""
    message: dict[str, Any] = {"role": "assistant"}
    if reasoning is not None:
        split = reasoning.split(text)
        message.update(thinking(split.reasoning))
        text = split.content or ""
    parsed = plan.parse(text)
    forced = plan.mode in ("named", "required") and bool(parsed.tool_calls)
    message["content"] = parsed.content if (parsed.content or reasoning is None or forced) else None
    if not parsed.tool_calls:
        return message, finish_reason
    message["tool_calls"] = [c.as_openai() for c in parsed.tool_calls]
    return message, tool_calls_finish(plan, finish_reason)


def tool_calls_finish(plan: ToolPlan, finish_reason: str | None) -> str | None:
    """The finish_reason of a choice that called tools, as OpenAI and vLLM give it: "tool_calls" where the model
    chose to call (auto, required) and stopped; a named tool_choice keeps "stop" (the call was forced)."""
    return "tool_calls" if finish_reason == "stop" and plan.mode != "named" else finish_reason


def tool_call_deltas(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Streamed tool calls as OpenAI sends them: per call its index, id, type, name and arguments."""
    return [{"index": i, **c.as_openai()} for i, c in enumerate(calls)]
