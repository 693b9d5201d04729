"""`--reasoning-parser`: a thinking model's `<think>...</think>` apart from its answer.

The reply's `message.reasoning` (and, under vLLM's older name, `message.reasoning_content`) holds the thinking
and `message.content` the rest, streamed as `delta.reasoning` (and `delta.reasoning_content`) then
`delta.content`. The two formats differ in where thinking starts:
- `deepseek_r1`: the chat template opens `<think>` in the prompt, so the output is thinking until
  `</think>` (a leading `<think>` is dropped if the model writes it anyway);
- `qwen3`: the model writes `<think>` itself; an output that does not start with it is all answer
  (thinking switched off with `enable_thinking: false`).
"""

from __future__ import annotations

from dataclasses import dataclass

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
        return Split(body[: _safe_len(body, END)], None)


def _safe_len(text: str, marker: str) -> int:
    """Length of `text` without a tail that is a proper prefix of `marker`."""
    for keep in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-keep:]):
            return len(text) - keep
    return len(text)
