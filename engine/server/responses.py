"""OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`), vLLM's subset of it.

A request is turned into a chat conversation (`instructions` as the system message, then the stored
conversation of `previous_response_id`, then `input`: a text, or message, `function_call` and
`function_call_output` items), rendered with the model's chat template and generated like a chat
completion, function tools and `text.format` included (responses_items.py maps them to chat's shapes,
so the chat path's grammar keeps `required` and named calls parseable). Streaming sends the Responses
event sequence (`response.created` ... `response.output_text.delta` / `response.function_call_arguments.delta`
... `response.completed`). With `--reasoning-parser`, the thinking is a `reasoning` output item before the message
(streamed as `response.reasoning_text.delta`s), as vLLM's. Responses are kept in a bounded in-memory store (the
oldest is dropped first) for `previous_response_id` and GET; `store: false` keeps one out.
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flotilla.engine.outputs import RequestOutput
from flotilla.engine.sampling_params import SEED_MAX, SEED_MIN
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.json_reply import OFF_LOOP_VALUES, built, json_body, off_the_loop
from flotilla.engine.server.protocol import ChatCompletionRequest, ChatMessage, JSONObjects, _RequestBody
from flotilla.engine.server.reasoning import ReasoningParser, ReasoningStream
from flotilla.engine.server.request_extras import CACHE_SALT_MAX_CHARS, PRIORITY_MAX, PRIORITY_MIN, engine_kwargs
from flotilla.engine.server.request_id_header import BodyRequestId
from flotilla.engine.server.responses_items import (
    assistant_turn,
    chat_response_format,
    chat_tool_choice,
    chat_tools,
    event_logprobs,
    function_call_item,
    input_messages,
    message_item,
    reasoning_item,
    reasoning_part,
    text_part,
)
from flotilla.engine.server.sampling_request import (
    RESPONSES_UNSUPPORTED_FIELDS,
    check_logprob_entries,
    refuse_unsupported_fields,
    sampling_params,
)
from flotilla.engine.server.serving import OpenAIServing, Prompt, admitted, reply_values
from flotilla.engine.server.sse import json_text, json_text_pieces, logprob_values
from flotilla.engine.server.tool_calls import ToolPlan, parse_values, plan_tools
from flotilla.engine.server.tool_parsers.base import ToolCall
from flotilla.engine.server.tool_stream import LogprobsOf, constrain_for_tools
from flotilla.validation_messages import describe

# Responses kept for `previous_response_id` and GET; each holds its conversation's text.
STORE_CAPACITY = 1024
# ... and at most this much of it, counted as each entry's JSON size (at least its text's UTF-8 bytes): 1,024 entries
# of up to a body's 8 MiB each (a whole conversation, `metadata`, `instructions`) could otherwise hold 8 GiB.
STORE_MAX_BYTES = 256 * 2**20
STORE_MAX_BYTES_ENV = "FLOTILLA_RESPONSES_STORE_BYTES"
# The `include` value asking for the output text's logprobs; the others are vLLM's accepted set (OpenAI's).
OUTPUT_LOGPROBS = "message.output_text.logprobs"
IncludeValue = Literal["code_interpreter_call.outputs", "computer_call_output.output.image_url",
                       "file_search_call.results", "message.input_image.image_url", "message.output_text.logprobs",
                       "reasoning.encrypted_content"]


class ReasoningOptions(BaseModel):
    """`reasoning`, OpenAI's shape (vLLM types it with the openai package's `Reasoning`; extra keys are kept)."""

    model_config = ConfigDict(extra="allow")

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(_RequestBody):
    """POST /v1/responses: the fields Flotilla acts on (others are accepted and logged, as elsewhere)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    input: str | JSONObjects
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    # Bounded below only, as vLLM's SamplingParams (OpenAI's own API stops at 2; vLLM serves more).
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(None, min_length=1)  # "" names no response: a 400, as OpenAI's
    metadata: dict[str, str] | None = None
    tools: JSONObjects | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    user: str | None = None
    # vLLM's extras
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)  # any finite number above 0, as vLLM
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    priority: int = Field(0, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    cache_salt: str | None = Field(None, min_length=1, max_length=CACHE_SALT_MAX_CHARS)
    request_id: BodyRequestId | None = None
    # vLLM's sampling and output fields of its Responses request, with its types and bounds, applied as chat's
    # (the chat request built from this one carries them to the one SamplingParams builder, sampling_request.py).
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM's object (structured_request.py reads it as chat's); not beside `text.format` (vLLM refuses both)
    structured_outputs: dict[str, Any] | None = None
    # Typed as vLLM's and accepted: vLLM ignores `prompt_cache_key`; the multimodal kwargs shape media only, and
    # this route reads text input (an image part is a 400 naming it), so they change nothing here.
    prompt_cache_key: str | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    # As chat's: false leaves the reasoning parser's thinking out of the output (no reasoning item, streamed or
    # not); it is still generated and split off, so the message is the answer alone (vLLM issue #56428 asked
    # this of vLLM's Responses API).
    include_reasoning: bool = True
    # Output logprobs, as vLLM's: asked for by `include` naming OUTPUT_LOGPROBS, each token with `top_logprobs`
    # alternatives (0: the token alone). vLLM's other `include` values are accepted and add nothing here: this
    # server makes none of the items they name (no built-in tool calls, no images, no encrypted reasoning).
    include: list[IncludeValue] | None = None
    # at most --max-logprobs, as chat's; -1 is vLLM's "the whole vocabulary" (SamplingParams' logprobs=-1)
    top_logprobs: int | None = Field(None, ge=-1)
    # OpenAI's fields that vLLM's request types (so a wrong type is a 400 naming the field, as there), served as
    # vLLM's chat-template path serves them: `truncation` "auto" keeps the prompt's last max_model_len -
    # max_output_tokens tokens (`_truncation`); `reasoning.effort` is the chat template's `reasoning_effort`
    # variable; `reasoning.summary`, `service_tier` and `max_tool_calls` change nothing here. `background: true` and
    # `prompt` are refused (`_refuse_unservable`).
    truncation: Literal["auto", "disabled"] | None = "disabled"
    reasoning: ReasoningOptions | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    max_tool_calls: int | None = None
    background: bool | None = False
    prompt: dict[str, Any] | None = None
    # vLLM's extras of its Responses request. `enable_response_messages` adds the raw prompt and output to the
    # response (`_raw_messages`). `previous_input_messages` (gpt-oss Harmony messages) and `previous_response` (a whole
    # response whose Harmony state rides in its reasoning items' encrypted_content) carry a conversation only on
    # vLLM's gpt-oss path; this server renders every model with its chat template, so they are refused
    # (`_refuse_unservable`), as are `vllm_xargs` and `kv_transfer_params` (left undeclared: chat's rule,
    # sampling_request.UNSUPPORTED_VLLM_FIELDS).
    enable_response_messages: bool = False
    previous_input_messages: list[Any] | None = None
    previous_response: dict[str, Any] | None = None


def _refuse_unservable(req: ResponsesRequest) -> None:
    """400 for `top_logprobs` above 0 without `include` asking for logprobs, which vLLM drops unsaid (as chat's
    `top_logprobs` without `logprobs: true`, a 400 there too, rather than a response without what was asked); for
    `background: true`, which vLLM runs as a task the client polls (this server would answer it in the request all the
    same, not what the client asked for); for `prompt`, which vLLM refuses too; for `structured_outputs` beside a
    `text.format` (vLLM's refusal, its words); for `previous_input_messages` and `previous_response`, which carry a
    conversation as gpt-oss Harmony state (vLLM reads them on that path only; its chat-template path drops them
    unsaid); and for `vllm_xargs` and `kv_transfer_params`, as chat and completions refuse them."""
    refuse_unsupported_fields(req, RESPONSES_UNSUPPORTED_FIELDS)
    if req.top_logprobs and not _wants_logprobs(req):
        raise APIError(400, f"top_logprobs needs include: [\"{OUTPUT_LOGPROBS}\"] (the Responses API returns "
                            "logprobs only when include asks for them)", param="top_logprobs")
    if req.background:
        raise APIError(400, "background is not supported: this server answers every response in the request that "
                            "creates it (leave background out, or stream)", param="background")
    if req.prompt is not None:  # vLLM's words
        raise APIError(400, "prompt template is not supported", param="prompt")
    if req.structured_outputs is not None and (req.text or {}).get("format") is not None:
        raise APIError(400, "Cannot specify both structured_outputs and text.format", param="structured_outputs")
    if req.previous_input_messages:
        raise APIError(400, "previous_input_messages is not supported: it carries gpt-oss Harmony messages, and this "
                            "server renders every conversation with the model's chat template (send the earlier "
                            "turns as input items, or continue with previous_response_id)",
                       param="previous_input_messages")
    if req.previous_response:
        raise APIError(400, "previous_response is not supported: it continues from gpt-oss Harmony state in the "
                            "response's reasoning encrypted_content, which this server does not produce (continue "
                            "with previous_response_id, or send the earlier turns as input items)",
                       param="previous_response")


def _wants_logprobs(req: ResponsesRequest) -> bool:
    return OUTPUT_LOGPROBS in (req.include or [])


def _template_kwargs(req: ResponsesRequest) -> dict[str, Any] | None:
    """The chat template's variables: `reasoning.effort` as `reasoning_effort`, the name vLLM passes it by (over the
    server's --default-chat-template-kwargs, as a request's own kwargs are); none when no effort is given."""
    effort = req.reasoning.effort if req.reasoning else None
    return {"reasoning_effort": effort} if effort is not None else None


def _truncation(req: ResponsesRequest, max_model_len: int) -> int | None:
    """The prompt tokens `truncation` keeps (chat's `truncate_prompt_tokens`): "auto" keeps the last max_model_len -
    max_output_tokens (all of max_model_len when it is not given, which leaves no room to generate, so a prompt cut
    to it is still refused: vLLM's count, TokenizeParams' max_input_tokens); "disabled" none (a prompt too long is a
    400)."""
    if req.truncation != "auto":
        return None
    keep = max_model_len - (req.max_output_tokens or 0)
    if keep < 1:  # vLLM: max_output_tokens above max_model_len is a 400 naming it (equal: an empty prompt)
        raise APIError(400, f"max_output_tokens={req.max_output_tokens} leaves no room for the input in this model's "
                            f"maximum context length of {max_model_len} tokens (truncation \"auto\" keeps the input's "
                            "last max_model_len - max_output_tokens tokens); request fewer output tokens",
                       param="max_output_tokens")
    return keep


def _refuse_a_full_context(kept: int | None, prompt_len: int, max_model_len: int) -> None:
    """400 for truncation "auto" without max_output_tokens on an input cut to the whole context (vLLM's count): no
    room is left to generate. Named here, not by the engine's generic too-long refusal, as the fix is another field."""
    if kept == prompt_len == max_model_len:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens: truncation \"auto\" "
                            "keeps the input's last max_model_len - max_output_tokens tokens, and without "
                            "max_output_tokens that leaves no room to generate (give max_output_tokens)",
                       param="max_output_tokens")


@dataclass
class StoredResponse:
    """A finished response as the store keeps it: its JSON body, as GET sends it, and the conversation it ends."""

    response_id: str
    # Bytes, not the response's dicts: a response with output logprobs is millions of objects (1.57M logprob entries
    # for 32 tokens of whole-vocabulary alternatives), and kept alive in the store each of the garbage collector's
    # full passes, on the event loop, walked them all (/health waited 12 s behind a 133 MB one, 1 s unstored)
    body: bytes
    conversation: list[dict[str, Any]]  # user/assistant messages, without the instructions
    # What it counts against the store's byte bound: the body's bytes and the conversation's JSON (ASCII escapes:
    # never fewer than its UTF-8 bytes). The whole conversation counts, though a chain's entries share their earlier
    # messages: an over-count that drops a long chain's older entries sooner (continuing it needs only the newest).
    size: int


def stored(response: dict[str, Any], conversation: list[dict[str, Any]], body: bytes | None = None) -> StoredResponse:
    """`response` and its `conversation` as the store keeps them (blocking: a large one is encoded on a worker
    thread); `body`: the response's JSON body (`json_body`) when it is encoded already."""
    body = json_body(response) if body is None else body
    return StoredResponse(response["id"], body, conversation, len(body) + len(json.dumps(conversation)))


class ResponseStore:
    """Finished responses by id, at most `capacity` of them and `max_bytes` of their JSON (the least recently
    stored goes first; the newest is kept even alone past the bound, so a chain can always go on)."""

    def __init__(self, capacity: int = STORE_CAPACITY, max_bytes: int | None = None) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes if max_bytes is not None else int(
            os.environ.get(STORE_MAX_BYTES_ENV, STORE_MAX_BYTES))
        self.num_bytes = 0
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, entry: StoredResponse) -> None:
        """Keep a finished response (`stored`'s form)."""
        old = self._items.pop(entry.response_id, None)
        if old is not None:
            self.num_bytes -= old.size
        self._items[entry.response_id] = entry
        self.num_bytes += entry.size
        while len(self._items) > self.capacity or (self.num_bytes > self.max_bytes and len(self._items) > 1):
            _, dropped = self._items.popitem(last=False)
            self.num_bytes -= dropped.size

    def get(self, response_id: str) -> StoredResponse:
        """The stored response; 404 (OpenAI's error JSON) when unknown or dropped."""
        stored = self._items.get(response_id)
        if stored is None:
            raise APIError(404, f"Response with id '{response_id}' not found (unknown, not stored, or dropped "
                                f"from the in-memory store of {self.capacity} responses and {self.max_bytes} bytes)",
                           param="previous_response_id", code="response_not_found")
        return stored

    def delete(self, response_id: str) -> None:
        """Forget a stored response (its bytes leave the bound); 404 as `get` when unknown or dropped."""
        self.get(response_id)
        self.num_bytes -= self._items.pop(response_id).size


class ResponsesServing:
    """Responses on top of the chat path of `OpenAIServing` (template, tokenizer, tools, engine)."""

    def __init__(self, serving: OpenAIServing, store: ResponseStore | None = None) -> None:
        self.serving = serving
        self.store = store or ResponseStore()

    async def create(self, req: ResponsesRequest, model: str,
                     header_id: str | None = None) -> Response | AsyncIterator[str]:
        """POST /v1/responses: the finished response (its JSON body), or its event stream (`header_id`: the
        request's X-Request-Id, which leads the response's id)."""
        _refuse_unservable(req)
        history = self.store.get(req.previous_response_id).conversation if req.previous_response_id else []
        conversation = history + input_messages(req.input)
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        if not system and not conversation:  # else the chat request's own refusal would name its `messages`
            raise APIError(400, "input must not be empty (or give instructions or a previous_response_id)",
                           param="input")
        tools = chat_tools(req.tools)
        try:
            chat = ChatCompletionRequest(
                messages=[ChatMessage(**m) for m in system + conversation], temperature=req.temperature,
                top_p=req.top_p, top_k=req.top_k, min_p=req.min_p, repetition_penalty=req.repetition_penalty,
                seed=req.seed, presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                logit_bias=req.logit_bias, stop=req.stop, ignore_eos=req.ignore_eos,
                skip_special_tokens=req.skip_special_tokens,
                include_stop_str_in_output=req.include_stop_str_in_output,
                structured_outputs=req.structured_outputs, tools=tools,
                tool_choice=chat_tool_choice(req.tool_choice, bool(tools)),
                parallel_tool_calls=req.parallel_tool_calls, response_format=chat_response_format(req.text),
                logprobs=_wants_logprobs(req), top_logprobs=req.top_logprobs,
                chat_template_kwargs=_template_kwargs(req),
                truncate_prompt_tokens=_truncation(req, self.serving.max_model_len))
        except ValidationError as exc:
            raise APIError(400, "invalid request: " + "; ".join(describe(exc.errors())), param="input") from None
        chat = self.serving.whole_vocabulary(chat)  # top_logprobs -1, as chat's
        plan = plan_tools(chat, self.serving.enable_auto_tool_choice, self.serving.tool_call_parser,
                          self.serving.exclude_tools_when_tool_choice_none)
        prompt = await self.serving.chat_prompt(chat, plan.template_tools)
        _refuse_a_full_context(chat.truncate_prompt_tokens, len(prompt.token_ids), self.serving.max_model_len)
        sp = constrain_for_tools(plan, sampling_params(chat, req.max_output_tokens, len(prompt.token_ids),
                                                       self.serving.max_model_len,
                                                       (chat.top_logprobs or 0) if chat.logprobs else None,
                                                       defaults=self.serving.default_sampling,
                                                       max_tokens_cap=self.serving.max_tokens_cap))
        [sp] = check_logprob_entries([len(prompt.token_ids)], [sp], 1, "input", "top_logprobs",
                                     self.serving.max_logprobs, max_tokens_given=req.max_output_tokens is not None)
        # The output text's logprobs, chat's conversion: every generated token's, the thinking's and calls' too (vLLM)
        logprobs = self.serving.logprobs_of(chat) if chat.logprobs else None
        # Only the end is read, or each step's news (which the stream's parsers take in turn): never the output so far
        sp = sp.model_copy(update={"output_kind": "delta" if req.stream else "final_only"})
        response_id = _response_id(req.request_id, header_id)
        base = _response(req, response_id, model)
        stream = await admitted(self.serving.generate(
            prompt.token_ids, sp, f"{response_id}-{uuid.uuid4().hex[:8]}", prompt.text, self.serving.lora_for(model),
            **engine_kwargs(req.priority, req.cache_salt)))
        reasoning = self.serving.reasoning_for(sp, prompt.token_ids)  # as chat's
        if req.stream:
            return self._events(req, base, plan, reasoning, stream, conversation, logprobs, prompt)
        final = None
        try:
            async for output in stream:
                final = output
        finally:
            await stream.aclose()  # aborts the request if this task is cancelled (the client left)
        assert final is not None and final.finished
        # A large reply (output logprobs: up to --max-logprobs alternatives a token, the whole vocabulary with -1) is
        # built and encoded off the loop: on it, /health waited 42 s for a 133 MB one. Encoded once: the store keeps
        # the very bytes the reply sends (encoded twice, once for each, it took 2 s more of a worker's time and GIL)
        per_token = (1 + (chat.top_logprobs or 0) if logprobs is not None else 0) + req.enable_response_messages
        values = reply_values([final], per_token) + (len(prompt.token_ids) if req.enable_response_messages else 0)
        values += parse_values(plan, reasoning, len(final.outputs[0].text))  # thousands of calls: parsed off it too
        reply = await built(functools.partial(_reply, req, base, plan, reasoning, final, logprobs, prompt,
                                              conversation), values)
        if reply.stored is not None:
            self.store.put(reply.stored)
        return Response(reply.body, media_type="application/json")  # JSONResponse's bytes and headers

    def get(self, response_id: str) -> bytes:
        """GET /v1/responses/{id}: the stored response's JSON body."""
        return self.store.get(response_id).body

    def delete(self, response_id: str) -> dict[str, Any]:
        """DELETE /v1/responses/{id}: the stored response forgotten (then GET and `previous_response_id` of it are
        404s), answered as OpenAI's API answers (the openai client reads no body: its `delete` returns None)."""
        self.store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def _events(self, req: ResponsesRequest, base: dict[str, Any], plan: ToolPlan,
                      reasoning: ReasoningParser | None, stream: Any, conversation: list[dict[str, Any]],
                      logprobs: LogprobsOf | None = None, prompt: Prompt | None = None) -> AsyncIterator[str]:
        """The Responses event stream, numbered by `sequence_number`. Thinking (with a reasoning parser) streams as
        `reasoning_text.delta`s of a reasoning item, closed before the answer's first event. Text that is surely
        content streams as `output_text.delta`s of a message item; a named function's arguments stream as
        `function_call_arguments.delta`s as they are generated; calls the parser or the `required`
        grammar yields are sent when the output ends, each as its own function_call item. `stream` yields delta
        outputs (each step's news): the parsers' state (`ReasoningStream`, `ToolPlan.stream`) takes them in turn,
        and the answer is joined and parsed once, at the end. With `logprobs`, each text delta carries the logprobs of
        the tokens generated since the last one (the thinking's and calls' included, as the message's part holds
        them all); those left at the end ride on the message's last delta (one with no text if none is left).
        Under auto tool choice the parser's stream holds whitespace that opens the answer (tool_parsers.base): calls
        that follow it leave no message, as the reply's parse (vLLM's rule). With `enable_response_messages`, the
        completed response carries the raw `prompt` and output, as the reply's does."""
        ev = _Numbered()
        yield ev("response.created", response=base)
        yield ev("response.in_progress", response=base)
        message_id, opened, named, final, tokens = f"msg_{uuid.uuid4().hex}", False, None, None, 0
        thinking = _StreamedReasoning(reasoning, req.include_reasoning) if reasoning is not None else None
        answer = plan.stream()  # none: all of it streams; auto: up to the parser's marker; required: nothing
        entries: list[dict[str, Any]] = []  # every token's logprobs (with `logprobs`), the first `logged` sent
        logged = unlogged_values = 0  # unlogged_values: the alternatives of those not sent yet
        raw_text: list[str] = []  # the whole output, kept only for enable_response_messages
        raw_ids: list[int] = []
        try:
            async for output in stream:
                final = output
                tokens += len(output.outputs[0].token_ids)
                if req.enable_response_messages:
                    raw_text.append(output.outputs[0].text)
                    raw_ids += output.outputs[0].token_ids
                if logprobs is not None:
                    # With the whole vocabulary's logprobs a step holds 49k alternatives a token: a large step's are
                    # converted, and the delta that carries them encoded, off the loop (on it, /health waited 116 s)
                    step_values = logprob_values(output)
                    convert = functools.partial(logprobs, output.outputs[0].token_ids, output.outputs[0].logprobs or [])
                    entries += (await built(convert, step_values))["content"]
                    unlogged_values += step_values
                new = output.outputs[0].text
                if thinking is not None:
                    events, new = thinking.feed(ev, new, output.outputs[0].finish_reason is not None)
                    for event in events:
                        yield event
                news = answer.feed(new)
                if plan.mode == "named":
                    if named is None:
                        assert plan.function is not None
                        named = function_call_item(ToolCall(plan.function, ""), "in_progress")
                        yield ev("response.output_item.added", output_index=0, item=named)
                    if news:
                        yield ev("response.function_call_arguments.delta", item_id=named["id"], output_index=0,
                                 delta=news)
                    continue
                if news:
                    index = int(thinking is not None and thinking.opened)  # after the reasoning item, if any
                    if not opened:
                        opened = True
                        for event in _open_message(ev, message_id, index):
                            yield event
                    delta = functools.partial(_text_delta, ev, unlogged_values > OFF_LOOP_VALUES, message_id, index,
                                              news, entries[logged:])
                    yield await built(delta, unlogged_values)
                    logged, unlogged_values = len(entries), 0
        finally:
            await stream.aclose()
        assert final is not None
        for event in thinking.close(ev) if thinking is not None else []:
            yield event
        text, status, sent = answer.text, _item_status(final), answer.sent
        # A long answer is parsed off the loop (thousands of calls: tool_calls.parse_values), and its calls' closing
        # events, about as many values as their text has characters at most, are built and sent off it too
        parsed_values = parse_values(plan, None, len(text))
        content, calls = await built(functools.partial(_split, plan, text), parsed_values)
        if named is not None:
            call_items = [{**named, "arguments": text, "status": status}]
        else:
            call_items = [function_call_item(c, status) for c in calls]
        message_text = (text[:sent] if opened else content) if calls else text
        thought = reasoning_item(thinking.text, thinking.item_id) if thinking is not None and thinking.shown else None
        items = _output_items(message_id, message_text, call_items, status, thought,
                              entries if logprobs is not None else None)
        raw = _raw_messages(prompt, "".join(raw_text), raw_ids) if prompt and req.enable_response_messages else {}
        response = _finished({**base, **raw}, items, final, _usage(final, tokens))
        # The closing events each carry the whole output (its logprobs: 1.57M entries for 32 tokens of the whole
        # vocabulary), and so does the stored copy: a large end is built and encoded off the loop, in pieces
        values = sum(2 + len(e["top_logprobs"]) for e in entries)
        values += len(raw_ids) + len(prompt.token_ids) if raw and prompt else 0
        values += parsed_values
        closing = _closing(response, named["id"] if named else None, unlogged=entries[logged:], opened=opened,
                           sent=sent)
        turn = [*conversation, assistant_turn(items)]
        if values <= OFF_LOOP_VALUES:
            events = [ev(kind, **fields) for kind, fields in closing]
            if req.store:  # stored before the client hears the end: a GET after response.completed finds it
                self.store.put(stored(response, turn))
            for event in events:
                yield event
            return
        if req.store:
            self.store.put(await off_the_loop(functools.partial(stored, response, turn)))
        # Each event is built when its turn comes and sent in pieces of about SEND_CHARS: held whole, all at once
        # (3 copies of the output's logprobs, each as text, then as bytes), the end of 1.57M entries took 3.3 GB
        texts = (text for kind, fields in closing for text in ev.pieces(kind, **fields))
        while batch := await off_the_loop(functools.partial(_joined, texts, SEND_CHARS)):
            yield batch


# A large stream end is sent in pieces of about this many characters (each joined on a worker thread)
SEND_CHARS = 1 << 20


def _closing(response: dict[str, Any], named_id: str | None, *, unlogged: list[dict[str, Any]], opened: bool,
             sent: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """A stream's closing events for its finished `response` (the items' last events, then `response.completed` or
    `.incomplete`), as (type, fields), each built when it is reached: a large end's events are encoded and sent one
    piece at a time, never all held at once. `named_id`: the call item a named tool choice added while streaming;
    `opened`, `sent`, `unlogged`: the message's state (`_close_message`)."""
    items = response["output"]
    for index, item in enumerate(items):
        if item["type"] == "reasoning":  # streamed and closed already
            continue
        if item["type"] == "message":
            yield from _close_message(item, index, opened, sent, unlogged)
            continue
        where = {"item_id": item["id"], "output_index": index}
        if item["id"] != named_id:
            yield "response.output_item.added", {"output_index": index,
                                                 "item": {**item, "arguments": "", "status": "in_progress"}}
            yield "response.function_call_arguments.delta", {**where, "delta": item["arguments"]}
        yield "response.function_call_arguments.done", {**where, "arguments": item["arguments"]}
        yield "response.output_item.done", {"output_index": index, "item": item}
    # OpenAI has no stream event for a cancelled response: vLLM ends one with response.completed, its status cancelled
    yield ("response.incomplete" if response["status"] == "incomplete" else "response.completed",
           {"response": response})


def _joined(texts: Iterator[str], chars: int) -> str:
    """The next texts of `texts`, joined, until they hold at least `chars` characters or `texts` ends ("": ended).
    Blocking: a large stream end's pieces are encoded on a worker thread as `texts` is read."""
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= chars:
            break
    return "".join(batch)


def _text_delta(ev: _Numbered, pieces: bool, item_id: str, output_index: int, delta: str,
                unlogged: list[dict[str, Any]]) -> str:
    """A stream's `output_text.delta` event carrying the `unlogged` logprobs (blocking: a large one is built on a
    worker thread and encoded in `pieces`)."""
    fields = {"item_id": item_id, "output_index": output_index, "content_index": 0, "delta": delta,
              "logprobs": event_logprobs(unlogged)}
    return "".join(ev.pieces("response.output_text.delta", **fields)) if pieces else ev(
        "response.output_text.delta", **fields)


@dataclass
class _Reply:
    """A non-streamed response's JSON body, and what the store keeps of it (None: `store` false)."""

    body: bytes
    stored: StoredResponse | None


def _reply(req: ResponsesRequest, base: dict[str, Any], plan: ToolPlan, reasoning: ReasoningParser | None,
           final: RequestOutput, logprobs: LogprobsOf | None, prompt: Prompt,
           conversation: list[dict[str, Any]]) -> _Reply:
    """The finished response of a non-streamed request whose last output is `final`, encoded (blocking: a large one
    is built and encoded on a worker thread), with what the store needs when `store` is true: the same bytes."""
    items = _reply_items(plan, reasoning, final, logprobs, req.include_reasoning)
    out = final.outputs[0]
    raw = _raw_messages(prompt, out.text, out.token_ids) if req.enable_response_messages else {}
    response = _finished({**base, **raw}, items, final, _usage(final, len(out.token_ids)))
    body = json_body(response)  # JSONResponse's bytes, in pieces when large
    return _Reply(body, stored(response, [*conversation, assistant_turn(items)], body) if req.store else None)


def _finished(base: dict[str, Any], items: list[dict[str, Any]], output: RequestOutput,
              usage: dict[str, Any]) -> dict[str, Any]:
    """The response object of `items`, `output` being the last output."""
    status = _status(output)
    return {**base, "status": status,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None, "output": items,
            "usage": usage}


class _StreamedReasoning:
    """A stream's reasoning item (output 0): opened by the first thinking, closed before the answer's first event
    (or at the end), as vLLM streams it: `output_item.added`, `content_part.added` (a `reasoning_text` part),
    `reasoning_text.delta`s, then `reasoning_text.done`, `content_part.done`, `output_item.done`. Not `shown`
    (`include_reasoning: false`), the thinking is split off the answer all the same but sends no event."""

    def __init__(self, parser: ReasoningParser, shown: bool = True) -> None:
        self.stream = ReasoningStream(parser)
        self.shown = shown
        self.item_id = f"rs_{uuid.uuid4().hex}"
        self.parts: list[str] = []
        self.opened = self.closed = False

    @property
    def text(self) -> str:
        """The thinking so far."""
        return "".join(self.parts)

    def feed(self, ev: _Numbered, new: str, finished: bool) -> tuple[list[str], str]:
        """The events for a step's new text (`finished`: the output's last), and the answer text it settles."""
        split = self.stream.feed(new, finished)
        if not self.shown:
            return [], split.content or ""
        events = []
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        if split.reasoning:
            if not self.opened:
                self.opened = True
                events += [ev("response.output_item.added", output_index=0, item={
                               "id": self.item_id, "type": "reasoning", "summary": [], "content": [],
                               "status": "in_progress"}),
                           ev("response.content_part.added", **where, part=reasoning_part(""))]
            self.parts.append(split.reasoning)
            events.append(ev("response.reasoning_text.delta", **where, delta=split.reasoning))
        if split.content:
            events += self.close(ev)
        return events, split.content or ""

    def close(self, ev: _Numbered) -> list[str]:
        """The item's done events, once (none when there was no thinking)."""
        if not self.opened or self.closed:
            return []
        self.closed = True
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        text = self.text
        return [ev("response.reasoning_text.done", **where, text=text),
                ev("response.content_part.done", **where, part=reasoning_part(text)),
                ev("response.output_item.done", output_index=0, item=reasoning_item(text, self.item_id, "completed"))]


class _Numbered:
    """Server-sent events of one Responses stream, numbered by `sequence_number` from 0."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        self.next += 1
        return _event(kind, self.next - 1, **fields)

    def pieces(self, kind: str, **fields: Any) -> Iterator[str]:
        """The next event's text in pieces of bounded size (json_reply.py: joined, the same text), for a large one
        built on a worker thread."""
        self.next += 1
        payload = {"type": kind, "sequence_number": self.next - 1, **fields}
        yield f"event: {kind}\ndata: "
        yield from json_text_pieces(payload)
        yield "\n\n"


def _open_message(ev: _Numbered, item_id: str, output_index: int) -> list[str]:
    return [ev(kind, **fields) for kind, fields in _message_opening(item_id, output_index)]


def _message_opening(item_id: str, output_index: int) -> list[tuple[str, dict[str, Any]]]:
    """A message item's first events, (type, fields)."""
    return [("response.output_item.added", {"output_index": output_index,
                                            "item": message_item(item_id, None, "in_progress")}),
            ("response.content_part.added", {"item_id": item_id, "output_index": output_index, "content_index": 0,
                                             "part": text_part("")})]


def _close_message(item: dict[str, Any], index: int, opened: bool, sent: int,
                   unlogged: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The message item's (output `index`) last events, (type, fields), each built when reached: its unsent text and
    `unlogged` logprobs (opened now if nothing streamed), then the dones."""
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    text, logprobs = item["content"][0]["text"], item["content"][0]["logprobs"]
    if not opened:
        yield from _message_opening(item["id"], index)
    if len(text) > (sent if opened else 0) or unlogged:
        yield "response.output_text.delta", {**where, "delta": text[sent if opened else 0:],
                                             "logprobs": event_logprobs(unlogged)}
    yield "response.output_text.done", {**where, "text": text, "logprobs": event_logprobs(logprobs)}
    yield "response.content_part.done", {**where, "part": text_part(text)}
    yield "response.output_item.done", {"output_index": index, "item": item}


def _reply_items(plan: ToolPlan, reasoning: ReasoningParser | None, final: RequestOutput,
                 logprobs: LogprobsOf | None, include_reasoning: bool = True) -> list[dict[str, Any]]:
    """A finished (not streamed) output's items: its thinking (unless not `include_reasoning`), its text, its calls.
    Text beside calls is the parser's content, which is None when only whitespace came before them (vLLM's rule: no
    message item)."""
    out = final.outputs[0]
    text, thought = out.text, None
    if reasoning is not None:
        split = reasoning.split(text)
        text, thought = split.content or "", split.reasoning
    content, calls = _split(plan, text)
    status = _item_status(final)
    entries = logprobs(out.token_ids, out.logprobs or [])["content"] if logprobs is not None else None
    return _output_items(f"msg_{uuid.uuid4().hex}", content if calls else text,
                         [function_call_item(c, status) for c in calls], status,
                         reasoning_item(thought) if include_reasoning else None, entries)


def _raw_messages(prompt: Prompt, text: str, token_ids: list[int]) -> dict[str, Any]:
    """vLLM's `enable_response_messages` fields for a chat-template model: `input_messages`, the rendered prompt, and
    `output_messages`, the output as generated (before the reasoning and tool parsers split it; none when nothing was
    generated), each a `raw_message_tokens` entry of its text and token ids (vLLM: the ids are the truth where the
    two differ)."""
    def raw(message: str | None, tokens: list[int]) -> dict[str, Any]:
        return {"type": "raw_message_tokens", "message": message or "", "tokens": list(tokens)}
    return {"input_messages": [raw(prompt.text, prompt.token_ids)],
            "output_messages": [raw(text, token_ids)] if text or token_ids else []}


def _split(plan: ToolPlan, text: str) -> tuple[str | None, list[ToolCall]]:
    """A finished output's content and tool calls, as the chat path splits them."""
    if plan.mode == "named":
        assert plan.function is not None
        return None, [ToolCall(plan.function, text)]
    parsed = plan.parse(text)
    return parsed.content, parsed.tool_calls


def _output_items(message_id: str, message_text: str | None, call_items: list[dict[str, Any]],
                  status: str, thought: dict[str, Any] | None = None,
                  logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The response's output: the reasoning item (when there was thinking), the message (when it has text, or when
    there is nothing else; its text's part carries `logprobs`), then the calls; vLLM's order."""
    alone = not call_items and thought is None
    message = [message_item(message_id, message_text or "", status, logprobs)] if message_text or alone else []
    return ([thought] if thought else []) + message + call_items


def _response_id(body_id: str | None, header_id: str | None) -> str:
    """The response's id, its key in the store. The body's `request_id` is taken as it is (vLLM's
    extra parameter: the caller names its response). An X-Request-Id only traces: gateways send the
    same one again (retries, one trace over many calls), so it is kept in the id for logs but followed
    by a random part; two responses with one X-Request-Id must not share a store entry."""
    if header_id is not None:
        return f"resp_{header_id}-{uuid.uuid4().hex}"
    return body_id or f"resp_{uuid.uuid4().hex}"


def _status(output: RequestOutput) -> str:
    """The response's status, its last output being `output` (vLLM's): "incomplete" at its length limit, "cancelled"
    when aborted (a sleep in mode abort ended it), else "completed"."""
    return {"length": "incomplete", "abort": "cancelled"}.get(output.outputs[0].finish_reason or "", "completed")


def _item_status(output: RequestOutput) -> str:
    """Its output items' status: an item has no "cancelled"; one cut short by its length or an abort is
    "incomplete"."""
    return "completed" if _status(output) == "completed" else "incomplete"


def _response(req: ResponsesRequest, response_id: str, model: str) -> dict[str, Any]:
    """The response object's fields known before generation (status in_progress, no output yet)."""
    return {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model,
            "status": "in_progress", "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p, "tool_choice": req.tool_choice,
            "tools": req.tools or [], "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "truncation": req.truncation or "disabled", "store": req.store, "background": False,
            # vLLM's echoes of the fields that change nothing here
            "reasoning": req.reasoning.model_dump(exclude_none=True) if req.reasoning else None,
            "service_tier": req.service_tier, "max_tool_calls": req.max_tool_calls,
            # vLLM's echo: the logprobs asked for (null when `include` does not ask)
            "top_logprobs": (req.top_logprobs or 0) if _wants_logprobs(req) else None,
            "user": req.user, "output": [], "usage": None}


def _usage(output: RequestOutput, generated: int) -> dict[str, Any]:
    """The usage of a response whose last output is `output`, `generated` tokens in all."""
    prompt = len(output.prompt_token_ids)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": output.num_cached_tokens},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + generated}


def _event(kind: str, sequence_number: int, **fields: Any) -> str:
    """One server-sent event of the Responses stream (`event:` names its type, as OpenAI's)."""
    payload = {"type": kind, "sequence_number": sequence_number, **fields}
    return f"event: {kind}\ndata: {json_text(payload)}\n\n"
