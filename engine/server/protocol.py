"""OpenAI request bodies as pydantic models, with vLLM's extra sampling fields.

As vLLM does, a field the server does not know (OpenAI's `store`, `metadata`, `parallel_tool_calls`,
...) is accepted and ignored with a log line that names it: SDKs and frameworks send such fields by
default. A known field with a bad value is still a 400 that names it, and so is a vLLM field that would
change the output but is not implemented (sampling_request.UNSUPPORTED_VLLM_FIELDS).
"""

from __future__ import annotations

import itertools
import logging
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from flotilla.engine.chat_content import content_texts
from flotilla.engine.sampling_params import SEED_MAX, SEED_MIN
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.request_extras import CACHE_SALT_MAX_CHARS, PRIORITY_MAX, PRIORITY_MIN
from flotilla.engine.server.request_id_header import BodyRequestId

logger = logging.getLogger(__name__)


# Containers a body may nest (the JSON parser takes ~1,000): deeper, the walk below refuses it, so that no later
# recursive reader (pydantic, the chat template, a grammar compiler) meets it; a JSON schema nests two a level.
MAX_BODY_NESTING = 128


def _body_problem(value: Any) -> str | None:
    """What makes a parsed body unusable as text, or None: a string holding a lone UTF-16 surrogate (JSON's
    "\\ud800" escape parses into one; no tokenizer or UTF-8 response can carry it), or containers nested past
    `MAX_BODY_NESTING`. Walked with a stack, not recursion: a deep body overflowed Python's stack (a 500)."""
    todo: list[tuple[Any, int]] = [(value, 0)] if isinstance(value, dict | list) else []
    if isinstance(value, str) and not _is_unicode(value):
        return _LONE_SURROGATE
    while todo:
        item, depth = todo.pop()
        if depth == MAX_BODY_NESTING:
            return f"the body nests objects and arrays more than {MAX_BODY_NESTING} levels deep"
        for child in itertools.chain(item.keys(), item.values()) if isinstance(item, dict) else item:
            if isinstance(child, str):
                if not _is_unicode(child):
                    return _LONE_SURROGATE
            elif isinstance(child, dict | list):
                todo.append((child, depth + 1))
    return None


_LONE_SURROGATE = ("the body holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which is not valid "
                   "Unicode text")


def _is_unicode(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _RequestBody(BaseModel):
    """A whole request body: refuses text that is not valid Unicode before any field is read; keeps
    unknown fields aside (`model_extra`) and logs their names, as vLLM does."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if problem := _body_problem(data):
            raise ValueError(problem)
        return data

    # Set once the ignored fields are logged: FastAPI passes a body validated off the loop (request_body.py)
    # through validation again, which runs this model's validators on the instance.
    _ignored_logged: bool = PrivateAttr(False)

    @model_validator(mode="after")
    def _log_ignored(self) -> Any:
        if self.model_extra and not self._ignored_logged:
            logger.warning("The following fields were present in the request but ignored: %s",
                           sorted(self.model_extra))
        self._ignored_logged = True
        return self


class StreamOptions(BaseModel):
    """`stream_options`: whether the last chunk carries token usage, and whether every chunk does."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    continuous_usage_stats: bool = False


# Fields vLLM's completions or chat request takes as null (its default then) that have a non-null default here.
NULL_MEANS_UNSET = frozenset({"presence_penalty", "frequency_penalty", "stream", "n",
                              "logprobs", "echo"})


class _SamplingFields(_RequestBody):
    """Sampling fields shared by completions and chat completions (token ids and top_k are bounded by the
    vocabulary in the engine, which knows it)."""

    # Python's JSON parser accepts NaN and Infinity; no sampling field means anything by them.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    # Bounded below only, as vLLM's SamplingParams (OpenAI's own API stops at 2; vLLM serves more).
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted for compatibility; not used
    # vLLM's extras
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)  # any finite number above 0, as vLLM
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # False: no space between two added tokens (kept special tokens)
    allowed_token_ids: list[int] | None = None  # only these may be drawn (bounded by the vocabulary in the engine)
    bad_words: list[str] | None = None  # words never completed (engine/bad_words.py)
    # vLLM's request extras (engine/server/request_extras.py applies them)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)  # keep the last N prompt tokens; -1: max_model_len
    truncation_side: Literal["left", "right"] | None = None  # vLLM's: "right" keeps the first N instead (cuts the end)
    # logprob tokens as "token_id:<id>"; None (unset or null): --return-tokens-as-token-ids (OpenAIServing.as_token_ids)
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: the prompt's and each choice's token ids beside the text (streams: the prompt's first, then each chunk's)
    return_token_ids: bool | None = None
    priority: int = Field(0, ge=PRIORITY_MIN, le=PRIORITY_MAX)  # lower first, with --scheduling-policy priority
    # prefix-cache blocks are shared within one salt only
    cache_salt: str | None = Field(None, min_length=1, max_length=CACHE_SALT_MAX_CHARS)
    request_id: BodyRequestId | None = None  # the response id's suffix
    # vLLM's: log-probabilities of the prompt's tokens (completions: per choice; chat: in the response)
    # at most --max-logprobs: check_logprob_entries; -1 (vLLM's): the whole vocabulary (OpenAIServing.whole_vocabulary)
    prompt_logprobs: int | None = Field(None, ge=-1)
    # Structured output (engine/server/structured_request.py): vLLM's object and its older names.
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data: Any) -> Any:
        # vLLM declares these Optional, so an explicit JSON null (what the SDKs send for an argument given as
        # None) is the field left out there; here each has a plain default, which null now takes too.
        if isinstance(data, dict) and any(data.get(name, 0) is None for name in NULL_MEANS_UNSET):
            data = {k: v for k, v in data.items() if not (v is None and k in NULL_MEANS_UNSET)}
        return data

    @field_validator("prompt_logprobs")
    @classmethod
    def _no_prompt_logprobs_on_a_stream(cls, value: int | None, info: ValidationInfo) -> int | None:
        # vLLM's check: stream chunks carry no prompt logprobs (0, no alternatives, passes as in vLLM).
        if value and info.data.get("stream"):
            raise ValueError("`prompt_logprobs` are not available when `stream=True`.")
        return value

    @field_validator("stream_options", mode="before")
    @classmethod
    def _options_need_a_stream(cls, value: Any, info: ValidationInfo) -> Any:
        # vLLM's check, truthiness included (null and {} pass): usage chunks asked of an answer that has no chunks.
        if value and not info.data.get("stream"):
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return value


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]]
    # OpenAI's and vLLM's default for completions (chat's is the context left); 0 only with echo: the prompt alone
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0)  # at most --max-logprobs: check_logprob_entries
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = True  # vLLM's default for completions: the tokenizer's BOS etc.
    response_format: dict[str, Any] | None = None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _batch_of_token_lists(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return token_id_batch(value, handler)



def token_id_batch(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A wrap validator for prompt fields that may be a batch of token-id lists: such a batch is checked here, list
    by list, in Python (pydantic-core's union tried every member over the whole batch in one C call: seconds for
    a million `[1]`s, the event loop's thread waiting on the GIL all along). Anything else, or anything odd
    inside (bools, floats, strings), is pydantic's to check, with its errors."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        batch = [list(ids) for ids in value if isinstance(ids, list) and all(type(t) is int for t in ids)]
        if len(batch) == len(value):
            return batch
    return handler(value)


def _yield_point(value: Any) -> Any:
    # A Python call per item of a long list of objects: pydantic-core validated such a list in one C call, holding
    # the GIL (and so the event loop's thread) for seconds; Python code gives it up at the switch interval.
    return value


# A list of JSON objects (tools, Responses input items), validated with a yield point per object.
JSONObjects = list[Annotated[dict[str, Any], AfterValidator(_yield_point)]]


# The content parts that are text: chat's "text", and the Responses API's names (vLLM takes all three as text).
TEXT_PART_TYPES = ("text", "input_text", "output_text")


def check_text_parts(parts: list[Any], param: str) -> None:
    """A 400 naming `param` for a content part that is not text (an image, audio)."""
    if any(not isinstance(part, dict) or part.get("type") not in TEXT_PART_TYPES for part in parts):
        raise APIError(400, "only text content parts are supported", param=param)


def message_text_chars(messages: list[dict[str, Any]], param: str) -> int:
    """The characters of the messages' text, strings and parts alike; a 400 naming `param` for a content part that
    is not text."""
    for m in messages:
        if isinstance(m.get("content"), list):
            check_text_parts(m["content"], param)
    return sum(len(text) for m in messages for text in content_texts(m.get("content")))


class ContentPart(BaseModel):
    """One part of a message's content list: `{"type": "text", "text": ...}` (other types are refused
    when the conversation is rendered, with a message that names them)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One message of a conversation (text content, or OpenAI's list of text parts)."""

    model_config = ConfigDict(extra="allow")
    # Any role, as vLLM (its custom message param): templates give their own roles meaning (Llama 3.1's "ipython"
    # tool results, GLM's "observation"); the template refuses one it does not know.
    role: str = Field(min_length=1)
    content: str | list[ContentPart] | None = None
    name: str | None = None
    # Text for the template, as vLLM's message schema types them (a number reached the template as is)
    tool_call_id: str | None = None
    reasoning: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _yield_point(cls, data: Any) -> Any:
        return _yield_point(data)  # see there: conversations of many small messages


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=-1)  # as prompt_logprobs (-1: the whole vocabulary)
    response_format: dict[str, Any] | None = None
    tools: JSONObjects | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    # vLLM's field: end the prompt inside the last message, for the model to continue it ("prefill")
    continue_final_message: bool = False
    chat_template: str | None = None  # vLLM's field; refused unless --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's field for RAG templates (Command R, Granite): the template's `documents` variable
    documents: list[dict[str, str]] | None = None
    add_special_tokens: bool = False  # vLLM's default for chat: the template already holds them
    echo: bool = False  # vLLM's: the reply starts with the last message's content when the roles match
    # vLLM's: false leaves the reasoning parser's thinking out of the reply and the stream (the answer is unchanged)
    include_reasoning: bool = True
    # OpenAI's field, served as vLLM serves it: the chat template's `reasoning_effort` variable, over the request's
    # own chat_template_kwargs (server_chat_template.request_template_kwargs)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None


class TokenizeRequest(_RequestBody):
    """POST /tokenize: a prompt or a conversation (rendered as chat renders it: tools, template and its
    variables included, so the count is the chat request's prompt_tokens); vLLM's fields."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # vLLM's defaults: true for a prompt, false for a conversation
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = False  # also the tokens' strings (`token_strs`)
    tools: JSONObjects | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_RequestBody):
    """POST /detokenize."""

    model: str | None = None
    tokens: list[int]
