"""POST /v1/embeddings (OpenAI's shape, vLLM's pooling runner behind it).

Inputs are text, a list of texts, token ids or a list of token-id lists; each text is tokenized by
the model's tokenizer (special tokens included, so an embedding model's appended end token is there).
Or, as vLLM's EmbeddingChatRequest, `messages`: a conversation rendered by the chat template as chat renders it
(no generation prompt and no extra special tokens by default), embedded as one prompt.
The pooling pass runs on the engine's thread between steps (`engine/pooling/embed.py`). Every input is
checked first (length, vocabulary), so a bad one is refused before any is embedded; then a list is embedded
in engine calls of at most `--max-model-len` tokens each (one longest prompt's prefill), and whatever other
requests queued meanwhile (another embeddings request, an abort, an adapter load) runs between two calls:
a long list never holds the engine for longer than one such call at a time. A list holds at most
`MAX_EMBEDDING_INPUTS` inputs, OpenAI's cap (docs/embeddings.md).
`encoding_format` base64 is the little-endian float32 bytes of each vector, as OpenAI sends them.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from fastapi import FastAPI, Request, Response
from pydantic import Field, StrictInt, ValidatorFunctionWrapHandler, field_validator

from flotilla.engine.engine_call import EngineCall
from flotilla.engine.pooling.output import EmbeddingOutput
from flotilla.engine.pooling.params import PoolingParams
from flotilla.engine.pooling.prompts import GENERATE_RUNNER_REFUSAL, check_prompt, prompt_batches
from flotilla.engine.prompt_truncation import truncate_prompt
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.json_reply import json_response
from flotilla.engine.server.protocol import ChatCompletionRequest, ChatMessage, _RequestBody, token_id_batch
from flotilla.engine.server.request_extras import CACHE_SALT_MAX_CHARS, PRIORITY_MAX, PRIORITY_MIN, response_ids
from flotilla.engine.server.request_id_header import BodyRequestId, named_by_header
from flotilla.engine.server.request_log import log_aborted, log_failed, log_finished, log_received

if TYPE_CHECKING:
    from flotilla.engine.server.app import ServerState

EmbeddingInput = str | list[str] | list[StrictInt] | list[list[StrictInt]]

# Inputs one request may list (texts or token-id lists), OpenAI's cap; completions cap prompts x n at 2,048 too
# (serving.MAX_SEQUENCES_PER_REQUEST). Without it an 8 MiB body of one-character texts was ~1.6M inputs, each
# tokenized in its own worker-thread call before any was embedded (vLLM has no cap).
MAX_EMBEDDING_INPUTS = 2048


# vLLM's chat-embedding extras that change how `messages` are rendered (set with `input`: a 400).
CHAT_ONLY_FIELDS = ("add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs")


class PoolingInputs(_RequestBody):
    """What a pooling request's prompts are made of (/v1/embeddings' and /classify's): `input` or `messages`, how they
    are tokenized and truncated, and vLLM's pooling extras."""

    model: str | None = None
    input: EmbeddingInput | None = None
    user: str | None = None
    add_special_tokens: bool | None = None  # vLLM's defaults: true for input, false for messages (in the template)
    # vLLM's extra: pool each input's last N tokens (-1: the context length), as on completions
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    # vLLM's chat pooling requests: a conversation in place of input, and how the template renders it
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's pooling extras: `truncation_side` "right" keeps the first truncate_prompt_tokens instead of the last.
    # The multimodal ones cannot be honoured here and are refused when set (`refuse_unservable`), rather than logged
    # and ignored.
    truncation_side: Literal["left", "right"] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    # vLLM's pooling request extras, with completions' bounds: `request_id` names the response (`embd-<id>`; the
    # X-Request-Id header wins, as on completions); `cache_salt` keys the pooling pass's prefix-cache blocks, so
    # they are shared within one salt only (engine/pooling/embed.py); `priority` other than 0 is refused
    # (`refuse_unservable`): a pooling pass runs between steps, outside the scheduler's queue it would order.
    request_id: BodyRequestId | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=CACHE_SALT_MAX_CHARS)
    priority: int = Field(0, ge=PRIORITY_MIN, le=PRIORITY_MAX)

    @field_validator("input", mode="wrap")
    @classmethod
    def _batch_of_token_lists(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return token_id_batch(value, handler)


class EmbeddingRequest(PoolingInputs):
    """POST /v1/embeddings."""

    encoding_format: Literal["float", "base64"] = "float"
    # vLLM's extras for base64: the dtype of each value and the byte order (native: this machine's, little here)
    embed_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    endianness: Literal["native", "little", "big"] = "native"
    dimensions: int | None = None
    # vLLM's extra: L2-normalise the pooled vector (the embed convert's default).
    normalize: bool = True
    # vLLM's newer name for `normalize` (None: normalize's value)
    use_activation: bool | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None


async def create_embeddings(state: ServerState, body: EmbeddingRequest, model: str) -> dict[str, Any]:
    """Tokenize, check, embed on the engine thread call by call (see the module docstring), and shape the
    OpenAI response."""
    if state.runner != "pooling":  # before the input is read: a long list took seconds to tokenize, then this 400
        raise APIError(400, GENERATE_RUNNER_REFUSAL, param="model")
    if state.convert == "classify":
        raise APIError(400, EMBED_NEEDS_EMBED_MODEL, param="model")
    refuse_unservable(body, "/v1/embeddings")
    _refuse_padding(body)
    prompts = await checked_prompts(state, body)
    params = PoolingParams(dimensions=body.dimensions, normalize=_normalize(body))
    response_id = response_ids("embd", body.request_id)[0]
    outputs = await embed_in_calls(state, prompts, params, body.cache_salt, response_id)
    tokens = sum(o.num_prompt_tokens for o in outputs)
    return {
        "id": response_id,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": _encode(o.embedding, body)}
                 for i, o in enumerate(outputs)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def embed_in_calls(state: ServerState, prompts: list[list[int]], params: PoolingParams, cache_salt: str | None,
                         response_id: str) -> list[EmbeddingOutput]:
    """Checked prompts' embeddings, in engine calls of at most `--max-model-len` tokens (the module docstring), logged
    under `response_id` with --enable-log-requests; /score and /rerank embed their texts here too."""
    return await pool_in_calls(state, prompts, lambda chunk: EngineCall("embed", (chunk, params, cache_salt)), params,
                               response_id)


async def pool_in_calls(state: ServerState, prompts: list[list[int]], call: Callable[[list[list[int]]], EngineCall],
                        logged: Any, response_id: str) -> list[Any]:
    """Checked prompts' pooling outputs, in the engine calls `call(chunk)` makes of chunks of at most
    `--max-model-len` tokens (the module docstring); with --enable-log-requests logged under `response_id` with
    `logged` as its parameters (embeddings, and /classify's class scores)."""
    if state.serving.log_requests:
        return await _logged_pool(state, prompts, call, logged, response_id)
    return await _pool(state, prompts, call)


async def _pool(state: ServerState, prompts: list[list[int]],
                call: Callable[[list[list[int]]], EngineCall]) -> list[Any]:
    """Every prompt's output, batch by batch on the engine thread."""
    outputs: list[Any] = []
    for chunk in prompt_batches(prompts, state.max_model_len):
        outputs += await state.engine.call(call(chunk))
    return outputs


async def _logged_pool(state: ServerState, prompts: list[list[int]], call: Callable[[list[list[int]]], EngineCall],
                       logged: Any, response_id: str) -> list[Any]:
    """`_pool`, its arrival and end logged (--enable-log-requests: request_log.py)."""
    log_received(response_id, logged, None, None, prompts, state.serving.max_log_len)
    try:
        outputs = await _pool(state, prompts, call)
    except Exception as exc:
        log_failed(response_id, exc)
        raise
    except BaseException:  # cancelled: the client went away
        log_aborted(response_id)
        raise
    log_finished(response_id)
    return outputs


# Why a classifier's server refuses /v1/embeddings (vLLM does not serve embeddings from a classify model).
EMBED_NEEDS_EMBED_MODEL = ("this server's model is a classifier (--convert classify): it serves /classify, and "
                           "cross-encoder /score and /rerank, not embeddings")


def refuse_unservable(body: PoolingInputs, route: str) -> None:
    """400 naming the first vLLM extra this server cannot honour on `route`: the multimodal ones (this server pools
    text: there is no HF processor or media loader to pass them to; empty is accepted) and a `priority` other than 0
    (nothing to order)."""
    for name, value in (("mm_processor_kwargs", body.mm_processor_kwargs), ("media_io_kwargs", body.media_io_kwargs)):
        if value:
            raise APIError(400, f"{name} is not supported: this server pools text only, so there is no multimodal "
                                "processor to pass it to (leave it out)", param=name)
    if body.priority != 0:
        raise APIError(400, f"priority is not supported on {route}: the pooling pass runs between engine steps, "
                            "outside the scheduler's queue that priority orders (leave it out, or 0)", param="priority")


def _refuse_padding(body: EmbeddingRequest) -> None:
    """`padding` "max_length" is for encoders trained on fixed-length input without an attention mask (e.g. SigLIP):
    a decoder's last-token embedding of a padded prompt would be the pad token's."""
    if body.padding == "max_length":
        raise APIError(400, 'padding "max_length" is not supported: it is for encoders trained on fixed-length '
                            'input, and this server pools a decoder\'s last token (leave it out, or "do_not_pad")',
                       param="padding")


async def checked_prompts(state: ServerState, body: PoolingInputs) -> list[list[int]]:
    """The request's prompts as token ids, truncated as asked and each checked (length, vocabulary) before any is
    pooled."""
    prompts = [truncate_prompt(ids, body.truncate_prompt_tokens, state.max_model_len, body.truncation_side or "left")
               for ids in await _token_ids(state, body)]
    for i, ids in enumerate(prompts):
        check_prompt(i, ids, state.max_model_len, state.vocab_size)
    return prompts


def _normalize(body: EmbeddingRequest) -> bool:
    """`use_activation` when given, else `normalize`; a 400 when both are given and disagree."""
    if body.use_activation is None:
        return body.normalize
    if "normalize" in body.model_fields_set and body.normalize != body.use_activation:
        raise APIError(400, f"use_activation={body.use_activation} contradicts normalize={body.normalize} (vLLM's "
                            "newer name for the same switch): give one of them", param="use_activation")
    return body.use_activation


async def _token_ids(state: ServerState, body: PoolingInputs) -> list[list[int]]:
    if (body.input is None) == (body.messages is None):
        raise APIError(400, "give exactly one of input or messages", param="input")
    if body.messages is not None:
        return [await _conversation_ids(state, body)]
    for name in CHAT_ONLY_FIELDS:  # not ignored: the client meant a conversation's rendering to change
        if getattr(body, name):
            raise APIError(400, f"{name} applies to a conversation (messages), not to input", param=name)
    given = body.input
    if isinstance(given, str):
        given = [given]
    if not given:
        raise APIError(400, "input must not be empty", param="input")
    if all(isinstance(x, int) for x in given):  # one prompt as token ids
        return [list(given)]  # type: ignore[arg-type]  # every item is an int: checked just above
    if len(given) > MAX_EMBEDDING_INPUTS:  # before any input is tokenized
        raise APIError(400, f"input lists {len(given)} inputs; at most {MAX_EMBEDDING_INPUTS} are embedded per "
                            "request (send more requests)", param="input")
    prompts = []
    for item in given:
        if isinstance(item, str):
            prompts.append(await state.serving.encode(item, add_special_tokens=body.add_special_tokens is not False,
                                                      param="input", keep=body.truncate_prompt_tokens,
                                                      side=body.truncation_side))
        elif isinstance(item, list):
            prompts.append(list(item))
        else:
            raise APIError(400, "input must be a string, a list of strings, a list of token ids or a list of "
                                "token-id lists (not a mix of ids and lists)", param="input")
    return prompts


async def _conversation_ids(state: ServerState, body: PoolingInputs) -> list[int]:
    """The conversation as chat renders it (the template, its trust rule and limits), with vLLM's embedding
    defaults (no generation prompt, no special tokens beyond the template's)."""
    chat = ChatCompletionRequest(messages=body.messages, add_generation_prompt=body.add_generation_prompt,
                                 continue_final_message=body.continue_final_message,
                                 add_special_tokens=bool(body.add_special_tokens), chat_template=body.chat_template,
                                 chat_template_kwargs=body.chat_template_kwargs)
    return (await state.serving.chat_prompt(chat)).token_ids


def _encode(vector: list[float], body: EmbeddingRequest) -> list[float] | str:
    """The vector as floats, or (base64) as the bytes of `embed_dtype` values in `endianness` order, as vLLM encodes
    them (float32 little-endian by default, the bytes OpenAI sends and its client decodes)."""
    if body.encoding_format == "float":
        return vector
    order = {"native": "=", "little": "<", "big": ">"}[body.endianness]
    values = np.asarray(vector, dtype=np.float32)
    if body.embed_dtype == "bfloat16":  # numpy has no bfloat16: float32's top half, rounded to nearest even as torch
        bits = values.view(np.uint32).astype(np.uint64)
        data = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(order + "u2").tobytes()
    else:
        data = values.astype(order + ("f4" if body.embed_dtype == "float32" else "f2")).tobytes()
    return base64.b64encode(data).decode("ascii")


def add_embedding_routes(app: FastAPI, state: ServerState, model_of: Any, until_disconnect: Any) -> None:
    """Register /v1/embeddings; `model_of(state, name)` resolves the served name (404 otherwise);
    `until_disconnect(work, request)` awaits the work, cancelling it if the client goes away first."""

    @app.post("/v1/embeddings", response_model=None)
    async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
        body = named_by_header(body, request.headers)  # names the response, as on completions (the header wins)
        # As vLLM's route (with_cancellation): a client that leaves stops the list between two engine calls.
        result = await until_disconnect(create_embeddings(state, body, model_of(state, body.model)), request)
        # Encoded here, not by FastAPI (jsonable_encoder and json.dumps on the event loop): a long list's vectors
        # are millions of floats, encoded off the loop (json_reply.py)
        return await json_response(result) if isinstance(result, dict) else result



