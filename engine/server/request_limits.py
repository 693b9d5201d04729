"""Per-request limits on what a client sends: header count, body size and how long the body may take.

An ASGI middleware, outermost, so that a request over a limit costs almost nothing: a declared
`Content-Length` above the limit is answered 413 before a byte of the body is read; a chunked body is
counted as the route reads it and stops at the limit; a body that trickles in (slow-loris on the body)
gets 408 once `--body-read-timeout` has passed. The body is read by the route itself, after the API-key
check, so an unauthenticated client never makes the server buffer its body.

Server-wide, the bytes of the bodies being received and parsed at once are bounded by
`--max-body-bytes-in-flight` (BodyBudget): without it `--limit-concurrency` connections could each send
`--max-request-body-size` at once (1,024 x 8 MiB, ~10x that once parsed, at the defaults). A declared body takes
its whole `Content-Length` from the budget when the route starts reading it, a chunked one its bytes as they come;
what it took comes back once the body is parsed (`release_body_budget` in the scope, called by request_body.py)
or the request ends. A body that does not fit is refused at once with 503 and `Retry-After: 1`, not queued:
a load balancer (Envoy/Istio retry 503 by default) or the openai client retries it, on a replica with room or
later, as for --limit-concurrency's 503; a queue would hold the connection on the busiest replica.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import HTTPException

from flotilla.engine.server.errors import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Said on every refusal that leaves a body unread: the connection cannot carry another request.
CLOSE = {"connection": "close"}


class BodyLimitError(HTTPException):
    """The body grew past the size limit (413), did not arrive in time (408) or found the server-wide budget of
    bodies in flight spent (503) while the route read it.

    FastAPI's HTTPException, the one type that its body parsing re-raises unchanged (any other error
    while reading becomes a 400 "error parsing the body").
    """

    def __init__(self, status: int, detail: str, retry_after: int | None = None) -> None:
        headers = CLOSE if retry_after is None else {**CLOSE, "retry-after": str(retry_after)}
        super().__init__(status, detail, headers=headers)


# The scope key of the callable that gives a request's body bytes back to the budget (after the parse).
RELEASE_BODY_BUDGET = "flotilla.release_body_budget"
# --max-body-bytes-in-flight when not given: this many bodies of --max-request-body-size at once.
BODY_BUDGET_BODIES = 16


class BodyBudget:
    """Bytes of request bodies in flight, server-wide, against a capacity (used on the event loop only)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0

    def take(self, size: int) -> bool:
        """Take `size` bytes if they fit; False (nothing taken) if not."""
        if self.used + size > self.capacity:
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        """Return bytes that `take` gave."""
        self.used -= size


class RequestLimits:
    """ASGI middleware enforcing `max_header_count`, `max_body_size` (bytes) and `body_timeout` (seconds)."""

    def __init__(self, app: ASGIApp, max_body_size: int, body_timeout: float, max_header_count: int,
                 body_budget: int | None = None) -> None:
        self.app = app
        self.max_body_size = max_body_size
        self.body_timeout = body_timeout
        self.max_header_count = max_header_count
        self.budget = BodyBudget(body_budget if body_budget is not None else BODY_BUDGET_BODIES * max_body_size)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse what the request head already shows is too much; bound the body as the route reads it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        if len(headers) > self.max_header_count:
            await _refuse(send, 431, f"the request has {len(headers)} headers; at most {self.max_header_count} "
                                     "are allowed (--h11-max-header-count)")
            return
        declared = _content_length(headers)
        if declared is not None and declared > self.max_body_size:
            await _refuse(send, 413, self._too_large(declared))
            return
        taken = 0

        def release() -> None:
            nonlocal taken
            self.budget.give_back(taken)
            taken = 0

        def take(size: int) -> None:
            nonlocal taken
            if not self.budget.take(size):
                raise BodyLimitError(503, f"the server is receiving and parsing {self.budget.used} bytes of request "
                                          f"bodies; this body's {size} more would pass the limit of "
                                          f"{self.budget.capacity} (--max-body-bytes-in-flight): retry",
                                     retry_after=1)
            taken += size

        scope[RELEASE_BODY_BUDGET] = release
        try:
            await self.app(scope, self._bounded(receive, declared, take), send)
        finally:
            release()

    def _too_large(self, size: int) -> str:
        return (f"the request body has {size} bytes or more; the limit is {self.max_body_size} bytes "
                "(--max-request-body-size)")

    def _bounded(self, receive: Receive, declared: int | None, take: Callable[[int], None]) -> Receive:
        """`receive`, counting body bytes against the limit and the budget, and the whole body against the
        deadline. A declared body takes its length from the budget at the first read, a chunked one each part."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        received = 0
        body_done = False
        started = False

        async def bounded_receive() -> Message:
            nonlocal received, body_done, started
            if body_done:  # after the body only http.disconnect comes, whenever the client leaves
                return await receive()
            if not started:
                started = True
                if declared:
                    take(declared)
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise BodyLimitError(408, f"the request body did not arrive within {self.body_timeout:g} s "
                                          "(--body-read-timeout)") from None
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                received += size
                if received > self.max_body_size:
                    raise BodyLimitError(413, self._too_large(received))
                if declared is None and size:
                    take(size)
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        return bounded_receive


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # h11 refuses a malformed Content-Length before we see it
    return None


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
