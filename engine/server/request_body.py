"""Request bodies parsed and validated on a worker thread, not on the event loop.

FastAPI reads a JSON body with `json.loads` and validates it with pydantic (and the body walk of
`protocol._RequestBody`) on the event loop: a body of many small values under the size limit (a few MB of
`[1, 2]` prompts, one-character messages or `{}`s) held every stream, /health and every other request for
seconds. Here the route parses and validates first on a worker thread, then hands FastAPI the validated model,
which it passes through as is (pydantic does not revalidate an instance of the model).

Python code on the worker thread (the walk, validators) gives the event loop its turn every few milliseconds
(the GIL's switch interval); a single C call does not. So `json.loads` gets Python hooks (per object and number),
the long-list fields of protocol.py Python validators (per message, tool, token-id list), and no garbage
collection runs during a parse (each one walked every object at once). What stays is bounded by the longest C
run between two such points (a long run of strings or empty lists). Errors are FastAPI's own (the same
`RequestValidationError`, so the same 400 body).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.message
import gc
import json
import math
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from flotilla.engine.server.errors import error_response
from flotilla.engine.server.protocol import MAX_BODY_NESTING
from flotilla.engine.server.request_limits import RELEASE_BODY_BUDGET

# What Starlette's Request holds as the body once it is parsed (the parsed model is its cached `json()`).
PARSED_BODY_STAND_IN = b"{}"


class BodyParsedOffTheLoop(APIRoute):
    """An APIRoute whose single pydantic body is parsed and validated on a worker thread."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, with the body already parsed (Starlette's Request caches `json()`)."""
        handler = super().get_route_handler()
        model = _body_model(self)
        if model is None:
            return handler

        async def parse_then_handle(request: Request) -> Response:
            try:
                raw = await request.body()
            except ClientDisconnect:  # the client left mid-body: the request's end, not an error of the app
                return error_response(499, "client disconnected")  # (which uvicorn logged with a traceback)
            content_type = request.headers.get("content-type")
            if raw and not _is_json(content_type):
                # FastAPI does not read such a body as JSON and said only "Input should be a valid dictionary"
                # (curl's -d sends application/x-www-form-urlencoded); vLLM's words, also a 400.
                return error_response(400, f"Unsupported Media Type: Only 'application/json' is allowed (the "
                                           f"request's Content-Type is {content_type or 'missing'})")
            if raw:
                # FastAPI's own `await request.json()` returns this; validating an instance of the model is a
                # pass-through.
                request._json = await asyncio.to_thread(_parsed, raw, model)
                # The raw bytes are not needed again, but Starlette's Request caches them (and FastAPI's handler
                # keeps what `body()` returns) until the request ends: a request queued behind long generations
                # held its whole body, uncounted once given back to the budget below. A non-empty stand-in keeps
                # FastAPI on its JSON path (`body()` non-empty, then `json()`: the model above).
                request._body = PARSED_BODY_STAND_IN
            del raw
            # The raw body is no longer needed: its bytes go back to the server-wide budget (request_limits.py).
            release = request.scope.get(RELEASE_BODY_BUDGET)
            if release is not None:
                release()
            return await handler(request)

        return parse_then_handle


def _body_model(route: APIRoute) -> type[BaseModel] | None:
    params = route.dependant.body_params
    if len(params) != 1:
        return None
    annotation = params[0].field_info.annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule for a JSON body: an application/json or application/*+json Content-Type."""
    if not content_type:
        return False  # FastAPI's strict_content_type: such a body is not read as JSON
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


# Python hooks for json.loads: its C scanner calls them for each object and number, and Python code lets the
# event loop's thread take the GIL at the switch interval; without them one json.loads of a body of many small
# values (a million `[1]` prompts) held the loop for seconds. What they return is what json.loads would.
def _yield_point(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # past Python's digit limit (sys.get_int_max_str_digits): json.loads would give no reason
        raise _NonFinite(f"the body holds an integer of {len(text.lstrip('-'))} digits; JSON integers here have at "
                         f"most {sys.get_int_max_str_digits()} digits") from None


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: read as infinity, which no reply can carry (see _constant)
        raise _NonFinite(f"the body holds {text[:40]}, a number past the range of a double: JSON numbers here are "
                         "finite")
    return value


class _NonFinite(ValueError):
    """A number the body may not hold: one Python's json.loads reads as NaN or an infinity, or an integer past
    Python's digit limit; refused (the message says why)."""


def _constant(text: str) -> float:
    # Refused, not read: RFC 8259's numbers are finite. Kept, a NaN in a free-form field (a tool's schema, template
    # kwargs) came back in replies, where json.dumps refused it (a plain-text 500) or a stream wrote `NaN` into its
    # events, which standard parsers (JavaScript's, Go's) cannot read.
    raise _NonFinite(f"the body is not valid JSON: {text} is not a JSON value (JSON numbers are finite)")


# Bodies from this size on parse with garbage collection paused: only large ones allocate enough containers for a
# full collection to start during the parse, and small ones (nearly every request) leave the collector alone, so
# that a steady stream of parses never keeps it off for long.
GC_PAUSE_MIN_BYTES = 256 * 1024
_gc_lock = threading.Lock()
_gc_parses = 0  # large-body parses running now


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage collection while a large body is parsed: a parse allocates its containers by the million, and
    each collection it set off walked every live object in one C call (a few tenths of a second each, the event
    loop's thread waiting on the GIL; a third of the parse's time). What the parse builds is alive: collecting
    during it frees nothing; the first collection after it does what was put off. A large reply's build and
    encoding (json_reply.py) pause it the same way, for the same reason.

    Only a parse that starts with no other large parse running pauses collection, and it alone turns it back on
    when it ends: GC is never off for longer than one parse. (A count of pausers kept it off for as long as
    overlapping large bodies kept coming, each starting before the last ended: the cyclic garbage of every
    request piled up.) The parses that overlap a pause's end run with GC on, as do those that start after it
    until none is running."""
    global _gc_parses
    with _gc_lock:
        pauses = _gc_parses == 0 and gc.isenabled()
        _gc_parses += 1
        if pauses:
            gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_parses -= 1
            if pauses:
                gc.enable()


def parsed_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """`raw` parsed and validated as `model` as a route's body is (the same errors); blocking: call it on a worker
    thread. /invocations reads a body's keys with it."""
    return _parsed(raw, model)


def _parsed(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """`raw` as the model, or FastAPI's RequestValidationError for it (blocking: call it on a worker thread)."""
    if len(raw) < GC_PAUSE_MIN_BYTES:  # too few containers to set a costly collection off
        return _parse_and_validate(raw, model)
    with gc_paused():
        return _parse_and_validate(raw, model)


def _parse_and_validate(raw: bytes, model: type[BaseModel]) -> BaseModel:
    try:
        data = json.loads(raw, object_hook=_yield_point, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except _NonFinite as exc:  # OpenAI's API refuses NaN as not JSON too
        error = {"type": "value_error", "loc": ("body",), "input": {}, "msg": str(exc)}
        raise RequestValidationError([error]) from None
    except json.JSONDecodeError as exc:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": exc.msg}}], body=exc.doc) from None
    except ValueError:  # e.g. bytes that are not UTF-8: FastAPI's answer to any other parse failure
        raise HTTPException(400, "There was an error parsing the body") from None
    except RecursionError:  # containers nested past the parser's depth (Python's recursion limit, ~1,000)
        raise RequestValidationError([{"type": "value_error", "loc": ("body",), "input": {}, "msg": (
            f"the body nests objects and arrays more than {MAX_BODY_NESTING} levels deep")}]) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=data) from None
