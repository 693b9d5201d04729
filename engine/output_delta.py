"""A step's request outputs as deltas, for the trip from the engine-core process to the API process.

The core's outputs for the API process are deltas (output_kind "delta": each completion's new text, token ids and
logprobs) or final ones, never cumulative snapshots: copying and pickling every request's whole output every step
would make the step's cost grow with each request's length, and the prompt (hundreds of token ids) would travel
every step. A request that asks for cumulative outputs is sent to the core as a delta one (`core_params`), and the
API process's `OutputDecoder` (one per request) rebuilds the snapshots its reader expects; a delta request's
decoder passes the deltas on. The prompt travels with a request's first output only (`OutputEncoder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.sampling_params import SamplingParams

# (prompt, prompt token ids, prompt logprobs, cached prompt tokens): sent with a request's first output only.
Head = tuple[str | None, list[int], Any, int]
# (new text, new token ids, new logprobs or None, cumulative logprob, finish reason, stop reason)
CompletionDelta = tuple[str, list[int], list[Any] | None, float | None, str | None, Any]
# (request id, finished, head or None, completions)
OutputDelta = tuple[str, bool, Head | None, list[CompletionDelta]]


def core_params(params: SamplingParams) -> SamplingParams:
    """What the core is asked for: deltas in place of cumulative outputs (the decoder rebuilds those)."""
    return params.model_copy(update={"output_kind": "delta"}) if params.output_kind == "cumulative" else params


class OutputEncoder:
    """The core's side: its delta (or final) outputs as messages, each request's prompt with its first one."""

    def __init__(self) -> None:
        self._started: set[str] = set()  # requests whose head has gone and that have not finished

    def encode(self, output: RequestOutput) -> OutputDelta:
        """`output` (a delta or final output) for the wire; the head too if it is the request's first."""
        request_id = output.request_id
        head: Head | None = None
        if request_id not in self._started:
            head = (output.prompt, output.prompt_token_ids, output.prompt_logprobs, output.num_cached_tokens)
            if not output.finished:
                self._started.add(request_id)
        elif output.finished:
            self._started.discard(request_id)
        completions = [(c.text, c.token_ids, c.logprobs, c.cumulative_logprob, c.finish_reason, c.stop_reason)
                       for c in output.outputs]
        return request_id, output.finished, head, completions

    def forget(self, request_id: str) -> None:
        """The request was aborted or failed: nothing more will be sent for it."""
        self._started.discard(request_id)

    def __len__(self) -> int:
        return len(self._started)


@dataclass
class OutputDecoder:
    """The API process's side, for one request: its delta outputs, or (`cumulative`) its outputs so far rebuilt
    from the deltas (each call then returns new lists: earlier outputs stay as they were)."""

    cumulative: bool = False
    head: Head | None = None
    texts: list[str] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[Any] | None] = field(default_factory=list)

    def decode(self, delta: OutputDelta) -> RequestOutput:
        """The request's output after `delta`: the delta itself, or the whole output so far (`cumulative`)."""
        request_id, finished, head, completions = delta
        if head is not None:
            self.head = head
            self.texts = [""] * len(completions)
            self.tokens = [[] for _ in completions]
            self.logprobs = [None] * len(completions)
        if self.head is None:
            raise ValueError(f"an output delta of request {request_id} arrived before its first output")
        outputs = []
        for i, (text, tokens, logprobs, cumulative, finish, stop) in enumerate(completions):
            if self.cumulative:  # O(output length): only readers that re-read the whole text ask for it
                text = self.texts[i] = self.texts[i] + text
                tokens = self.tokens[i] = self.tokens[i] + tokens
                if logprobs is not None:
                    logprobs = self.logprobs[i] = (self.logprobs[i] or []) + logprobs
            outputs.append(CompletionOutput(index=i, text=text, token_ids=tokens, finish_reason=finish,
                                            stop_reason=stop, cumulative_logprob=cumulative, logprobs=logprobs))
        prompt, prompt_token_ids, prompt_logprobs, cached = self.head
        return RequestOutput(request_id=request_id, prompt=prompt, prompt_token_ids=prompt_token_ids,
                             prompt_logprobs=prompt_logprobs, num_cached_tokens=cached, outputs=outputs,
                             finished=finished)
