"""A step's request outputs as deltas, for the trip from the engine-core process to the API process.

The engine's outputs are cumulative snapshots (all text, token ids and logprobs so far); pickling them
whole every step would make the IPC cost grow with every request's length, and the prompt (hundreds
of token ids) would travel every step. The core's `OutputEncoder` sends, per completion, how much of
the previous text/tokens/logprobs to keep and what is new, and the prompt once; the API process's
`OutputDecoder` (one per request) rebuilds the cumulative `RequestOutput` its readers expect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flotilla.engine.outputs import CompletionOutput, RequestOutput

# (prompt, prompt token ids, prompt logprobs, cached prompt tokens): sent with a request's first output only.
Head = tuple[str | None, list[int], Any, int]
# (text kept, new text, tokens kept, new tokens, logprobs kept, new logprobs or None, cumulative
# logprob, finish reason, stop reason)
CompletionDelta = tuple[int, str, int, list[int], int, list[Any] | None, float | None, str | None, Any]
# (request id, finished, head or None, completions)
OutputDelta = tuple[str, bool, Head | None, list[CompletionDelta]]


@dataclass
class _Sent:
    """What the API process holds of one completion."""

    text: str = ""
    num_tokens: int = 0
    num_logprobs: int = 0


class OutputEncoder:
    """The core's side: what each live request's receiver already has, so that only news travels."""

    def __init__(self) -> None:
        self._sent: dict[str, list[_Sent]] = {}

    def encode(self, output: RequestOutput) -> OutputDelta:
        """The delta of `output` against what was sent of its request before (all of it the first time)."""
        sent = self._sent.get(output.request_id)
        head: Head | None = None
        if sent is None:
            head = (output.prompt, output.prompt_token_ids, output.prompt_logprobs, output.num_cached_tokens)
            sent = [_Sent() for _ in output.outputs]
        completions = [_completion_delta(c, s) for c, s in zip(output.outputs, sent, strict=True)]
        if output.finished:
            self._sent.pop(output.request_id, None)
        else:
            self._sent[output.request_id] = sent
        return output.request_id, output.finished, head, completions

    def forget(self, request_id: str) -> None:
        """The request was aborted or failed: nothing more will be sent for it."""
        self._sent.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._sent)


def _completion_delta(c: CompletionOutput, sent: _Sent) -> CompletionDelta:
    # Text can shrink when a stop string is cut off, so keep the common prefix; tokens and logprobs
    # only lose entries of this step (never sent), so their previous count is a prefix.
    keep_text = len(sent.text) if c.text.startswith(sent.text) else _common_prefix(c.text, sent.text)
    keep_tokens = min(sent.num_tokens, len(c.token_ids))
    new_logprobs = None
    keep_logprobs = 0
    if c.logprobs is not None:
        keep_logprobs = min(sent.num_logprobs, len(c.logprobs))
        new_logprobs = c.logprobs[keep_logprobs:]
        sent.num_logprobs = len(c.logprobs)
    sent.text, sent.num_tokens = c.text, len(c.token_ids)
    return (keep_text, c.text[keep_text:], keep_tokens, c.token_ids[keep_tokens:], keep_logprobs, new_logprobs,
            c.cumulative_logprob, c.finish_reason, c.stop_reason)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class OutputDecoder:
    """The API process's side, for one request: its outputs so far, rebuilt from deltas."""

    head: Head | None = None
    texts: list[str] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[Any] | None] = field(default_factory=list)

    def decode(self, delta: OutputDelta) -> RequestOutput:
        """The cumulative output after `delta` (each call returns new lists: earlier outputs stay as they were)."""
        request_id, finished, head, completions = delta
        if head is not None:
            self.head = head
            self.texts = [""] * len(completions)
            self.tokens = [[] for _ in completions]
            self.logprobs = [None] * len(completions)
        if self.head is None:
            raise ValueError(f"an output delta of request {request_id} arrived before its first output")
        outputs = []
        for i, delta_i in enumerate(completions):
            keep_text, text, keep_tokens, tokens, keep_lp, new_lp, cumulative, finish, stop = delta_i
            self.texts[i] = self.texts[i][:keep_text] + text
            self.tokens[i] = self.tokens[i][:keep_tokens] + tokens
            previous = self.logprobs[i]
            self.logprobs[i] = None if new_lp is None else (previous or [])[:keep_lp] + new_lp
            outputs.append(CompletionOutput(index=i, text=self.texts[i], token_ids=self.tokens[i],
                                            finish_reason=finish, stop_reason=stop, cumulative_logprob=cumulative,
                                            logprobs=self.logprobs[i]))
        prompt, prompt_token_ids, prompt_logprobs, cached = self.head
        return RequestOutput(request_id=request_id, prompt=prompt, prompt_token_ids=prompt_token_ids,
                             prompt_logprobs=prompt_logprobs, num_cached_tokens=cached, outputs=outputs,
                             finished=finished)
