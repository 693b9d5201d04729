"""A burst of queued messages taken as one batch, by the threads that write messages down a pipe.

The engine core's output sender and the API process's command sender each write every message queued
since their last write as one list (one write, one read and one unpickling for a burst), and stop at a
None in the queue once the messages before it are written.
"""

from __future__ import annotations

import queue
from typing import TypeVar

T = TypeVar("T")


def take_batch(messages: queue.SimpleQueue[T | None]) -> tuple[list[T], bool]:
    """Wait for the next message, then take every one queued behind it without waiting: (the messages,
    whether the None that closes the queue came; the messages before it are in the list)."""
    message = messages.get()
    batch: list[T] = []
    while message is not None:
        batch.append(message)
        try:
            message = messages.get_nowait()
        except queue.Empty:
            return batch, False
    return batch, True
