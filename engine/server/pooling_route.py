"""POST /pooling: vLLM's raw pooling route, which on this server is /v1/embeddings (an embedding model) or /classify
(a classifier) in another envelope.

The request is /v1/embeddings' (input or messages, and every extra, with the same checks and limits) plus vLLM's
`task`, which may be left out (the model's task) or name the model's task, "embed" or "classify"; a classifier also
serves "token_classify" (vLLM's ALL pooling: the class scores at every token, `[num_tokens, num_labels]` per input).
The other pooling tasks (token_embed, plugin, or the other of embed and classify) need poolers this model does not
have, and are a 400 naming `task`. The response is vLLM's PoolingResponse: the vectors (embeddings, class
probabilities, or per-token rows of them) under `data[i].data`, `object` "pooling", the id `pool-...`. As /score,
a generate server answers 404: vLLM registers the route only for pooling models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response

from flotilla.engine.engine_call import EngineCall
from flotilla.engine.server.classify import ClassificationRequest, classification_reply, create_classification
from flotilla.engine.server.embeddings import (
    EmbeddingRequest,
    checked_prompts,
    create_embeddings,
    pool_in_calls,
    refuse_unservable,
)
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.json_reply import json_response
from flotilla.engine.server.request_extras import response_ids
from flotilla.engine.server.request_id_header import named_by_header

if TYPE_CHECKING:
    from flotilla.engine.server.app import ServerState

# Why a generate server answers /pooling with a 404 (vLLM does not register the route there).
POOLING_NEEDS_POOLING = ("/pooling is served by the pooling runner; start the server with --runner pooling (or --task "
                         "embed, or a *ForSequenceClassification model)")


class PoolingRequest(EmbeddingRequest):
    """POST /pooling: /v1/embeddings' request and vLLM's `task`."""

    task: str | None = None


async def create_pooling(state: ServerState, body: PoolingRequest, model: str) -> dict[str, Any]:
    """The embeddings of the request, in vLLM's PoolingResponse shape."""
    if state.runner != "pooling":
        raise APIError(404, POOLING_NEEDS_POOLING, param="model")
    task = state.convert  # "embed" or "classify": the pooling runner's sequence task
    served = (task, "token_classify") if task == "classify" else (task,)
    if body.task not in (None, *served):
        raise APIError(400, f'task "{body.task}" is not served: this model\'s pooling runner has the '
                            f'{" and ".join(served)} task{"s" if len(served) > 1 else ""} only (leave task out, or '
                            f'name one of them)', param="task")
    if body.task == "token_classify":
        return await _token_classification(state, _classification_request(body), model)
    if task == "classify":
        result = await create_classification(state, _classification_request(body), model)
        prefix, key = "classify-", "probs"
    else:
        result = await create_embeddings(state, body, model)
        prefix, key = "embd-", "embedding"
    return {
        **result,
        "id": "pool-" + result["id"].removeprefix(prefix),
        "data": [{"index": item["index"], "object": "pooling", "data": item[key]} for item in result["data"]],
    }


async def _token_classification(state: ServerState, body: ClassificationRequest, model: str) -> dict[str, Any]:
    """The class scores at every token of each input (the token_classify task), in vLLM's PoolingResponse shape;
    the inputs' handling, checks and engine calls are /classify's."""
    refuse_unservable(body, "/pooling")
    prompts = await checked_prompts(state, body)
    response_id = response_ids("pool", body.request_id)[0]
    use_activation = body.use_activation is not False
    rows = await pool_in_calls(
        state, prompts, lambda chunk: EngineCall("token_classify", (chunk, use_activation, body.cache_salt)),
        {"task": "token_classify", "use_activation": use_activation}, response_id)
    data = [{"index": i, "object": "pooling", "data": r} for i, r in enumerate(rows)]
    return classification_reply(response_id, model, data, sum(len(ids) for ids in prompts))


# /v1/embeddings' fields that a classifier's /pooling cannot honour (they shape an embedding).
_EMBEDDING_ONLY = ("encoding_format", "embed_dtype", "endianness", "dimensions", "normalize", "padding")


def _classification_request(body: PoolingRequest) -> ClassificationRequest:
    """The /classify request a classifier's /pooling body is; a 400 naming an embedding-only field it sets."""
    for name in _EMBEDDING_ONLY:
        if name in body.model_fields_set:
            raise APIError(400, f"{name} shapes an embedding: this model is a classifier (leave it out)", param=name)
    fields = set(ClassificationRequest.model_fields) & body.model_fields_set
    return ClassificationRequest.model_validate({name: getattr(body, name) for name in fields})


def add_pooling_route(app: FastAPI, state: ServerState, model_of: Any, until_disconnect: Any) -> None:
    """Register /pooling; `model_of` and `until_disconnect` as for /v1/embeddings (app.py)."""

    @app.post("/pooling", response_model=None)
    async def pooling(body: PoolingRequest, request: Request) -> Response:
        body = named_by_header(body, request.headers)
        result = await until_disconnect(create_pooling(state, body, model_of(state, body.model)), request)
        return await json_response(result) if isinstance(result, dict) else result
