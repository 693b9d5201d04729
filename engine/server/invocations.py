"""POST /invocations: SageMaker's one inference route, which vLLM dispatches by the body's shape.

vLLM tries its request types in order and takes the first the body validates as: on a generate model chat (a body
with `messages`), then completions (`prompt`); on an embedding model embeddings (`input`, or `messages`), on a
classifier /classify (the same keys), then rerank (`query` and `documents`), then score (`text_1`/`text_2` or
another spelling of the two sides). Its request types require exactly those fields, so the same keys choose the
route here (`invocation_target`); the body then goes to that route as it came, with its own parsing, checks and
answer (a stream too). A body of no such shape is a 400
naming what it may hold. One difference: vLLM moves on to the next type when a body fails a type's validation for
any field (a chat body with a bad `temperature` ends in its "cannot find a handler"); here the route chosen by the
keys answers, naming the bad field.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict
from starlette.requests import ClientDisconnect, Request
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from flotilla.engine.server.errors import error_response
from flotilla.engine.server.request_body import parsed_body
from flotilla.engine.server.score import SCORE_SIDES

if TYPE_CHECKING:
    from flotilla.engine.server.app import ServerState

# Either side of a score (the other missing: /score's 400 says what to send).
_SCORE_KEYS = tuple(((side,), "/score") for side in sorted({name for pair in SCORE_SIDES for name in pair}))

# (keys the body must all hold, the route that answers it) in vLLM's order, per served task (`served_task`).
_ROUTES = {
    "generate": ((("messages",), "/v1/chat/completions"), (("prompt",), "/v1/completions")),
    "embed": ((("input",), "/v1/embeddings"), (("messages",), "/v1/embeddings"), (("query", "documents"), "/rerank"),
              *_SCORE_KEYS),
    "classify": ((("input",), "/classify"), (("messages",), "/classify"), (("query", "documents"), "/rerank"),
                 *_SCORE_KEYS),
}

_EXPECTED = {
    "generate": "a chat body (messages) or a completions body (prompt)",
    "embed": "an embeddings body (input or messages), a rerank body (query and documents) or a score body (text_1 "
             "and text_2)",
    "classify": "a classify body (input or messages), a rerank body (query and documents) or a score body (text_1 "
                "and text_2)",
}


def served_task(runner: str, convert: str) -> str:
    """What a server answers /invocations with: "generate", or its pooling runner's convert ("embed", "classify")."""
    return convert if runner == "pooling" else "generate"


def invocation_target(keys: Iterable[str], task: str) -> str | None:
    """The route that answers a body of top-level `keys` on a server of `task` (`served_task`), or None."""
    present = set(keys)
    for needed, path in _ROUTES[task]:
        if present.issuperset(needed):
            return path
    return None


class _AnyObject(BaseModel):
    """A JSON object of any keys (what /invocations reads of a body before choosing its route)."""

    model_config = ConfigDict(extra="allow")


class Invocations:
    """The ASGI endpoint of /invocations (an object, not a function: Starlette hands an object the raw ASGI call):
    hands the request to the route its body's keys choose."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read and parse the body, choose the route, and call the app's router with the request sent there."""
        try:
            raw = await Request(scope, receive).body()
        except ClientDisconnect:
            return
        task = served_task(self.state.runner, self.state.convert)
        target = await asyncio.to_thread(_target, raw, task)
        if target is None:
            answer = error_response(400, f"/invocations found no route for this body: this server takes "
                                         f"{_EXPECTED[task]}")
            await answer(scope, receive, send)
            return
        path = scope.get("root_path", "") + target
        replay = _replayed(raw, receive)
        del raw  # from here the body is held only until the chosen route has parsed it (request_body.py)
        await scope["app"].router({**scope, "path": path, "raw_path": path.encode()}, replay, send)


def _target(raw: bytes, task: str) -> str | None:
    """The route for body `raw` (blocking: parsed as every body is, off the event loop; a 400 for one that is not a
    JSON object); the parsed body is dropped here, not held while the chosen route answers."""
    body = parsed_body(raw or b"{}", _AnyObject)
    return invocation_target((body.model_extra or {}).keys(), task)


def invocations_route(state: ServerState) -> Route:
    """The /invocations route (POST)."""
    return Route("/invocations", Invocations(state), methods=["POST"])


def add_invocations_to_schema(app: FastAPI) -> None:
    """List POST /invocations in `app`'s /openapi.json as vLLM's schema does (operation `invocations_invocations_post`,
    no request body: any of the bodies above). FastAPI describes only its own routes, and this one is a Starlette
    Route, so the schema is built from the app's routes plus a FastAPI route that only describes it."""
    described = APIRoute("/invocations", _described, methods=["POST"], name="invocations",
                         responses={400: {"description": "A body of no shape this server takes, or one the route it "
                                                         "chose refuses (OpenAI's error JSON)"}})

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:  # built once, as FastAPI's own
            app.openapi_schema = get_openapi(
                title=app.title, version=app.version, openapi_version=app.openapi_version,
                description=app.description, routes=[*app.routes, described], servers=app.servers,
                separate_input_output_schemas=app.separate_input_output_schemas)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI documents this override (openapi_schema cache)


async def _described() -> dict[str, Any]:
    """SageMaker's inference route: the body's keys choose chat completions or completions (a generate model), or
    embeddings, rerank or score (a pooling model); the answer is that route's."""
    raise NotImplementedError  # only describes /invocations: invocations_route answers it


def _replayed(raw: bytes, receive: Receive) -> Receive:
    """A receive that gives `raw` as the whole body first (and lets go of it), then what `receive` gives (a
    disconnect, for the chosen route's cancellation)."""
    held = [raw]

    async def replay() -> Message:
        if held:
            return {"type": "http.request", "body": held.pop(), "more_body": False}
        return await receive()

    return replay
