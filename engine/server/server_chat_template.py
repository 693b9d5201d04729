"""The operator's chat template and template variables: vLLM's `--chat-template` and `--default-chat-template-kwargs`.

`--chat-template` replaces the tokenizer's template for every chat rendering (chat completions, /tokenize with
messages, /v1/embeddings with messages, the Responses API); a template sent in a request still comes first where
`--trust-request-chat-template` allows one. The value is a file path or the template itself, told apart as vLLM
does: a value that opens as a file is read; one that does not is taken as the template when it holds a `{`, a `}`
or a newline (what a path never has), and refused at start-up otherwise (a mistyped path). The operator's
template is trusted as the model's own is: transformers renders it, not the request sandbox.

`--default-chat-template-kwargs` are template variables under each request's `chat_template_kwargs`: a request's
key wins unless its value is null or "auto" (vLLM's merge), which leaves the default. A chat request's top-level
`reasoning_effort` is the template's `reasoning_effort` over both, and switches `enable_thinking` (off for "none")
unless the request's own kwargs set it (vLLM's ChatCompletionRequest.build_chat_params).
"""

from __future__ import annotations

from typing import Any

from flotilla.engine_rules import looks_like_chat_template


def load_chat_template(value: str | None) -> str | None:
    """The template `--chat-template` gives: a file's text, or the value itself (see the module's rule).

    Raises ValueError for a value that looks like a path but cannot be read.
    """
    if value is None:
        return None
    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the value, or a file that is not UTF-8
        if looks_like_chat_template(value):
            return value
        raise ValueError(f"--chat-template {value!r} looks like a file path, but it could not be read ({exc}); "
                         "give a readable file or the template's text") from None


def request_template_kwargs(request: dict[str, Any] | None, reasoning_effort: str | None) -> dict[str, Any] | None:
    """A chat request's template variables: its `chat_template_kwargs`, with its top-level `reasoning_effort` over
    them and, unless they name `enable_thinking`, `enable_thinking` false for effort "none", true for any other
    (templates such as Gemma's think only when asked; a template that reads neither renders as before)."""
    if reasoning_effort is None:
        return request
    switch = {} if "enable_thinking" in (request or {}) else {"enable_thinking": reasoning_effort != "none"}
    return (request or {}) | {"reasoning_effort": reasoning_effort} | switch


def merged_template_kwargs(defaults: dict[str, Any] | None, request: dict[str, Any] | None) -> dict[str, Any] | None:
    """A request's `chat_template_kwargs` over the server's defaults (vLLM's merge; no defaults: the request's)."""
    if not defaults:
        return request
    # null and "auto" are vLLM's unset values: they leave the default in place
    return defaults | {k: v for k, v in (request or {}).items() if v is not None and v != "auto"}
