"""Responses API items and fields in the chat path's shapes, and back.

The Responses API spells flat what chat completions nest: a tool is `{"type": "function", "name",
"parameters"}` (chat: under `function`), a named `tool_choice` is `{"type": "function", "name"}`, an
output format is `text.format` (chat: `response_format`). A model's call is an output item
`{"type": "function_call", "call_id", "name", "arguments"}`, and its result comes back as an input item
`{"type": "function_call_output", "call_id", "output"}`. Mapped onto chat's shapes, the chat path's
tool machinery (tool_calls.py: plan, grammar, parsing) and structured output serve both APIs.
"""

from __future__ import annotations

import uuid
from typing import Any

from flotilla.engine.server.errors import APIError
from flotilla.engine.server.protocol import TEXT_PART_TYPES
from flotilla.engine.server.tool_parsers.base import ToolCall


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' function tools in chat's nested shape; other tool types (web search, file search,
    MCP, ...) are a 400 that names them."""
    if not tools:
        return None
    nested = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise APIError(400, f"tools[{i}]: only function tools ({{\"type\": \"function\", \"name\": ...}}) are "
                                f"supported, not {tool.get('type')!r}", param="tools")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        nested.append({"type": "function", "function": function})
    return nested


def chat_tool_choice(choice: str | dict[str, Any], has_tools: bool) -> str | dict[str, Any]:
    """`auto` / `required` / `none`, or a named function in chat's shape (`none` for `auto` when there are no tools,
    as Responses' default `auto` means nothing then). Without tools, a choice that asks for a call (`required`, a
    named function) or is no choice at all (`"bogus"`) goes on as it is, for plan_tools' 400: it was served without
    a call (vLLM refuses a named function not among `tools`, and an unknown choice)."""
    named = isinstance(choice, dict) and choice.get("type") == "function"
    if not has_tools and (choice in ("auto", "none") or (isinstance(choice, dict) and not named)):
        return "none"
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format`: json_schema's flat `name`/`schema` go under `json_schema`."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise APIError(400, "text.format must be an object with a type (text, json_object, json_schema)",
                       param="text")
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "text.format json_schema needs schema, a JSON schema object", param="text")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "response"), "schema": fmt["schema"]}}
    raise APIError(400, f"text.format type {kind!r} is not one of text, json_object, json_schema", param="text")


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `input` field as chat messages: a text is one user message; message items keep their role and
    their content (a text, or its list of text parts); `function_call` items become the assistant's `tool_calls`
    (consecutive ones join one assistant message), `function_call_output` items become `tool` messages; a
    `reasoning` item (a response's output sent back whole) is the assistant message's `reasoning`, as vLLM's."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            _add_message(messages, _message(item, f"input[{i}].content"))
        elif kind == "reasoning":
            _add_reasoning(messages, item, i)
        elif kind == "function_call":
            _add_call(messages, item)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or not isinstance(output, str | list):
                raise APIError(400, f"input[{i}]: a function_call_output item needs call_id and output (a text, or "
                                    "a list of input_text parts)", param="input")
            # A list stays a list, as vLLM hands it on: the template gets the parts as a chat tool message's
            content = output if isinstance(output, str) else _text_parts(output, f"input[{i}].output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        else:
            raise APIError(400, f"input items of type {kind!r} are not supported (only message, reasoning, "
                                "function_call and function_call_output)", param="input")
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A message item as a chat message; a list of text parts stays a list, so the template gets its content as
    chat's would (each part in the openai content format, or joined by a newline in the string one)."""
    content = item.get("content")
    if not isinstance(content, str | list) or item.get("role") not in ("user", "assistant", "system", "developer"):
        raise APIError(400, "each input message needs a role (user, assistant, system, developer) and text "
                            "content", param="input")
    return {"role": item["role"], "content": content if isinstance(content, str) else _text_parts(content, where)}


def _text_parts(parts: list[Any], where: str) -> list[dict[str, Any]]:
    """`parts` (found at `where`), each checked to be a text part whose text, if any, is a string (a part without
    text adds nothing, as in chat); any other part (input_image, input_file: this server reads text only) or a
    text that is not a string is a 400 naming it, where joining them into one text turned `5` into "5" and a
    missing text into an empty line."""
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in TEXT_PART_TYPES:
            raise APIError(400, f"{where}[{j}]: content parts of type {kind!r} are not supported; only text parts "
                                f"({', '.join(TEXT_PART_TYPES)})", param="input")
        if part.get("text") is not None and not isinstance(part["text"], str):
            raise APIError(400, f"{where}[{j}].text must be a string", param="input")
    return parts


def _add_message(messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """A message, or (an assistant message after a reasoning item) the answer of the reasoning's message."""
    last = messages[-1] if messages else None
    if (message["role"] == "assistant" and last is not None and last["role"] == "assistant"
            and last["content"] is None and "tool_calls" not in last):
        last["content"] = message["content"]
    else:
        messages.append(message)


def _add_reasoning(messages: list[dict[str, Any]], item: dict[str, Any], index: int) -> None:
    """A `reasoning` input item as the `reasoning` of the assistant message it follows (or of a new one): its
    first content part's text (or its first summary's), as vLLM reads it; encrypted content is a 400, as vLLM's."""
    if item.get("encrypted_content"):
        raise APIError(400, f"input[{index}]: encrypted reasoning content is not supported", param="input")
    parts = item.get("content") or item.get("summary") or [{"text": ""}]  # none: an empty thinking, as vLLM's
    first = parts[0] if isinstance(parts, list) else None
    text = first.get("text") if isinstance(first, dict) else None
    if not isinstance(text, str):
        raise APIError(400, f"input[{index}]: a reasoning item's content (or summary) is a list of parts with a text",
                       param="input")
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "reasoning" not in last:
        last["reasoning"] = text
    else:
        messages.append({"role": "assistant", "content": None, "reasoning": text})


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any]) -> None:
    """A `function_call` input item as a tool call of the assistant message it follows (or a new one)."""
    if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
        raise APIError(400, "a function_call item needs call_id, name and arguments (a JSON text)", param="input")
    call = {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def assistant_turn(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A response's output items as the assistant message a later turn's conversation holds."""
    text = "".join(part["text"] for item in items if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                       "arguments": item["arguments"]}}
             for item in items if item["type"] == "function_call"]
    return {"role": "assistant", "content": text or (None if calls else ""), **({"tool_calls": calls} if calls else {})}


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An `output_text` content part; `logprobs`: its tokens' (chat's entries), when the request included them."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(message_id: str, text: str | None, status: str,
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The assistant's `message` output item (no content part yet when `text` is None)."""
    content = [] if text is None else [text_part(text, logprobs)]
    return {"id": message_id, "type": "message", "role": "assistant", "status": status, "content": content}


def event_logprobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat's logprob entries as an `output_text.delta`/`.done` event's, vLLM's shape: token, logprob and the
    alternatives' token and logprob (no `bytes`, which only the content part's entries have)."""
    return [{"token": e["token"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]]}
            for e in entries]


def reasoning_item(text: str | None, item_id: str | None = None,
                   status: str | None = None) -> dict[str, Any] | None:
    """vLLM's `reasoning` output item: the thinking as one `reasoning_text` part, no summary (None when there is no
    thinking). Its status is None in a response, as vLLM's (only the last item has one); "completed" in the
    stream's `output_item.done`."""
    if not text:
        return None
    return {"id": item_id or f"rs_{uuid.uuid4().hex}", "type": "reasoning", "summary": [],
            "content": [reasoning_part(text)], "status": status}


def reasoning_part(text: str) -> dict[str, Any]:
    """A `reasoning_text` content part."""
    return {"type": "reasoning_text", "text": text}


def function_call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    """A `function_call` output item; `call_id` is what the client's `function_call_output` refers to."""
    return {"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "call_id": f"call_{uuid.uuid4().hex}",
            "name": call.name, "arguments": call.arguments, "status": status}
