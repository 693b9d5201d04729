"""Rendering a conversation with a trusted chat template: the part of chat rendering that the server and the
offline API (`LLM.chat`) share.

A trusted template is the model's own, the operator's `--chat-template`, or one an offline caller passes (it runs
in the caller's own process); transformers renders it. A template sent in a server request is not trusted: the
server renders that one in its sandbox (server/chat_template.py), with the same variables.
"""

from __future__ import annotations

import json
from typing import Any

from flotilla.engine.chat_content import ContentFormatOption, model_content_format, template_messages
from flotilla.engine_rules import CHAT_TEMPLATE_RENDERER_ARGUMENTS


def chosen_template(chat_template: str | None, kwargs: dict[str, Any] | None) -> str | None:
    """The template asked for: `chat_template`, else `chat_template_kwargs["chat_template"]` (vLLM reads both)."""
    template = chat_template if chat_template is not None else (kwargs or {}).get("chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError("chat_template must be a string")
    return template


def template_variables(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`chat_template_kwargs` as extra template variables; names of the renderer's own arguments are refused."""
    variables = dict(kwargs or {})
    variables.pop("chat_template", None)  # decided by chosen_template
    reserved = sorted(CHAT_TEMPLATE_RENDERER_ARGUMENTS & variables.keys())
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)}: these are the renderer's own "
                         "arguments, not template variables")
    return variables


def history_for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant `tool_calls` with their arguments as objects: chat templates (Qwen's, Llama's)
    serialise them themselves, and a JSON string would be encoded twice (a message's content is put in the
    template's form by chat_content.template_messages). A message's thinking sent back as `reasoning` (vLLM's
    reply field) is also its `reasoning_content`, the name templates read (Qwen3's), as vLLM passes it; and the
    other way round. Changes `messages` in place.

    Raises ValueError for `tool_calls` that are not a list of objects, a tool call without a function named by a
    string, or one whose arguments are not JSON.
    """
    for m in messages:
        for name, other in (("reasoning", "reasoning_content"), ("reasoning_content", "reasoning")):
            if m.get(name) is not None and m.get(other) is None:
                m[other] = m[name]
        calls = m.get("tool_calls")
        # As vLLM's message schema: a list of call objects or null. A number was iterated (a TypeError: a plain-text
        # 500); a string or an object reached the template as characters or keys.
        if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
            raise ValueError("an assistant message's tool_calls must be a list of tool call objects")
        for call in calls or []:
            function = call.get("function")
            # As vLLM's message schema (and OpenAI's): the name is text; a number reached the template as is.
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError("an assistant tool call's function must be an object with a string name")
            if isinstance(function.get("arguments"), str):
                try:
                    function["arguments"] = json.loads(function["arguments"])
                except (ValueError, RecursionError):  # nested past the parser's depth: RecursionError
                    raise ValueError("an assistant tool call's arguments are not JSON (or nest too deeply)") from None
    return messages


def render_trusted(tokenizer: Any, messages: list[dict[str, Any]], chat_template: str | None,
                   content_format: ContentFormatOption, add_generation_prompt: bool, continue_final_message: bool,
                   variables: dict[str, Any]) -> str:
    """The prompt text of `messages` (already through history_for_template) under `chat_template` (None: the
    model's own), their content in `content_format`; `variables` (with `tools` where given) reach the template.

    Raises what the template raises (e.g. a role order it refuses), and ValueError without a template.
    """
    found = model_content_format(tokenizer, content_format, variables.get("tools"), chat_template)
    return tokenizer.apply_chat_template(template_messages(messages, found), chat_template=chat_template,
                                         tokenize=False, add_generation_prompt=add_generation_prompt,
                                         continue_final_message=continue_final_message, **variables)


def check_prompt_end(add_generation_prompt: bool, continue_final_message: bool) -> None:
    """vLLM's rule: a prompt either opens a new reply or continues the last message, not both.

    Raises ValueError when both are asked for.
    """
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true (set "
                         "add_generation_prompt to false to continue the final message)")
