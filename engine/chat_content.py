"""How a message's content reaches the chat template: vLLM's `--chat-template-content-format`.

`string`: each message's content is one text (a content list's text parts joined by a newline). `openai`: each
message's content is OpenAI's list of parts, `[{"type": "text", "text": ...}]` (a plain string becomes one part, no
content an empty list), for templates that loop over `message['content']`. `auto` (the default) picks per
template with vLLM's rule: `openai` when the template has a `for` loop over a message's `content`, a message
being a loop variable over `messages` (or over a variable set from it; filters, tests and slices are seen
through), else `string`; a template that does not parse is `string`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, Literal

from jinja2 import nodes

ContentFormat = Literal["string", "openai"]
ContentFormatOption = Literal["auto", "string", "openai"]


def detect_content_format(ast: nodes.Template) -> ContentFormat:
    """vLLM's detection on a parsed template: `openai` when it loops over a message's content parts."""
    try:
        return "openai" if any(True for _ in _content_loops(ast)) else "string"
    except (ValueError, RecursionError):  # a shape the rule does not follow (vLLM: its default, string)
        return "string"


def model_content_format(tokenizer: Any, given: ContentFormatOption, tools: list[dict[str, Any]] | None,
                         server_template: str | None = None) -> ContentFormat:
    """The content format for the server's template (--chat-template), else the model's own (the one transformers
    picks for `tools`)."""
    if given != "auto":
        return given
    try:
        return model_template_format(tokenizer.get_chat_template(server_template, tools))
    except ValueError:  # no template: rendering refuses the conversation
        return "string"


@functools.lru_cache(maxsize=32)
def model_template_format(source: str) -> ContentFormat:
    """`detect_content_format` for a trusted template (the model's own), parsed as transformers compiles it."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        ast = _compile_jinja_template(source).environment.parse(source)
    except Exception:
        return "string"
    return detect_content_format(ast)


def template_messages(messages: list[dict[str, Any]], content_format: ContentFormat) -> list[dict[str, Any]]:
    """The messages with their content in `content_format` (content parts already checked to be text)."""
    return [{**m, "content": _as_format(m.get("content"), content_format)} for m in messages]


def final_text(messages: list[dict[str, Any]]) -> str | None:
    """The text a `continue_final_message` continues: the last message's, or its last text part's (transformers'
    rule)."""
    texts = content_texts(messages[-1].get("content")) if messages else []
    return texts[-1] if texts else None


def _as_format(content: Any, content_format: ContentFormat) -> Any:
    if content_format == "string":  # no content: "", as vLLM (templates read message.content)
        return "\n".join(content_texts(content))
    return [{"type": "text", "text": text} for text in content_texts(content)]


def content_texts(content: Any) -> list[str]:
    """A content's texts: a string, or a part list's text parts (a part without text is skipped, as vLLM)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    return [str(part["text"]) for part in content if part.get("text") is not None]


def _content_loops(ast: nodes.Template) -> Iterator[nodes.For]:
    """`for` loops over a message's content, a message being a loop variable over messages."""
    messages = _aliases(ast, "messages")
    message_names = [_target(loop) for loop in ast.find_all(nodes.For)
                     if any(_reads(loop.iter, name) for name in messages)]
    for loop in ast.find_all(nodes.For):
        if any(_reads(loop.iter, name, "content") for name in message_names):
            _target(loop)
            yield loop


def _aliases(ast: nodes.Template, name: str) -> list[str]:
    """`name` and every variable set from it (or from one of those), transitively."""
    names, pending = [name], [name]
    while pending:
        current = pending.pop(0)
        for assign in ast.find_all(nodes.Assign):
            if _reads(assign.node, current):
                target = _target(assign)
                if target not in names:  # each name once: `set a = b` ... `set b = a` would loop forever
                    names.append(target)
                    pending.append(target)
    return names


def _target(node: nodes.For | nodes.Assign) -> str:
    if not isinstance(node.target, nodes.Name):
        raise ValueError("a loop or assignment target that is not one name")
    return node.target.name


def _reads(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """`node` is variable `name` (or its `key` item or attribute), possibly under filters, tests or a slice."""
    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    if key is None:
        return _is_name(node, name)
    if isinstance(node, nodes.Getitem):  # message['content'] (of the variable itself, as vLLM's rule)
        return isinstance(node.arg, nodes.Const) and node.arg.value == key and _is_name(node.node, name)
    return isinstance(node, nodes.Getattr) and node.attr == key and _is_name(node.node, name)


def _is_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name
