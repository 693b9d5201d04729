"""Constrained requests waiting for their grammar to compile, before the scheduler sees them.

A request whose grammar is not cached waits here (vLLM's WAITING_FOR_FSM) while compile_queue.py
compiles it off the step loop: it holds no KV blocks and cannot be scheduled. At the start of each step
the engine takes the requests whose compile is done (each completion given its own matcher) and those
that must fail (their compile failed or ran past its bound).

The room also builds the compiler and its compile threads (and their processes): on the first constrained
request (the offline LLM: reading the vocabulary into xgrammar takes a moment that unconstrained use should
not pay), or, on the server, in the background once the engine has started (`warm_up`): there the compile
processes' start (a fork server importing xgrammar and torch: 7-15 s on a loaded 2-core machine) would
otherwise hold up the first constrained request (unless --structured-outputs-config's `warm_up` is false:
then on the first constrained request, as offline).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flotilla.engine.structured_output.compile_queue import MAX_PENDING, PendingGrammar  # stdlib only
from flotilla.engine.structured_output.thinking import ThinkingMarkers, thinking_markers

if TYPE_CHECKING:  # xgrammar is imported on the first constrained request only
    import xgrammar as xgr

    from flotilla.engine.request import Request
    from flotilla.engine.structured_output.compile_queue import GrammarCompiles
    from flotilla.engine.structured_output.compiler import GrammarCompiler
    from flotilla.engine.structured_output.config import StructuredOutputsConfig

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class WaitingForGrammar:
    """A request (its completions) waiting for the compile of its grammar."""

    group: list[Request]
    pending: PendingGrammar


class GrammarWaitingRoom:
    """The requests waiting for a grammar, by request id, and the compiler they wait on. Engine thread only,
    but for `warm_up`'s thread, which builds the compiler and its compile threads (under `_build_lock`)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 config: StructuredOutputsConfig) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        self._config = config
        self._compiler: GrammarCompiler | None = None  # built on the first constrained request
        self._compiles: GrammarCompiles | None = None  # its compile threads, likewise
        # Distinct grammar compiles queued or running at most (a new one past it is EngineBusyError, a 503);
        # None: no cap (the offline LLM). Read when the compile threads start.
        self.max_pending: int | None = MAX_PENDING
        self._waiting: dict[str, WaitingForGrammar] = {}
        self._build_lock = threading.Lock()  # the engine thread and warm_up's may both build them
        self._closed = False  # shut down: warm_up builds nothing more
        # The reasoning parser's markers: grammars start after the thinking (thinking.py); None: from the first token.
        self.thinking = _grammar_waits_for(tokenizer, config)

    @property
    def compiler(self) -> GrammarCompiler:
        """Structured output's compiler and its cache of compiled grammars (built on first use)."""
        if self._compiler is None:
            with self._build_lock:
                if self._compiler is None:
                    from flotilla.engine.structured_output.compiler import GrammarCompiler

                    self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size, self._stop_token_ids,
                                                     disable_any_whitespace=self._config.disable_any_whitespace)
        return self._compiler

    @property
    def compiles(self) -> GrammarCompiles:
        """The compile threads in front of `compiler` (started on first use)."""
        if self._compiles is None:
            compiler = self.compiler
            with self._build_lock:
                if self._compiles is None:
                    from flotilla.engine.structured_output.compile_queue import GrammarCompiles

                    self._compiles = GrammarCompiles(compiler, self._config.compile_timeout_s,
                                                     max_pending=self.max_pending)
        return self._compiles

    def warm_up(self) -> threading.Thread:
        """Build the compiler and start the compile threads and processes on a thread of their own, so that
        they are ready before the first constrained request (the server's engine, once started). The engine
        thread goes on meanwhile: the fork server imports xgrammar in a process of its own; this thread holds
        the GIL for this process's xgrammar import and reading the vocabulary into it (~1 s in all, in pieces:
        the longest pause a 1 ms probe thread saw was 0.2-0.9 s, on a loaded 2-core machine)."""
        thread = threading.Thread(target=self._warm_up, name="grammar-warm-up", daemon=True)
        thread.start()
        return thread

    def _warm_up(self) -> None:
        try:
            from flotilla.engine.structured_output.compile_process import start_fork_server

            start_fork_server()  # first: its import of xgrammar and torch is the long part, in its own process
            if not self._closed:
                compiles = self.compiles  # builds the compiler and the threads, which start their processes
                if self._closed:  # shut down meanwhile
                    compiles.shutdown()
        except Exception:  # structured output then starts on the first constrained request, as offline
            logger.exception("starting structured output's compile processes in the background failed")

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waiting

    def __getitem__(self, request_id: str) -> WaitingForGrammar:
        return self._waiting[request_id]

    def first_requests(self) -> Iterator[Request]:
        """Each waiting request's first completion (the one the scheduler would be given)."""
        return (waiting.group[0] for waiting in self._waiting.values())

    def add(self, request_id: str, group: list[Request], pending: PendingGrammar) -> None:
        """Let `request_id` (its completions `group`) wait for `pending`."""
        self._waiting[request_id] = WaitingForGrammar(group, pending)

    def take_done(self, now: float) -> tuple[list[list[Request]], list[tuple[str, Exception]]]:
        """Take out the requests whose wait is over: those whose grammar has compiled (each completion given
        its matcher), to schedule, and (request id, error) for those to fail: their compile failed or took
        too long (`GrammarCompiles.check`)."""
        compiles = self._compiles
        assert compiles is not None, "requests wait for grammars only once the compiler exists"
        ready: list[list[Request]] = []
        failed: list[tuple[str, Exception]] = []
        for request_id, waiting in list(self._waiting.items()):
            pending = waiting.pending
            if not pending.future.done():
                error = compiles.check(pending, request_id, now)
                if error is not None:
                    del self._waiting[request_id]
                    failed.append((request_id, error))
                continue
            del self._waiting[request_id]
            compiles.forget(pending, request_id)
            try:
                compiled = pending.future.result()
            except Exception as exc:  # an invalid constraint (refused) or xgrammar failed: this request's problem
                failed.append((request_id, exc))
                continue
            attach_grammar(waiting.group, compiled, self.thinking)
            ready.append(waiting.group)
        return ready, failed

    def wait(self, timeout: float) -> None:
        """Block up to `timeout` s, or until some compile is done (the engine has nothing else to do)."""
        assert self._compiles is not None, "requests wait for grammars only once the compiler exists"
        self._compiles.wait(timeout)

    def discard(self, request_id: str) -> None:
        """`request_id` waits no more (aborted); its compile is dropped if no other request waits for it."""
        waiting = self._waiting.pop(request_id, None)
        if waiting is not None:
            assert self._compiles is not None, "requests wait for grammars only once the compiler exists"
            self._compiles.forget(waiting.pending, request_id)

    def shutdown(self) -> None:
        """Let the compile threads, if any, end once their current compile returns."""
        self._closed = True
        if self._compiles is not None:
            self._compiles.shutdown()


def _grammar_waits_for(tokenizer: Any, config: StructuredOutputsConfig) -> ThinkingMarkers | None:
    """The markers whose `</think>` starts a thinking request's grammar: with a reasoning parser, unless
    `enable_in_reasoning`. A vocabulary without them as single tokens constrains from the first token (logged)."""
    if config.reasoning_parser is None or config.enable_in_reasoning:
        return None
    markers = thinking_markers(tokenizer, config.reasoning_parser)
    if markers is None:
        logger.warning("--reasoning-parser %s: <think> and </think> are not single tokens of this vocabulary, so "
                       "structured output is constrained from the first token (the thinking cannot run free)",
                       config.reasoning_parser)
    return markers


def attach_grammar(group: list[Request], compiled: xgr.CompiledGrammar | None,
                   thinking: ThinkingMarkers | None = None) -> None:
    """Give each completion its own matcher of the compiled grammar (None: unconstrained). With `thinking` (the
    reasoning parser's markers), a completion whose prompt has not ended the thinking is constrained only after
    its `</think>` (thinking.py)."""
    if compiled is None:
        return
    from flotilla.engine.structured_output.matcher import RequestGrammar

    for child in group:
        thinks = thinking is not None and not thinking.ended(child.prompt_token_ids)
        child.grammar = RequestGrammar(compiled, thinking if thinks else None)
