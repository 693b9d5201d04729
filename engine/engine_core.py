"""The engine core in a process of its own (vLLM V1's EngineCore process), for `flotilla serve`.

The API process keeps HTTP, tokenization, chat templates and SSE; this process runs the step loop
(scheduler, model runner, the tp/pp executor and its workers, structured-output grammars, detokenization
and stop strings) with a GIL of its own, so the server's Python never competes with the step loop.

The two talk over two one-way `multiprocessing` pipes (spawn context). Commands come in as lists:
`("add", ...)`, `("abort", ids)`, `("call", id, EngineCall)`, `("shutdown",)`. Out goes one message per
step: `("step", output deltas, failures, stats snapshot)`; plus, while starting, `("tokenizer", pickled
tokenizer or None)` once the tokenizer is loaded (the API process's copy: it never loads its own, nor imports
torch) and `("ready", snapshot)` once built (or `("failed", error)` at either point); `("stats", snapshot)`
every half second when idle, `("call", id, ok, result)`, `("stopped",)` after a shutdown and `("dead", error)`
if the loop dies. After "ready", messages travel in lists, written by a thread of their own
(`core_output_sender.py`), so the step loop never waits for the API process to read. `EngineCoreClient` is the
other end.

The process ignores SIGINT and SIGTERM: the API process decides when it stops (draining first), and
a Ctrl-C sent to the whole process group must not kill the core under in-flight requests. If the API
process goes away its pipe reads end of file and the core exits.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import signal
import sys
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.core_output_sender import OutputSender
from flotilla.engine.engine_call import EngineCall
from flotilla.engine.errors import EngineBusyError, RequestFailedError, client_error
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.output_delta import OutputEncoder
from flotilla.engine.start_failure import forget_frames
from flotilla.engine.tokenizer import load_tokenizer, tokenizer_bytes

if TYPE_CHECKING:  # imported by the API process too (EngineFactory), which must not pay for torch
    from flotilla.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

IDLE_REPORT_S = 0.5  # stats snapshots (and the health check) while no request runs


@dataclass(frozen=True)
class StartupAdapter:
    """A `--lora-modules` adapter to load before serving: its flag's name and path, and its request."""

    name: str
    path: str
    lora: LoRARequest


@dataclass(frozen=True)
class EngineFactory:
    """Builds the server's engine and loads the start-up adapters (picklable: it crosses into the core)."""

    config: EngineConfig
    adapters: tuple[StartupAdapter, ...] = field(default=())

    def __call__(self, tokenizer: Any = None) -> LLMEngine:
        """The engine, with every start-up adapter loaded; ConfigError names a bad adapter. `tokenizer`: the
        config's, already loaded (None: the engine loads it)."""
        from flotilla.engine.llm_engine import LLMEngine  # in the process that runs it (torch and the model)

        engine = LLMEngine(self.config, tokenizer)
        try:
            self.load_adapters(engine, self.adapters)
        except BaseException as exc:
            engine.shutdown()
            del engine  # this frame stays in the traceback: it must not hold the engine's weights
            forget_frames(exc)
            raise
        return engine

    @staticmethod
    def load_adapters(engine: LLMEngine, adapters: tuple[StartupAdapter, ...]) -> None:
        """Load `adapters` into `engine`; ConfigError names the first one that cannot be served."""
        for adapter in adapters:
            try:
                engine.add_lora(adapter.lora)
            except ValueError as exc:  # LoRAAdapterError included
                raise ConfigError(f"--lora-modules {adapter.name}={adapter.path}: {exc}") from None
            logger.info("LoRA adapter %s served from %s", adapter.name, adapter.path)


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError with its type and message (for the trip to the
    API process, where it becomes the HTTP answer)."""
    try:
        copy = pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return copy if isinstance(copy, BaseException) else RuntimeError(str(exc))


def freeze_startup_heap() -> None:
    """Leave what start-up built (modules, the model, the tokenizer: hundreds of thousands of objects) out of
    every later garbage collection: collected once, then moved to the collector's permanent generation. A full
    collection otherwise walks all of it, 0.15 s on a CPU's tiny model and 0.23-0.35 s with an 8B model on a
    GPU (bench/throughput.py's gc_full_ms), all that time holding the GIL of the step loop or the event loop."""
    gc.collect()
    gc.freeze()


def run_engine_core(factory: EngineFactory, commands: Connection, outputs: Connection) -> None:
    """The core process's entry point: load the tokenizer and send the API process a copy (it unpickles it while
    this process builds the engine, instead of loading its own), build the engine, then step until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    try:
        tokenizer = load_tokenizer(factory.config.model.tokenizer)
        outputs.send(("tokenizer", tokenizer_bytes(tokenizer)))
        engine = factory(tokenizer)
        freeze_startup_heap()
        outputs.send(("ready", engine.stats_snapshot()))
    except BaseException as exc:
        logger.exception("the engine failed to start")
        outputs.send(("failed", portable(exc)))
        return
    # After "ready", in the background: /health and the first requests do not wait for it, and the first
    # constrained request no longer waits for the compile processes' start (seconds).
    engine.warm_up_grammars()
    code = EngineCore(engine, outputs).run(commands)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # The engine (and its workers) have shut down and the last message is sent: skip tearing down the
    # interpreter's torch modules, which the API process would wait for at every server stop.
    os._exit(code)


class EngineCore:
    """The step loop of the core process: commands in between steps, one message out per step."""

    def __init__(self, engine: LLMEngine, outputs: Connection) -> None:
        self.engine = engine
        self.outputs = OutputSender(outputs, engine.step_trace)
        self.encoder = OutputEncoder()
        self.stopping = False

    def run(self, commands: Connection) -> int:
        """Step until a shutdown command (0), the API process's exit (0) or an error (1)."""
        engine = self.engine
        try:
            while not self.stopping:
                busy = engine.can_step()  # not while asleep (sleep mode): its requests wait for wake_up
                if commands.poll(0 if busy else IDLE_REPORT_S):
                    self._drain(commands)
                    continue  # re-check: the commands may have added work or asked to stop
                if not busy:
                    engine.check_health()  # a dead worker fails the loop even when no request runs
                    self.outputs.send(("stats", engine.stats_snapshot()))
                    continue
                self._step()
        except EOFError:  # the API process has gone: nobody is left to answer
            logger.warning("the API process went away: stopping the engine core")
            engine.shutdown()
            return 0
        except BaseException as exc:  # a bug or a device error: the API process fails every waiter
            logger.exception("engine loop died")
            self._send_quietly(("dead", portable(exc)))
            self.outputs.close()
            engine.shutdown()
            return 1
        self._send_quietly(("stopped",))
        self.outputs.close()
        engine.shutdown()
        return 0

    def _step(self) -> None:
        outputs = self.engine.step()
        deltas = [self.encoder.encode(o) for o in outputs]
        failures = []
        for failure in self.engine.take_failures():
            self.encoder.forget(failure.request_id)
            failures.append((failure.request_id, portable(client_error(failure))))
        self.outputs.send(("step", deltas, failures, self.engine.stats_snapshot()))

    def _drain(self, commands: Connection) -> None:
        while commands.poll(0):
            for command in commands.recv():
                self._handle(command)

    def _handle(self, command: tuple[Any, ...]) -> None:
        kind = command[0]
        if kind == "add":
            self._add(*command[1:])
            if self.engine.step_trace is not None:
                self.engine.step_trace.note(adds=1)
        elif kind == "abort":
            self.engine.abort(command[1])
            for request_id in command[1]:
                self.encoder.forget(request_id)
        elif kind == "call":
            self._call(command[1], command[2])
        elif kind == "shutdown":
            self.stopping = True

    def _add(self, request_id: str, *args: Any) -> None:
        try:
            self.engine.add_request(args[0], args[1], request_id, *args[2:])
        except (ValueError, EngineBusyError) as exc:  # invalid prompt or params (a 400), or busy (a 503)
            self.outputs.send(("step", [], [(request_id, portable(exc))], None))
        except Exception as exc:  # e.g. the tokenizer failed on this prompt: this request fails alone
            logger.exception("adding request %s failed", request_id)
            self.engine.abort([request_id])
            self.outputs.send(("step", [], [(request_id, portable(RequestFailedError(request_id, exc)))], None))

    def _call(self, call_id: int, call: EngineCall) -> None:
        try:
            result = call(self.engine)
        except Exception as exc:  # the caller's error to answer, not the loop's
            self.outputs.send(("call", call_id, False, portable(exc)))
            return
        # The requests the call ended: a sleep's abort finishes those in flight ("abort", their final outputs).
        deltas = [self.encoder.encode(o) for o in self.engine.take_aborted_outputs()]
        failures = self.engine.take_failures()
        for failure in failures:
            self.encoder.forget(failure.request_id)
        if deltas or failures:
            self.outputs.send(("step", deltas, [(f.request_id, portable(client_error(f))) for f in failures], None))
        if call.changes_gauges:
            self.outputs.send(("stats", self.engine.stats_snapshot()))
        self.outputs.send(("call", call_id, True, result))

    def _send_quietly(self, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError):  # the API process has gone already
            self.outputs.send(message)
