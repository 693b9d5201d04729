"""take_batch: a burst of queued messages comes out as one list; a None closes the queue after the
messages before it."""

from __future__ import annotations

import queue
import threading

from flotilla.engine.queue_batch import take_batch


def test_a_burst_is_one_batch_and_a_none_closes_after_what_came_before():
    q: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    for item in (1, 2, 3, None, 4):
        q.put(item)
    assert take_batch(q) == ([1, 2, 3], True)
    assert take_batch(q) == ([4], False)


def test_a_lone_none_closes_with_nothing_to_write():
    q: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    q.put(None)
    assert take_batch(q) == ([], True)


def test_it_waits_for_the_first_message():
    q: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    threading.Timer(0.05, q.put, args=(7,)).start()
    assert take_batch(q) == ([7], False)
