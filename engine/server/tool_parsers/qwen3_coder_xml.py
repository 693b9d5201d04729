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
Qwen3-Coder models also write a call without its `<tool_call>` wrapper: vLLM then reads the whole output as one
block. In a block, or bare, every `<function=` is a call (vLLM's): a function ends at a `</function>` followed by
another `<function=`, a `<tool_call>` or the end of the block.
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

# Every helper reads the text in place, by offsets, and a body's value ends are worked out once (_ValueEnds): slicing
# the rest of the text at each closer (to look at what follows it), searching it again for each parameter, or
# depth-matching each nested parameter's value over the rest made a reply quadratic to parse, seconds of the API
# process for one reply of many `</parameter>`, many parameters, or many nested parameters.


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


def functions(text: str) -> Iterator[str]:
    """Each `<function=NAME>...</function>` of a block's inside, or of bare text (before any `<tool_call>`): from its
    `<function=` up to a `</function>` that another `<function=` or the end (after whitespace) follows, the last up
    to the end."""
    pos = text.find(FUNCTION_OPEN)
    while pos >= 0:
        end = _closer_followed_by(text, pos, FUNCTION_CLOSE, (FUNCTION_OPEN,))
        if end < 0:
            yield text[pos:]
            return
        yield text[pos:end + len(FUNCTION_CLOSE)]
        pos = text.find(FUNCTION_OPEN, end + len(FUNCTION_CLOSE))


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
    pos, ends = 0, _ValueEnds(body, names, at_body_end=True)
    while (start := _line_start_open(body, pos, 0, None)) >= 0:
        name_end = body.find(">", start + len(PARAM_OPEN))
        if name_end < 0:
            return
        value = name_end + 1
        end = ends.end(value)
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
    pos, seen, ends = 0, set[str](), _ValueEnds(body, names, at_body_end=False)
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
        end = ends.end(value_start)
        if end >= 0:
            pos = end + len(PARAM_CLOSE)
        else:  # left open: the next line-start parameter of a name not yet seen ends it
            unseen = None if names is None else names - seen - {name}
            implicit = _line_start_open(body, value_start, value_start, unseen)
            if implicit < 0:
                return -1
            pos = implicit
        seen.add(name)


class _ValueEnds:
    """Where each value of a text ends (see the module docstring), worked out once for every start.

    Reading from a value's start, a line-start `<parameter=` opens a nested parameter and a `</parameter>` closes the
    innermost one; at depth 0 a closer ends the value if it is structural, and is passed over if not. So, with the
    level of the text's opens minus closers before each event: the closers met at depth 0 are those that reach a level
    lower than any before them since the start; each is the first later event one level lower than the one before
    (a next-lower table, built with a stack), and the first structural one of that chain is listed for each event."""

    def __init__(self, text: str, names: set[str] | None, at_body_end: bool) -> None:
        """`names`: the schema's parameter names (None: any name). `at_body_end`: `text` ends where the function body
        does, so a closer with nothing after it is structural."""
        opens = [found.start() + 1 for found in re.finditer(re.escape("\n" + PARAM_OPEN), text)]
        closes = [found.start() for found in re.finditer(re.escape(PARAM_CLOSE), text)]
        events = sorted([(at, 1) for at in opens] + [(at, -1) for at in closes])
        self._text, self._positions = text, [at for at, _ in events]
        levels = [0]  # levels[i]: opens minus closers among the first i events
        for _, step in events:
            levels.append(levels[-1] + step)
        self._lower = _next_lower(levels)
        # each closer looked at once (many starts can meet the same one, and what follows it can be long whitespace)
        ends = [step < 0 and _structural(text, at, names, at_body_end) for at, step in events]
        # _stop[i]: the first structural closer that a value whose text begins after i events, at depth 0, meets
        self._stop = [-1] * len(levels)
        for i in reversed(range(len(levels))):
            if (lower := self._lower[i]) >= 0:  # event `lower` is a closer met at depth 0
                self._stop[i] = self._positions[lower - 1] if ends[lower - 1] else self._stop[lower]

    def end(self, start: int) -> int:
        """Index of the `</parameter>` that ends the value starting at `start`, or -1."""
        base = bisect_left(self._positions, start)
        text = self._text
        if text.startswith(PARAM_OPEN, start) and (start == 0 or text[start - 1] != "\n"):
            # an open at the value's start (not after a newline) is nested only for this value: its closer comes first
            base = self._lower[base]
            if base < 0:
                return -1
        return self._stop[base]


def _next_lower(levels: list[int]) -> list[int]:
    """For each index, the first later index whose level is lower (-1 when none)."""
    lower, waiting = [-1] * len(levels), list[int]()
    for i, level in enumerate(levels):
        while waiting and levels[waiting[-1]] > level:
            lower[waiting.pop()] = i
        waiting.append(i)
    return lower


def _structural(text: str, close: int, names: set[str] | None, at_body_end: bool) -> bool:
    """Whether the `</parameter>` at `close` ends a value at depth 0: what follows it (after whitespace) is the next
    parameter, `</function>`, `</tool_call>`, or the body's end."""
    after = _skip_space(text, close + len(PARAM_CLOSE))
    return (at_body_end and after == len(text)) or _opens_parameter(text, after, names) \
        or text.startswith((FUNCTION_CLOSE, CALL_CLOSE), after)


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
