"""Grammar compiles off the step loop: a few worker threads, one compile per distinct constraint, bounded.

Compiling a grammar against the vocabulary takes milliseconds for usual schemas, but a large legal one
can take seconds to minutes (measured with xgrammar 0.2.9 on a 49k vocabulary: 100 string properties
with bounded-repetition patterns, 8.7 KB of schema, 6.5 s; 1,000 optional object properties, 196 KB,
43 s; the 19-character regex `(a{1,1000}){1,1000}`, ~90 s). Compiled on the step loop, it stalled every
running stream for that long. Here, as in vLLM (`StructuredOutputManager.grammar_init`, a thread pool,
requests WAITING_FOR_FSM), the compile runs off the step loop and the request waits, holding no KV
blocks, until the engine finds its grammar ready at the start of a step. Each worker thread drives a
compile process of its own (compile_process.py), because xgrammar cannot interrupt a compile: a process
can be killed.

Bounds:
- requests that ask for a constraint already compiling share that compile (and the compiled-grammar
  cache, which is the compiler's); once none of them waits any more (aborted, or failed at the bound), the
  compile is dropped, killed with its process if it runs;
- a compile that has run for `timeout_s` is killed with its process (a fresh one takes its place) and
  fails the requests that wait for it with a 400 that says so (the bound covers the parse, the compile
  and the grammar's serialization in the process); its constraint is refused at once from
  then on (the last 256 such constraints are remembered), so that no client can queue it again. The
  engine thread fails the waiters as soon as the bound passes, whether or not the kill has happened yet.
  So no compile holds a thread for much longer than the bound, and a queued compile waits its turn;
- at most `max_pending` distinct compiles are queued or running: more is a 503. The offline `LLM` lifts
  this cap (a batch of distinct schemas is the caller's own work, not a flood).
The threads are daemons and the processes daemonic children, so neither holds up the process's exit.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flotilla.engine.errors import EngineBusyError, InvalidParamError

if TYPE_CHECKING:
    import xgrammar as xgr

    from flotilla.engine.structured_output.compile_process import CompileProcess
    from flotilla.engine.structured_output.compiler import CacheKey, GrammarCompiler
    from flotilla.engine.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

# Distinct compiles queued or running at once; a burst of distinct schemas past it is a 503.
MAX_PENDING = 64
# A constraint (schema text, regex, grammar) up to this size is parsed into a grammar on the engine thread when it
# comes (invalid: refused at once); a larger one in a compile process: the parse's time grows faster than the text
# (a chain of `$ref`s: 500 links, 17 KB, 0.5 s; 4,000, 141 KB, 79 s; 120 links fit here: milliseconds).
SYNC_PARSE_CHARS = 4096
# Constraints whose compile ran past the bound, remembered to refuse them at once.
SLOW_KEYS_KEPT = 256


def default_workers() -> int:
    """Compile threads: half the CPUs this process may use (as vLLM), at least 1, at most 4."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, (cpus + 1) // 2))


@dataclass(eq=False)
class PendingGrammar:
    """One compile queued or running, shared by every request that waits for its constraint."""

    key: CacheKey
    future: Future[xgr.CompiledGrammar]
    started: float | None = None  # when a worker took it (time.monotonic())
    waiters: set[str] = field(default_factory=set)  # request ids waiting for it
    # Set once no request waits for it while it runs: its worker kills its process (compile_process.py).
    abandoned: threading.Event = field(default_factory=threading.Event)


class GrammarCompiles:
    """The engine's asynchronous front to a GrammarCompiler. Called on the engine thread only (the
    workers touch a PendingGrammar's `started` and the pending map, under the lock)."""

    def __init__(self, compiler: GrammarCompiler, timeout_s: float, workers: int | None = None,
                 max_pending: int | None = MAX_PENDING) -> None:
        self.compiler = compiler
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self._pending: dict[CacheKey, PendingGrammar] = {}
        self._slow: OrderedDict[CacheKey, None] = OrderedDict()
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[PendingGrammar, StructuredOutputsParams] | None] = queue.SimpleQueue()
        self.workers = workers or default_workers()
        from flotilla.engine.structured_output.compile_process import CompileProcess  # imports xgrammar

        self._processes = [CompileProcess(compiler, f"grammar-compile-{i}") for i in range(self.workers)]
        self._threads = [threading.Thread(target=self._work, args=(process,), name=f"grammar-compile-{i}",
                                          daemon=True) for i, process in enumerate(self._processes)]
        for thread in self._threads:
            thread.start()

    def submit(self, params: StructuredOutputsParams, request_id: str) -> xgr.CompiledGrammar | PendingGrammar:
        """The compiled grammar if it is cached, else the compile `request_id` waits for (joined, or queued
        now). Raises InvalidParamError for a constraint whose compile ran past the bound, EngineBusyError when
        `max_pending` compiles are pending (None: no cap). An invalid constraint is refused here when it is
        small (`SYNC_PARSE_CHARS`), else it fails its compile (the waiters' 400): it is parsed on a compile
        thread."""
        key = params.cache_key()
        compiled = self.compiler.lookup(key)
        if compiled is not None:
            return compiled
        with self._lock:
            pending = self._pending.get(key)
        if pending is not None and self._ran_too_long(pending, time.monotonic()):
            self._mark_slow(pending)
        with self._lock:
            slow = key in self._slow
        if slow:
            raise self.too_slow()
        if pending is None:
            if self.max_pending is not None and len(self._pending) >= self.max_pending:
                raise EngineBusyError(f"{len(self._pending)} structured-output grammars are compiling already; "
                                      "retry later")
            # A small constraint is parsed here, so that an invalid one is refused before the request is queued
            # (milliseconds); a larger one in the compile process: parsing is not always quick (a chain of
            # 4,000 `$ref`s took 79 s), and on the step loop it stopped every stream meanwhile.
            if len(key[1]) <= SYNC_PARSE_CHARS:
                self.compiler.prepare(params)  # (the compile process parses it again: milliseconds at this size)
            pending = PendingGrammar(key, Future())
            with self._lock:
                self._pending[key] = pending
            self._jobs.put((pending, params))
        pending.waiters.add(request_id)
        return pending

    def check(self, pending: PendingGrammar, request_id: str, now: float) -> InvalidParamError | None:
        """Why `request_id`, waiting for `pending`, must fail now (None: it may wait on): its compile has run
        for `timeout_s` (a 400; its process is killed at that bound too, by the worker thread). A queued
        compile waits its turn: none holds a thread for longer than the bound."""
        if pending.future.done() or not self._ran_too_long(pending, now):
            return None
        self._mark_slow(pending)
        self.forget(pending, request_id)
        return self.too_slow()

    def forget(self, pending: PendingGrammar, request_id: str) -> None:
        """`request_id` no longer waits (aborted, failed or served). A compile nobody waits for any more is
        dropped: one no worker has started is cancelled, one running is killed with its process (within
        `ABANDON_POLL_S`), rather than burn a core up to the bound and then ship back a grammar nobody wants
        (slow_schema(90): 6.5 s of compile, then 15 s to serialize 155 MB, 5.7 s to read it back), holding its
        compile thread from the requests that do wait. A request for that constraint later compiles it anew."""
        pending.waiters.discard(request_id)
        if pending.waiters:
            return
        with self._lock:
            if self._pending.get(pending.key) is pending and not pending.future.done():
                del self._pending[pending.key]  # a new request for the constraint queues a compile of its own
            if pending.started is not None:
                pending.abandoned.set()
            else:
                pending.future.cancel()

    def wait(self, timeout: float) -> None:
        """Block up to `timeout` s, or until some pending compile is done (the engine has nothing else to do)."""
        with self._lock:
            futures = [p.future for p in self._pending.values()]
        if futures:
            wait_futures(futures, timeout, return_when=FIRST_COMPLETED)

    @property
    def num_pending(self) -> int:
        """Distinct compiles queued or running (past their bound included)."""
        with self._lock:
            return len(self._pending)

    def too_slow(self) -> InvalidParamError:
        """The refusal of a constraint whose compile ran past the bound."""
        return InvalidParamError(
            f"the structured-output grammar took longer than {self.timeout_s:g} s to compile "
            "(--structured-outputs-config compile_timeout_s): simplify the schema, regex or grammar",
            "structured_outputs")

    def _ran_too_long(self, pending: PendingGrammar, now: float) -> bool:
        started = pending.started
        return started is not None and not pending.future.done() and now - started >= self.timeout_s

    def _mark_slow(self, pending: PendingGrammar) -> None:
        with self._lock:  # the engine thread and a worker (at the kill) may both mark it
            if pending.key not in self._slow:
                logger.warning("a structured-output grammar has compiled for over %g s; its constraint is refused "
                               "from now on", self.timeout_s)
            self._slow[pending.key] = None
            while len(self._slow) > SLOW_KEYS_KEPT:
                self._slow.popitem(last=False)

    def _work(self, process: CompileProcess) -> None:
        from flotilla.engine.structured_output.compile_process import CompileTimeout

        self._start_process(process)
        while True:
            job = self._jobs.get()
            if job is None:
                process.stop()
                return
            pending, params = job
            try:
                process.wait_ready()  # the first compile waits for the process's start, not counted in its bound
            except BaseException as exc:
                self._finish(pending, exc)
                continue
            with self._lock:
                if not pending.future.set_running_or_notify_cancel():  # cancelled while queued
                    continue
                pending.started = time.monotonic()
            try:
                compiled = process.compile(params, self.timeout_s, pending.abandoned)
                self.compiler.store(pending.key, compiled)
                pending.future.set_result(compiled)
            except CompileTimeout:
                self._mark_slow(pending)
                pending.future.set_exception(self.too_slow())
            except BaseException as exc:  # the waiting requests' error (CompileAbandoned: none wait), not the worker's
                pending.future.set_exception(exc)
            finally:
                with self._lock:
                    if self._pending.get(pending.key) is pending:
                        del self._pending[pending.key]

    def _start_process(self, process: CompileProcess) -> None:
        """Start this worker's compile process before any job (the server's engine makes the compile threads at
        start: structured_output/waiting_room.py); one that fails to start is started again by the first job."""
        try:
            process.wait_ready()
        except Exception:
            logger.exception("a structured-output compile process failed to start; the next compile starts another")

    def _finish(self, pending: PendingGrammar, exc: BaseException) -> None:
        """Fail a queued compile that could not be sent to its process (the process did not start)."""
        with self._lock:
            if pending.future.set_running_or_notify_cancel():
                pending.future.set_exception(exc)
            if self._pending.get(pending.key) is pending:
                del self._pending[pending.key]

    def shutdown(self) -> None:
        """Let the worker threads end, and their compile processes with them, once their current compile
        returns or is killed at its bound."""
        for _ in self._threads:
            self._jobs.put(None)
