"""One request's outputs on its event loop, and the hand-over of a step's outputs to the event loops.

Both front ends of the engine (`AsyncEngine`, `EngineCoreClient`) produce outputs on a thread of their
own and hand each event loop a step's items in a single callback (a per-token `call_soon_threadsafe`
per request cost the GIL-shared event loop more than the step itself at hundreds of streams). Outputs
are cumulative snapshots, so a stream whose reader falls behind keeps only the latest one: a slow reader
then sends fewer, larger deltas instead of queueing work.
"""

from __future__ import annotations

import asyncio
import contextlib

from flotilla.engine.outputs import RequestOutput

StreamItem = RequestOutput | BaseException


class RequestStream:
    """One request's outputs on its event loop: the latest cumulative output and any error.

    Written only on its event loop (by `hand_over`'s callback), read by `next`; the producing thread
    holds it only to name where an output goes.
    """

    __slots__ = ("done", "error", "latest", "loop", "ready")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.latest: RequestOutput | None = None
        self.error: BaseException | None = None
        self.ready = asyncio.Event()
        # True once the reader has taken the finished output or the error: the engine holds nothing of the
        # request any more, so an abort by its id would end another request (e.g. the live one whose id a
        # duplicate was refused for).
        self.done = False

    def put(self, item: StreamItem) -> None:
        """Store an output (superseding an unread one: outputs are cumulative) or an error."""
        if isinstance(item, BaseException):
            self.error = item
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
