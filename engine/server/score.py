"""POST /score, /v1/score, /rerank, /v1/rerank and /v2/rerank: vLLM's scoring on the pooling runner, a bi-encoder's
or a cross-encoder's by the model.

On an embedding model (`--convert embed`) each text is embedded as /v1/embeddings embeds it (the same tokenization,
truncation, checks and engine calls: embeddings.embed_in_calls), and a pair's score is the cosine similarity of its two
embeddings, as vLLM scores a pair on an embedding model. On a classifier (`--convert classify`, one label: a reranker)
each pair is one prompt, the tokenizer's pair encoding of the two texts, and its score the classifier's activated
logit (classify.classify_in_calls), as vLLM scores a pair on a cross-encoder. The two sides pair as vLLM pairs them:
1 to 1, 1 to N (the one first text against every second text) or N to N (index by index); any other shape is a 400.
/rerank is the same score of one query against each document, in the Jina/Cohere shape, sorted by relevance. On an
embedding model usage counts tokens per pair, as vLLM's (`scoring.pair_tokens`), not the tokens embedded; on a
cross-encoder the tokens of each pair's encoding.

vLLM registers these routes only for pooling models, so a generate server answers them 404 (here with a message
saying how to start a pooling one, where vLLM's is FastAPI's bare "Not Found").
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Request, Response
from pydantic import Field

from flotilla.engine.pooling import scoring
from flotilla.engine.pooling.params import PoolingParams
from flotilla.engine.pooling.prompts import check_prompt
from flotilla.engine.prompt_truncation import truncate_prompt
from flotilla.engine.server.classify import classify_in_calls
from flotilla.engine.server.embeddings import MAX_EMBEDDING_INPUTS, embed_in_calls
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.json_reply import json_response
from flotilla.engine.server.protocol import _RequestBody
from flotilla.engine.server.request_extras import CACHE_SALT_MAX_CHARS, PRIORITY_MAX, PRIORITY_MIN, response_ids
from flotilla.engine.server.request_id_header import BodyRequestId, named_by_header

if TYPE_CHECKING:
    from flotilla.engine.server.app import ServerState

# Texts one request embeds, both sides together (1 to N embeds the one first text once): the embeddings cap, so a
# score or rerank request costs at most what one /v1/embeddings request may.
MAX_SCORE_TEXTS = MAX_EMBEDDING_INPUTS

# vLLM's four spellings of a score request's two sides, in the order it tries them.
SCORE_SIDES = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))

ScoreInputs = str | list[str]


class _ScoringRequest(_RequestBody):
    """What /score and /rerank share: vLLM's pooling extras, with /v1/embeddings' meanings and bounds."""

    model: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    request_id: BodyRequestId | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=CACHE_SALT_MAX_CHARS)
    priority: int = Field(0, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    # vLLM's switch for a classifier's activation (false: a cross-encoder's raw logit); a cosine score is the same
    # with or without normalised vectors
    use_activation: bool | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class ScoreRequest(_ScoringRequest):
    """POST /score: `text_1` against `text_2` (or vLLM's other spellings of the two sides, SCORE_SIDES)."""

    text_1: ScoreInputs | None = None
    text_2: ScoreInputs | None = None
    queries: ScoreInputs | None = None
    documents: ScoreInputs | None = None
    items: ScoreInputs | None = None
    data_1: ScoreInputs | None = None
    data_2: ScoreInputs | None = None

    def sides(self) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
        """The two sides as (field name, texts), a lone string as a list of one; a 400 unless exactly one of
        SCORE_SIDES' pairs is given."""
        given = {name for pair in SCORE_SIDES for name in pair if getattr(self, name) is not None}
        for first, second in SCORE_SIDES:
            if given == {first, second}:
                return (first, _listed(getattr(self, first))), (second, _listed(getattr(self, second)))
        raise APIError(400, f"give text_1 and text_2 (or vLLM's queries with documents or items, or data_1 with "
                            f"data_2), one pair of them; got {sorted(given) or 'none'}", param="text_1")


class RerankRequest(_ScoringRequest):
    """POST /rerank (Jina's and Cohere's shape): `query` against each of `documents`."""

    query: str
    documents: list[str]
    top_n: int = 0  # 0 or less: every document, as vLLM
    return_documents: bool = True  # Jina's; vLLM always returns them


def _listed(value: ScoreInputs) -> list[str]:
    return [value] if isinstance(value, str) else value


def check_pairing(first: tuple[str, list[str]], second: tuple[str, list[str]]) -> None:
    """vLLM's pairing rule (scoring.check_pairing), and at most MAX_SCORE_TEXTS texts together."""
    (name_1, texts_1), (name_2, texts_2) = first, second
    scoring.check_pairing((name_1, len(texts_1)), (name_2, len(texts_2)))
    if len(texts_1) + len(texts_2) > MAX_SCORE_TEXTS:  # before any text is tokenized
        raise APIError(400, f"{name_1} and {name_2} list {len(texts_1) + len(texts_2)} texts together; at most "
                            f"{MAX_SCORE_TEXTS} are embedded per request (send more requests)", param=name_2)


async def score_texts(state: ServerState, body: _ScoringRequest, first: tuple[str, list[str]],
                      second: tuple[str, list[str]], response_id: str) -> tuple[list[float], int]:
    """(each pair's score, the usage's tokens: `scoring.pair_tokens`): every text tokenized and checked before any is
    embedded, then the two sides embedded in one list of engine calls."""
    if state.runner != "pooling":  # before any text is read
        raise APIError(404, SCORE_NEEDS_POOLING, param="model")
    _refuse_unservable(body)
    check_pairing(first, second)
    if state.convert == "classify":
        return await _cross_encoder_scores(state, body, first, second, response_id)
    prompts = []
    for name, texts in (first, second):
        for i, text in enumerate(texts):
            ids = await state.serving.encode(text, add_special_tokens=True, param=name,
                                             keep=body.truncate_prompt_tokens, side=body.truncation_side)
            ids = truncate_prompt(ids, body.truncate_prompt_tokens, state.max_model_len, body.truncation_side or "left")
            check_prompt(i, ids, state.max_model_len, state.vocab_size, param=name)
            prompts.append(ids)
    outputs = await embed_in_calls(state, prompts, PoolingParams(), body.cache_salt, response_id)
    vectors = [o.embedding for o in outputs]
    split = len(first[1])
    counts = [len(ids) for ids in prompts]
    return (scoring.cosine_scores(vectors[:split], vectors[split:]),
            scoring.pair_tokens(counts[:split], counts[split:], state.serving.tokenizer.pad_token_id))


async def _cross_encoder_scores(state: ServerState, body: _ScoringRequest, first: tuple[str, list[str]],
                                second: tuple[str, list[str]], response_id: str) -> tuple[list[float], int]:
    """(each pair's score, the tokens classified) on a one-label classifier: each pair as one prompt (the tokenizer's
    pair encoding), its score the activated logit (a sigmoid, or the logit with `use_activation` false)."""
    if len(state.labels) != 1:
        raise APIError(400, f"this classifier has {len(state.labels)} labels: a cross-encoder score needs one (use "
                            "/classify for its class probabilities)", param="model")
    if body.truncation_side is not None:
        raise APIError(400, "truncation_side is not supported on a cross-encoder: truncate_prompt_tokens cuts a pair "
                            "as its tokenizer does, the longer text first (leave it out)", param="truncation_side")
    (_, texts_1), (name_2, texts_2) = first, second
    prompts = []
    for i, (text_1, text_2) in enumerate(scoring.pairs(texts_1, texts_2)):
        ids = await state.serving.encode_pair(text_1, text_2, body.truncate_prompt_tokens, param=name_2)
        check_prompt(i, ids, state.max_model_len, state.vocab_size, param=name_2)
        prompts.append(ids)
    outputs = await classify_in_calls(state, prompts, body.use_activation is not False, body.cache_salt, response_id)
    return [o.probs[0] for o in outputs], sum(o.num_prompt_tokens for o in outputs)


# A generate server's answer on these routes: vLLM does not register them there (a 404).
SCORE_NEEDS_POOLING = ("scoring and reranking are served by the pooling runner (an embedding model's cosine "
                       "similarity, or a classifier's cross-encoder score); start the server with --runner pooling "
                       "(or --task embed, or a *ForSequenceClassification model)")


def _refuse_unservable(body: _ScoringRequest) -> None:
    """400 naming a vLLM extra that cannot be honoured here, as /v1/embeddings refuses it."""
    if body.mm_processor_kwargs:
        raise APIError(400, "mm_processor_kwargs is not supported: this server scores text only (leave it out)",
                       param="mm_processor_kwargs")
    if body.priority != 0:
        raise APIError(400, "priority is not supported here: the pooling pass runs between engine steps, outside the "
                            "scheduler's queue that priority orders (leave it out, or 0)", param="priority")


async def create_score(state: ServerState, body: ScoreRequest, model: str) -> dict[str, Any]:
    """vLLM's score response: one `{"index", "object": "score", "score"}` per pair, in pair order."""
    first, second = body.sides()
    response_id = response_ids("score", body.request_id)[0]
    scores, tokens = await score_texts(state, body, first, second, response_id)
    return {
        "id": response_id,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


async def create_rerank(state: ServerState, body: RerankRequest, model: str) -> dict[str, Any]:
    """vLLM's rerank response: the documents by descending score (their request index in `index`), the first
    `top_n` of them when it is above 0 (vLLM's: 0 or a negative number returns them all)."""
    response_id = response_ids("rerank", body.request_id)[0]
    scores, tokens = await score_texts(state, body, ("query", [body.query]), ("documents", body.documents),
                                       response_id)
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[:body.top_n if body.top_n > 0 else None]
    results: list[dict[str, Any]] = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            result["document"] = {"text": body.documents[i]}
        results.append(result)
    return {"id": response_id, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results}


SCORE_PATHS = ("/score", "/v1/score")
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")


def add_score_routes(app: FastAPI, state: ServerState, model_of: Any, until_disconnect: Any) -> None:
    """Register SCORE_PATHS and RERANK_PATHS; `model_of` and `until_disconnect` as for /v1/embeddings (app.py)."""

    async def answer(work: Any, request: Request) -> Response:
        result = await until_disconnect(work, request)
        return await json_response(result) if isinstance(result, dict) else result

    # Each path written out (not a loop over SCORE_PATHS): tests/test_readme_claims.py reads the declared routes.
    @app.post("/score", response_model=None)
    @app.post("/v1/score", response_model=None)
    async def score(body: ScoreRequest, request: Request) -> Response:
        body = named_by_header(body, request.headers)
        return await answer(create_score(state, body, model_of(state, body.model)), request)

    @app.post("/rerank", response_model=None)
    @app.post("/v1/rerank", response_model=None)
    @app.post("/v2/rerank", response_model=None)
    async def rerank(body: RerankRequest, request: Request) -> Response:
        body = named_by_header(body, request.headers)
        return await answer(create_rerank(state, body, model_of(state, body.model)), request)

