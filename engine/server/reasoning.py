"""`--reasoning-parser`: a thinking model's `<think>...</think>` apart from its answer.

The reply's `message.reasoning` (and, under vLLM's older name, `message.reasoning_content`) holds the thinking
and `message.content` the rest, streamed as `delta.reasoning` (and `delta.reasoning_content`) then
`delta.content`. The two formats differ in where thinking starts:
- `deepseek_r1`: the chat template opens `<think>` in the prompt, so the output is thinking until
  `</think>` (a leading `<think>` is dropped if the model writes it anyway);
- `qwen3`: the model writes `<think>` itself; an output that does not start with it is all answer
  (thinking switched off with `enable_thinking: false`). Where the prompt opened the thinking (its last marker is
  `<think>`: Qwen3.5's and Qwen3-Thinking-2507's templates), the output starts inside it, as deepseek_r1's, and the
  engine's grammar waits for its end alike (`opened`). A call opening ends qwen3's thinking as `</think>` does, as
  vLLM's qwen3 parser has it for Qwen3.5: `<tool_call>`, whitespace, then `<function=` (or `<function `); the answer
  (and so the tool parser's text) starts at the `<tool_call>`. A `<tool_call>` that goes on otherwise stays thinking
  (structured_output/thinking.py, whose gate starts the grammar there too). The rule is qwen3's own, whatever
  `--tool-call-parser` is, as vLLM's (its reasoning parsers do not know the tool parser, and its qwen3 one looks for
  this opening alone): the other shipped parsers' openers stay thinking — hermes's `<tool_call>` then JSON,
  qwen3_coder's bare `<function=` (a call without its wrapper), mistral's `[TOOL_CALLS]`, llama3_json's
  `<|python_tag|>` or `{`. deepseek_r1 ends only at `</think>`, as vLLM's.

`split` parses a whole output; a stream parses each choice with a `ReasoningStream` of its own, which looks at each
step's new text plus the few held-back characters a marker could straddle, and sends exactly what `split` gives for
the whole output (thinking, then the answer).
"""

from __future__ import annotations

from dataclasses import dataclass

from flotilla.engine.server.marker_tail import safe_len
from flotilla.engine.structured_output.thinking import CALL_MAX_SPACE, CALL_OPEN, END, START, call_follows

# Characters after a `<tool_call>` that always decide `call_follows`: the most whitespace, `<function`, one more.
_DECISIVE = CALL_MAX_SPACE + len("<function") + 1


@dataclass
class Split:
    """An output, or the part of a growing one that is safe to send, as thinking and answer."""

    reasoning: str | None
    content: str | None


class ReasoningParser:
    """Splits `<think>` output; `name` is the flag's value, `opened` whether the prompt opened the thinking."""

    def __init__(self, name: str, opened: bool = False) -> None:
        if name not in ("deepseek_r1", "qwen3"):
            raise ValueError(f"unknown reasoning parser {name!r}")
        self.name = name
        # Whether the output must open the thinking itself, else it is all answer (qwen3 where the prompt did not).
        self.model_opens = name == "qwen3" and not opened
        # qwen3: a call opening ends the thinking as </think> does.
        self.calls_end_thinking = name == "qwen3"

    def split(self, text: str, finished: bool = True) -> Split:
        """The finished output's parts; for a partial one (`finished=False`), the parts that can no
        longer change (a tail that may grow into a marker is held back)."""
        body = text.lstrip()
        opened = body.startswith(START)
        if opened:
            body = body[len(START) :]
        elif not finished and START.startswith(body) and self.model_opens:
            return Split(None, None)  # could still become "<think>"
        if self.model_opens and not opened:
            return Split(None, text if text else None)
        cut, answer_at, by_call = thinking_cut(body, self.calls_end_thinking, finished)
        if answer_at is None:
            return Split(body[:cut], None)
        answer = body[answer_at:] if by_call else body[answer_at:].lstrip("\n")
        return Split(body[:cut], answer or None)


def thinking_cut(text: str, calls: bool, finished: bool) -> tuple[int, int | None, bool]:
    """Where the thinking `text` ends: (how much of it is surely thinking, where the answer starts or None, whether
    a call opening ended it). Unfinished, a tail that may still grow into `</think>` or (`calls`) a call opening is
    not thinking yet."""
    end = text.find(END)
    if calls:
        call = _call_start(text, len(text) if end < 0 else end)
        if call >= 0:
            return call, call, True
    if end >= 0:
        return end, end + len(END), False
    if finished:
        return len(text), None, False
    keep = safe_len(text, END)
    return (min(keep, _call_hold(text)) if calls else keep), None, False


def _call_start(text: str, before: int) -> int:
    """The first call opening in `text[:before]` (its `<tool_call>`'s index), or -1."""
    at = text.find(CALL_OPEN, 0, before)
    while at >= 0:
        if call_follows(text[at + len(CALL_OPEN) : at + len(CALL_OPEN) + _DECISIVE]):
            return at
        at = text.find(CALL_OPEN, at + 1, before)
    return -1


def _call_hold(text: str) -> int:
    """Where a call opening may still be completing at the end of `text` (len(text) when none may): a `<tool_call>`
    whose following text cannot tell yet, or a tail that may grow into `<tool_call>`."""
    hold = safe_len(text, CALL_OPEN)
    at = text.find(CALL_OPEN, max(0, len(text) - _DECISIVE - len(CALL_OPEN)))
    while at >= 0:
        if call_follows(text[at + len(CALL_OPEN) :]) is None:
            return min(hold, at)
        at = text.find(CALL_OPEN, at + 1)
    return hold


class ReasoningStream:
    """One streamed choice's thinking and answer, parsed as its text grows: each `feed` returns the new thinking and
    the new answer that can no longer change, and their concatenations over the stream are `split`'s parts of the
    whole text. Per step it reads the new text and a held-back tail shorter than a marker (`scanned` counts the
    characters read), so a step's work does not grow with the output."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.model_opens = parser.model_opens
        self.calls = parser.calls_end_thinking
        # start: <think> may still open; think; answer (after </think>); plain (qwen3 without <think>, or after a call
        # opening)
        self.phase = "start"
        self.lead: list[str] = []  # the text read in the start phase (a qwen3 answer is all of it)
        self.body = ""  # the start phase's text without leading whitespace: a proper prefix of <think>
        self.held = ""  # thinking not yet sent: a tail that may be the start of </think>
        self.scanned = 0  # characters read so far (tests bound each step's share)

    def feed(self, new: str, finished: bool = False) -> Split:
        """The parts of `new` (and of what was held back) that are settled; `finished`: `new` ends the output, so
        nothing is held back any more."""
        self.scanned += len(new)
        if self.phase == "start":
            return self._start(new, finished)
        if self.phase == "think":
            return self._think(new, finished)
        if self.phase == "answer":
            return Split("", self._answer(new))
        return Split("", new)

    def _start(self, new: str, finished: bool) -> Split:
        """Before the output is known to open with <think> or not (qwen3 holds it back; so does deepseek_r1, whose
        leading <think> is dropped)."""
        self.lead.append(new)
        self.body = self.body + new if self.body else new.lstrip()
        self.scanned += len(self.body)
        if self.body.startswith(START):
            self.phase = "think"
            return self._think(self.body[len(START) :], finished)
        if START.startswith(self.body) and not finished:
            return Split("", "")  # could still become "<think>"
        if self.model_opens:
            self.phase = "plain"
            return Split("", "".join(self.lead))
        self.phase = "think"
        return self._think(self.body, finished)

    def _think(self, new: str, finished: bool) -> Split:
        window = self.held + new
        self.scanned += len(self.held)
        cut, answer_at, by_call = thinking_cut(window, self.calls, finished)
        if answer_at is None:
            self.held = window[cut:]
            return Split(window[:cut], "")
        self.held = ""
        if by_call:  # the answer is the call, from its <tool_call> on
            self.phase = "plain"
            return Split(window[:cut], window[answer_at:])
        self.phase = "answer"
        return Split(window[:cut], self._answer(window[answer_at:]))

    def _answer(self, new: str) -> str:
        """The answer's newlines after </think> are dropped, as `split` drops them."""
        if self.phase == "answer":
            new = new.lstrip("\n")
            if new:
                self.phase = "plain"
        return new

