"""The engine core's messages to the API process, written by a thread of their own.

A step's message (every streaming request's output delta) is tens of kilobytes at hundreds of running
requests, more than a pipe holds once the API process lags one read behind; a `send` from the step
loop then waits for the API process's output handler, which shares its GIL with the event loop that
writes the SSE chunks. Meanwhile nothing plans or launches the next step and the GPU idles. vLLM's core
process likewise serializes and writes its outputs from a thread of its own.

So the step loop only queues a message; the sender thread writes every message queued since its last
write as one list (one write, one read and one unpickling in the API process for a burst of steps),
in order. `FLOTILLA_CORE_OUTPUT_THREAD=0` writes from the step loop instead (one-message lists), for
A/B measurements.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from flotilla.engine.queue_batch import take_batch
from flotilla.engine.step_trace import StepTrace
from flotilla.kernels.switches import env_flag

THREAD_ENV = "FLOTILLA_CORE_OUTPUT_THREAD"


class OutputSender:
    """Writes the core's messages to the API process in order, as lists, from a thread unless turned off."""

    def __init__(self, outputs: Connection, trace: StepTrace | None = None) -> None:
        self._outputs = outputs
        self._trace = trace
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if env_flag(THREAD_ENV, True):
            self._thread = threading.Thread(target=self._run, name="flotilla-core-output", daemon=True)
            self._thread.start()

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue `message` (or write it now, without the thread); OSError only without the thread."""
        if self._thread is None:
            self._write([message])
        else:
            self._queue.put(message)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread (the core's last messages must reach the API process)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)

    def _run(self) -> None:
        closed = False
        while not closed:
            batch, closed = take_batch(self._queue)
            if batch:
                with contextlib.suppress(OSError):  # the API process has gone; the step loop sees EOF
                    self._write(batch)

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        start = time.perf_counter()
        self._outputs.send(batch)
        if self._trace is not None:
            self._trace.note(send_ms=round((time.perf_counter() - start) * 1e3, 2), sends=1)
