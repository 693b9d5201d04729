"""Grammar compiles off the step loop: a few worker threads, one compile per distinct constraint, bounded.

Compiling a grammar against the vocabulary takes milliseconds for usual schemas, but a large legal one
can take seconds to minutes (measured with xgrammar 0.2.9 on a 49k vocabulary: 100 string properties
with bounded-repetition patterns, 8.7 KB of schema, 6.5 s; 1,000 optional object properties, 196 KB,
43 s). Compiled on the step loop, it stalled every running stream for that long. Here, as in vLLM
(`StructuredOutputManager.grammar_init`, a thread pool, requests WAITING_FOR_FSM), the compile runs on
a worker thread (xgrammar releases the GIL while it compiles) and the request waits, holding no KV
blocks, until the engine finds its grammar ready at the start of a step.

Bounds, since xgrammar cannot interrupt a compile:
- requests that ask for a constraint already compiling share that compile (and the compiled-grammar
  cache, which is the compiler's);
- a compile that has run for `timeout_s` fails the requests that wait for it with a 400 that says so,
  and its constraint is refused at once from then on (the last 256 such constraints are remembered; one
  whose compile does finish is served from the cache), so that no client can queue it again;
- a compile that runs past its bound keeps its worker thread until xgrammar returns, so with `workers`
  threads that many such compiles can stop the queue: a request whose compile has not started
  `timeout_s` after it came, while every thread is so held, fails with a 503 (retry later). Behind
  compiles that finish in time, a queued request waits its turn;
- at most `max_pending` distinct compiles are queued or running (a running one past its bound
  included): more is a 503. The offline `LLM` lifts this cap (a batch of distinct schemas is the
  caller's own work, not a flood).
The threads are daemons, so a stuck compile never holds up the process's exit.
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
from typing import TYPE_CHECKING, Any

from flotilla.engine.errors import EngineBusyError, InvalidParamError

if TYPE_CHECKING:
    import xgrammar as xgr

    from flotilla.engine.structured_output.compiler import CacheKey, GrammarCompiler
    from flotilla.engine.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

# Distinct compiles queued or running at once; a burst of distinct schemas past it is a 503.
MAX_PENDING = 64
# A constraint (schema text, regex, grammar) up to this size is parsed into a grammar on the engine thread when it
# comes (invalid: refused at once); a larger one on a compile thread: the parse's time grows faster than the text
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
        self._jobs: queue.SimpleQueue[tuple[PendingGrammar, Any, StructuredOutputsParams] | None] = queue.SimpleQueue()
        self.workers = workers or default_workers()
        self._threads = [threading.Thread(target=self._work, name=f"grammar-compile-{i}", daemon=True)
                         for i in range(self.workers)]
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
        if key in self._slow:
            raise self.too_slow()
        if pending is None:
            if self.max_pending is not None and len(self._pending) >= self.max_pending:
                raise EngineBusyError(f"{len(self._pending)} structured-output grammars are compiling already; "
                                      "retry later")
            # A small constraint is parsed here, so that an invalid one is refused before the request is queued
            # (milliseconds); a larger one on the compile thread: parsing is not always quick (a chain of
            # 4,000 `$ref`s took 79 s), and on the step loop it stopped every stream meanwhile.
            grammar = self.compiler.prepare(params) if len(key[1]) <= SYNC_PARSE_CHARS else None
            pending = PendingGrammar(key, Future())
            with self._lock:
                self._pending[key] = pending
            self._jobs.put((pending, grammar, params))
        pending.waiters.add(request_id)
        return pending

    def check(self, pending: PendingGrammar, request_id: str, since: float,
              now: float) -> InvalidParamError | EngineBusyError | None:
        """Why `request_id`, waiting since `since` for `pending`, must fail now (None: it may wait on): its
        compile has run for `timeout_s` (a 400), or has not started `timeout_s` after the request came while
        every compile thread is held by a compile past the bound (a 503). Behind compiles that finish in
        time, a queued request waits its turn."""
        if pending.future.done():
            return None
        error: InvalidParamError | EngineBusyError
        if self._ran_too_long(pending, now):
            self._mark_slow(pending)
            error = self.too_slow()
        elif pending.started is None and now - since >= self.timeout_s and self._stuck(now):
            error = EngineBusyError(f"the structured-output grammar could not start compiling within "
                                    f"{self.timeout_s:g} s: grammars that compile for longer than that hold every "
                                    "compile thread; retry later")
        else:
            return None
        self.forget(pending, request_id)
        return error

    def forget(self, pending: PendingGrammar, request_id: str) -> None:
        """`request_id` no longer waits (aborted, failed or served); a compile nobody waits for and no
        worker has started is dropped (one already running finishes and fills the cache)."""
        pending.waiters.discard(request_id)
        if pending.waiters:
            return
        with self._lock:
            if pending.started is None and pending.future.cancel():
                self._pending.pop(pending.key, None)

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

    def _stuck(self, now: float) -> bool:
        """Whether every worker thread runs a compile that has passed the bound (no queued compile can start)."""
        with self._lock:
            running = [p for p in self._pending.values() if p.started is not None]
        return sum(self._ran_too_long(p, now) for p in running) >= self.workers

    def _ran_too_long(self, pending: PendingGrammar, now: float) -> bool:
        started = pending.started
        return started is not None and not pending.future.done() and now - started >= self.timeout_s

    def _mark_slow(self, pending: PendingGrammar) -> None:
        if pending.key not in self._slow:
            logger.warning("a structured-output grammar has compiled for over %g s; its constraint is refused "
                           "from now on", self.timeout_s)
        self._slow[pending.key] = None
        while len(self._slow) > SLOW_KEYS_KEPT:
            self._slow.popitem(last=False)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            pending, grammar, params = job
            with self._lock:
                if not pending.future.set_running_or_notify_cancel():  # cancelled while queued
                    continue
                pending.started = time.monotonic()
            try:
                if grammar is None:  # a large constraint, parsed here (an invalid one fails its waiters)
                    grammar = self.compiler.prepare(params)
                pending.future.set_result(self.compiler.compile_prepared(pending.key, grammar))
            except BaseException as exc:  # the waiting requests' error, not the worker's
                pending.future.set_exception(exc)
            finally:
                with self._lock:
                    self._pending.pop(pending.key, None)

    def shutdown(self) -> None:
        """Let the worker threads end once their current compile returns."""
        for _ in self._threads:
            self._jobs.put(None)
