"""OpenAI completions and chat completions on top of the async engine: request -> SamplingParams,
engine outputs -> response JSON or SSE chunks."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from flotilla.engine.async_engine import AsyncEngine
from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.server.errors import APIError
from flotilla.engine.server.protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields


@dataclass
class Prompt:
    """A tokenized prompt ready for the engine."""

    token_ids: list[int]
    text: str | None


def sampling_params(req: _SamplingFields, max_tokens: int | None, prompt_len: int, max_model_len: int,
                    logprobs: int | None, prompt_logprobs: int | None = None) -> SamplingParams:
    """OpenAI/vLLM request fields -> SamplingParams; defaults as vLLM's server (temperature 1)."""
    room = max_model_len - prompt_len
    if max_tokens is not None and max_tokens > room:
        raise APIError(400, f"max_tokens={max_tokens} is too large: the prompt has {prompt_len} tokens and this "
                            f"model's maximum context length is {max_model_len} tokens", param="max_tokens")
    try:
        bias = {int(k): v for k, v in (req.logit_bias or {}).items()} or None
    except ValueError:
        raise APIError(400, "logit_bias keys must be token ids", param="logit_bias") from None
    try:
        return SamplingParams(
            n=req.n,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k is None else req.top_k,
            min_p=0.0 if req.min_p is None else req.min_p,
            seed=req.seed,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            logit_bias=bias,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids or [],
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            max_tokens=max_tokens if max_tokens is not None else room,
            min_tokens=req.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=req.skip_special_tokens,
        )
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def usage(output: RequestOutput) -> dict[str, int]:
    """OpenAI's usage block."""
    completion = sum(len(c.token_ids) for c in output.outputs)
    prompt = len(output.prompt_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class StreamState:
    """Per-choice text already sent, to turn cumulative outputs into deltas."""

    def __init__(self, n: int) -> None:
        self.sent_text = [0] * n
        self.sent_tokens = [0] * n
        self.finished = [False] * n

    def deltas(self, output: RequestOutput) -> list[tuple[CompletionOutput, str, int]]:
        """(choice, new text, index of its first new token) for choices that changed."""
        changes = []
        for c in output.outputs:
            if self.finished[c.index]:
                continue
            new_text = c.text[self.sent_text[c.index] :]
            first_new_token = self.sent_tokens[c.index]
            if new_text or c.finish_reason is not None or len(c.token_ids) > first_new_token:
                changes.append((c, new_text, first_new_token))
                self.sent_text[c.index] = len(c.text)
                self.sent_tokens[c.index] = len(c.token_ids)
                self.finished[c.index] = c.finish_reason is not None
        return changes


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class OpenAIServing:
    """The two generation endpoints; the app supplies tokenization and the chosen model name."""

    def __init__(self, engine: AsyncEngine, tokenizer: Any, max_model_len: int) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len

    # --- prompts ------------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize on the front end's own tokenizer (the engine thread has its own)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def check_length(self, token_ids: list[int]) -> None:
        """400 for prompts the model cannot take."""
        if not token_ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        if len(token_ids) >= self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                                f"your prompt has {len(token_ids)} tokens (plus at least 1 for the completion). "
                                "Please reduce the length of the prompt.",
                           param="prompt", code="context_length_exceeded")
        vocab = len(self.tokenizer)
        if any(not 0 <= t < vocab for t in token_ids):
            raise APIError(400, f"prompt token ids must lie in [0, {vocab})", param="prompt")

    def completion_prompts(self, req: CompletionRequest) -> list[Prompt]:
        """The `prompt` field in any of its four shapes."""
        p = req.prompt
        if isinstance(p, str):
            items: list[str | list[int]] = [p]
        elif p and isinstance(p[0], int):
            items = [p]
        else:
            items = list(p)
        if not items:
            raise APIError(400, "prompt must not be empty", param="prompt")
        prompts = [Prompt(self.encode(x), x) if isinstance(x, str) else Prompt(list(x), None) for x in items]
        for prompt in prompts:
            self.check_length(prompt.token_ids)
        return prompts

    def chat_prompt(self, req: ChatCompletionRequest) -> Prompt:
        """Render the chat template, then tokenize (the template already holds special tokens)."""
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        for m in messages:
            if isinstance(m.get("content"), list):  # OpenAI's [{"type": "text", "text": ...}] form
                parts = m["content"]
                if any(part.get("type") != "text" for part in parts):
                    raise APIError(400, "only text content parts are supported", param="messages")
                m["content"] = "".join(part.get("text", "") for part in parts)
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=req.add_generation_prompt,
                                                      **(req.chat_template_kwargs or {}))
        except Exception as exc:  # a template error is the conversation's fault (e.g. bad role order)
            raise APIError(400, f"the chat template rejected the conversation: {exc}", param="messages") from None
        prompt = Prompt(self.encode(text, add_special_tokens=False), text)
        self.check_length(prompt.token_ids)
        return prompt

    # --- completions ---------------------------------------------------------------------------------

    async def completions(self, req: CompletionRequest, model: str) -> dict[str, Any] | AsyncIterator[str]:
        """POST /v1/completions."""
        if req.echo or req.suffix is not None or (req.best_of not in (None, req.n)):
            raise APIError(400, "echo, suffix and best_of are not supported", param="echo")
        prompts = self.completion_prompts(req)
        params = [sampling_params(req, req.max_tokens, len(p.token_ids), self.max_model_len, req.logprobs,
                                  req.prompt_logprobs) for p in prompts]
        request_id = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if req.stream:
            return self._stream_completions(req, prompts, params, request_id, created, model)
        outputs = await asyncio.gather(
            *(self._final(p, sp, f"{request_id}-{i}") for i, (p, sp) in enumerate(zip(prompts, params, strict=True)))
        )
        choices = []
        for i, output in enumerate(outputs):
            for c in output.outputs:
                choices.append({"index": i * req.n + c.index, "text": c.text, "finish_reason": c.finish_reason,
                                "stop_reason": c.stop_reason,
                                "logprobs": self._completion_logprobs(c, 0) if req.logprobs is not None else None,
                                "prompt_logprobs": _jsonable_prompt_logprobs(output) if req.prompt_logprobs else None})
        total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for output in outputs:
            for k, v in usage(output).items():
                total[k] += v
        return {"id": request_id, "object": "text_completion", "created": created, "model": model,
                "choices": choices, "usage": total}

    async def _stream_completions(self, req: CompletionRequest, prompts: list[Prompt], params: list[SamplingParams],
                                  request_id: str, created: int, model: str) -> AsyncIterator[str]:
        total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        states = [StreamState(req.n) for _ in prompts]
        streams = [self.engine.generate(p.token_ids, sp, f"{request_id}-{i}", p.text)
                   for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
        async for i, output in merge(streams):
            for c, text, first in states[i].deltas(output):
                choice = {"index": i * req.n + c.index, "text": text, "finish_reason": c.finish_reason,
                          "stop_reason": c.stop_reason,
                          "logprobs": self._completion_logprobs(c, first) if req.logprobs is not None else None}
                yield sse({"id": request_id, "object": "text_completion", "created": created, "model": model,
                           "choices": [choice]})
            if output.finished:
                for k, v in usage(output).items():
                    total[k] += v
        if req.stream_options and req.stream_options.include_usage:
            yield sse({"id": request_id, "object": "text_completion", "created": created, "model": model,
                       "choices": [], "usage": total})
        yield "data: [DONE]\n\n"

    def _completion_logprobs(self, c: CompletionOutput, first: int) -> dict[str, Any]:
        """The legacy completions logprobs block, for tokens from index `first` on."""
        tokens, token_logprobs, top, offsets = [], [], [], []
        for token, entry in zip(c.token_ids[first:], (c.logprobs or [])[first:], strict=False):
            tokens.append(self._piece(token))
            token_logprobs.append(entry[token][0])
            top.append({self._piece(t): lp for t, (lp, _) in entry.items()})
            offsets.append(0)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}

    # --- chat ----------------------------------------------------------------------------------------

    async def chat(self, req: ChatCompletionRequest, model: str) -> dict[str, Any] | AsyncIterator[str]:
        """POST /v1/chat/completions."""
        if req.tools or (req.tool_choice not in (None, "none")):
            raise APIError(400, "tools are not supported yet", param="tools")
        if req.response_format and req.response_format.get("type") not in (None, "text"):
            raise APIError(400, f"response_format {req.response_format.get('type')!r} is not supported yet",
                           param="response_format")
        prompt = self.chat_prompt(req)
        top = req.top_logprobs if req.logprobs else None
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        sp = sampling_params(req, max_tokens, len(prompt.token_ids), self.max_model_len,
                             (top or 0) if req.logprobs else None)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if req.stream:
            return self._stream_chat(req, prompt, sp, request_id, created, model)
        output = await self._final(prompt, sp, request_id)
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": self._chat_logprobs(c, 0, top or 0) if req.logprobs else None,
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason} for c in output.outputs]
        return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
                "choices": choices, "usage": usage(output)}

    async def _stream_chat(self, req: ChatCompletionRequest, prompt: Prompt, sp: SamplingParams, request_id: str,
                           created: int, model: str) -> AsyncIterator[str]:
        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return sse({"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": choices, **extra})

        for i in range(req.n):
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}])
        state = StreamState(req.n)
        last = None
        top = req.top_logprobs or 0
        async for output in self.engine.generate(prompt.token_ids, sp, request_id, prompt.text):
            last = output
            for c, text, first in state.deltas(output):
                yield chunk([{"index": c.index, "delta": {"content": text} if text else {},
                              "logprobs": self._chat_logprobs(c, first, top) if req.logprobs else None,
                              "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}])
        if req.stream_options and req.stream_options.include_usage and last is not None:
            yield chunk([], usage=usage(last))
        yield "data: [DONE]\n\n"

    def _chat_logprobs(self, c: CompletionOutput, first: int, top: int) -> dict[str, Any]:
        content = []
        for token, entry in zip(c.token_ids[first:], (c.logprobs or [])[first:], strict=False):
            best = sorted(entry.items(), key=lambda kv: kv[1][1])[:top]
            content.append({**self._token_info(token, entry[token][0]),
                            "top_logprobs": [self._token_info(t, lp) for t, (lp, _) in best]})
        return {"content": content}

    def _token_info(self, token: int, logprob: float) -> dict[str, Any]:
        piece = self._piece(token)
        return {"token": piece, "logprob": max(logprob, -9999.0), "bytes": list(piece.encode("utf-8"))}

    def _piece(self, token: int) -> str:
        return self.tokenizer.decode([token])

    async def _final(self, prompt: Prompt, sp: SamplingParams, request_id: str) -> RequestOutput:
        final = None
        sp = sp.model_copy(update={"output_kind": "final_only"})  # a non-streaming reply needs only the end
        async for output in self.engine.generate(prompt.token_ids, sp, request_id, prompt.text):
            final = output
        assert final is not None and final.finished
        return final


async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several requests' outputs as they come; closing the merge closes (aborts) them all."""
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
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


def _jsonable_prompt_logprobs(output: RequestOutput) -> list[dict[str, dict[str, float]] | None] | None:
    if output.prompt_logprobs is None:
        return None
    return [None if e is None else {str(t): {"logprob": lp, "rank": r} for t, (lp, r) in e.items()}
            for e in output.prompt_logprobs]
