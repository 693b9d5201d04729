"""Server-sent events of streamed completions and chat completions: the engine's outputs (deltas, or cumulative
snapshots) turned into each choice's new text, written as OpenAI's `data:` chunks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from json.encoder import encode_basestring
from typing import Any, NamedTuple

from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.server.json_reply import json_pieces


class ChoiceDelta(NamedTuple):
    """What one choice's chunk carries: its news since the previous chunk."""

    choice: CompletionOutput  # the output's choice (index, finish and stop reasons)
    text: str  # new text
    token_ids: list[int]  # new token ids
    logprobs: list[dict[int, tuple[float, int]]] | None  # their logprob entries (None: not asked for)
    first: int  # the index of the first new token in the whole output (0: the choice's first chunk)
    num_tokens: int  # the choice's tokens so far (continuous usage)


class StreamState:
    """Per-choice text and tokens already sent, to turn outputs into each choice's news: the outputs are deltas
    (`delta`: output_kind "delta", O(new tokens) a step) or cumulative snapshots."""

    def __init__(self, n: int, delta: bool = False) -> None:
        self.delta = delta
        self.sent_text = [0] * n
        self.sent_tokens = [0] * n
        self.finished = [False] * n

    def deltas(self, output: RequestOutput) -> list[ChoiceDelta]:
        """The news of choices that changed."""
        changes = []
        for c in output.outputs:
            i = c.index
            if self.finished[i]:
                continue
            first = self.sent_tokens[i]
            if self.delta:
                text, token_ids, logprobs = c.text, c.token_ids, c.logprobs
            else:
                text, token_ids = c.text[self.sent_text[i] :], c.token_ids[first:]
                logprobs = None if c.logprobs is None else c.logprobs[first:]
            if text or c.finish_reason is not None or token_ids:
                self.sent_tokens[i] = first + len(token_ids)
                changes.append(ChoiceDelta(c, text, token_ids, logprobs, first, self.sent_tokens[i]))
                self.sent_text[i] = self.sent_text[i] + len(text) if self.delta else len(c.text)
                self.finished[i] = c.finish_reason is not None
        return changes

    @property
    def completion_tokens(self) -> int:
        """Every choice's tokens so far."""
        return sum(self.sent_tokens)


# JSON values one logprob alternative becomes in a stream step: chat's `{"token", "logprob", "bytes": [...]}` is an
# object, two scalars, a list and the token's bytes (10,769 values for a token with 1,000 alternatives of the embedded
# model's vocabulary); a Responses delta's is smaller but the step also builds chat's (the stored output's).
VALUES_PER_ALTERNATIVE = 10


def logprob_values(output: RequestOutput) -> int:
    """About how many JSON values a step's logprob entries make, all choices' (each entry: the sampled token and the
    request's top ones, VALUES_PER_ALTERNATIVE each): what a stream step's logprobs cost to build, the streams' one
    estimate of it, against `OFF_LOOP_VALUES` (`built`). Counted as alternatives, a step of 1,000 (2.7 CPU ms of
    build and encode) stayed on the event loop, 20-70 ms of it at load 10."""
    return VALUES_PER_ALTERNATIVE * sum(len(entry) for c in output.outputs for entry in c.logprobs or ())


# `json.dumps(value, ensure_ascii=False)` builds a new encoder at every call (only the default arguments reuse
# json's cached one): a few microseconds a field, four fields a chunk, a chunk per stream per step. One encoder
# with those arguments writes the same text.
_ENCODER = json.JSONEncoder(ensure_ascii=False)
_encode_str = encode_basestring  # what that encoder writes for a str (non-ASCII kept), without the dispatch


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"data: {_ENCODER.encode(payload)}\n\n"


def json_text_in_pieces(value: Any) -> str:
    """`json_text(value)` encoded in pieces of bounded size (json_reply.py), for a large value on a worker thread: the
    event loop takes the GIL between two, where a single `json.dumps` of up to seconds would hold it (one choice's
    echoed prompt can hold ~700k logprob entries, one step of a chat stream with the whole vocabulary's logprobs 49k
    alternatives a token)."""
    return "".join(json_text_pieces(value))


def json_text_pieces(value: Any) -> Iterator[str]:
    """`json_text(value)` as consecutive pieces of bounded size (json_reply.py), for a large value on a worker thread,
    read a piece at a time: a Responses stream's closing events each carry the whole output's logprobs."""
    return json_pieces(value, _ENCODER)


def json_text(value: Any) -> str:
    """`json.dumps(value, ensure_ascii=False)`, with a chunk's usual values (a text, a null) written directly."""
    if value is None:
        return "null"
    if type(value) is str:
        return _encode_str(value)
    return _ENCODER.encode(value)


class ChunkFormat:
    """SSE chunks of one streamed response, serialised cheaply: the fields every chunk repeats (id,
    object, created, model) are encoded once, and each chunk encodes only its choice's own values.
    The text is the same JSON that `sse` writes for the equivalent dict."""

    def __init__(self, request_id: str, obj: str, created: int, model: str) -> None:
        self.head = (f'data: {{"id": {json_text(request_id)}, "object": {json_text(obj)}, "created": {created}, '
                     f'"model": {json_text(model)}, "choices": [')

    def completion(self, index: int, text: str, c: CompletionOutput, logprobs: dict[str, Any] | str | None,
                   usage: dict[str, int] | None = None, ids: dict[str, Any] | None = None) -> str:
        """A /v1/completions chunk with one choice (and the usage so far, for continuous_usage_stats); `ids`: the
        choice's extra fields (return_token_ids: prompt_token_ids, token_ids); `logprobs` as a str: their JSON
        already (`json_text_in_pieces`)."""
        logprobs_json = logprobs if isinstance(logprobs, str) else json_text(logprobs)
        return (f'{self.head}{{"index": {index}, "text": {json_text(text)}, '
                f'"finish_reason": {json_text(c.finish_reason)}, "stop_reason": {json_text(c.stop_reason)}, '
                f'"logprobs": {logprobs_json}{_fields(ids)}}}]{_usage(usage)}}}\n\n')

    def chat(self, text: str, c: CompletionOutput, logprobs: dict[str, Any] | str | None,
             usage: dict[str, int] | None = None, ids: dict[str, Any] | None = None) -> str:
        """A chat.completion.chunk with one choice whose delta is `text` (no content key when empty); `ids`: the
        choice's extra fields (return_token_ids: token_ids); `logprobs` as a str: their JSON already
        (`json_text_in_pieces`)."""
        delta = f'{{"content": {json_text(text)}}}' if text else "{}"
        logprobs_json = logprobs if isinstance(logprobs, str) else json_text(logprobs)
        return (f'{self.head}{{"index": {c.index}, "delta": {delta}, "logprobs": {logprobs_json}, '
                f'"finish_reason": {json_text(c.finish_reason)}, "stop_reason": {json_text(c.stop_reason)}'
                f'{_fields(ids)}}}]{_usage(usage)}}}\n\n')


def _fields(fields: dict[str, Any] | None) -> str:
    return "" if not fields else "".join(f', {json_text(k)}: {json_text(v)}' for k, v in fields.items())


def _usage(usage: dict[str, int] | None) -> str:
    return "" if usage is None else f', "usage": {json_text(usage)}'
