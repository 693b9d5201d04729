"""POST /v1/embeddings (OpenAI's shape, vLLM's pooling runner behind it).

Inputs are text, a list of texts, token ids or a list of token-id lists; each text is tokenized by
the model's tokenizer (special tokens included, so an embedding model's appended end token is there).
Or, as vLLM's EmbeddingChatRequest, `messages`: a conversation rendered by the chat template as chat renders it
(no generation prompt and no extra special tokens by default), embedded as one prompt.
The pooling pass runs on the engine's thread between steps (`engine/pooling/embed.py`). Every input is
checked first (length, vocabulary), so a bad one is refused before any is embedded; then a list is embedded
in engine calls of at most `--max-model-len` tokens each (one longest prompt's prefill), and whatever other
requests queued meanwhile (another embeddings request, an abort, an adapter load) runs between two calls:
a long list never holds the engine for longer than one such call at a time. There is no cap on the list's
length beyond the request-body limit (docs/embeddings.md).
`encoding_format` base64 is the little-endian float32 bytes of each vector, as OpenAI sends them.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from fastapi import FastAPI, Request, Response
from pydantic import Field, StrictInt, ValidatorFunctionWrapHandler, field_validator

from flotilla.engine.engine_call import EngineCall
from flotilla.engine.pooling.embed import check_prompt, prompt_batches
from flotilla.engine.pooling.output import EmbeddingOutput
from flotilla.engine.pooling.params import PoolingParams
from flotilla.engine.prompt_truncation import truncate_prompt
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.protocol import ChatCompletionRequest, ChatMessage, _RequestBody, token_id_batch

if TYPE_CHECKING:
    from flotilla.engine.server.app import ServerState

EmbeddingInput = str | list[str] | list[StrictInt] | list[list[StrictInt]]


class EmbeddingRequest(_RequestBody):
    """POST /v1/embeddings."""

    model: str | None = None
    input: EmbeddingInput | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    # vLLM's extra: L2-normalise the pooled vector (the embed convert's default).
    normalize: bool = True
    add_special_tokens: bool | None = None  # vLLM's defaults: true for input, false for messages (in the template)
    # vLLM's extra: embed each input's last N tokens (-1: the context length), as on completions
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    # vLLM's EmbeddingChatRequest: a conversation in place of input, and how the template renders it
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("input", mode="wrap")
    @classmethod
    def _batch_of_token_lists(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return token_id_batch(value, handler)


async def create_embeddings(state: ServerState, body: EmbeddingRequest, model: str) -> dict[str, Any]:
    """Tokenize, check, embed on the engine thread call by call (see the module docstring), and shape the
    OpenAI response."""
    prompts = [truncate_prompt(ids, body.truncate_prompt_tokens, state.max_model_len)
               for ids in await _token_ids(state, body)]
    for i, ids in enumerate(prompts):
        check_prompt(i, ids, state.max_model_len, state.vocab_size)
    params = PoolingParams(dimensions=body.dimensions, normalize=body.normalize)
    outputs: list[EmbeddingOutput] = []
    for chunk in prompt_batches(prompts, state.max_model_len):
        outputs += await state.engine.call(EngineCall("embed", (chunk, params)))
    tokens = sum(o.num_prompt_tokens for o in outputs)
    return {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": _encode(o.embedding, body.encoding_format)}
                 for i, o in enumerate(outputs)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def _token_ids(state: ServerState, body: EmbeddingRequest) -> list[list[int]]:
    if (body.input is None) == (body.messages is None):
        raise APIError(400, "give exactly one of input or messages", param="input")
    if body.messages is not None:
        return [await _conversation_ids(state, body)]
    given = body.input
    if isinstance(given, str):
        given = [given]
    if not given:
        raise APIError(400, "input must not be empty", param="input")
    if all(isinstance(x, int) for x in given):  # one prompt as token ids
        return [list(given)]  # type: ignore[arg-type]  # every item is an int: checked just above
    prompts = []
    for item in given:
        if isinstance(item, str):
            prompts.append(await state.serving.encode(item, add_special_tokens=body.add_special_tokens is not False,
                                                      param="input"))
        elif isinstance(item, list):
            prompts.append(list(item))
        else:
            raise APIError(400, "input must be a string, a list of strings, a list of token ids or a list of "
                                "token-id lists (not a mix of ids and lists)", param="input")
    return prompts


async def _conversation_ids(state: ServerState, body: EmbeddingRequest) -> list[int]:
    """The conversation as chat renders it (the template, its trust rule and limits), with vLLM's embedding
    defaults (no generation prompt, no special tokens beyond the template's)."""
    chat = ChatCompletionRequest(messages=body.messages, add_generation_prompt=body.add_generation_prompt,
                                 continue_final_message=body.continue_final_message,
                                 add_special_tokens=bool(body.add_special_tokens), chat_template=body.chat_template,
                                 chat_template_kwargs=body.chat_template_kwargs)
    return (await state.serving.chat_prompt(chat)).token_ids


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def add_embedding_routes(app: FastAPI, state: ServerState, model_of: Any, until_disconnect: Any) -> None:
    """Register /v1/embeddings; `model_of(state, name)` resolves the served name (404 otherwise);
    `until_disconnect(work, request)` awaits the work, cancelling it if the client goes away first."""

    @app.post("/v1/embeddings", response_model=None)
    async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any] | Response:
        # As vLLM's route (with_cancellation): a client that leaves stops the list between two engine calls.
        return await until_disconnect(create_embeddings(state, body, model_of(state, body.model)), request)



