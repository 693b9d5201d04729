"""OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`), vLLM's subset of it.

A request is turned into a chat conversation (`instructions` as the system message, then the stored
conversation of `previous_response_id`, then `input`, a text or a list of messages), rendered with the
model's chat template and generated like a chat completion. Streaming sends the Responses event
sequence (`response.created` ... `response.output_text.delta` ... `response.completed`). Responses are
kept in a bounded in-memory store (the oldest is dropped first) for `previous_response_id` and GET;
`store: false` keeps one out. Function tools need tool-call parsing and are refused until it lands.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from flotilla.engine.outputs import RequestOutput
from flotilla.engine.sampling_params import REPETITION_PENALTY_MAX, REPETITION_PENALTY_MIN, SEED_MAX, SEED_MIN
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.protocol import ChatCompletionRequest, ChatMessage, _RequestBody
from flotilla.engine.server.request_extras import CACHE_SALT_MAX_CHARS, PRIORITY_MAX, PRIORITY_MIN, engine_kwargs
from flotilla.engine.server.serving import OpenAIServing, admitted, sampling_params
from flotilla.validation_messages import describe

# Responses kept for `previous_response_id` and GET; each holds its conversation's text.
STORE_CAPACITY = 1024


class ResponsesRequest(_RequestBody):
    """POST /v1/responses: the fields Flotilla acts on (others are accepted and logged, as elsewhere)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    user: str | None = None
    # vLLM's extras
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, ge=REPETITION_PENALTY_MIN, le=REPETITION_PENALTY_MAX)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    priority: int = Field(0, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    cache_salt: str | None = Field(None, min_length=1, max_length=CACHE_SALT_MAX_CHARS)
    request_id: str | None = Field(None, min_length=1, max_length=256)


@dataclass
class _Stored:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]  # user/assistant messages, without the instructions


class ResponseStore:
    """Finished responses by id, at most `capacity` of them (the least recently stored goes first)."""

    def __init__(self, capacity: int = STORE_CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, _Stored] = OrderedDict()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        """Keep a finished response and the conversation that ends with it."""
        self._items[response["id"]] = _Stored(response, conversation)
        self._items.move_to_end(response["id"])
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> _Stored:
        """The stored response; 404 (OpenAI's error JSON) when unknown or dropped."""
        stored = self._items.get(response_id)
        if stored is None:
            raise APIError(404, f"Response with id '{response_id}' not found (unknown, not stored, or dropped "
                                f"from the in-memory store of {self.capacity} responses)",
                           param="previous_response_id", code="response_not_found")
        return stored


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `input` field as chat messages: a text is one user message; message items keep their role,
    their text parts (`input_text`, `output_text`, `text`) joined."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages = []
    for item in items:
        kind = item.get("type", "message")
        if kind != "message":
            raise APIError(400, f"input items of type {kind!r} are not supported yet (only messages)", param="input")
        content = item.get("content")
        if isinstance(content, list):
            if any(not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text")
                   for part in content):
                raise APIError(400, "only text content parts are supported", param="input")
            content = "".join(str(part.get("text", "")) for part in content)
        if not isinstance(content, str) or item.get("role") not in ("user", "assistant", "system", "developer"):
            raise APIError(400, "each input message needs a role (user, assistant, system, developer) and text "
                                "content", param="input")
        messages.append({"role": item["role"], "content": content})
    return messages


class ResponsesServing:
    """Responses on top of the chat path of `OpenAIServing` (template, tokenizer, engine)."""

    def __init__(self, serving: OpenAIServing, store: ResponseStore | None = None) -> None:
        self.serving = serving
        self.store = store or ResponseStore()

    async def create(self, req: ResponsesRequest, model: str) -> dict[str, Any] | AsyncIterator[str]:
        """POST /v1/responses: the finished response, or its event stream."""
        if req.tools and req.tool_choice != "none":
            raise APIError(400, "function tools in the Responses API are not supported yet", param="tools")
        text_format = (req.text or {}).get("format") or {}
        fmt = text_format.get("type", "text") if isinstance(text_format, dict) else text_format
        if fmt != "text":
            raise APIError(400, f"text.format {fmt!r} is not supported yet", param="text")
        history = self.store.get(req.previous_response_id).conversation if req.previous_response_id else []
        conversation = history + input_messages(req.input)
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        try:
            chat = ChatCompletionRequest(
                messages=[ChatMessage(**m) for m in system + conversation], temperature=req.temperature,
                top_p=req.top_p, top_k=req.top_k, min_p=req.min_p, repetition_penalty=req.repetition_penalty,
                seed=req.seed)
        except ValidationError as exc:
            raise APIError(400, "invalid request: " + "; ".join(describe(exc.errors())), param="input") from None
        prompt = await self.serving.chat_prompt(chat)
        sp = sampling_params(chat, req.max_output_tokens, len(prompt.token_ids), self.serving.max_model_len, None)
        if not req.stream:  # only the end is read: spare the per-step outputs
            sp = sp.model_copy(update={"output_kind": "final_only"})
        response_id = req.request_id or f"resp_{uuid.uuid4().hex}"
        base, message_id = _response(req, response_id, model), f"msg_{uuid.uuid4().hex}"
        stream = await admitted(self.serving.engine.generate(
            prompt.token_ids, sp, f"{response_id}-{uuid.uuid4().hex[:8]}", prompt.text, self.serving.lora_for(model),
            **engine_kwargs(req.priority, req.cache_salt)))
        if req.stream:
            return self._events(req, base, message_id, stream, conversation)
        final = None
        try:
            async for output in stream:
                final = output
        finally:
            await stream.aclose()  # aborts the request if this task is cancelled (the client left)
        assert final is not None and final.finished
        return self._finish(req, base, message_id, final, conversation)

    def get(self, response_id: str) -> dict[str, Any]:
        """GET /v1/responses/{id}."""
        return self.store.get(response_id).response

    def _finish(self, req: ResponsesRequest, base: dict[str, Any], message_id: str, output: RequestOutput,
                conversation: list[dict[str, Any]]) -> dict[str, Any]:
        """The finished response object (stored unless `store` is false)."""
        c = output.outputs[0]
        complete = c.finish_reason != "length"
        response = {**base, "status": "completed" if complete else "incomplete",
                    "incomplete_details": None if complete else {"reason": "max_output_tokens"},
                    "output": [_message(message_id, c.text, "completed" if complete else "incomplete")],
                    "usage": _usage(output)}
        if req.store:
            self.store.put(response, [*conversation, {"role": "assistant", "content": c.text}])
        return response

    async def _events(self, req: ResponsesRequest, base: dict[str, Any], message_id: str, stream: Any,
                      conversation: list[dict[str, Any]]) -> AsyncIterator[str]:
        """The Responses event stream, numbered by `sequence_number`."""
        seq = iter(range(1 << 62))
        start = base
        where = {"item_id": message_id, "output_index": 0, "content_index": 0}
        yield _event("response.created", next(seq), response=start)
        yield _event("response.in_progress", next(seq), response=start)
        yield _event("response.output_item.added", next(seq), output_index=0,
                     item=_message(message_id, None, "in_progress"))
        yield _event("response.content_part.added", next(seq), **where, part=_text_part(""))
        sent, final = 0, None
        try:
            async for output in stream:
                final = output
                text = output.outputs[0].text
                if len(text) > sent:
                    yield _event("response.output_text.delta", next(seq), **where, delta=text[sent:], logprobs=[])
                    sent = len(text)
        finally:
            await stream.aclose()
        assert final is not None
        response = self._finish(req, base, message_id, final, conversation)
        text = final.outputs[0].text
        yield _event("response.output_text.done", next(seq), **where, text=text, logprobs=[])
        yield _event("response.content_part.done", next(seq), **where, part=_text_part(text))
        yield _event("response.output_item.done", next(seq), output_index=0, item=response["output"][0])
        yield _event("response.completed" if response["status"] == "completed" else "response.incomplete",
                     next(seq), response=response)


def _response(req: ResponsesRequest, response_id: str, model: str) -> dict[str, Any]:
    """The response object's fields known before generation (status in_progress, no output yet)."""
    return {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model,
            "status": "in_progress", "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p, "tool_choice": req.tool_choice, "tools": [],
            "text": {"format": {"type": "text"}}, "truncation": "disabled", "store": req.store,
            "user": req.user, "output": [], "usage": None}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(message_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"id": message_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _usage(output: RequestOutput) -> dict[str, Any]:
    prompt, generated = len(output.prompt_token_ids), len(output.outputs[0].token_ids)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + generated}


def _event(kind: str, sequence_number: int, **fields: Any) -> str:
    """One server-sent event of the Responses stream (`event:` names its type, as OpenAI's)."""
    payload = {"type": kind, "sequence_number": sequence_number, **fields}
    return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"
