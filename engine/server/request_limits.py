"""Per-request limits on what a client sends: header count, body size and how long the body may take.

An ASGI middleware, outermost, so that a request over a limit costs almost nothing: a declared
`Content-Length` above the limit is answered 413 before a byte of the body is read; a chunked body is
counted as the route reads it and stops at the limit; a body that trickles in (slow-loris on the body)
gets 408 once `--body-read-timeout` has passed. The body is read by the route itself, after the API-key
check, so an unauthenticated client never makes the server buffer its body.
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
    """The body grew past the size limit (413) or did not arrive in time (408) while the route read it.

    FastAPI's HTTPException, the one type that its body parsing re-raises unchanged (any other error
    while reading becomes a 400 "error parsing the body").
    """

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(status, detail, headers=CLOSE)


class RequestLimits:
    """ASGI middleware enforcing `max_header_count`, `max_body_size` (bytes) and `body_timeout` (seconds)."""

    def __init__(self, app: ASGIApp, max_body_size: int, body_timeout: float, max_header_count: int) -> None:
        self.app = app
        self.max_body_size = max_body_size
        self.body_timeout = body_timeout
        self.max_header_count = max_header_count

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
        await self.app(scope, self._bounded(receive), send)

    def _too_large(self, size: int) -> str:
        return (f"the request body has {size} bytes or more; the limit is {self.max_body_size} bytes "
                "(--max-request-body-size)")

    def _bounded(self, receive: Receive) -> Receive:
        """`receive`, counting body bytes against the limit and the whole body against the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        received = 0
        body_done = False

        async def bounded_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # after the body only http.disconnect comes, whenever the client leaves
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise BodyLimitError(408, f"the request body did not arrive within {self.body_timeout:g} s "
                                          "(--body-read-timeout)") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_size:
                    raise BodyLimitError(413, self._too_large(received))
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
