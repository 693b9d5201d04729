"""A per-step trace of the engine loop, for finding out where serving time goes.

`FLOTILLA_STEP_TRACE=PATH` makes the engine append one JSON line per finished step to PATH (the
engine core's process writes it when serving; the offline `LLM` in its own process). A line says
what the step held and what it cost:

- `t`: when the step's outputs were taken in (`time.monotonic()`, one clock for every process of the
  machine, so the API process's lines line up with the core's);
- `tokens`, `decode` (rows decoding a generated token), `prefill` (rows feeding prompt tokens),
  `prefill_tokens`, `running` / `waiting` (the scheduler's queues after the step), `preempted` (requests
  the step's plan preempted for want of KV blocks);
- `graph`: the CUDA graph's padded token count that ran the step, 0 when it ran eagerly (the log's
  "step runs eagerly" line says why once per kind);
- `host_ms`: the host's part of the launch (inputs, kernel launches or the graph replay, the draw);
  `sync_ms`: how long taking in the step's tokens waited for the device (near 0: the host was the
  bottleneck); `step_ms`: launch to outputs (with asynchronous scheduling it spans the next launch);
- `first` / `ttft_ms`: requests that got their first token in the step, and the sum of their times
  from reaching the engine (the client's TTFT minus this is the API process's and the network's part);
- fields the engine core adds: `adds` (requests received since the step before), `sends` / `send_ms`
  (pipe writes of output messages to the API process since then, and the time they took: a write
  waits while the API process is behind on reading).

The API process of a server writes `PATH.api` beside it: one line per message batch read from the
core (`t`, `messages`, `deltas`, `handle_ms`: unpickled, decoded and handed to the event loop).

Writes are line-buffered: the core process leaves with `os._exit`, and a trace must survive that. A
line costs a few microseconds; without the variable nothing is done.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import IO, Any

TRACE_ENV = "FLOTILLA_STEP_TRACE"


class StepTrace:
    """Appends one JSON line per step to a file; extra fields noted in between go on the next line."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 (open for the engine's lifetime)
        self._extra: dict[str, Any] = {}
        self._lock = threading.Lock()  # the core's output thread notes its writes too

    @classmethod
    def from_env(cls, suffix: str = "") -> StepTrace | None:
        """The trace `FLOTILLA_STEP_TRACE` asks for (its path plus `suffix`), or None."""
        path = os.environ.get(TRACE_ENV)
        return cls(path + suffix) if path else None

    def note(self, **fields: Any) -> None:
        """Fields for the next line (numbers add up until then)."""
        with self._lock:
            for key, value in fields.items():
                self._extra[key] = round(self._extra.get(key, 0) + value, 2)

    def record(self, **fields: Any) -> None:
        """Write one step's line."""
        with self._lock:
            line = {"t": round(time.monotonic(), 4), **fields, **self._extra}
            self._extra = {}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
