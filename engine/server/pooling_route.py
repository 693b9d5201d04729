"""POST /pooling: vLLM's raw pooling route, which on this server's one pooling task (embed) is /v1/embeddings in
another envelope.

The request is /v1/embeddings' (input or messages, and every extra, with the same checks and limits) plus vLLM's
`task`, which may be left out or be "embed": the other pooling tasks (token_embed, classify, token_classify, plugin)
need poolers this server does not have, and are a 400 naming `task`. The response is vLLM's PoolingResponse: the
vectors under `data[i].data`, `object` "pooling", the id `pool-...`. As /score, a generate server answers 404: vLLM
registers the route only for pooling models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response

from flotilla.engine.server.embeddings import EmbeddingRequest, create_embeddings
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.json_reply import json_response
from flotilla.engine.server.request_id_header import checked_request_id

if TYPE_CHECKING:
    from flotilla.engine.server.app import ServerState

# Why a generate server answers /pooling with a 404 (vLLM does not register the route there).
POOLING_NEEDS_POOLING = ("/pooling is served by the pooling runner; start the server with --runner pooling (or --task "
                         "embed)")


class PoolingRequest(EmbeddingRequest):
    """POST /pooling: /v1/embeddings' request and vLLM's `task`."""

    task: str | None = None


async def create_pooling(state: ServerState, body: PoolingRequest, model: str) -> dict[str, Any]:
    """The embeddings of the request, in vLLM's PoolingResponse shape."""
    if state.runner != "pooling":
        raise APIError(404, POOLING_NEEDS_POOLING, param="model")
    if body.task not in (None, "embed"):
        raise APIError(400, f'task "{body.task}" is not served: this server\'s pooling runner has the embed task '
                            'only (leave task out, or "embed")', param="task")
    result = await create_embeddings(state, body, model)
    return {
        **result,
        "id": "pool-" + result["id"].removeprefix("embd-"),
        "data": [{"index": item["index"], "object": "pooling", "data": item["embedding"]} for item in result["data"]],
    }


def add_pooling_route(app: FastAPI, state: ServerState, model_of: Any, until_disconnect: Any) -> None:
    """Register /pooling; `model_of` and `until_disconnect` as for /v1/embeddings (app.py)."""

    @app.post("/pooling", response_model=None)
    async def pooling(body: PoolingRequest, request: Request) -> Response:
        header = checked_request_id(request.headers)  # the header wins over the body's request_id, as on embeddings
        body = body if header is None else body.model_copy(update={"request_id": header})
        result = await until_disconnect(create_pooling(state, body, model_of(state, body.model)), request)
        return await json_response(result) if isinstance(result, dict) else result
