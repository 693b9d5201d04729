"""The engine's step loop on its own thread, fed and drained by an asyncio front end.

Why a thread and not a process: the model runs in torch ops that release the GIL, so HTTP work on
the event loop overlaps them; a thread needs no serialisation of requests and outputs.
`bench/loop_overhead.py` measures what the thread costs against the offline engine.

The engine is *built* on the loop thread too (`AsyncEngine.build`): on the CPU, torch ops run ~1.6x
slower on a thread other than the one that first ran torch ops (each thread gets its own OpenMP
team, and the first one's idle workers still compete for the cores; measured on the 2-core CI
machine), so every torch op of the server must happen on one thread.

All engine calls happen on the loop thread. Front ends talk to it through a command queue
(add, abort) and receive outputs through one hand-off per step: the loop thread gathers every
request's output of a step and schedules a single callback on each waiting event loop, which
stores each output in its request's `RequestStream` (engine/request_stream.py says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from flotilla.engine.engine_call import EngineCall
from flotilla.engine.errors import EngineBusyError, EngineDeadError, RequestFailedError, client_error
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.request_stream import Handoffs, RequestStream, StreamItem, hand_over, queue_item
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.stats import StatsSnapshot
from flotilla.engine.structured_output.params import key_made_off_the_loop

if TYPE_CHECKING:  # the server imports this module even when its engine runs in a core process: no torch
    from flotilla.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    prompt_text: str | None
    stream: RequestStream
    lora_request: LoRARequest | None = None
    priority: int = 0
    cache_salt: str | None = None


@dataclass
class _Call:
    """A function to run on the engine between steps (e.g. loading a LoRA adapter), and its future."""

    fn: Callable[[LLMEngine], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]

    def run(self, engine: LLMEngine, before_answer: Callable[[], None]) -> None:
        """Call it, then `before_answer`, then hand the result or the error to the waiting event loop."""
        try:
            result = self.fn(engine)
        except Exception as exc:  # the caller's error to answer, not the loop's
            before_answer()
            self.fail(exc)
            return
        before_answer()
        self._settle(lambda: self.future.set_result(result))

    def fail(self, error: BaseException) -> None:
        """Answer with `error` without running."""
        self._settle(lambda: self.future.set_exception(error))

    def _settle(self, set_future: Callable[[], None]) -> None:
        def settle() -> None:
            if not self.future.done():  # else the caller went away
                set_future()

        with contextlib.suppress(RuntimeError):  # that loop has closed
            self.loop.call_soon_threadsafe(settle)


class AsyncEngine:
    """Runs `LLMEngine.step()` in a background thread: a `ServingEngine` (engine/serving_engine.py)."""

    def __init__(
        self,
        engine: LLMEngine | Callable[[], LLMEngine],
        on_step: Callable[[StatsSnapshot], None] | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
    ) -> None:
        """`on_step` gets the engine's stats snapshot after every step (and every half second when idle), on
        the loop thread, and once before `start` returns; `on_dead` runs there once
        if the loop dies of an error no single request accounts for (e.g. the server's `exit_process`)."""
        from flotilla.engine.llm_engine import LLMEngine  # this process runs the engine: torch is needed now

        self._build = engine if callable(engine) and not isinstance(engine, LLMEngine) else None
        # None only until the loop thread has built it; start() returns after that (or raises).
        self.engine: LLMEngine = None if self._build is not None else engine  # type: ignore[assignment]  # see above
        self._built = threading.Event()
        self._on_step = on_step
        self._on_dead = on_dead
        self._commands: queue.Queue[_Add | _Call | tuple[str, str]] = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        # What the current step has for each event loop, handed over at once by `_flush`.
        self._pending: Handoffs = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flotilla-engine", daemon=True)
        self.dead: BaseException | None = None

    @classmethod
    def build(
        cls,
        factory: Callable[[], LLMEngine],
        on_step: Callable[[StatsSnapshot], None] | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
    ) -> AsyncEngine:
        """Start a loop thread that first builds its engine with `factory`; returns once it is built."""
        engine = cls(factory, on_step, on_dead)
        engine.start()
        return engine

    def start(self) -> None:
        """Start the step loop (building the engine first when given a factory); raises if the build fails."""
        self._thread.start()
        self._built.wait()
        if self.engine is None:
            raise RuntimeError("the engine failed to start") from self.dead

    def shutdown(self, timeout: float = 10.0) -> None:
        """`ServingEngine.shutdown`: waits up to `timeout` s for the loop thread to end. The loop thread shuts the
        engine down as it ends (`LLMEngine.shutdown`: the KV pool, graphs and grammar workers are freed, as the core
        process frees them when it exits), so a server stopped in-process gives its device memory back."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        """`ServingEngine.is_alive`: the loop thread runs and has not died of an error."""
        return self._thread.is_alive() and self.dead is None

    @property
    def num_unfinished(self) -> int:
        """`ServingEngine.num_unfinished`."""
        return len(self._streams)

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        prompt_text: str | None = None,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncGenerator[RequestOutput]:
        """`ServingEngine.generate`: the request reaches the loop thread through the command queue."""
        await key_made_off_the_loop(params.structured_outputs)  # not on the step loop at admission
        if self.dead is not None:
            raise EngineDeadError("the engine loop has stopped") from self.dead
        if self._stop.is_set():  # after shutdown() no loop would ever answer this request
            raise EngineDeadError("the engine is shutting down")
        stream = RequestStream(asyncio.get_running_loop(), delta=params.output_kind == "delta")
        self._commands.put(_Add(request_id, prompt, params, prompt_text, stream, lora_request, priority,
                                cache_salt))
        self._wake.set()
        try:
            while not stream.done:
                yield await stream.next()
        finally:
            if not stream.done:  # the reader went away: the engine still holds the request
                self.abort(request_id)

    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """`ServingEngine.call`, for any `fn(engine)` (an `EngineCall` or, in-process only, a plain function)."""
        if self.dead is not None or self._stop.is_set():
            raise EngineDeadError("the engine loop has stopped") from self.dead
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._commands.put(_Call(fn, loop, future))
        self._wake.set()
        return await future

    def abort(self, request_id: str) -> None:
        """`ServingEngine.abort`."""
        self._commands.put(("abort", request_id))
        self._wake.set()

    # --- the loop thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            if self._build is not None:
                self.engine = self._build()
            self._report()  # the first snapshot (e.g. the pool size) is published before serving starts
        except BaseException as exc:
            if self._build is not None and self.engine is not None:  # built here, then failed: free it here
                self._shut_engine_down()
            self.dead = exc
            self.engine = None  # type: ignore[assignment]  # start() sees None and raises
            return
        finally:
            self._built.set()
        try:
            while not self._stop.is_set():
                self._drain_commands()
                if not self.engine.can_step():  # idle, or asleep (sleep mode): requests wait for wake_up
                    self._flush()
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    self._report()
                    self.engine.check_health()  # a dead worker fails the loop even when no request runs
                    continue
                outputs = self.engine.step()
                for output in outputs:
                    self._deliver(output)
                for failure in self.engine.take_failures():
                    self._fail(failure)
                self._flush()
                self._report()
        except BaseException as exc:  # a bug or a device error: fail every waiter, loudly
            logger.exception("engine loop died")
            self.dead = exc
            self._pending.clear()
            for stream in list(self._streams.values()):
                self._send(stream, EngineDeadError(f"the engine loop died: {exc!r}"))
            self._streams.clear()
            self._flush()
            self._fail_calls(EngineDeadError(f"the engine loop died: {exc!r}"))
            self._shut_engine_down()
            if self._on_dead is not None:
                self._on_dead(exc)
            return
        self.engine.abort(list(self._streams))
        for stream in self._streams.values():
            self._send(stream, EngineDeadError("the engine is shutting down"))
        self._flush()
        self._fail_calls(EngineDeadError("the engine is shutting down"))
        self._shut_engine_down()

    def _shut_engine_down(self) -> None:
        """Free the engine's device memory on the thread that ran its torch ops; after a device error this may fail
        too, which is logged: the waiters have their answers already."""
        try:
            self.engine.shutdown()
        except Exception:
            logger.exception("shutting the engine down failed")

    def _fail_calls(self, error: EngineDeadError) -> None:
        """Answer the calls still queued when the loop ends, so that no caller waits forever."""
        for command in self._queued_commands():
            if isinstance(command, _Call):
                command.fail(error)

    def _queued_commands(self) -> Iterator[_Add | _Call | tuple[str, str]]:
        """Take the commands queued so far, oldest first, without waiting for more."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _report(self) -> None:
        if self._on_step is not None:
            self._on_step(self.engine.stats_snapshot())

    def _drain_commands(self) -> None:
        for command in self._queued_commands():
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Call):
                command.run(self.engine, partial(self._after_call, command.fn))
            else:
                self._streams.pop(command[1], None)
                self.engine.abort([command[1]])

    def _after_call(self, fn: Callable[[LLMEngine], Any]) -> None:
        """Before a call's answer: deliver the final outputs of the requests it ended (a sleep's abort), fail those
        it failed and, for a call that changes the gauges (`EngineCall.changes_gauges`: a sleep's state), publish
        them, so that a scrape after the answer sees them."""
        for output in self.engine.take_aborted_outputs():
            self._deliver(output)
        for failure in self.engine.take_failures():
            self._fail(failure)
        if isinstance(fn, EngineCall) and fn.changes_gauges:
            self._report()

    def _add(self, command: _Add) -> None:
        try:
            self.engine.add_request(command.prompt, command.params, command.request_id, command.prompt_text,
                                   command.lora_request, command.priority, command.cache_salt)
        except (ValueError, EngineBusyError) as exc:  # invalid prompt or params (a 400), or busy (a 503)
            self._send(command.stream, exc)
            return
        except Exception as exc:  # e.g. the tokenizer failed on this prompt: this request fails alone
            logger.exception("adding request %s failed", command.request_id)
            self.engine.abort([command.request_id])
            self._send(command.stream, RequestFailedError(command.request_id, exc))
            return
        self._streams[command.request_id] = command.stream

    def _fail(self, failure: RequestFailedError) -> None:
        """Hand a request's failure to its waiter (the engine has already aborted it)."""
        stream = self._streams.pop(failure.request_id, None)
        if stream is not None:
            self._send(stream, client_error(failure))

    def _deliver(self, output: RequestOutput) -> None:
        stream = self._streams.get(output.request_id)
        if stream is None:
            return
        self._send(stream, output)
        if output.finished:
            with contextlib.suppress(KeyError):
                del self._streams[output.request_id]

    def _send(self, stream: RequestStream, item: StreamItem) -> None:
        """Queue an item for the next `_flush` (still on the loop thread)."""
        queue_item(self._pending, stream, item)

    def _flush(self) -> None:
        """Hand this step's items to each event loop in a single callback."""
        pending, self._pending = self._pending, {}
        hand_over(pending)

