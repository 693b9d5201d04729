"""SIGTERM or SIGINT while `flotilla serve` starts, before uvicorn takes the signals over.

The engine core is a spawned process that ignores both (engine_core.py: the API process decides when it stops).
Killed by either one's default action mid-start, the API process left that core behind: one still reading the
spawn data from the dead parent's pipe printed an UnpicklingError traceback, one that had built its engine found
the pipe gone at its "ready" (two BrokenPipeError tracebacks), and until then it went on loading the model. Here
the signal is only recorded; start-up looks at it where stopping is safe (never in the middle of the core's spawn,
whose data an interrupted write would truncate), kills the core that is still starting and exits 0, as a SIGTERM
drain does. A signal before these handlers exist (while modules import) still takes the default action: no core
exists yet; so does one while an engine is built on a thread of the server's own process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), which could not look at it until its build ended.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None  # what signal.signal returns


class StartStopped(Exception):
    """A SIGTERM or SIGINT came while the server was starting: stop starting (the core is stopped by the caller)."""


class StartSignals:
    """Records SIGTERM and SIGINT from `install` to `restore`; `check` raises StartStopped once one came."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Handler] = {}

    def install(self) -> StartSignals:
        """Record the signals from now on (a no-op off the main thread, where handlers cannot be set)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._record) for sig in SIGNALS}
        return self

    def restore(self) -> None:
        """The handlers from before `install` (uvicorn installs its own once it runs)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: not set from Python
        self._previous = {}

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)

    def check(self) -> None:
        """StartStopped when a signal came since `install`."""
        if self.received is not None:
            raise StartStopped(f"{self.received.name} while starting")
