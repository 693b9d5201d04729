"""OpenAI completions and chat completions on top of the async engine: request -> prompt and SamplingParams
(sampling_request.py), engine outputs -> response JSON or SSE chunks."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from flotilla.engine.chat_content import ContentFormatOption, final_text
from flotilla.engine.chat_rendering import check_prompt_end, history_for_template, render_trusted, template_variables
from flotilla.engine.lora.registry import LoRARegistry
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.outputs import RequestOutput
from flotilla.engine.pooling.scoring import pair_encoding
from flotilla.engine.prompt_rules import check_prompt
from flotilla.engine.prompt_truncation import (
    kept_tokens,
    run_parts,
    tokenized_part,
    truncate_prompt,
    truncated_parts,
)
from flotilla.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from flotilla.engine.server.chat_template import (
    MAX_CONCURRENT_RENDERS,
    render_untrusted,
    request_template,
)
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.json_reply import OFF_LOOP_VALUES, built
from flotilla.engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    StreamOptions,
    _SamplingFields,
    message_text_chars,
)
from flotilla.engine.server.reasoning import ReasoningParser
from flotilla.engine.server.request_extras import engine_kwargs, response_ids, token_label
from flotilla.engine.server.request_log import logged
from flotilla.engine.server.sampling_request import check_logprob_entries, sampling_params
from flotilla.engine.server.server_chat_template import merged_template_kwargs, request_template_kwargs
from flotilla.engine.server.sse import (
    ChoiceDelta,
    ChunkFormat,
    StreamState,
    json_text_in_pieces,
    logprob_values,
    sse,
)
from flotilla.engine.server.tool_calls import ToolPlan, chat_message, parse_values, plan_tools
from flotilla.engine.server.tool_stream import constrain_for_tools, stream_tool_chat
from flotilla.engine.serving_engine import ServingEngine
from flotilla.engine.structured_output.thinking import thinking_markers
from flotilla.engine.tokenizer import decoder_without_gil, longest_token_chars

_Req = TypeVar("_Req", CompletionRequest, ChatCompletionRequest)


@dataclass
class Prompt:
    """A tokenized prompt ready for the engine."""

    token_ids: list[int]
    text: str | None


# Completions one request may ask for (prompts x n): n alone is bounded, but a list of one-token prompts
# multiplied it without bound (20,000 of them, a 100 KB body, held the server 195 s and 630 MB). Enough for
# any batching client to keep the engine full (8x the default --max-num-seqs).
MAX_SEQUENCES_PER_REQUEST = 2048


def continued(text: str, messages: list[dict[str, Any]]) -> str:
    """A rendered conversation cut just after its last message's text, so that the model continues that
    message (what transformers' `continue_final_message` does for the model's own template)."""
    final = final_text(messages)
    if final is None or not final.strip() or final.strip() not in text:
        raise APIError(400, "continue_final_message: the last message's text does not appear in the rendered "
                            "conversation", param="continue_final_message")
    start = text.rindex(final.strip())
    # The template may have trimmed the message: keep its leading-trimmed text when it is there whole.
    kept = final.lstrip() if text[start:start + len(final.lstrip())] == final.lstrip() else final.strip()
    return text[:start + len(kept)]


def usage(output: RequestOutput) -> dict[str, int]:
    """OpenAI's usage block."""
    completion = sum(len(c.token_ids) for c in output.outputs)
    prompt = len(output.prompt_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def reply_values(outputs: list[RequestOutput], per_token: int, carries_prompt: bool = False) -> int:
    """About how many JSON values a non-streamed reply of `outputs` holds, before it is built: `per_token` for
    each token a choice carries (its own; its prompt's too when `carries_prompt`) and a few per choice."""
    values = 0
    for output in outputs:
        prompt = len(output.prompt_token_ids) if carries_prompt else 0
        values += sum(CHOICE_VALUES + (prompt + len(c.token_ids)) * per_token for c in output.outputs)
    return values


# The JSON values of a choice without per-token data (its index, text, finish reason, ...), as `reply_values`
# counts them.
CHOICE_VALUES = 8


def choice_usage(output: RequestOutput, num_tokens: int) -> dict[str, int]:
    """The usage of one choice so far, `num_tokens` generated (vLLM's continuous_usage_stats: each chunk counts its
    own choice's tokens)."""
    return counted_usage(len(output.prompt_token_ids), num_tokens)


def counted_usage(prompt: int, completion: int) -> dict[str, int]:
    """OpenAI's usage block of `prompt` and `completion` tokens."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def opening_usage(prompt_tokens: int) -> dict[str, int]:
    """The usage of a chunk sent before any token (vLLM's continuous_usage_stats on the chat stream's role and
    echo chunks): the prompt, no completion tokens."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}


def with_cached_tokens(block: dict[str, Any], cached: int) -> dict[str, Any]:
    """A usage block with `prompt_tokens_details.cached_tokens` (vLLM's --enable-prompt-tokens-details:
    added only when some prompt tokens came from the prefix cache)."""
    return {**block, "prompt_tokens_details": {"cached_tokens": cached}} if cached else block


def reply_role(req: ChatCompletionRequest, response_role: str = "assistant") -> str:
    """The reply's role, as vLLM's get_chat_request_role: `response_role` (--response-role) after a generation
    prompt, else the last message's (the model continues that message)."""
    return response_role if req.add_generation_prompt or not req.messages else req.messages[-1].role


def chat_echo(req: ChatCompletionRequest, response_role: str = "assistant") -> str:
    """vLLM's chat `echo`: the text a reply starts with, the last message's content when its role is the reply's
    (the assistant's, or with add_generation_prompt false the last message's own: a continued message); else ""."""
    if not req.echo or not req.messages:
        return ""
    last = req.messages[-1]
    if last.role != reply_role(req, response_role) or last.content is None:
        return ""
    if isinstance(last.content, str):
        return last.content
    return "\n".join(part.text or "" for part in last.content)


async def _echo_first(chunks: AsyncIterator[str], n: int, echo: str, request_id: str, created: int,
                      model: str, usage: dict[str, int] | None = None) -> AsyncIterator[str]:
    """A chat stream with the echoed text as each choice's first content, after its role chunk (as vLLM sends it);
    `usage`: each echo chunk's (continuous_usage_stats). The n role chunks come first, in one piece."""
    extra = {} if usage is None else {"usage": usage}
    first = True
    async for chunk in chunks:
        yield chunk
        if first:
            first = False
            yield "".join(sse({"id": request_id, "object": "chat.completion.chunk", "created": created,
                               "model": model, "choices": [{"index": i, "delta": {"content": echo}, "logprobs": None,
                                                            "finish_reason": None}], **extra}) for i in range(n))


def _streamed(sp: SamplingParams) -> SamplingParams:
    """A stream's parameters: delta outputs, each step's news only (what `StreamState(delta=True)` and
    `stream_tool_chat` read), so that a step's cost does not grow with the outputs' length."""
    return sp.model_copy(update={"output_kind": "delta"})


def _continuous_usage(req: _SamplingFields) -> bool:
    # vLLM's should_include_usage: per-chunk usage only along with the final usage chunk (include_usage)
    options = req.stream_options
    return bool(options and options.include_usage and options.continuous_usage_stats)


class OpenAIServing:
    """The two generation endpoints; the app supplies tokenization and the chosen model name.

    Prompt rules are the engine's (engine/prompt_rules.py, applied when it queues a request); the server applies
    them too to every prompt of a multi-prompt completions request before it submits any, so one bad prompt
    refuses the request with nothing run. What the server adds is cheap and happens before any expensive work:
    a bound on characters (a text longer than `max_prompt_chars` cannot fit `max_model_len` tokens; not on a text
    that `truncate_prompt_tokens` cuts, whose tail may fit, as vLLM's), then
    template rendering and tokenization on worker threads, so that a large prompt or a slow template never
    holds the event loop (and /health) up.
    """

    def __init__(self, engine: ServingEngine, tokenizer: Any, max_model_len: int, vocab_size: int,
                 trust_request_chat_template: bool = False, loras: LoRARegistry | None = None,
                 enable_auto_tool_choice: bool = False, tool_call_parser: str | None = None,
                 exclude_tools_when_tool_choice_none: bool = False,
                 reasoning_parser: str | None = None, enable_prompt_tokens_details: bool = False,
                 default_sampling: dict[str, Any] | None = None, max_tokens_cap: int | None = None,
                 chat_template_content_format: ContentFormatOption = "auto", chat_template: str | None = None,
                 default_chat_template_kwargs: dict[str, Any] | None = None,
                 max_logprobs: int = MAX_LOGPROBS, log_requests: bool = False, max_log_len: int | None = None,
                 response_role: str = "assistant", return_tokens_as_token_ids: bool = False,
                 grammar_after_thinking: bool = True, force_include_usage: bool = False) -> None:
        self.engine = engine
        self.force_include_usage = force_include_usage  # --enable-force-include-usage: `forced_usage`
        self.log_requests = log_requests  # --enable-log-requests: request_log.py
        self.max_log_len = max_log_len  # --max-log-len: the logged prompt's characters / ids
        self.response_role = response_role  # --response-role: the chat reply's role after a generation prompt
        self.return_tokens_as_token_ids = return_tokens_as_token_ids  # --return-tokens-as-token-ids
        self.max_logprobs = max_logprobs  # --max-logprobs (-1 resolved to the vocabulary size)
        self.chat_template = chat_template  # --chat-template's text (None: the tokenizer's template)
        self.default_chat_template_kwargs = default_chat_template_kwargs  # under each request's chat_template_kwargs
        self.content_format = chat_template_content_format  # chat_content.py: how message content reaches templates
        self.max_tokens_cap = max_tokens_cap  # vLLM's override_max_tokens: sampling_request.max_tokens_cap
        self.default_sampling = default_sampling or {}  # generation_config.json's fields (--generation-config)
        self.enable_prompt_tokens_details = enable_prompt_tokens_details
        self.loras = loras  # served LoRA adapters (None: --enable-lora is off)
        self.reasoning = ReasoningParser(reasoning_parser) if reasoning_parser else None
        # qwen3's parser for a prompt that opened the thinking (its template wrote <think>): the output starts in it
        self.reasoning_opened = ReasoningParser(reasoning_parser, opened=True) if reasoning_parser else None
        # The markers as token ids (None: not single tokens of this vocabulary): a prompt that ends the thinking
        self.thinking = thinking_markers(tokenizer, reasoning_parser) if reasoning_parser else None
        # Whether the engine starts a thinking request's grammar after its </think> (not with enable_in_reasoning)
        self.grammar_after_thinking = grammar_after_thinking and self.thinking is not None
        self.enable_auto_tool_choice = enable_auto_tool_choice
        self.exclude_tools_when_tool_choice_none = exclude_tools_when_tool_choice_none
        self.tool_call_parser = tool_call_parser
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size  # the model's logits' width: prompt ids lie below it (prompt_rules.py)
        self.trust_request_chat_template = trust_request_chat_template
        self.token_chars = longest_token_chars(tokenizer)  # the most characters one token stands for
        self.max_prompt_chars = max_model_len * self.token_chars
        self._decode = decoder_without_gil(tokenizer)
        # Each token's logprobs label and bytes (by `as_ids`), kept for every later entry that names it. A stream of
        # 400 tokens x 1,000 alternatives made 400k `bytes` lists (and decoded 400k labels); lists are always
        # tracked by the garbage collector, so each entry's dict was too, and every full collection while the
        # stream lived walked 800k objects (0.26 s each, on whichever thread held the GIL). A tuple of ints is
        # untracked by the first collection it survives, and a dict whose values are all untracked is made
        # untracked: an entry naming a known token costs the collector nothing. The JSON is the same (a tuple is
        # an array). At most the vocabulary's size of entries each (about 0.3 KB a token: 14 MB for 49k).
        self._token_texts: dict[bool, dict[int, tuple[str, tuple[int, ...]]]] = {False: {}, True: {}}
        self._request_template_renders = asyncio.Semaphore(MAX_CONCURRENT_RENDERS)

    # --- prompts ------------------------------------------------------------------------------------

    async def encode(self, text: str, add_special_tokens: bool = True, param: str = "prompt",
                     keep: int | None = None, side: Literal["left", "right"] | None = None) -> list[int]:
        """Tokenize on the front end's own tokenizer (the engine thread has its own), off the event loop. A text
        that will be truncated to `keep` tokens (`truncate_prompt_tokens`, `side`: `truncation_side`) is not bounded
        in characters (its tail may fit), and only its part that holds the kept tokens is tokenized, when that part
        gives them as the whole text does (prompt_truncation.truncated_parts): a body-sized text took 20-140 s of one
        Rust call, which went on after its client left."""
        if keep is None:
            self.check_chars(len(text), param)
            return await self._tokenized(text, add_special_tokens)
        kept, side = kept_tokens(keep, self.max_model_len), side or "left"  # a bad `keep`: a 400 before any work
        for cut in (truncated_parts, run_parts):  # the second when the first's parts disagree (a long run)
            parts = cut(text, kept, side, self.token_chars)
            if parts:  # each part's call bounded: a client gone meanwhile costs at most the one under way
                ids = tokenized_part([await self._tokenized(part, add_special_tokens) for part in parts], kept, side)
                if ids is not None:
                    return ids
        return await self._tokenized(text, add_special_tokens)

    async def encode_pair(self, text: str, pair: str, keep: int | None, param: str) -> list[int]:
        """A cross-encoder's prompt for a pair (scoring.pair_encoding) on a worker thread; without `keep`, a pair too
        long in characters is a 400 before it is tokenized."""
        if keep is None:
            self.check_chars(len(text) + len(pair), param)
        return await asyncio.to_thread(pair_encoding, self.tokenizer, text, pair, keep, self.max_model_len)

    async def _tokenized(self, text: str, add_special_tokens: bool) -> list[int]:
        # The Rust tokenizer releases the GIL while it works, so the event loop keeps running meanwhile
        # (measured: 2.7 s of tokenization on a worker thread held the main thread up 44 ms at most).
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)

    async def decode(self, token_ids: list[int]) -> str:
        """`tokenizer.decode(token_ids)` on a worker thread that releases the GIL while it decodes (a body-sized
        list takes ~1 s: on the event loop, or holding the GIL, it would stop every stream meanwhile)."""
        return await asyncio.to_thread(self._decode, token_ids)

    def check_chars(self, chars: int, param: str = "prompt") -> None:
        """400 for a text too long to fit the context whatever it tokenizes to (no tokenization needed)."""
        if chars > self.max_prompt_chars:
            # Opening as vLLM's context-length refusals do, which clients recognise
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                                f"request has {chars} characters: more than that context can hold (at most "
                                f"{self.max_prompt_chars} characters with this tokenizer). Please reduce the length "
                                "of the input messages.", param=param)

    async def completion_prompts(self, req: CompletionRequest) -> list[Prompt]:
        """The `prompt` field in any of its four shapes, cut to `truncate_prompt_tokens` when asked. Several prompts
        are each checked by the engine's rules here (a 400 before any is submitted: the engine would refuse a bad
        one only once the others were queued, and they could prefill a step before their abort); a single prompt
        is left to the engine, whose refusal comes before it runs."""
        p = req.prompt
        if isinstance(p, str):
            items: list[str | list[int]] = [p]
        elif p and isinstance(p[0], int):
            items = [p]
        else:  # a list of texts or of token-id lists (p[0] is not an int)
            items = list(cast("list[str] | list[list[int]]", p))
        if not items:
            raise APIError(400, "prompt must not be empty", param="prompt")
        if len(items) * req.n > MAX_SEQUENCES_PER_REQUEST:  # before any prompt is tokenized or queued
            raise APIError(400, f"{len(items)} prompts with n={req.n} ask for {len(items) * req.n} completions; at "
                                f"most {MAX_SEQUENCES_PER_REQUEST} are served per request (send more requests)",
                           param="prompt")
        prompts = [Prompt(await self.encode(x, req.add_special_tokens, keep=req.truncate_prompt_tokens,
                                            side=req.truncation_side), x) if isinstance(x, str) else
                   Prompt(list(x), None) for x in items]
        prompts = [self._truncated(p, req.truncate_prompt_tokens, req.truncation_side) for p in prompts]
        if len(prompts) > 1:
            for prompt in prompts:
                check_prompt(prompt.token_ids, self.max_model_len, self.vocab_size)
        return prompts

    def _truncated(self, prompt: Prompt, keep: int | None, side: Literal["left", "right"] | None) -> Prompt:
        ids = truncate_prompt(prompt.token_ids, keep, self.max_model_len, side or "left")
        return prompt if len(ids) == len(prompt.token_ids) else Prompt(ids, None)

    async def chat_prompt(self, req: ChatCompletionRequest, tools: list[dict[str, Any]] | None = None) -> Prompt:
        """Render the chat template (with `tools` when the model may call them), then tokenize (the
        template already holds special tokens)."""
        try:
            messages = history_for_template([m.model_dump(exclude_none=True) for m in req.messages])
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from None
        chars = message_text_chars(messages, "messages")
        cut = req.truncate_prompt_tokens is not None  # vLLM bounds a text's length only when it is not truncated
        if not cut:
            self.check_chars(chars, "messages")
        try:
            check_prompt_end(req.add_generation_prompt, req.continue_final_message)
        except ValueError as exc:
            raise APIError(400, str(exc), param="continue_final_message") from None
        try:
            template = request_template(req.chat_template, req.chat_template_kwargs, self.trust_request_chat_template)
            kwargs = merged_template_kwargs(self.default_chat_template_kwargs,
                                            request_template_kwargs(req.chat_template_kwargs, req.reasoning_effort))
            variables = (template_variables(kwargs) | ({"tools": tools} if tools else {})
                         | ({"documents": req.documents} if req.documents else {}))
        except ValueError as exc:
            raise APIError(400, str(exc), param="chat_template") from None
        render = functools.partial(self._render, messages, req.add_generation_prompt, template, variables,
                                   req.continue_final_message)
        if template is None:
            text = await asyncio.to_thread(render)
        else:  # a request's template: a child process of bounded memory each, so a bounded number at once
            async with self._request_template_renders:
                text = await asyncio.to_thread(render)
        prompt = Prompt(await self.encode(text, req.add_special_tokens, "messages", req.truncate_prompt_tokens,
                                          req.truncation_side), text)
        return self._truncated(prompt, req.truncate_prompt_tokens, req.truncation_side)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, template: str | None,
                variables: dict[str, Any], continue_final_message: bool = False) -> str:
        """The prompt text: the model's template, or the request's in the bounded sandbox (blocking); with
        `continue_final_message`, cut just after the last message's text (nothing closes it)."""
        if template is not None:
            context = {**self.tokenizer.special_tokens_map, **variables, "messages": messages,
                       "add_generation_prompt": add_generation_prompt}
            try:  # the render process puts the content in the template's form (it parses the template)
                text = render_untrusted(template, context, self.max_prompt_chars, content_format=self.content_format)
            except ValueError as exc:
                raise APIError(400, str(exc), param="chat_template") from None
            return continued(text, messages) if continue_final_message else text
        try:
            return render_trusted(self.tokenizer, messages, self.chat_template, self.content_format,
                                  add_generation_prompt, continue_final_message, variables)
        except Exception as exc:  # a template error is the conversation's fault (e.g. bad role order)
            raise APIError(400, f"the chat template rejected the conversation: {exc}", param="messages") from None

    # --- completions ---------------------------------------------------------------------------------

    def whole_vocabulary(self, req: _Req) -> _Req:
        """`req` with vLLM's -1 for top_logprobs or prompt_logprobs (every vocabulary entry) as the vocabulary size,
        which --max-logprobs then bounds as any count (vLLM's rule: only --max-logprobs -1, or one at least the
        vocabulary size, lets it through)."""
        update = {name: self.vocab_size for name in ("top_logprobs", "prompt_logprobs")
                  if getattr(req, name, None) == -1}
        return req.model_copy(update=update) if update else req

    def forced_usage(self, req: _Req) -> _Req:
        """`req` as --enable-force-include-usage serves it: a stream carries the final usage chunk and each chunk's
        usage so far, whatever its stream_options ask (vLLM's should_include_usage: (True, True) with the flag)."""
        if not (self.force_include_usage and req.stream):
            return req
        return req.model_copy(update={"stream_options": StreamOptions(include_usage=True, continuous_usage_stats=True)})

    async def completions(self, req: CompletionRequest, model: str) -> dict[str, Any] | AsyncIterator[str]:
        """POST /v1/completions (with `echo`: the prompt's text, and its logprobs, before the completion)."""
        req = self.forced_usage(self.whole_vocabulary(req))
        if req.suffix is not None:
            raise APIError(400, "suffix and best_of are not supported", param="suffix")
        if req.best_of not in (None, req.n):
            raise APIError(400, f"suffix and best_of are not supported (best_of={req.best_of} must be left out or "
                                f"equal n={req.n})", param="best_of")
        if req.max_tokens == 0 and not req.echo:
            raise APIError(400, "max_tokens must be at least 1 (0 only with echo, which returns the prompt alone)",
                           param="max_tokens")
        # vLLM's (and OpenAI's) echo with max_tokens 0: one token is generated, the prompt alone returned
        max_tokens = 1 if req.max_tokens == 0 else req.max_tokens
        prompts = await self.completion_prompts(req)
        prompt_logprobs = req.prompt_logprobs
        if req.echo and req.logprobs is not None:  # the echoed prompt's logprobs are the engine's prompt logprobs
            prompt_logprobs = max(req.logprobs, prompt_logprobs or 0)
        params = [sampling_params(req, max_tokens, len(p.token_ids), self.max_model_len, req.logprobs,
                                  prompt_logprobs, self.default_sampling, self.max_tokens_cap) for p in prompts]
        # Every choice carries its prompt's entries (echoed logprobs and `prompt_logprobs` alike).
        params = check_logprob_entries([len(p.token_ids) for p in prompts], params, req.n,
                                       "prompt_logprobs" if req.prompt_logprobs is not None else "logprobs", "logprobs",
                                       self.max_logprobs, max_tokens_given=max_tokens is not None)
        request_id, engine_id = response_ids("cmpl", req.request_id)
        extras = engine_kwargs(req.priority, req.cache_salt)
        created = int(time.time())
        if req.stream:
            lora = self.lora_for(model)
            # Every prompt is submitted before any is waited on (their prefills can share engine steps), as vLLM
            streams = await admitted_all([self.generate(p.token_ids, _streamed(sp), f"{engine_id}-{i}", p.text,
                                                               lora, **extras)
                                          for i, (p, sp) in enumerate(zip(prompts, params, strict=True))])
            return self._stream_completions(req, prompts, streams, request_id, created, model)
        finals = [asyncio.ensure_future(self._final(p, sp, f"{engine_id}-{i}", model, extras))
                  for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
        try:
            outputs = await asyncio.gather(*finals)
        except BaseException:
            # gather leaves the other prompts running when one fails (e.g. refused: a 400): cancelling
            # them aborts their engine requests, which would otherwise generate for a reply never sent.
            for task in finals:
                task.cancel()
            await asyncio.gather(*finals, return_exceptions=True)
            raise
        # Each choice carries its prompt's tokens (echo, prompt_logprobs, token ids); a large reply is built off the
        # loop
        logprobs = req.logprobs is not None or req.prompt_logprobs is not None
        ids = bool(req.return_token_ids)
        per_token = (1 + max(req.logprobs or 0, req.prompt_logprobs or 0) if logprobs else 0) + ids
        carries_prompt = req.echo or req.prompt_logprobs is not None or ids
        choices = await built(functools.partial(self._completion_choices, req, prompts, outputs),
                              reply_values(outputs, per_token, carries_prompt))
        total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for output in outputs:
            for k, v in usage(output).items():
                total[k] += v
        return {"id": request_id, "object": "text_completion", "created": created, "model": model,
                "choices": choices, "usage": self._cached(total, sum(o.num_cached_tokens for o in outputs))}

    def _completion_choices(self, req: CompletionRequest, prompts: list[Prompt],
                            outputs: list[RequestOutput]) -> list[dict[str, Any]]:
        """A non-streamed reply's choices, prompt by prompt (blocking: a large reply's run on a worker thread)."""
        choices = []
        for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
            for c in output.outputs:
                text, token_ids, entries = self._echoed(req, prompt, output, c.text, c.token_ids, c.logprobs, 0)
                logprobs = self._completion_logprobs(req, token_ids, entries, 0) if req.logprobs is not None else None
                choices.append({"index": i * req.n + c.index, "text": text, "finish_reason": c.finish_reason,
                                "stop_reason": c.stop_reason, "logprobs": logprobs,
                                "prompt_logprobs": self._prompt_logprobs_json(output)
                                if req.prompt_logprobs is not None else None,
                                **({"prompt_token_ids": list(output.prompt_token_ids),
                                    "token_ids": list(c.token_ids)} if req.return_token_ids else {})})
        return choices

    async def _stream_completions(self, req: CompletionRequest, prompts: list[Prompt],
                                  streams: list[AsyncGenerator[RequestOutput]], request_id: str, created: int,
                                  model: str) -> AsyncIterator[str]:
        total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        cached = 0  # prompt tokens found in the prefix cache, as the non-streamed reply reports them
        states = [StreamState(req.n, delta=True) for _ in streams]  # the engine sends deltas (`_streamed`)
        fmt = ChunkFormat(request_id, "text_completion", created, model)
        wants_logprobs = req.logprobs is not None
        continuous = _continuous_usage(req)
        sent_chars: dict[int, int] = {}  # per choice: text sent so far, where the next text_offset starts
        ids_sent: set[int] = set()  # choices whose prompt_token_ids went out (return_token_ids)

        def step_of(i: int, output: RequestOutput, deltas: list[ChoiceDelta], off_loop: bool = False) -> str:
            """One SSE event per choice that changed, written together (one transport write per step, not n);
            `off_loop`: built on a worker thread, each choice's logprobs encoded in pieces (`json_text_in_pieces`)."""
            step = []
            for d in deltas:
                c = d.choice
                index = i * req.n + c.index
                text, token_ids, entries = self._echoed(req, prompts[i], output, d.text, d.token_ids, d.logprobs,
                                                        d.first)
                logprobs = (self._completion_logprobs(req, token_ids, entries, sent_chars.get(index, 0))
                            if wants_logprobs else None)
                sent_chars[index] = sent_chars.get(index, 0) + len(text)
                chunk_logprobs = json_text_in_pieces(logprobs) if off_loop and logprobs is not None else logprobs
                ids = None
                if req.return_token_ids:  # vLLM's: the prompt's ids on a choice's first chunk, then null
                    ids = {"prompt_token_ids": None if index in ids_sent else list(output.prompt_token_ids),
                           "token_ids": list(d.token_ids)}
                    ids_sent.add(index)
                step.append(fmt.completion(index, text, c, chunk_logprobs,
                                           choice_usage(output, d.num_tokens) if continuous else None, ids))
            return "".join(step)

        # A choice's first chunk carries its prompt (echo, return_token_ids): n of them can hold millions of values
        # (n 128, echo with 20 logprobs of a 500-token prompt: 1.3M); and any step carries its tokens' logprobs, up to
        # the whole vocabulary's (49k alternatives a token, with --max-logprobs -1). A large step is built off the
        # loop, as a large reply is.
        per_prompt_token = (1 + (req.logprobs or 0) if wants_logprobs and req.echo else 0) + bool(req.return_token_ids)
        # One prompt (the usual case) reads its stream directly: no pump task and queue per token.
        outputs = merge(streams) if len(streams) > 1 else _indexed(streams[0])
        async for i, output in outputs:
            deltas = states[i].deltas(output)
            openers = sum(d.first == 0 for d in deltas) if per_prompt_token else 0
            values = (openers * len(output.prompt_token_ids) * per_prompt_token
                      + (logprob_values(output) if wants_logprobs else 0))
            step = await built(functools.partial(step_of, i, output, deltas, values > OFF_LOOP_VALUES), values)
            if step:
                yield step
            if output.finished:
                for k, v in counted_usage(len(output.prompt_token_ids), states[i].completion_tokens).items():
                    total[k] += v
                cached += output.num_cached_tokens
        if req.stream_options and req.stream_options.include_usage:
            yield sse({"id": request_id, "object": "text_completion", "created": created, "model": model,
                       "choices": [], "usage": self._cached(total, cached)})
        yield "data: [DONE]\n\n"

    def _echoed(self, req: CompletionRequest, prompt: Prompt, output: RequestOutput, text: str, new_ids: list[int],
                new_entries: list[dict[int, tuple[float, int]]] | None,
                first: int) -> tuple[str, list[int], list[dict[int, tuple[float, int]] | None]]:
        """A choice's new `text`, token ids and logprob entries, the first of them its token `first`; from the start
        with `echo`, the prompt comes first (its first token has no logprob: nothing precedes it)."""
        token_ids: list[int] = list(new_ids)
        entries: list[dict[int, tuple[float, int]] | None] = list(new_entries or [])
        if req.echo and req.max_tokens == 0:  # the prompt alone (its one generated token is not returned)
            text, token_ids, entries = "", [], []
        if req.echo and first == 0:
            prompt_text = prompt.text if prompt.text is not None else self.tokenizer.decode(prompt.token_ids)
            text = prompt_text + text
            token_ids = prompt.token_ids + token_ids
            entries = list(output.prompt_logprobs or [None] * len(prompt.token_ids)) + entries
        return text, token_ids, entries

    def as_token_ids(self, req: CompletionRequest | ChatCompletionRequest) -> bool:
        """Whether logprobs name tokens `token_id:<id>`: the request's return_tokens_as_token_ids, else (unset or
        null) --return-tokens-as-token-ids, as vLLM."""
        asked = req.return_tokens_as_token_ids
        return self.return_tokens_as_token_ids if asked is None else asked

    def _completion_logprobs(self, req: CompletionRequest, token_ids: list[int],
                             entries: list[dict[int, tuple[float, int]] | None], offset: int) -> dict[str, Any]:
        """The legacy completions logprobs block; `text_offset` counts characters from `offset` (the
        text already sent), each token's text after the previous one's, as vLLM counts."""
        n, as_ids = req.logprobs or 0, self.as_token_ids(req)
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token, entry in zip(token_ids, entries, strict=False):
            piece = self._token_text(token, as_ids)[0]
            tokens.append(piece)
            offsets.append(offset)
            offset += len(self.tokenizer.decode([token])) if as_ids else len(piece)
            if entry is None:
                token_logprobs.append(None)
                top.append(None)
                continue
            token_logprobs.append(max(entry[token][0], -9999.0))
            # The prompt's entries may hold more than `n` (prompt_logprobs asked for more): keep the top n.
            # Labels from the per-token cache, as chat's are (one decode a token for the server's life).
            top.append({self._token_text(t, as_ids)[0]: max(lp, -9999.0)
                        for t, (lp, rank) in entry.items() if rank <= n or t == token})
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}

    def _prompt_logprobs_json(self, output: RequestOutput) -> list[dict[str, dict[str, Any]] | None] | None:
        """vLLM's `prompt_logprobs`: per prompt token (None for the first), token id -> logprob, rank, text."""
        if output.prompt_logprobs is None:
            return None
        return [None if e is None else
                {str(t): {"logprob": max(lp, -9999.0), "rank": r, "decoded_token": self.tokenizer.decode([t])}
                 for t, (lp, r) in e.items()} for e in output.prompt_logprobs]

    # --- chat ----------------------------------------------------------------------------------------

    async def chat(self, req: ChatCompletionRequest, model: str) -> dict[str, Any] | AsyncIterator[str]:
        """POST /v1/chat/completions."""
        req = self.forced_usage(self.whole_vocabulary(req))
        if req.tools == []:  # vLLM's (and OpenAI's) refusal, whatever the tool_choice
            raise APIError(400, "`tools` must not be an empty array. Either provide at least one tool or omit the "
                                "field entirely.", param="tools")
        plan = plan_tools(req, self.enable_auto_tool_choice, self.tool_call_parser,
                          self.exclude_tools_when_tool_choice_none)
        prompt = await self.chat_prompt(req, plan.template_tools)
        top = req.top_logprobs if req.logprobs else None
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        sp = constrain_for_tools(plan, sampling_params(req, max_tokens, len(prompt.token_ids), self.max_model_len,
                                                       (top or 0) if req.logprobs else None, req.prompt_logprobs,
                                                       defaults=self.default_sampling,
                                                       max_tokens_cap=self.max_tokens_cap))
        [sp] = check_logprob_entries([len(prompt.token_ids)], [sp], 1,  # the prompt's: one copy, beside the choices
                                     "prompt_logprobs", "top_logprobs" if top else "logprobs", self.max_logprobs,
                                     max_tokens_given=max_tokens is not None)
        request_id, engine_id = response_ids("chatcmpl", req.request_id)
        extras = engine_kwargs(req.priority, req.cache_salt)
        created = int(time.time())
        echo = chat_echo(req, self.response_role)
        if req.stream:
            # vLLM's continuous usage covers the chunks sent before any token too (role, echo): the prompt, 0 tokens
            opening = opening_usage(len(prompt.token_ids)) if _continuous_usage(req) else None
            prompt_ids = list(prompt.token_ids) if req.return_token_ids else None  # vLLM's, on the role chunks
            lora = self.lora_for(model)
            reasoning = self.reasoning_for(sp, prompt.token_ids)
            stream = await admitted(self.generate(prompt.token_ids, _streamed(sp), engine_id, prompt.text, lora,
                                                         **extras))
            if plan.mode != "none" or reasoning is not None:
                fmt = ChunkFormat(request_id, "chat.completion.chunk", created, model)
                chunks = stream_tool_chat(plan, reasoning, req.n, stream, fmt, req.stream_options,
                                          self.enable_prompt_tokens_details, reply_role(req, self.response_role),
                                          opening, prompt_ids,
                                          include_reasoning=req.include_reasoning,
                                          logprobs_of=self.logprobs_of(req) if req.logprobs else None)
            else:
                chunks = self._stream_chat(req, stream, request_id, created, model, opening, prompt_ids)
            return _echo_first(chunks, req.n, echo, request_id, created, model, opening) if echo else chunks
        output = await self._final(prompt, sp, engine_id, model, extras)
        # The prompt's entries come once, beside the choices (prompt_logprobs, prompt_token_ids); a large reply is
        # built off the loop
        ids = bool(req.return_token_ids)
        per_prompt_token = (1 + req.prompt_logprobs if req.prompt_logprobs is not None else 0) + ids
        values = (reply_values([output], (1 + (top or 0) if req.logprobs else 0) + ids)
                  + len(output.prompt_token_ids) * per_prompt_token)
        # and so is one whose outputs the parsers read at length (thousands of tool calls)
        reasoning = self.reasoning_for(sp, output.prompt_token_ids)
        values += sum(parse_values(plan, reasoning, len(c.text)) for c in output.outputs)
        return await built(functools.partial(self._chat_reply, req, plan, sp, output, echo, top, request_id, created,
                                             model), values)

    def reasoning_for(self, sp: SamplingParams, prompt_ids: Sequence[int]) -> ReasoningParser | None:
        """The parser that splits a request's output into thinking and answer, None when it is all answer: a prompt
        that ended the thinking (its last marker is </think>: vLLM's prompt_is_reasoning_end), or a grammar that
        applies from the first token (--structured-outputs-config enable_in_reasoning, or a vocabulary without the
        markers as tokens); a grammar otherwise starts after the thinking (structured_output/thinking.py). A prompt
        that opened the thinking (its last marker is <think>) gets a parser whose output starts inside it, as the
        engine's grammar does (qwen3 on Qwen3.5's and Qwen3-Thinking-2507's templates, as vLLM's qwen3 parser)."""
        if self.reasoning is None or (self.thinking is not None and self.thinking.ended(prompt_ids)):
            return None
        if sp.structured_outputs is not None and not self.grammar_after_thinking:
            return None
        if self.thinking is not None and self.thinking.opened(prompt_ids):
            return self.reasoning_opened
        return self.reasoning

    def _chat_reply(self, req: ChatCompletionRequest, plan: ToolPlan, sp: SamplingParams, output: RequestOutput,
                    echo: str, top: int | None, request_id: str, created: int, model: str) -> dict[str, Any]:
        """A non-streamed chat reply (blocking: a large one is built on a worker thread)."""
        as_ids = self.as_token_ids(req)
        choices = []
        for c in output.outputs:
            message, finish_reason = chat_message(plan, c.text, c.finish_reason,
                                                  self.reasoning_for(sp, output.prompt_token_ids))
            message["role"] = reply_role(req, self.response_role)
            if not req.include_reasoning:  # vLLM's: the thinking is left out, the answer stays as parsed
                message.pop("reasoning", None)
                message.pop("reasoning_content", None)
            if req.echo:
                message["content"] = echo + (message["content"] or "")
            choices.append({"index": c.index, "message": message,
                            "logprobs": self._chat_logprobs(c.token_ids, c.logprobs, top or 0, as_ids)
                            if req.logprobs else None,
                            "finish_reason": finish_reason, "stop_reason": c.stop_reason,
                            **({"token_ids": list(c.token_ids)} if req.return_token_ids else {})})
        reply = {"id": request_id, "object": "chat.completion", "created": created, "model": model,
                 "choices": choices, "usage": self._cached(usage(output), output.num_cached_tokens)}
        if req.prompt_logprobs is not None:  # vLLM's chat field, beside the choices
            reply["prompt_logprobs"] = self._prompt_logprobs_json(output)
        if req.return_token_ids:  # vLLM's, beside the choices' token_ids
            reply["prompt_token_ids"] = list(output.prompt_token_ids)
        return reply

    async def _stream_chat(self, req: ChatCompletionRequest, stream: AsyncGenerator[RequestOutput], request_id: str,
                           created: int, model: str, opening: dict[str, int] | None = None,
                           prompt_ids: list[int] | None = None) -> AsyncIterator[str]:
        """The chat stream; `opening`: the role chunks' usage (continuous_usage_stats), else None; `prompt_ids`: with
        return_token_ids, the prompt's ids (on the role chunks; then each chunk carries its choice's new ids)."""

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return sse({"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": choices, **extra})

        # One SSE event per choice, as OpenAI and vLLM; the events of one step are written together
        role = reply_role(req, self.response_role)
        yield "".join(chunk([{"index": i, "delta": {"role": role, "content": ""}, "logprobs": None,
                              "finish_reason": None}], **({} if opening is None else {"usage": opening}),
                            **({} if prompt_ids is None else {"prompt_token_ids": prompt_ids})) for i in range(req.n))
        state = StreamState(req.n, delta=True)  # the engine sends deltas (`_streamed`)
        last = None
        top = req.top_logprobs or 0
        fmt = ChunkFormat(request_id, "chat.completion.chunk", created, model)
        as_ids, continuous = self.as_token_ids(req), _continuous_usage(req)

        def step_of(output: RequestOutput, deltas: list[ChoiceDelta], off_loop: bool = False) -> str:
            """One SSE event per choice that changed, written together; `off_loop`: built on a worker thread, each
            choice's logprobs encoded in pieces (`json_text_in_pieces`)."""
            step = []
            for d in deltas:
                logprobs = self._chat_logprobs(d.token_ids, d.logprobs, top, as_ids) if req.logprobs else None
                step.append(fmt.chat(d.text, d.choice,
                                     json_text_in_pieces(logprobs) if off_loop and logprobs is not None else logprobs,
                                     choice_usage(output, d.num_tokens) if continuous else None,
                                     None if prompt_ids is None else {"token_ids": list(d.token_ids)}))
            return "".join(step)

        async for output in stream:
            last = output
            deltas = state.deltas(output)
            # A step of the whole vocabulary's logprobs holds 49k alternatives a token (each a few values): built on
            # the loop, /health waited 116 s while steps queued behind one another. A large one is built off it.
            values = logprob_values(output) if req.logprobs else 0
            step = await built(functools.partial(step_of, output, deltas, values > OFF_LOOP_VALUES), values)
            if step:
                yield step
        if req.stream_options and req.stream_options.include_usage and last is not None:
            total = counted_usage(len(last.prompt_token_ids), state.completion_tokens)
            yield chunk([], usage=self._cached(total, last.num_cached_tokens))
        yield "data: [DONE]\n\n"

    def logprobs_of(self, req: ChatCompletionRequest) -> Callable[[list[int], list[Any]], dict[str, Any]]:
        """Chat's logprobs (`{"content": [...]}`) of some tokens, as `_chat_logprobs` gives them for this request: a
        chat stream's chunks' and the Responses API's output text's."""
        top, as_ids = req.top_logprobs or 0, self.as_token_ids(req)
        return lambda token_ids, entries: self._chat_logprobs(token_ids, entries, top, as_ids)

    def _chat_logprobs(self, token_ids: list[int], entries: list[dict[int, tuple[float, int]]] | None, top: int,
                       as_ids: bool = False) -> dict[str, Any]:
        content = []
        for token, entry in zip(token_ids, entries or [], strict=False):
            best = sorted(entry.items(), key=lambda kv: kv[1][1])[:top]
            content.append({**self._token_info(token, entry[token][0], as_ids),
                            "top_logprobs": [self._token_info(t, lp, as_ids) for t, (lp, _) in best]})
        return {"content": content}

    def _token_info(self, token: int, logprob: float, as_ids: bool = False) -> dict[str, Any]:
        piece, utf8 = self._token_text(token, as_ids)
        return {"token": piece, "logprob": max(logprob, -9999.0), "bytes": utf8}

    def _token_text(self, token: int, as_ids: bool) -> tuple[str, tuple[int, ...]]:
        """A token's logprobs label and its UTF-8 bytes, made once per token (`_token_texts`)."""
        known = self._token_texts[as_ids]
        text = known.get(token)
        if text is None:
            piece = token_label(self.tokenizer, token, as_ids)
            text = known[token] = (piece, tuple(piece.encode("utf-8")))
        return text

    def _cached(self, block: dict[str, Any], cached: int) -> dict[str, Any]:
        return with_cached_tokens(block, cached) if self.enable_prompt_tokens_details else block

    def generate(self, token_ids: list[int], sp: SamplingParams, request_id: str, text: str | None,
                 lora: LoRARequest | None, **extras: Any) -> AsyncGenerator[RequestOutput]:
        """The engine's `generate`, its arrival and end logged with --enable-log-requests."""
        stream = self.engine.generate(token_ids, sp, request_id, text, lora, **extras)
        return logged(stream, request_id, token_ids, text, sp, lora, self.max_log_len) if self.log_requests else stream

    def lora_for(self, model: str) -> LoRARequest | None:
        """The adapter a served name stands for (None: the base model)."""
        return self.loras.get(model) if self.loras is not None else None

    async def _final(self, prompt: Prompt, sp: SamplingParams, request_id: str, model: str,
                     extras: dict[str, Any] | None = None) -> RequestOutput:
        final = None
        sp = sp.model_copy(update={"output_kind": "final_only"})  # a non-streaming reply needs only the end
        async for output in self.generate(prompt.token_ids, sp, request_id, prompt.text, self.lora_for(model),
                                                 **(extras or {})):
            final = output
        assert final is not None and final.finished
        return final


async def _indexed(stream: AsyncGenerator[RequestOutput]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """A single request's outputs in `merge`'s shape; closing it closes (aborts) the request."""
    try:
        async for output in stream:
            yield 0, output
    finally:
        await stream.aclose()


async def admitted(stream: AsyncGenerator[RequestOutput]) -> AsyncGenerator[RequestOutput]:
    """`stream` once the engine has accepted its request (its first output is in).

    The engine validates prompts when it queues them; waiting for the first output turns a refusal
    into an error before the response starts (a 400, not an error event inside a 200 stream).
    """
    return _from_first(await anext(stream), stream)


async def admitted_all(streams: list[AsyncGenerator[RequestOutput]]) -> list[AsyncGenerator[RequestOutput]]:
    """`admitted` for several requests at once: all are submitted before any output is awaited, and the streams
    come back once the engine has accepted every one. When any is refused (or the caller is cancelled), every
    request is closed (aborted, its KV blocks freed) before the error is raised."""
    firsts = [asyncio.ensure_future(_first(stream)) for stream in streams]
    try:
        outputs = await asyncio.gather(*firsts)
    except BaseException:
        for task in firsts:  # gather leaves the others running: a request admitted meanwhile must not generate on
            task.cancel()
        await asyncio.gather(*firsts, return_exceptions=True)
        for stream in streams:  # aborts a request whose first output was in (a cancelled one is closed already)
            await stream.aclose()
        raise
    return [_from_first(first, stream) for first, stream in zip(outputs, streams, strict=True)]


async def _first(stream: AsyncGenerator[RequestOutput]) -> RequestOutput:
    return await anext(stream)


async def _from_first(first: RequestOutput, stream: AsyncGenerator[RequestOutput]) -> AsyncGenerator[RequestOutput]:
    """`stream` again from its `first` output, already taken; closing it closes (aborts) the request."""
    try:
        yield first
        async for item in stream:
            yield item
    finally:
        await stream.aclose()  # aborts the request when the client leaves early


async def merge(streams: list[AsyncGenerator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several requests' outputs as they come; closing the merge closes (aborts) them all."""
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[RequestOutput]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item))
            await queue.put((i, None))
        except BaseException as exc:
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()  # a generator cancelled mid-iteration aborts its request on the way out
        await asyncio.gather(*tasks, return_exceptions=True)

