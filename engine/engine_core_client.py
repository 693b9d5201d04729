"""The API process's end of the engine-core process (`engine_core.py`): a `ServingEngine`
(engine/serving_engine.py) as `AsyncEngine` is, with the step loop in a process of its own.

Three parties in this process touch it: the event loop (generate, call, abort), a sender thread
that batches the commands queued since its last send into one pipe write (so a burst of new requests
never blocks the event loop on a full pipe), and the output-handler thread, which receives one message
per step, turns each request's delta into its output (`OutputDecoder`: the delta, or the cumulative output
rebuilt when the request asked for that) and hands the
step's outputs to each event loop in a single callback, as `AsyncEngine` does. Prometheus metrics are
fed here, from the stats snapshot each step message carries.

If the core process dies (an error in the step loop, a crash, a kill), its pipe reads end of file:
every waiter gets EngineDeadError at once and `on_dead` runs (the server exits non-zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from flotilla.engine.engine_call import EngineCall
from flotilla.engine.engine_core import EngineFactory, run_engine_core
from flotilla.engine.errors import EngineDeadError
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.output_delta import OutputDecoder, OutputDelta, core_params
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.queue_batch import take_batch
from flotilla.engine.request_stream import Handoffs, RequestStream, StreamItem, hand_over, queue_item
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.stats import StatsSnapshot
from flotilla.engine.step_trace import StepTrace
from flotilla.engine.structured_output.params import ready_off_the_loop

logger = logging.getLogger(__name__)


class _CoreStream(RequestStream):
    """A request's stream, with the decoder that rebuilds its outputs (dropped with it on abort)."""

    __slots__ = ("decoder",)

    def __init__(self, loop: asyncio.AbstractEventLoop, output_kind: str) -> None:
        super().__init__(loop, delta=output_kind == "delta")
        self.decoder = OutputDecoder(cumulative=output_kind == "cumulative")


class EngineCoreClient:
    """Starts the engine-core process and streams its requests' outputs; see the module docstring."""

    def __init__(
        self,
        factory: EngineFactory,
        on_step: Callable[[StatsSnapshot], None] | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
    ) -> None:
        """`on_step` gets every stats snapshot of the core (on the output-handler thread); `on_dead`
        runs once if the core dies of an error or goes away."""
        ctx = multiprocessing.get_context("spawn")  # CUDA and the workers' gloo threads do not survive fork
        commands_in, self._commands = ctx.Pipe(duplex=False)
        self._outputs, outputs_out = ctx.Pipe(duplex=False)
        # Not a daemon: a daemon cannot start the tp/pp worker processes.
        self._process = ctx.Process(target=run_engine_core, args=(factory, commands_in, outputs_out),
                                    name="flotilla-engine-core", daemon=False)
        self._child_ends = (commands_in, outputs_out)
        self._on_step = on_step
        self._on_dead = on_dead
        self._streams: dict[str, _CoreStream] = {}
        self._calls: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}
        self._call_ids = itertools.count()
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._trace = StepTrace.from_env(".api")  # FLOTILLA_STEP_TRACE: the output handler's reads, beside the core's
        self._stopping = False
        self._stopped = threading.Event()
        self.dead: BaseException | None = None
        self._reader = threading.Thread(target=self._read, name="flotilla-output-handler", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="flotilla-command-sender", daemon=True)

    @classmethod
    def build(
        cls,
        factory: EngineFactory,
        on_step: Callable[[StatsSnapshot], None] | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
    ) -> EngineCoreClient:
        """Start the core process and return once its engine is built (RuntimeError from the build's
        error if it failed)."""
        client = cls(factory, on_step, on_dead)
        client.start()
        return client

    def start(self) -> None:
        """Start the core; return once it has built its engine, or raise RuntimeError from its error."""
        self.launch()
        self.wait_until_ready()

    def launch(self) -> None:
        """Start the core process and return at once: the caller can do its own start-up work (load the
        tokenizer) while the core builds its engine, then call `wait_until_ready` (or `stop_launch`)."""
        self._process.start()
        for end in self._child_ends:  # the child holds them now; ours would hide its exit from us
            end.close()

    def wait_for_tokenizer(self, check: Callable[[], None] | None = None) -> bytes | None:
        """The launched core's tokenizer, pickled (None: it does not pickle), sent once loaded and before the core
        builds its engine, so this process unpickles it meanwhile (`tokenizer_from_bytes`); RuntimeError from the
        core's error if it could not load it. `check` as for `wait_until_ready`."""
        message = self._start_message(check)
        if message[0] != "tokenizer":
            raise RuntimeError(f"the engine core sent {message[0]!r} before its tokenizer")
        return message[1]

    def wait_until_ready(self, check: Callable[[], None] | None = None) -> None:
        """Wait for the launched core to build its engine (RuntimeError from its error if it could not). `check`
        runs every 0.1 s meanwhile: what it raises ends the wait (the caller then stops the launch)."""
        message = self._start_message(check)
        if message[0] == "tokenizer":  # a caller that does not take the core's tokenizer
            message = self._start_message(check)
        if message[0] != "ready":
            raise RuntimeError(f"the engine core sent {message[0]!r} before it was ready")
        self._report(message[1])
        self._reader.start()
        self._sender.start()

    def _start_message(self, check: Callable[[], None] | None) -> tuple[Any, ...]:
        """The core's next message while it starts; RuntimeError if it failed (from its error) or exited."""
        while check is not None and not self._outputs.poll(0.1):
            check()
        try:
            message = self._outputs.recv()
        except (EOFError, OSError):
            self._process.join(5)
            raise RuntimeError(f"the engine core exited while starting (exit code {self._process.exitcode})") from None
        if message[0] == "failed":
            self._process.join(10)
            raise RuntimeError("the engine failed to start") from message[1]
        return message

    def stop_launch(self) -> None:
        """Stop a core that was launched but is not serving yet (this process failed to start)."""
        self._stopping = True
        self._process.kill()
        self._process.join(10)

    def shutdown(self, timeout: float = 10.0) -> None:
        """`ServingEngine.shutdown`: the core gets `timeout` s to stop, then is terminated."""
        if not self._stopping and self.dead is None:
            self._stopping = True
            live = list(self._streams)
            if live:
                self._queue.put(("abort", live))
            self._queue.put(("shutdown",))
        self._stopped.wait(timeout)
        self._process.join(timeout)
        if self._process.is_alive():
            logger.warning("the engine core did not stop within %g s: terminating it", timeout)
            self._process.terminate()
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        self._queue.put(None)

    @property
    def is_alive(self) -> bool:
        """`ServingEngine.is_alive`: the core process runs and has not died of an error."""
        return self.dead is None and not self._stopped.is_set() and self._process.is_alive()

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
        """`ServingEngine.generate`: the request and its outputs cross the pipes to the core."""
        self._check_running()
        params = await ready_off_the_loop(params)  # a schema crosses the pipe as text, its key made and checked
        if request_id in self._streams:  # the live request's stream must stay its own (the core refuses it too)
            raise ValueError(f"duplicate request id {request_id!r}")
        stream = _CoreStream(asyncio.get_running_loop(), params.output_kind)
        self._streams[request_id] = stream
        self._queue.put(("add", request_id, prompt, core_params(params), prompt_text, lora_request, priority,
                         cache_salt))
        try:
            while not stream.done:
                yield await stream.next()
        finally:
            if not stream.done:  # the reader went away: the core still holds the request
                self.abort(request_id)

    async def call(self, call: EngineCall) -> Any:
        """`ServingEngine.call`, run in the core process (hence named and picklable)."""
        self._check_running()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call_id = next(self._call_ids)
        self._calls[call_id] = (loop, future)
        self._queue.put(("call", call_id, call))
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    def abort(self, request_id: str) -> None:
        """`ServingEngine.abort`."""
        if self._streams.pop(request_id, None) is not None:
            self._queue.put(("abort", [request_id]))

    def _check_running(self) -> None:
        if self.dead is not None:
            raise EngineDeadError("the engine core has stopped") from self.dead
        if self._stopping:  # after shutdown() no core would ever answer
            raise EngineDeadError("the engine is shutting down")

    # --- the sender thread -------------------------------------------------------------------------

    def _send_loop(self) -> None:
        closed = False
        while not closed:
            batch, closed = take_batch(self._queue)
            if batch:
                try:
                    self._commands.send(batch)
                except OSError:  # the core has gone; the output handler reports it
                    return

    # --- the output-handler thread -----------------------------------------------------------------

    def _read(self) -> None:
        while True:
            try:
                batch = self._outputs.recv()  # the messages the core queued since its last write
            except (EOFError, OSError):
                batch = [("dead", None)]
            # The batch's stream items go to each event loop in one callback, after the whole batch.
            start = time.perf_counter()
            pending: Handoffs = {}
            for message in batch:
                if not self._handle(message, pending):
                    return
            hand_over(pending)
            if self._trace is not None:
                self._trace.record(messages=len(batch), deltas=sum(len(m[1]) for m in batch if m[0] == "step"),
                                   handle_ms=round((time.perf_counter() - start) * 1e3, 2))

    def _handle(self, message: tuple[Any, ...], pending: Handoffs) -> bool:
        """Act on one message from the core (stream items into `pending`); False once nothing more will come."""
        kind = message[0]
        if kind == "step":
            self._deliver_step(message[1], message[2], pending)
            if message[3] is not None:
                self._report(message[3])
            return True
        if kind == "stats":
            self._report(message[1])
            return True
        if kind == "call":
            self._settle_call(message[1], message[2], message[3])
            return True
        hand_over(pending)  # the items before the end, then the end
        if kind == "stopped":
            self._end(EngineDeadError("the engine is shutting down"))
        else:  # "dead", or the pipe closed
            self._die(message[1])
        return False

    def _deliver_step(self, deltas: list[OutputDelta], failures: list[tuple[str, BaseException]],
                      pending: Handoffs) -> None:
        streams = self._streams
        for delta in deltas:
            request_id, finished = delta[0], delta[1]
            stream = streams.get(request_id)
            if stream is None:  # aborted meanwhile
                continue
            item: StreamItem
            try:
                item = stream.decoder.decode(delta)
            except ValueError as exc:
                item = exc
            if finished:
                streams.pop(request_id, None)
            queue_item(pending, stream, item)
        for request_id, error in failures:
            failed = streams.pop(request_id, None)
            if failed is not None:
                queue_item(pending, failed, error)

    def _settle_call(self, call_id: int, ok: bool, result: Any) -> None:
        entry = self._calls.pop(call_id, None)
        if entry is None:
            return
        loop, future = entry

        def settle() -> None:
            if future.done():  # the caller went away
                return
            if ok:
                future.set_result(result)
            else:
                future.set_exception(result)

        with contextlib.suppress(RuntimeError):  # that loop has closed
            loop.call_soon_threadsafe(settle)

    def _report(self, snapshot: StatsSnapshot) -> None:
        if self._on_step is not None:
            self._on_step(snapshot)

    def _end(self, error: EngineDeadError) -> None:
        """Answer every open stream and call with `error`; nothing will come from the core any more."""
        self._stopping = True
        pending: Handoffs = {}
        for stream in list(self._streams.values()):
            queue_item(pending, stream, error)
        self._streams.clear()
        hand_over(pending)
        for call_id in list(self._calls):
            self._settle_call(call_id, False, error)
        self._stopped.set()

    def _die(self, cause: BaseException | None) -> None:
        if self._stopping:  # a shutdown we asked for, whose "stopped" message was lost with the pipe
            self._end(EngineDeadError("the engine is shutting down"))
            return
        self._process.join(1)
        exc = cause if cause is not None else RuntimeError(
            f"the engine core process exited (exit code {self._process.exitcode})")
        self.dead = exc
        logger.error("the engine core died: %r", exc)
        self._end(EngineDeadError(f"the engine loop died: {exc!r}"))
        if self._on_dead is not None:
            self._on_dead(exc)

