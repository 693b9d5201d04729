"""A grammar compile in a child process that is killed when it runs past its bound.

xgrammar cannot interrupt a compile, and a short legal constraint can compile for minutes (the regex
`(a{1,1000}){1,1000}`: ~90 s on a 49k vocabulary). On a thread, such a compile held that thread until
xgrammar returned, and with all threads held every new grammar waited or was refused. Here each compile
thread of compile_queue.py sends its compiles to a child process of its own; one that has run for the
bound is killed, a fresh child takes its place (a fork, ~0.1 s), and the thread takes the next compile.

The child compiles (`GrammarCompiler.build`: parse, compile, the first-token check) and sends the grammar
back serialized (xgrammar's `serialize_json`); the engine reads it back against its own tokenizer info
(`deserialize_json`, which gives up the GIL). Costs, measured with xgrammar 0.2.9 on the embedded model's
vocabulary (2 loaded cores): a `choice` or a small schema adds ~1 ms (0.2 ms serialize, 0.1-1 ms read back, a
pipe round trip), a compile of seconds about half as much again (30 bound patterns: 5.4 s compile, 29 MB of
JSON, 2.2 s to serialize, 0.7 s to read back). The bound covers what the child does: the parse, the compile
and the serialization (seconds for a big grammar: slow_schema(90) compiled in 6.5 s, then took 15 s to
serialize to 155 MB on a loaded core); reading it back is not timed. A compile that no request waits for any
more is killed too (compile_queue.py's `forget`).

Children fork from multiprocessing's fork server, started once per process with this module (and so
xgrammar and torch) preloaded. The server's engine starts it, and the compile processes, in the background
at start (waiting_room.py's `warm_up`; not with --structured-outputs-config's `warm_up` false); elsewhere
(the offline LLM) the first constrained request waits for
that start (importing xgrammar: seconds). A respawn after a kill does not. Where the fork server already
runs without it (a chat template rendered first in this process: server/chat_template.py), a child imports
xgrammar itself.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.forkserver
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import xgrammar as xgr

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.structured_output.compiler import GrammarCompiler
from flotilla.engine.structured_output.params import StructuredOutputsParams

# How often a compile's wait looks whether its requests all left (the kill's delay at most).
ABANDON_POLL_S = 0.05


class CompileTimeout(Exception):
    """A compile ran past its bound; its process was killed."""


class CompileAbandoned(Exception):
    """No request waited for a compile any more; its process was killed."""


class CompileProcessDied(RuntimeError):
    """A compile process ended without an answer (killed from outside, out of memory)."""


class CompileProcess:
    """One compile child, driven by one compile thread at a time."""

    def __init__(self, compiler: GrammarCompiler, name: str) -> None:
        self._compiler = compiler
        self._name = name
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._ready = False

    def start(self) -> None:
        """Start the child (it reads the vocabulary first; `compile` waits for that)."""
        ctx = _context()
        ours, theirs = ctx.Pipe()
        info = self._compiler.tokenizer_info_json
        process = ctx.Process(target=_serve, name=self._name, daemon=True,
                              args=(theirs, info, self._compiler.vocab_size, self._compiler.disable_any_whitespace))
        process.start()
        theirs.close()  # the child holds it now; ours would hide the child's exit from recv
        self._process, self._conn, self._ready = process, ours, False

    def wait_ready(self) -> None:
        """Block until the child can compile (started if it is not)."""
        if self._conn is None:
            self.start()
        if not self._ready:
            self._receive()  # the child's ("ready",)
            self._ready = True

    def compile(self, params: StructuredOutputsParams, timeout_s: float,
                abandoned: threading.Event | None = None) -> xgr.CompiledGrammar:
        """`params` compiled in the child. The child is killed and replaced if it has not sent the grammar back
        within `timeout_s` (parse, compile and serialization: CompileTimeout) or once `abandoned` is set (no
        request waits for it any more: CompileAbandoned); InvalidParamError for a constraint xgrammar refuses."""
        self.wait_ready()
        if abandoned is not None and abandoned.is_set():  # left while queued behind this thread's start
            raise CompileAbandoned
        assert self._conn is not None
        self._conn.send(params)
        deadline = time.monotonic() + max(timeout_s, 0.0)
        self._await_reply(deadline, abandoned)
        reply = self._receive()
        if reply[0] == "refused":
            raise reply[1]
        if reply[0] == "failed":
            raise RuntimeError(f"the grammar compile failed: {reply[1]}")
        # The child serializes the grammar before the first byte comes: seconds for a big one (slow_schema(90):
        # 6.5 s of compile, then 155 MB and 15 s of serialize on a loaded core), under the same bound.
        self._await_reply(deadline, abandoned)
        text = self._receive_bytes().decode()  # the compiled grammar, serialized
        return xgr.CompiledGrammar.deserialize_json(text, self._compiler.tokenizer_info)

    def _await_reply(self, deadline: float, abandoned: threading.Event | None) -> None:
        """Wait for the child's next message until `deadline` (CompileTimeout) or `abandoned` (CompileAbandoned),
        killing and replacing the child in both cases."""
        assert self._conn is not None
        while not self._conn.poll(min(ABANDON_POLL_S, max(deadline - time.monotonic(), 0.0))):
            if abandoned is not None and abandoned.is_set():
                self.restart()
                raise CompileAbandoned
            if time.monotonic() >= deadline:
                self.restart()
                raise CompileTimeout

    def restart(self) -> None:
        """Kill the child (mid-compile or idle) and start a fresh one."""
        self.stop()
        self.start()

    def stop(self) -> None:
        """Kill the child, if any."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is not None:
            process.kill()
            process.join()
        if conn is not None:
            conn.close()

    def _receive(self) -> tuple[Any, ...]:
        try:
            assert self._conn is not None
            reply: tuple[Any, ...] = self._conn.recv()
        except (EOFError, OSError):
            self.stop()
            raise CompileProcessDied("the structured-output compile process ended") from None
        return reply

    def _receive_bytes(self) -> bytes:
        try:
            assert self._conn is not None
            return self._conn.recv_bytes()
        except (EOFError, OSError):
            self.stop()
            raise CompileProcessDied("the structured-output compile process ended") from None


@functools.cache
def _context() -> Any:
    """The fork-server context, its server preloaded with this module (xgrammar and torch imported once)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def start_fork_server() -> None:
    """Start the fork server (it preloads this module: seconds) and return at once."""
    _context()
    multiprocessing.forkserver.ensure_running()


def _serve(conn: Connection, info_json: str, vocab_size: int, disable_any_whitespace: bool) -> None:
    """The child: compile each constraint it is sent, answer ("compiled",) then the grammar's JSON bytes, or
    ("refused", the InvalidParamError) / ("failed", message); end when the engine's end of the pipe closes."""
    info = xgr.TokenizerInfo.deserialize_json(info_json)
    compiler = GrammarCompiler.from_tokenizer_info(info, vocab_size, disable_any_whitespace)
    conn.send(("ready",))
    while True:
        try:
            params: StructuredOutputsParams = conn.recv()
        except (EOFError, ConnectionResetError):  # the engine's end closed (the server's engine core exits unwound)
            return
        try:
            compiled = compiler.build(params.kind, compiler.prepare(params))
        except InvalidParamError as exc:
            conn.send(("refused", exc))
            continue
        except Exception as exc:  # xgrammar's own failure: the waiting requests' error (a 500), not the child's end
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
            continue
        conn.send(("compiled",))
        conn.send_bytes(compiled.serialize_json().encode())
        del compiled
