"""POST /classify: vLLM's classification route, on a classifier served by the pooling runner (`--convert classify`).

The request is /v1/embeddings' input (a text, texts, token ids or lists of them; or `messages`, rendered by the chat
template) with its tokenization, truncation, checks, limits and engine calls (embeddings.py), plus vLLM's
`use_activation` (false: the head's raw logits). Each prompt's answer is the `score` head on its last token through
the activation config.json implies (a softmax over the labels; a sigmoid for one label), in vLLM's
ClassificationResponse: `data[i]` = {index, label (id2label of the highest), probs, num_classes}, the id
`classify-...`. vLLM registers the route only for classifiers, so any other server answers 404 (here saying how to
start one).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response

from flotilla.engine.engine_call import EngineCall
from flotilla.engine.server.embeddings import PoolingInputs, checked_prompts, pool_in_calls, refuse_unservable
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.json_reply import json_response
from flotilla.engine.server.request_extras import response_ids
from flotilla.engine.server.request_id_header import named_by_header

if TYPE_CHECKING:
    from flotilla.engine.server.app import ServerState

# Why a server of another model answers /classify with a 404 (vLLM does not register the route there).
CLASSIFY_NEEDS_CLASSIFIER = ("/classify is served by a classifier on the pooling runner: start the server with a "
                             "*ForSequenceClassification model (or --runner pooling --convert classify)")


class ClassificationRequest(PoolingInputs):
    """POST /classify: /v1/embeddings' inputs, and vLLM's `use_activation` (None: true)."""

    use_activation: bool | None = None


def check_classifier(state: ServerState) -> None:
    """404 unless this server runs a classifier (before any input is read)."""
    if state.runner != "pooling" or state.convert != "classify":
        raise APIError(404, CLASSIFY_NEEDS_CLASSIFIER, param="model")


async def classify_in_calls(state: ServerState, prompts: list[list[int]], use_activation: bool, cache_salt: str | None,
                            response_id: str) -> list[Any]:
    """Checked prompts' ClassificationOutputs, in engine calls as embeddings' (/score and /rerank's cross-encoder
    scores come from here too)."""
    return await pool_in_calls(
        state, prompts, lambda chunk: EngineCall("classify", (chunk, use_activation, cache_salt)),
        {"task": "classify", "use_activation": use_activation}, response_id)


async def create_classification(state: ServerState, body: ClassificationRequest, model: str) -> dict[str, Any]:
    """Tokenize, check, classify on the engine thread call by call, and shape vLLM's response."""
    check_classifier(state)
    refuse_unservable(body, "/classify")
    prompts = await checked_prompts(state, body)
    response_id = response_ids("classify", body.request_id)[0]
    outputs = await classify_in_calls(state, prompts, body.use_activation is not False, body.cache_salt, response_id)
    data = [{"index": i, "label": state.labels[max(range(len(o.probs)), key=o.probs.__getitem__)],
             "probs": o.probs, "num_classes": len(o.probs)} for i, o in enumerate(outputs)]
    return classification_reply(response_id, model, data, sum(o.num_prompt_tokens for o in outputs))


def classification_reply(response_id: str, model: str, data: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    """vLLM's envelope of a classifier's reply (/classify, and /pooling's token_classify): `data` and the usage of
    `tokens` prompt tokens."""
    return {
        "id": response_id,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                  "prompt_tokens_details": None},
    }


def add_classify_route(app: FastAPI, state: ServerState, model_of: Any, until_disconnect: Any) -> None:
    """Register /classify; `model_of` and `until_disconnect` as for /v1/embeddings (app.py)."""

    @app.post("/classify", response_model=None)
    async def classify(body: ClassificationRequest, request: Request) -> Response:
        body = named_by_header(body, request.headers)
        result = await until_disconnect(create_classification(state, body, model_of(state, body.model)), request)
        return await json_response(result) if isinstance(result, dict) else result
