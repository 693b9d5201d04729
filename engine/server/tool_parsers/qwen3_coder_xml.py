"""Where Qwen3-Coder's XML tool calls begin and end, when a value holds the format's own tags as text.

A parameter's value is raw text, so code written as a value can contain `</parameter>`, `</function>` or a whole
`<tool_call>` block. As vLLM's `qwen3_coder` parser reads the format, a tag is structural only where the format
could put one:
- `<parameter=NAME>` opens a parameter only at the start of a line (or of the function body);
- `</parameter>` closes one only when what follows it (after whitespace) is the next parameter (`<parameter=NAME>`
  with a NAME of the tool's schema, when the request has the tool), `</function>`, `</tool_call>`, or the end of the
  function body; a line-start `<parameter=` inside a value opens a nested (literal) parameter whose own
  `</parameter>` is not the value's end;
- `</function>` ends the function where the body's parameters end (each read as above), or, failing that, where it
  is followed by `</tool_call>` or the end of the text;
- `</tool_call>` ends a block only when followed by another `<tool_call>` or the end of the text.
A value with no structural end ends at the next line-start parameter of another schema name, or at the function's
end (generation stopped: the text so far).
"""

from __future__ import annotations

from collections.abc import Iterator

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
_SPACE = " \t\n\r"


def call_blocks(text: str) -> Iterator[str]:
    """Each `<tool_call>` block's inside: up to its structural `</tool_call>`, the last up to the end of the text."""
    pos = 0
    while (start := text.find(CALL_OPEN, pos)) >= 0:
        inside = text[start + len(CALL_OPEN):]
        end = _closer_followed_by(inside, CALL_CLOSE, (CALL_OPEN,))
        if end < 0:
            yield inside
            return
        yield inside[:end]
        pos = start + len(CALL_OPEN) + end + len(CALL_CLOSE)


def function_open(block: str) -> tuple[str, str] | None:
    """(NAME, the text after it) of a block's `<function=NAME>`, or None when it has none."""
    start = block.find(FUNCTION_OPEN)
    if start < 0:
        return None
    rest = block[start + len(FUNCTION_OPEN):]
    name_end = rest.find(">")
    return None if name_end < 0 else (rest[:name_end], rest[name_end + 1:])


def function_body(after_name: str, names: set[str] | None) -> str:
    """The function's body: the text after `<function=NAME>` up to its structural `</function>` (all of it when
    there is none). `names`: the tool's parameter names (None: the request does not have the tool)."""
    end = _function_end(after_name, names)
    if end < 0:  # parameters that do not read as the format: the first `</function>` a block end follows
        end = _closer_followed_by(after_name, FUNCTION_CLOSE, (CALL_CLOSE,))
    return after_name if end < 0 else after_name[:end]


def parameters(body: str, names: set[str] | None) -> Iterator[tuple[str, str]]:
    """(name, raw value) of each parameter of a function body, in order."""
    pos = 0
    while (start := _line_start_open(body, pos, None)) >= 0:
        name_end = body.find(">", start + len(PARAM_OPEN))
        if name_end < 0:
            return
        value = body[name_end + 1:]
        end = _value_end(value, names, at_body_end=True)
        if end >= 0:
            pos = name_end + 1 + end + len(PARAM_CLOSE)
        elif (implicit := _line_start_open(value, 0, names)) >= 0:  # left open: the next parameter ends it
            end, pos = implicit, name_end + 1 + implicit
        else:  # unfinished: up to a `</function>` a block end follows, or all of it
            end, pos = _closer_followed_by(value, FUNCTION_CLOSE, (CALL_CLOSE,)), len(body)
            end = len(value) if end < 0 else end
        yield body[start + len(PARAM_OPEN):name_end], value[:end]


def _function_end(body: str, names: set[str] | None) -> int:
    """Index of the body's structural `</function>`, found by stepping over each parameter, or -1."""
    pos, seen = 0, set[str]()
    while True:
        while pos < len(body) and body[pos] in _SPACE:
            pos += 1
        if pos >= len(body):
            return -1
        if body.startswith(FUNCTION_CLOSE, pos):
            return pos
        if not body.startswith(PARAM_OPEN, pos):  # stray text: the first `</function>` that a block end follows
            end = _closer_followed_by(body[pos:], FUNCTION_CLOSE, (CALL_CLOSE,))
            return -1 if end < 0 else pos + end
        name_end = body.find(">", pos + len(PARAM_OPEN))
        if name_end < 0:
            return -1
        name = body[pos + len(PARAM_OPEN):name_end]
        value_start = name_end + 1 + body.startswith("\n", name_end + 1)
        end = _value_end(body[value_start:], names, at_body_end=False)
        if end >= 0:
            pos = value_start + end + len(PARAM_CLOSE)
        else:  # left open: the next line-start parameter of a name not yet seen ends it
            unseen = None if names is None else names - seen - {name}
            implicit = _line_start_open(body[value_start:], 0, unseen)
            if implicit < 0:
                return -1
            pos = value_start + implicit
        seen.add(name)


def _value_end(value: str, names: set[str] | None, at_body_end: bool) -> int:
    """Index of the `</parameter>` that ends `value` (see the module docstring), or -1. `at_body_end`: the text ends
    where the function body does, so a closer with nothing after it is structural."""
    depth, pos = 0, 0
    while (close := value.find(PARAM_CLOSE, pos)) >= 0:
        nested = _line_start_open(value, pos, None)
        if 0 <= nested < close:
            depth, pos = depth + 1, nested + len(PARAM_OPEN)
        elif depth:
            depth, pos = depth - 1, close + len(PARAM_CLOSE)
        else:
            after = value[close + len(PARAM_CLOSE):].lstrip(_SPACE)
            if (at_body_end and not after) or _opens_parameter(after, names) \
                    or after.startswith((FUNCTION_CLOSE, CALL_CLOSE)):
                return close
            pos = close + len(PARAM_CLOSE)
    return -1


def _opens_parameter(text: str, names: set[str] | None) -> bool:
    """Whether `text` begins with `<parameter=NAME>`, NAME one of `names` (any, when None)."""
    if not text.startswith(PARAM_OPEN):
        return False
    name_end = text.find(">", len(PARAM_OPEN))
    return names is None or (name_end >= 0 and text[len(PARAM_OPEN):name_end] in names)


def _line_start_open(text: str, pos: int, names: set[str] | None) -> int:
    """Index of the next `<parameter=` from `pos` at the start of a line (or of `text`), NAME in `names` when given;
    -1 when none."""
    while (at := text.find(PARAM_OPEN, pos)) >= 0:
        if (at == 0 or text[at - 1] == "\n") and _opens_parameter(text[at:], names):
            return at
        pos = at + 1
    return -1


def _closer_followed_by(text: str, closer: str, nexts: tuple[str, ...]) -> int:
    """Index of the first `closer` followed (after whitespace) by the end of `text` or one of `nexts`; -1 if none."""
    pos = 0
    while (at := text.find(closer, pos)) >= 0:
        after = text[at + len(closer):].lstrip(_SPACE)
        if not after or after.startswith(nexts):
            return at
        pos = at + len(closer)
    return -1
