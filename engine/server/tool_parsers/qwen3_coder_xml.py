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

import re
from bisect import bisect_left
from collections.abc import Iterator

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
_NOT_SPACE = re.compile(r"[^ \t\n\r]")

# Every helper reads the text in place, by offsets, and a body's `</parameter>` positions are found once: slicing
# the rest of the text at each closer (to look at what follows it), or searching it again for each parameter, made a
# reply of many `</parameter>` (or of many parameters) quadratic to parse, seconds of the API process for one reply.


def call_blocks(text: str) -> Iterator[str]:
    """Each `<tool_call>` block's inside: up to its structural `</tool_call>`, the last up to the end of the text."""
    pos = 0
    while (start := text.find(CALL_OPEN, pos)) >= 0:
        inside = start + len(CALL_OPEN)
        end = _closer_followed_by(text, inside, CALL_CLOSE, (CALL_OPEN,))
        if end < 0:
            yield text[inside:]
            return
        yield text[inside:end]
        pos = end + len(CALL_CLOSE)


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
        end = _closer_followed_by(after_name, 0, FUNCTION_CLOSE, (CALL_CLOSE,))
    return after_name if end < 0 else after_name[:end]


def parameters(body: str, names: set[str] | None) -> Iterator[tuple[str, str]]:
    """(name, raw value) of each parameter of a function body, in order."""
    pos, closes = 0, _closers(body)
    while (start := _line_start_open(body, pos, 0, None)) >= 0:
        name_end = body.find(">", start + len(PARAM_OPEN))
        if name_end < 0:
            return
        value = name_end + 1
        end = _value_end(body, value, names, closes, at_body_end=True)
        if end >= 0:
            pos = end + len(PARAM_CLOSE)
        elif (implicit := _line_start_open(body, value, value, names)) >= 0:  # left open: the next parameter ends it
            end, pos = implicit, implicit
        else:  # unfinished: up to a `</function>` a block end follows, or all of it
            end, pos = _closer_followed_by(body, value, FUNCTION_CLOSE, (CALL_CLOSE,)), len(body)
            end = len(body) if end < 0 else end
        yield body[start + len(PARAM_OPEN):name_end], body[value:end]


def _function_end(body: str, names: set[str] | None) -> int:
    """Index of the body's structural `</function>`, found by stepping over each parameter, or -1."""
    pos, seen, closes = 0, set[str](), _closers(body)
    while True:
        pos = _skip_space(body, pos)
        if pos >= len(body):
            return -1
        if body.startswith(FUNCTION_CLOSE, pos):
            return pos
        if not body.startswith(PARAM_OPEN, pos):  # stray text: the first `</function>` that a block end follows
            return _closer_followed_by(body, pos, FUNCTION_CLOSE, (CALL_CLOSE,))
        name_end = body.find(">", pos + len(PARAM_OPEN))
        if name_end < 0:
            return -1
        name = body[pos + len(PARAM_OPEN):name_end]
        value_start = name_end + 1 + body.startswith("\n", name_end + 1)
        end = _value_end(body, value_start, names, closes, at_body_end=False)
        if end >= 0:
            pos = end + len(PARAM_CLOSE)
        else:  # left open: the next line-start parameter of a name not yet seen ends it
            unseen = None if names is None else names - seen - {name}
            implicit = _line_start_open(body, value_start, value_start, unseen)
            if implicit < 0:
                return -1
            pos = implicit
        seen.add(name)


def _closers(text: str) -> list[int]:
    """Every `</parameter>`'s index in `text`, in order."""
    return [found.start() for found in re.finditer(re.escape(PARAM_CLOSE), text)]


def _value_end(text: str, start: int, names: set[str] | None, closes: list[int], at_body_end: bool) -> int:
    """Index in `text` of the `</parameter>` that ends the value starting at `start` (see the module docstring), or
    -1. `closes`: `_closers(text)`. `at_body_end`: `text` ends where the function body does, so a closer with nothing
    after it is structural."""
    depth, pos = 0, start
    nested = _line_start_open(text, start, start, None)  # the next line-start open at or after `pos`: kept until passed
    while (close := _next(closes, pos)) >= 0:
        if 0 <= nested < pos:
            nested = _line_start_open(text, pos, start, None)
        if 0 <= nested < close:
            depth, pos = depth + 1, nested + len(PARAM_OPEN)
        elif depth:
            depth, pos = depth - 1, close + len(PARAM_CLOSE)
        else:
            after = _skip_space(text, close + len(PARAM_CLOSE))
            if (at_body_end and after == len(text)) or _opens_parameter(text, after, names) \
                    or text.startswith((FUNCTION_CLOSE, CALL_CLOSE), after):
                return close
            pos = close + len(PARAM_CLOSE)
    return -1


def _opens_parameter(text: str, at: int, names: set[str] | None) -> bool:
    """Whether `text` has `<parameter=NAME>` at `at`, NAME one of `names` (any, when None)."""
    if not text.startswith(PARAM_OPEN, at):
        return False
    if names is None:
        return True
    name = at + len(PARAM_OPEN)
    # a `>` past the longest name's end closes no name of `names`: the search stops there
    name_end = text.find(">", name, name + max(map(len, names), default=0) + 1)
    return name_end >= 0 and text[name:name_end] in names


def _line_start_open(text: str, pos: int, line_start: int, names: set[str] | None) -> int:
    """Index of the next `<parameter=` from `pos` at the start of a line (or at `line_start`, where the text read
    begins), NAME in `names` when given; -1 when none."""
    if names is not None and not names:  # no name left to open
        return -1
    while (at := text.find(PARAM_OPEN, pos)) >= 0:
        if (at == line_start or text[at - 1] == "\n") and _opens_parameter(text, at, names):
            return at
        pos = at + 1
    return -1


def _next(positions: list[int], pos: int) -> int:
    """The first of the sorted `positions` at or after `pos`, or -1."""
    i = bisect_left(positions, pos)
    return positions[i] if i < len(positions) else -1


def _skip_space(text: str, pos: int) -> int:
    """The first index from `pos` that is not whitespace (len(text) when none is)."""
    found = _NOT_SPACE.search(text, pos)
    return len(text) if found is None else found.start()


def _closer_followed_by(text: str, start: int, closer: str, nexts: tuple[str, ...]) -> int:
    """Index of the first `closer` from `start` followed (after whitespace) by the end of `text` or one of `nexts`;
    -1 if none."""
    pos = start
    while (at := text.find(closer, pos)) >= 0:
        after = _skip_space(text, at + len(closer))
        if after == len(text) or text.startswith(nexts, after):
            return at
        pos = at + len(closer)
    return -1
