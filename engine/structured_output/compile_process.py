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
JSON, 2.2 s to serialize, 0.7 s to read back). The bound covers the compile only: once the child says its
grammar compiled, its transfer is not timed (it grows with the grammar's size, which the compile bounds).

Children fork from multiprocessing's fork server, started once per process with this module (and so
xgrammar and torch) preloaded: the first constrained request waits for that start (importing xgrammar: a
few seconds), a respawn after a kill does not. Where the fork server already runs without it (a chat
template rendered first in this process: server/chat_template.py), a child imports xgrammar itself.
"""

from __future__ import annotations

import functools
import multiprocessing
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import xgrammar as xgr

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.structured_output.compiler import GrammarCompiler
from flotilla.engine.structured_output.params import StructuredOutputsParams


class CompileTimeout(Exception):
    """A compile ran past its bound; its process was killed."""


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

    def compile(self, params: StructuredOutputsParams, timeout_s: float) -> xgr.CompiledGrammar:
        """`params` compiled in the child; CompileTimeout (the child killed and replaced) if it has not
        compiled within `timeout_s`, InvalidParamError for a constraint xgrammar refuses."""
        self.wait_ready()
        assert self._conn is not None
        self._conn.send(params)
        if not self._conn.poll(max(timeout_s, 0.0)):
            self.restart()
            raise CompileTimeout
        reply = self._receive()
        if reply[0] == "refused":
            raise reply[1]
        if reply[0] == "failed":
            raise RuntimeError(f"the grammar compile failed: {reply[1]}")
        text = self._receive_bytes().decode()  # the compiled grammar, serialized
        return xgr.CompiledGrammar.deserialize_json(text, self._compiler.tokenizer_info)

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


def _serve(conn: Connection, info_json: str, vocab_size: int, disable_any_whitespace: bool) -> None:
    """The child: compile each constraint it is sent, answer ("compiled",) then the grammar's JSON bytes, or
    ("refused", the InvalidParamError) / ("failed", message); end when the engine's end of the pipe closes."""
    info = xgr.TokenizerInfo.deserialize_json(info_json)
    compiler = GrammarCompiler.from_tokenizer_info(info, vocab_size, disable_any_whitespace)
    conn.send(("ready",))
    while True:
        try:
            params: StructuredOutputsParams = conn.recv()
        except EOFError:
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
