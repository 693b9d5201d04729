"""One request's outputs on its event loop, and the hand-over of a step's outputs to the event loops.

Both front ends of the engine (`AsyncEngine`, `EngineCoreClient`) produce outputs on a thread of their
own and hand each event loop a step's items in a single callback (a per-token `call_soon_threadsafe`
per request cost the GIL-shared event loop more than the step itself at hundreds of streams). Outputs
are cumulative snapshots or deltas (`SamplingParams.output_kind`); a stream whose reader falls behind keeps one
unread output, the latest snapshot or the unread deltas joined into one: a slow reader then sends fewer, larger
deltas instead of queueing work.
"""

from __future__ import annotations

import asyncio
import contextlib

from flotilla.engine.outputs import CompletionOutput, RequestOutput

StreamItem = RequestOutput | BaseException


class RequestStream:
    """One request's outputs on its event loop: the latest cumulative output and any error.

    Written only on its event loop (by `hand_over`'s callback), read by `next`; the producing thread
    holds it only to name where an output goes.
    """

    __slots__ = ("delta", "done", "error", "latest", "loop", "ready")

    def __init__(self, loop: asyncio.AbstractEventLoop, delta: bool = False) -> None:
        """`delta`: the request's outputs are deltas (output_kind "delta"), joined while unread; else snapshots."""
        self.loop = loop
        self.delta = delta
        self.latest: RequestOutput | None = None
        self.error: BaseException | None = None
        self.ready = asyncio.Event()
        # True once the reader has taken the finished output or the error: the engine holds nothing of the
        # request any more, so an abort by its id would end another request (e.g. the live one whose id a
        # duplicate was refused for).
        self.done = False

    def put(self, item: StreamItem) -> None:
        """Store an output (superseding an unread snapshot, or joined to unread deltas) or an error."""
        if isinstance(item, BaseException):
            self.error = item
        elif self.delta and self.latest is not None:
            self.latest = joined(self.latest, item)
        else:
            self.latest = item
        self.ready.set()

    async def next(self) -> RequestOutput:
        """Wait for the next output (the latest one, when several came) and return it; raise the request's
        error once its outputs before the error have been taken. Sets `done` with the last of either."""
        while True:
            item, self.latest = self.latest, None
            if item is not None:
                self.done = item.finished
                return item
            if self.error is not None:
                self.done = True
                raise self.error
            await self.ready.wait()
            self.ready.clear()


# A step's stream items, grouped by the event loop each goes to.
Handoffs = dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, StreamItem]]]


def queue_item(handoffs: Handoffs, stream: RequestStream, item: StreamItem) -> None:
    """Add an item to what its stream's event loop gets at the next `hand_over`."""
    handoffs.setdefault(stream.loop, []).append((stream, item))


def hand_over(handoffs: Handoffs) -> None:
    """Hand each event loop its items in a single callback (from the producing thread)."""
    for loop, batch in handoffs.items():
        with contextlib.suppress(RuntimeError):  # that loop has closed: nobody is waiting any more
            loop.call_soon_threadsafe(_put_all, batch)


def _put_all(batch: list[tuple[RequestStream, StreamItem]]) -> None:
    """On an event loop: a step's items for that loop's streams."""
    for stream, item in batch:
        stream.put(item)


def joined(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """Two successive delta outputs of one request as one: each completion's text, token ids and logprobs
    concatenated, the later finish and cumulative logprob."""
    outputs = [_joined(a, b) for a, b in zip(first.outputs, then.outputs, strict=True)]
    return RequestOutput(request_id=then.request_id, prompt=then.prompt, prompt_token_ids=then.prompt_token_ids,
                         prompt_logprobs=first.prompt_logprobs, outputs=outputs, finished=then.finished,
                         num_cached_tokens=then.num_cached_tokens)


def _joined(a: CompletionOutput, b: CompletionOutput) -> CompletionOutput:
    logprobs = None if b.logprobs is None else (a.logprobs or []) + b.logprobs
    return CompletionOutput(index=b.index, text=a.text + b.text, token_ids=a.token_ids + b.token_ids,
                            finish_reason=b.finish_reason, stop_reason=b.stop_reason,
                            cumulative_logprob=b.cumulative_logprob, logprobs=logprobs)
