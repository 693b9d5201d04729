"""The `X-Request-Id` header, as vLLM treats it.

A client's (or a gateway's) `X-Request-Id` names the request: it takes the place of the body's
`request_id` in the response id (`chatcmpl-<id>`, `cmpl-<id>`, `resp_<id>`) and the engine's request id,
so that logs, traces and the answer carry the id the caller already knows. With
`--enable-request-id-headers` every response also carries `X-Request-Id`: the request's own, or a
random one (uuid4 hex) when it sent none.
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.datastructures import Headers, MutableHeaders

from flotilla.engine.server.errors import APIError

HEADER = "X-Request-Id"
# The body's `request_id` bound (protocol.py): the header takes its place in ids and logs, so it holds here too.
MAX_LENGTH = 256


def header_request_id(headers: Headers) -> str | None:
    """The request's X-Request-Id (None when absent or empty)."""
    return headers.get(HEADER) or None


def checked_request_id(headers: Headers) -> str | None:
    """The request's X-Request-Id to name it by; a 400 when it is longer than a body's `request_id` may be."""
    request_id = header_request_id(headers)
    if request_id is not None and len(request_id) > MAX_LENGTH:
        raise APIError(400, f"the {HEADER} header has {len(request_id)} characters; at most {MAX_LENGTH} are "
                       "accepted", param=HEADER)
    return request_id


class RequestIdHeader:
    """ASGI middleware: echo the request's X-Request-Id on the response (a random one when absent)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Pass the request on; add the header to the response's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = header_request_id(Headers(scope=scope)) or uuid.uuid4().hex

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)
