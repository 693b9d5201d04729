"""The `X-Request-Id` header, as vLLM treats it.

A client's (or a gateway's) `X-Request-Id` names the request: it takes the place of the body's
`request_id` in the response id (`chatcmpl-<id>`, `cmpl-<id>`, `resp_<id>`) and the engine's request id,
so that logs, traces and the answer carry the id the caller already knows. With
`--enable-request-id-headers` every response also carries `X-Request-Id`: the request's own, or a
random one (uuid4 hex) when it sent none.

A client's id, the header's or the body's `request_id`, lands in the response and in every log line of the
request (--enable-log-requests), so it must be printable: a control character (an ESC starting a terminal escape,
a C1 control, a bidi override) is a 400, never copied into a log. vLLM takes either as it comes; h11 lets every
byte but NUL, CR, LF and other whitespace through in a header, so the check is ours.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, Field
from starlette.datastructures import Headers, MutableHeaders

from flotilla.engine.server.errors import APIError

BodyT = TypeVar("BodyT", bound=BaseModel)

HEADER = "X-Request-Id"
# The body's `request_id` bound (protocol.py): the header takes its place in ids and logs, so it holds here too.
MAX_LENGTH = 256


def unprintable_at(request_id: str) -> int | None:
    """The position of the id's first unprintable character (str.isprintable: controls, format characters such as
    bidi overrides, separators but the space), or None when it has none."""
    if request_id.isprintable():
        return None
    return next(i for i, c in enumerate(request_id) if not c.isprintable())


def _printable(request_id: str) -> str:
    """A body's `request_id`, refused (a ValueError, pydantic's 400) when it holds an unprintable character."""
    at = unprintable_at(request_id)
    if at is not None:
        raise ValueError(f"holds an unprintable character (U+{ord(request_id[at]):04X} at {at})")
    return request_id


# The body's `request_id` (completions, chat, embeddings, responses): the response id's suffix.
BodyRequestId = Annotated[str, Field(min_length=1, max_length=MAX_LENGTH), AfterValidator(_printable)]


def header_request_id(headers: Headers) -> str | None:
    """The request's X-Request-Id (None when absent or empty)."""
    return headers.get(HEADER) or None


def _refusal(request_id: str) -> str | None:
    """Why the header's id cannot name the request (never quoting it), or None when it can."""
    if len(request_id) > MAX_LENGTH:
        return f"the {HEADER} header has {len(request_id)} characters; at most {MAX_LENGTH} are accepted"
    at = unprintable_at(request_id)
    if at is not None:
        return f"the {HEADER} header holds an unprintable character (U+{ord(request_id[at]):04X} at {at})"
    return None


def checked_request_id(headers: Headers) -> str | None:
    """The request's X-Request-Id to name it by; a 400 when it is longer than a body's `request_id` may be or
    holds an unprintable character."""
    request_id = header_request_id(headers)
    if request_id is not None and (reason := _refusal(request_id)) is not None:
        raise APIError(400, reason, param=HEADER)
    return request_id


def named_by_header(body: BodyT, headers: Headers) -> BodyT:
    """A pooling route's request body named by the X-Request-Id header when one is sent: the header wins over the
    body's `request_id` (checked as `checked_request_id` checks it)."""
    header = checked_request_id(headers)
    return body if header is None else body.model_copy(update={"request_id": header})


class RequestIdHeader:
    """ASGI middleware: echo the request's X-Request-Id on the response (a random one when absent, or refused:
    its control bytes are not sent back)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Pass the request on; add the header to the response's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = header_request_id(Headers(scope=scope))
        if request_id is None or _refusal(request_id) is not None:
            request_id = uuid.uuid4().hex

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)
