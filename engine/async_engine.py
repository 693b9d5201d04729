"""The engine's step loop on its own thread, fed and drained by an asyncio front end.

Why a thread and not a process: the model runs in torch ops that release the GIL, so HTTP work on
the event loop overlaps them; a thread needs no serialisation of requests and outputs.
`bench/loop_overhead.py` measures what the thread costs against the offline engine.

The engine is *built* on the loop thread too (`AsyncEngine.build`): on the CPU, torch ops run ~1.6x
slower on a thread other than the one that first ran torch ops (each thread gets its own OpenMP
team, and the first one's idle workers still compete for the cores; measured on the 2-core CI
machine), so every torch op of the server must happen on one thread.

All engine calls happen on the loop thread. Front ends talk to it through a command queue
(add, abort) and receive outputs on per-request asyncio queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The step loop stopped after an unexpected error; the server must be restarted."""


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    prompt_text: str | None
    sink: Callable[[RequestOutput | BaseException], None]


class AsyncEngine:
    """Runs `LLMEngine.step()` in a background thread; `generate()` streams a request's outputs."""

    def __init__(
        self,
        engine: LLMEngine | Callable[[], LLMEngine],
        on_step: Callable[[LLMEngine], None] | None = None,
    ) -> None:
        self._build = engine if callable(engine) and not isinstance(engine, LLMEngine) else None
        self.engine: LLMEngine = None if self._build is not None else engine  # type: ignore[assignment]
        self._built = threading.Event()
        self._on_step = on_step
        self._commands: queue.Queue[_Add | tuple[str, str]] = queue.Queue()
        self._sinks: dict[str, Callable[[RequestOutput | BaseException], None]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flotilla-engine", daemon=True)
        self.dead: BaseException | None = None
        self.last_step_time = time.monotonic()

    @classmethod
    def build(cls, factory: Callable[[], LLMEngine], on_step: Callable[[LLMEngine], None] | None = None) -> AsyncEngine:
        """Start a loop thread that first builds its engine with `factory`; returns once it is built."""
        engine = cls(factory, on_step)
        engine.start()
        return engine

    def start(self) -> None:
        """Start the step loop (building the engine first when given a factory); raises if the build fails."""
        self._thread.start()
        self._built.wait()
        if self.engine is None:
            raise RuntimeError("the engine failed to start") from self.dead

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the step loop (in-flight requests are aborted)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        """True while the loop thread runs and has not died of an error."""
        return self._thread.is_alive() and self.dead is None

    @property
    def num_unfinished(self) -> int:
        """Requests added and not yet finished or aborted."""
        return len(self._sinks)

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        prompt_text: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its outputs as steps produce them; the last one is `finished`.

        Closing the iterator early (e.g. the client went away) aborts the request and frees its blocks.
        """
        if self.dead is not None:
            raise EngineDeadError("the engine loop has stopped") from self.dead
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

        def sink(item: RequestOutput | BaseException) -> None:
            loop.call_soon_threadsafe(outputs.put_nowait, item)

        self._commands.put(_Add(request_id, prompt, params, prompt_text, sink))
        self._wake.set()
        finished = False
        try:
            while True:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread."""
        self._commands.put(("abort", request_id))
        self._wake.set()

    # --- the loop thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            if self._build is not None:
                self.engine = self._build()
        except BaseException as exc:
            self.dead = exc
            return
        finally:
            self._built.set()
        try:
            while not self._stop.is_set():
                self._drain_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    self.last_step_time = time.monotonic()
                    if self._on_step is not None:
                        self._on_step(self.engine)
                    continue
                outputs = self.engine.step()
                self.last_step_time = time.monotonic()
                for output in outputs:
                    self._deliver(output)
                if self._on_step is not None:
                    self._on_step(self.engine)
        except BaseException as exc:  # a bug or a device error: fail every waiter, loudly
            logger.exception("engine loop died")
            self.dead = exc
            for sink in list(self._sinks.values()):
                sink(EngineDeadError(f"the engine loop died: {exc!r}"))
            self._sinks.clear()
            return
        self.engine.abort(list(self._sinks))
        for sink in self._sinks.values():
            sink(EngineDeadError("the engine is shutting down"))

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                self._add(command)
            else:
                self._sinks.pop(command[1], None)
                self.engine.abort([command[1]])

    def _add(self, command: _Add) -> None:
        try:
            self.engine.add_request(command.prompt, command.params, command.request_id, command.prompt_text)
        except ValueError as exc:  # invalid prompt: the caller turns it into a 400
            command.sink(exc)
            return
        self._sinks[command.request_id] = command.sink

    def _deliver(self, output: RequestOutput) -> None:
        sink = self._sinks.get(output.request_id)
        if sink is None:
            return
        sink(output)
        if output.finished:
            with contextlib.suppress(KeyError):
                del self._sinks[output.request_id]
