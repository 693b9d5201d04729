"""Which chat template a request may use, and a bounded sandbox for templates sent by clients.

A chat template is a program. The model's own template (from its tokenizer) is trusted and rendered
by transformers. A template sent in a request is refused unless the operator passed
`--trust-request-chat-template` (vLLM's flag, same meaning; vLLM treated running request templates
as a vulnerability). Even then it runs in jinja2's immutable sandbox with limits that a sandbox alone
does not give: a wall-clock deadline (checked on every line the template executes), a cap on the
rendered size, and caps on the strings and lists that `*`, `+` and `**` can build, so that a nested
loop or `'ab' * 10**9` fails that one request with a 400 instead of freezing or bloating the server.

Those checks cannot see every way to build a value (`'%0999999999d' % 1`, `s.replace('', s)`, `a ~ a`
doubled, a long division of huge integers in C, where no template line comes to check the deadline),
so the render runs in a child process of its own (forked from a small fork server, not from the
server), with an address-space limit and killed at the deadline: whatever a template does costs that
child, and its request gets a 400. The caller waits on a worker thread, so /health keeps answering; at most
`MAX_CONCURRENT_RENDERS` children run at once (the server's caller holds that bound), so their memory is bounded
in total, not only each.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import operator
import resource
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from types import FrameType
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from flotilla.engine.chat_content import ContentFormatOption, detect_content_format, template_messages
from flotilla.engine.chat_rendering import chosen_template

# A chat template renders a few kilobytes in microseconds; one that needs seconds is a loop.
RENDER_TIMEOUT_S = 5.0
# The render process's address space beyond what it starts with: a base, plus room for the rendered text
# (up to 4 bytes a character) and a few copies of it.
RENDER_MEMORY_BASE_BYTES = 256 << 20
RENDER_MEMORY_BYTES_PER_CHAR = 16
# After the deadline, how long the parent waits for the child's own deadline error before killing it
# (a template stuck inside one C call never reaches a line to check the deadline at).
RENDER_KILL_GRACE_S = 2.0
# Request-template renders (child processes) at once, server-wide: their memory is bounded in total by this many
# times a child's cap; more requests wait their turn (without holding a worker thread).
MAX_CONCURRENT_RENDERS = 4
class TemplateLimitError(Exception):
    """A request's template exceeded a render limit (time or size)."""


def request_template(chat_template: str | None, kwargs: dict[str, Any] | None, trusted: bool) -> str | None:
    """The template a request carries (`chat_template`, or `chat_template_kwargs.chat_template`), if any.

    Raises ValueError when the request carries one and the server does not trust request templates.
    """
    template = chosen_template(chat_template, kwargs)
    if template is not None and not trusted:
        raise ValueError("a chat template in the request is refused: this server renders only the model's "
                         "own template (start it with --trust-request-chat-template to allow request templates)")
    return template


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, plus caps on what `*`, `+` and `**` may build."""

    intercepted_binops = frozenset({"*", "+", "**"})

    def __init__(self, max_chars: int) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        self.max_chars = max_chars
        # transformers gives templates these; templates written for it expect them.
        self.filters["tojson"] = _tojson
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        # Filters such as center(width) or indent(width) build strings as long as an argument says.
        self.filters = {name: self._bounded(f) for name, f in self.filters.items()}

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        """A sandboxed call (e.g. `'x'.ljust(n)`), refused when a size argument or its result is too large."""
        __self._check_sizes(args, kwargs)
        return __self._check_result(super().call(__context, __obj, *args, **kwargs))

    def _bounded(self, f: Any) -> Any:
        @functools.wraps(f)  # keeps jinja2's pass_context/pass_environment markers
        def bounded(*args: Any, **kwargs: Any) -> Any:
            self._check_sizes(args, kwargs)
            return self._check_result(f(*args, **kwargs))

        return bounded

    def _check_sizes(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if any(isinstance(a, int) and a > self.max_chars for a in (*args, *kwargs.values())):
            raise TemplateLimitError(f"the template passes a size above {self.max_chars}")

    def _check_result(self, value: Any) -> Any:
        if isinstance(value, str | list | tuple) and len(value) > self.max_chars:
            raise TemplateLimitError(f"the template builds a value longer than {self.max_chars}")
        return value

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        """Refuse to build a string or list longer than the output may be, or a huge power."""
        if op == "**" and isinstance(right, int) and abs(right) > 64:
            raise TemplateLimitError("the template raises to a power above 64")
        if _result_length(op, left, right) > self.max_chars:
            raise TemplateLimitError(f"the template builds a value longer than {self.max_chars}")
        return {"*": operator.mul, "+": operator.add, "**": operator.pow}[op](left, right)


def _result_length(op: str, left: Any, right: Any) -> int:
    """The length of `left op right` when it is a sequence (0 otherwise), computed without building it."""
    sequence = str | list | tuple
    if op == "*" and isinstance(left, int) and isinstance(right, sequence):
        left, right = right, left
    if op == "*" and isinstance(left, sequence) and isinstance(right, int):
        return len(left) * right
    if op == "+" and isinstance(left, sequence) and isinstance(right, sequence):
        return len(left) + len(right)
    return 0


def render_untrusted(source: str, variables: dict[str, Any], max_chars: int, timeout_s: float = RENDER_TIMEOUT_S,
                     content_format: ContentFormatOption = "string") -> str:
    """Render a request's template in the bounded sandbox, in a child process with bounded memory that is
    killed past the deadline; blocking (call it on a worker thread). The messages' content reaches the template
    in `content_format` (chat_content.py; `auto` is detected there, where the template is parsed anyway).

    Raises ValueError for a template that does not compile, fails, or exceeds a limit.
    """
    ctx = _render_context()
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_render_child, args=(sender, source, variables, max_chars, timeout_s, content_format),
                        name="flotilla-chat-template", daemon=True)
    child.start()
    sender.close()  # the child holds it now; ours would hide the child's exit from recv
    try:
        if not receiver.poll(timeout_s + RENDER_KILL_GRACE_S):
            raise ValueError("the request's chat template exceeded a limit: rendering took longer than "
                             f"{timeout_s:g} s")
        try:
            ok, value = receiver.recv()
        except EOFError:  # the child died (e.g. memory it could not even report)
            raise ValueError("the request's chat template exceeded a limit: its render stopped") from None
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receiver.close()
        with contextlib.suppress(ValueError):  # Process.close: nothing left to free on an already-reaped child
            child.close()
    if not ok:
        raise ValueError(value)
    return value


@functools.cache
def _render_context() -> Any:
    """The fork-server context, its server preloaded with this module: a render forks a small process that
    has nothing of the server's (no threads, no torch, no device), in milliseconds."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _render_child(sender: Any, source: str, variables: dict[str, Any], max_chars: int, timeout_s: float,
                  content_format: ContentFormatOption) -> None:
    """In the render process: bound the address space, render, send (True, text) or (False, message)."""
    _limit_address_space(RENDER_MEMORY_BASE_BYTES + RENDER_MEMORY_BYTES_PER_CHAR * max_chars)
    try:
        result = (True, _render_in_sandbox(source, variables, max_chars, timeout_s, content_format))
    except ValueError as exc:
        result = (False, str(exc))
    except MemoryError:
        result = (False, "the request's chat template exceeded a limit: it needs more memory than a render has")
    except Exception as exc:  # the template's own failure, whatever its type: its request's 400
        result = (False, f"the request's chat template failed: {exc}")
    sender.send(result)
    sender.close()


def _limit_address_space(extra_bytes: int) -> None:
    """Cap this process's address space at its current size plus `extra_bytes` (allocations past it fail
    with MemoryError instead of growing the machine's memory use)."""
    with open("/proc/self/status") as status:
        size_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size_kb * 1024 + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _render_in_sandbox(source: str, variables: dict[str, Any], max_chars: int, timeout_s: float,
                       content_format: ContentFormatOption = "string") -> str:
    """Render in the bounded sandbox on this thread (the render process's body)."""
    env = _BoundedSandbox(max_chars)
    deadline = time.monotonic() + timeout_s
    try:
        ast = env.parse(source)
        found = detect_content_format(ast) if content_format == "auto" else content_format
        if "messages" in variables:
            variables = {**variables, "messages": template_messages(variables["messages"], found)}
        template = env.from_string(ast)
        with _deadline(deadline, timeout_s):
            return _collect(template.generate(**variables), max_chars, deadline, timeout_s)
    except TemplateLimitError as exc:
        raise ValueError(f"the request's chat template exceeded a limit: {exc}") from None
    except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"the request's chat template failed: {exc}") from None


def _collect(chunks: Iterator[str], max_chars: int, deadline: float, timeout_s: float) -> str:
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > max_chars:
            raise TemplateLimitError(f"the rendered prompt is longer than {max_chars} characters")
        if time.monotonic() > deadline:
            raise TemplateLimitError(f"rendering took longer than {timeout_s:g} s")
        parts.append(chunk)
    return "".join(parts)


class _deadline:
    """Trace the template's own frames on this thread and stop it once the deadline passes.

    jinja2 has no hook per loop iteration; a line trace of the compiled template's frames (their file
    name is "<template>") is one, and it costs nothing outside those frames.
    """

    def __init__(self, deadline: float, timeout_s: float) -> None:
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.previous: Any = None

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._local if frame.f_code.co_filename == "<template>" else None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and time.monotonic() > self.deadline:
            raise TemplateLimitError(f"rendering took longer than {self.timeout_s:g} s")
        return self._local

    def __enter__(self) -> None:
        self.previous = sys.gettrace()
        sys.settrace(self._global)

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.previous)


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)
