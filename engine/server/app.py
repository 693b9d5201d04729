"""The FastAPI application: routes, API-key check, drain state (errors as OpenAI's: server/errors.py)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response, StreamingResponse
from starlette.datastructures import Headers

from flotilla import __version__
from flotilla.engine.config import ServerConfig
from flotilla.engine.errors import EngineBusyError, EngineDeadError, RequestFailedError
from flotilla.engine.server.classify import add_classify_route
from flotilla.engine.server.embeddings import add_embedding_routes
from flotilla.engine.server.errors import APIError, add_error_handlers, error_body, error_response
from flotilla.engine.server.invocations import add_invocations_to_schema, invocations_route
from flotilla.engine.server.json_reply import json_response
from flotilla.engine.server.lora_routes import adapter_models, add_lora_routes, runtime_lora_updating_allowed
from flotilla.engine.server.metrics import CONTENT_TYPE, EngineMetrics
from flotilla.engine.server.model_cards import model_card
from flotilla.engine.server.pooling_route import add_pooling_route
from flotilla.engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from flotilla.engine.server.request_body import BodyParsedOffTheLoop
from flotilla.engine.server.request_id_header import RequestIdHeader, checked_request_id
from flotilla.engine.server.request_limits import RequestLimits
from flotilla.engine.server.responses import ResponsesRequest, ResponsesServing
from flotilla.engine.server.score import RERANK_PATHS, SCORE_PATHS, add_score_routes
from flotilla.engine.server.serving import OpenAIServing
from flotilla.engine.server.sleep_routes import add_sleep_routes, server_dev_mode
from flotilla.engine.server.tool_calls import plan_tools
from flotilla.engine.serving_engine import ServingEngine

logger = logging.getLogger(__name__)


@dataclass
class ServerState:
    """What the routes share: the engine, names, key, metrics and whether we are draining."""

    engine: ServingEngine
    serving: OpenAIServing
    model_names: list[str]
    metrics: EngineMetrics
    api_keys: list[str] | None = None  # --api-key's (any one is accepted) or VLLM_API_KEY's
    max_model_len: int = 0
    vocab_size: int = 0
    kv_cache_dtype: str = ""  # what a KV element is stored as, as the start-up log names it
    quantization: str | None = None
    runner: str = "generate"  # the engine's --runner: "pooling" serves /v1/embeddings or /classify
    convert: str = "none"  # the pooling runner's --convert: "embed" (embeddings) or "classify" (/classify)
    # a classifier's label names (config.json's id2label) and its activation (engine/pooling/classifier_config.py)
    labels: list[str] = field(default_factory=list)
    activation: str = "softmax"
    draining: bool = False
    created: int = 0
    # The model as given (vLLM's model card `root`: the path or repository, not a served name); "" for the first name
    model_path: str = ""
    # vLLM's /load: generation and embedding requests in progress (counted with --enable-server-load-tracking)
    track_load: bool = False
    server_load: int = 0
    # API requests being answered (/v1 and the unversioned API routes: `_api_path`; Gate counts them): the drain
    # waits for these too, not only for engine requests (an embeddings list runs as engine calls; a reply may still
    # be sending).
    in_flight: int = 0


def build_app(state: ServerState, config: ServerConfig | None = None) -> FastAPI:
    """Create the app for one engine, with the request limits of `config` (defaults when None)."""
    config = config or ServerConfig()
    # No Swagger UI or ReDoc page (they load scripts from a CDN); the schema unless --disable-fastapi-docs.
    app = FastAPI(title="Flotilla", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None if config.disable_fastapi_docs else "/openapi.json")
    app.state.flotilla = state
    # Every route declared below parses and validates its body on a worker thread (a few MB of small JSON values
    # took seconds, which on the event loop stopped every stream).
    app.router.route_class = BodyParsedOffTheLoop
    add_error_handlers(app)
    _add_probe_routes(app, state)
    _add_model_routes(app, state)
    _add_generation_routes(app, state)
    _add_token_routes(app, state)
    add_embedding_routes(app, state, _model, _cancel_on_disconnect)
    add_score_routes(app, state, _model, _cancel_on_disconnect)
    add_pooling_route(app, state, _model, _cancel_on_disconnect)
    add_classify_route(app, state, _model, _cancel_on_disconnect)
    app.router.routes.append(invocations_route(state))
    add_invocations_to_schema(app)
    if state.serving.loras is not None and runtime_lora_updating_allowed():
        add_lora_routes(app, state.engine, state.serving.loras)
    if server_dev_mode():
        add_sleep_routes(app, state.engine)
    _add_middleware(app, state, config)
    return app


def _add_probe_routes(app: FastAPI, state: ServerState) -> None:
    """/health, /ping, /load, /version and /metrics: what probes and scrapers read (`PUBLIC_PATHS`)."""

    @app.get("/health")
    async def health() -> Response:
        if state.draining or not state.engine.is_alive:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:  # vLLM's SageMaker probe: /health's answer
        return await health()

    @app.get("/load")
    async def load() -> dict[str, int]:  # vLLM's: 0 unless --enable-server-load-tracking
        return {"server_load": state.server_load}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)


def _add_model_routes(app: FastAPI, state: ServerState) -> None:
    """/v1/models and /v1/models/{id}: the served names and the loaded adapters, as model cards."""

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [_model_card(state, name) for name in state.model_names]
        return {"object": "list", "data": data + adapter_models(state.serving.loras, state.created)}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if not model_id:  # /v1/models/: the list, where vLLM's redirect to /v1/models ends (not the first card)
            return await models()
        name = _model(state, model_id, code="model_not_found")
        if name in state.model_names:
            return _model_card(state, name)
        # an adapter: its own card, as the list gives it (it was the base model's card under the adapter's name)
        for card in adapter_models(state.serving.loras, state.created):
            if card["id"] == name:
                return card
        # (unloaded since _model looked: the registry is shared with other threads; a 404, not a 500)
        raise APIError(404, f"The model `{name}` does not exist", param="model", code="model_not_found")


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    """The model card of served name `name` (vLLM's fields, with the KV dtype and quantization)."""
    return model_card(name, state.created, state.model_path or state.model_names[0], max_model_len=state.max_model_len,
                      kv_cache_dtype=state.kv_cache_dtype, quantization=state.quantization)


def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    """/v1/responses, /v1/completions and /v1/chat/completions: each cancelled when its client goes away."""
    responses = ResponsesServing(state.serving)

    @app.post("/v1/responses", response_model=None)
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        work = responses.create(body, _model(state, body.model), checked_request_id(request.headers))
        result = await _cancel_on_disconnect(work, request)
        return await _respond(result, request)

    @app.get("/v1/responses/{response_id}", response_model=None)
    async def get_response(response_id: str) -> Response:
        # stored encoded (responses.StoredResponse): sent as it is
        return Response(responses.get(response_id), media_type="application/json")

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> dict[str, Any]:
        return responses.delete(response_id)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        body = _named_by_header(body, request)
        result = await _cancel_on_disconnect(state.serving.completions(body, _model(state, body.model)), request)
        return await _respond(result, request)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        body = _named_by_header(body, request)
        result = await _cancel_on_disconnect(state.serving.chat(body, _model(state, body.model)), request)
        return await _respond(result, request)


def _add_token_routes(app: FastAPI, state: ServerState) -> None:
    """/tokenize and /detokenize (vLLM's): the model's tokenizer, without the engine."""

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        _model(state, body.model)
        serving = state.serving
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt or messages", param="prompt")
        if body.prompt is not None:
            add_special = body.add_special_tokens is not False
            tokens = await serving.encode(body.prompt, add_special_tokens=add_special)
        else:
            # tool_choice "none": the tools are rendered (as vLLM's /tokenize does) and none is asked for
            req = ChatCompletionRequest(messages=body.messages, add_generation_prompt=body.add_generation_prompt,
                                        continue_final_message=body.continue_final_message,
                                        add_special_tokens=bool(body.add_special_tokens), tools=body.tools,
                                        tool_choice="none", chat_template=body.chat_template,
                                        chat_template_kwargs=body.chat_template_kwargs)
            tokens = (await serving.chat_prompt(req, plan_tools(req, False, None).template_tools)).token_ids
        # on a worker thread, as the encode: a body's worth of ids is a long call
        strings = await asyncio.to_thread(serving.tokenizer.convert_ids_to_tokens, tokens) if body.return_token_strs \
            else None
        return {"count": len(tokens), "max_model_len": state.max_model_len, "tokens": tokens, "token_strs": strings}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, str]:
        _model(state, body.model)
        vocab = state.vocab_size  # the model's (maybe padded) vocabulary, as the engine checks prompts
        # On a worker thread, as the decode: a body's worth of ids takes tens of milliseconds to check.
        if await asyncio.to_thread(lambda: any(not 0 <= t < vocab for t in body.tokens)):
            raise APIError(400, f"token ids must lie in [0, {vocab})", param="tokens")
        return {"prompt": await state.serving.decode(body.tokens)}


def _add_middleware(app: FastAPI, state: ServerState, config: ServerConfig) -> None:
    """The middleware around the routes; each added one wraps all before it, so the last added runs first."""
    app.add_middleware(Gate, state=state)
    if config.enable_request_id_headers:
        app.add_middleware(RequestIdHeader)
    # Cross-origin requests from browsers, as vLLM answers them (its default: any origin); outside the Gate, so a
    # preflight (OPTIONS, which carries no key) is answered without the key, as vLLM's.
    app.add_middleware(CORSMiddleware, allow_origins=config.allowed_origins, allow_methods=config.allowed_methods,
                       allow_headers=config.allowed_headers, allow_credentials=config.allow_credentials)
    # Outermost: a request over a limit is refused before any route or middleware works on it.
    app.add_middleware(RequestLimits, max_body_size=config.max_request_body_size,
                       body_timeout=config.body_read_timeout, max_header_count=config.h11_max_header_count,
                       body_budget=config.max_body_bytes_in_flight)


class Gate:
    """ASGI middleware in front of the routes: 503 on API routes (`_api_path`) while draining, 401 without the API
    key (all but `PUBLIC_PATHS`); counts the API requests it lets through (`ServerState.in_flight`) until their
    answers are sent.

    Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware reads the body
    through a task group, which would wrap a body-limit error (413/408) into a generic 400.
    """

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Refuse API requests while draining; without the key, every request but the public probes (as
        vLLM's `PUBLIC_ENDPOINTS`); pass everything else on."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # uvicorn's path includes --root-path (the ASGI rule); the routes and these checks are below it
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        refusal = None
        if _api_path(path) and self.state.draining:
            refusal = error_response(503, "the server is shutting down; retry on another replica")
        elif (self.state.api_keys is not None and not _public(path)
              and not _authorised(Headers(scope=scope), self.state.api_keys)):
            refusal = error_response(401, "Unauthorized: a valid API key is required (Authorization: Bearer <key>)",
                                     code="invalid_api_key")
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if _api_path(path):
            load = int(self.state.track_load and scope["method"] == "POST" and path in LOAD_AWARE_PATHS)
            self.state.in_flight += 1
            self.state.server_load += load
            try:
                await self.app(scope, receive, send)
            finally:
                self.state.in_flight -= 1
                self.state.server_load -= load
            return
        await self.app(scope, receive, send)


def _named_by_header(body: Any, request: Request) -> Any:
    """The body with the X-Request-Id header as its `request_id` (the header wins, as in vLLM)."""
    header = checked_request_id(request.headers)
    return body if header is None else body.model_copy(update={"request_id": header})


# Paths that answer without the API key (vLLM's PUBLIC_ENDPOINTS, less its API docs, which this server does not
# serve): probes and scrapes. Every other path needs the key, /tokenize and /detokenize included (as vLLM; they
# were open here, so any client could make the server parse and tokenize a body-limit's worth of text).
PUBLIC_PATHS = ("/health", "/ping", "/load", "/version", "/metrics", "/openapi.json")


# The routes whose requests vLLM's /load counts (load_aware_call), as far as this server has them.
LOAD_AWARE_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses",
                              *SCORE_PATHS, *RERANK_PATHS, "/pooling", "/classify", "/invocations"})

# The API routes outside /v1 (vLLM's paths): refused while draining and counted in flight, as the /v1 routes.
UNVERSIONED_API_PATHS = frozenset({*SCORE_PATHS, *RERANK_PATHS, "/pooling", "/classify", "/invocations"})


def _api_path(path: str) -> bool:
    """Whether `path` is an API route (under /v1, or one of UNVERSIONED_API_PATHS) rather than a probe or /tokenize."""
    return path.startswith("/v1") or path in UNVERSIONED_API_PATHS


def _public(path: str) -> bool:
    """Whether `path` is a public path or under one (on a segment boundary: /healthz is not /health)."""
    return any(path == public or path.startswith(public + "/") for public in PUBLIC_PATHS)


def _authorised(headers: Headers, keys: list[str]) -> bool:
    """Whether the request's `Authorization: Bearer <key>` names one of `keys`."""
    header = headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    # Constant-time: response timing must not reveal how much of a guessed key matched, nor (every key is compared,
    # as SHA-256 digests of one length) which key came closest or how long the keys are.
    digest = hashlib.sha256(given.strip().encode()).digest()
    matches = [hmac.compare_digest(digest, hashlib.sha256(key.encode()).digest()) for key in keys]
    return scheme.lower() == "bearer" and any(matches)


def _model(state: ServerState, requested: str | None, code: str | None = None) -> str:
    """The served name a request addresses; 404 for names this server does not serve, with vLLM's error code (the
    status) unless `code` (OpenAI's "model_not_found" for its model-retrieval route, which vLLM does not have)."""
    if requested is None or requested == "":
        return state.model_names[0]
    loras = state.serving.loras
    if requested not in state.model_names and (loras is None or loras.get(requested) is None):
        served = state.model_names + ([lora.lora_name for lora, _ in loras.entries()] if loras is not None else [])
        raise APIError(404, f"The model `{requested}` does not exist. Served: {', '.join(served)}",
                       param="model", code=code)
    return requested


async def _cancel_on_disconnect(work: Awaitable[Any], request: Request) -> Any:
    """Await `work`, cancelling it (which aborts its engine requests) if the client goes away first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    listener = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return error_response(499, "client disconnected")
    return task.result()


async def _respond(result: dict[str, Any] | AsyncIterator[str] | Response, request: Request) -> Response:
    if isinstance(result, Response):
        return result
    if isinstance(result, dict):
        return await json_response(result)  # a large one encoded off the loop
    return StreamingResponse(_until_disconnect(result, request), media_type="text/event-stream")


class _LoopTurn:
    """Whether the event loop has run a turn since `start`: a callback queued then has run."""

    __slots__ = ("_loop", "passed")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.passed = True

    def start(self) -> None:
        """Count from now."""
        self.passed = False
        self._loop.call_soon(self._pass)

    def _pass(self) -> None:
        self.passed = True


async def _until_disconnect(stream: AsyncIterator[str], request: Request) -> AsyncIterator[str]:
    """Relay SSE chunks, one write per turn of the event loop; an engine failure mid-stream becomes a final error
    event, not a dropped socket.

    A piece of the stream holds one step's events (n choices' chunks, or the n role chunks, joined by the stream:
    one write where n writes cost n system calls and n loop turns). Pieces are also often ready at once (several
    prompts' steps). Written in one turn, the first write that finds the client gone (a reset, or a close racing
    the step) only marks the socket lost; uvicorn hears of it in the next turn, so the rest of the burst went to
    the dead socket, each write past the fifth logging asyncio's "socket.send() raised exception." (a log flood
    any client could cause). Yielding to the loop between two pieces of a burst lets the loss be heard first: the
    next send is dropped, and the disconnect cancels the stream (aborting its requests) a turn later. A piece that
    had to wait for its step comes a turn (or many) after the one before already, and is written without one more
    (a task switch per stream per step is a few percent of the event loop at hundreds of streams)."""
    turn = _LoopTurn(asyncio.get_running_loop())
    try:
        async for chunk in stream:
            if not turn.passed:  # the chunk before went out in this very turn of the loop
                await asyncio.sleep(0)
            yield chunk
            turn.start()
    except (APIError, EngineDeadError, EngineBusyError, RequestFailedError, ValueError) as exc:
        busy = isinstance(exc, EngineDeadError | EngineBusyError)
        status = exc.status if isinstance(exc, APIError) else (503 if busy else 400)
        status = 500 if isinstance(exc, RequestFailedError) else status
        body = json.dumps(error_body(status, str(exc), getattr(exc, "param", None)), separators=(",", ":"))
        yield f"data: {body}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if isinstance(stream, AsyncGenerator):  # cancelled between chunks: close it now, aborting its requests
            await stream.aclose()
