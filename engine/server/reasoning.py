"""`--reasoning-parser`: a thinking model's `<think>...</think>` apart from its answer.

The reply's `message.reasoning` (and, under vLLM's older name, `message.reasoning_content`) holds the thinking
and `message.content` the rest, streamed as `delta.reasoning` (and `delta.reasoning_content`) then
`delta.content`. The two formats differ in where thinking starts:
- `deepseek_r1`: the chat template opens `<think>` in the prompt, so the output is thinking until
  `</think>` (a leading `<think>` is dropped if the model writes it anyway);
- `qwen3`: the model writes `<think>` itself; an output that does not start with it is all answer
  (thinking switched off with `enable_thinking: false`).

`split` parses a whole output; a stream parses each choice with a `ReasoningStream` of its own, which looks at each
step's new text plus the few held-back characters a marker could straddle, and sends exactly what `split` gives for
the whole output (thinking, then the answer).
"""

from __future__ import annotations

from dataclasses import dataclass

from flotilla.engine.server.marker_tail import safe_len

START, END = "<think>", "</think>"


@dataclass
class Split:
    """An output, or the part of a growing one that is safe to send, as thinking and answer."""

    reasoning: str | None
    content: str | None


class ReasoningParser:
    """Splits `<think>` output; `name` is the flag's value."""

    def __init__(self, name: str) -> None:
        if name not in ("deepseek_r1", "qwen3"):
            raise ValueError(f"unknown reasoning parser {name!r}")
        self.name = name

    def split(self, text: str, finished: bool = True) -> Split:
        """The finished output's parts; for a partial one (`finished=False`), the parts that can no
        longer change (a tail that may grow into a marker is held back)."""
        body = text.lstrip()
        opened = body.startswith(START)
        if opened:
            body = body[len(START) :]
        elif not finished and START.startswith(body) and self.name == "qwen3":
            return Split(None, None)  # could still become "<think>"
        if self.name == "qwen3" and not opened:
            return Split(None, text if text else None)
        end = body.find(END)
        if end >= 0:
            answer = body[end + len(END) :].lstrip("\n")
            return Split(body[:end], answer or None)
        if finished:
            return Split(body, None)
        return Split(body[: safe_len(body, END)], None)


class ReasoningStream:
    """One streamed choice's thinking and answer, parsed as its text grows: each `feed` returns the new thinking and
    the new answer that can no longer change, and their concatenations over the stream are `split`'s parts of the
    whole text. Per step it reads the new text and a held-back tail shorter than a marker (`scanned` counts the
    characters read), so a step's work does not grow with the output."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.qwen3 = parser.name == "qwen3"
        self.phase = "start"  # start: <think> may still open; think; answer (after </think>); plain (qwen3, no <think>)
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
        if self.qwen3:
            self.phase = "plain"
            return Split("", "".join(self.lead))
        self.phase = "think"
        return self._think(self.body, finished)

    def _think(self, new: str, finished: bool) -> Split:
        window = self.held + new
        self.scanned += len(self.held)
        end = window.find(END)
        if end >= 0:
            self.held, self.phase = "", "answer"
            return Split(window[:end], self._answer(window[end + len(END) :]))
        keep = len(window) if finished else safe_len(window, END)
        self.held = window[keep:]
        return Split(window[:keep], "")

    def _answer(self, new: str) -> str:
        """The answer's newlines after </think> are dropped, as `split` drops them."""
        if self.phase == "answer":
            new = new.lstrip("\n")
            if new:
                self.phase = "plain"
        return new

