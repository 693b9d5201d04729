"""Streaming chat completions that may call tools: chunks shaped as OpenAI streams them.

Text that is surely content streams as `delta.content` as it comes. A named function's arguments
stream as they are generated (the first chunk carries the call's id, type and name, later ones
only `function.arguments`). Calls the parser or the `required` grammar yields appear when the
choice finishes, one `delta.tool_calls` entry per call, and the choice ends with
`finish_reason: "tool_calls"` (`"stop"` for a named function, as OpenAI and vLLM).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from flotilla.engine.outputs import CompletionOutput, RequestOutput
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.server.json_reply import OFF_LOOP_VALUES, built
from flotilla.engine.server.protocol import StreamOptions
from flotilla.engine.server.reasoning import ReasoningParser, ReasoningStream
from flotilla.engine.server.sse import ChunkFormat, json_text, json_text_in_pieces, logprob_values
from flotilla.engine.server.tool_calls import ToolPlan, parse_values, thinking, tool_call_deltas, tool_calls_finish
from flotilla.engine.server.tool_parsers.base import ToolCall

logger = logging.getLogger(__name__)

# A step's token ids and their logprob entries as a chunk's `logprobs` (OpenAI's `{"content": [...]}`).
LogprobsOf = Callable[[list[int], list[Any]], dict[str, Any]]


def constrain_for_tools(plan: ToolPlan, sp: SamplingParams) -> SamplingParams:
    """The request's sampling parameters with its tool grammar (required / named), and special tokens
    kept when the parser's marker is one. A forced call is the whole reply, so a reply format beside it
    (response_format, text.format, structured_outputs) has nothing to constrain: the tool grammar replaces it, as
    vLLM's tool parsers do (`adjust_request`) and OpenAI serves the pair (the SDK's `parse` with a pydantic tool,
    instructor's Responses tools mode)."""
    update: dict[str, Any] = {}
    if plan.constraint is not None:
        if sp.structured_outputs is not None:
            logger.info("tool_choice %r forces a tool call: the request's reply format does not apply", plan.mode)
        update["structured_outputs"] = plan.constraint
    if plan.mode == "auto" and plan.parser is not None and plan.parser.keeps_special_tokens:
        update["skip_special_tokens"] = False
    return sp.model_copy(update=update) if update else sp


class _Choice:
    """What one choice has streamed so far: its parsers' state (each step parses only the step's news)."""

    def __init__(self, plan: ToolPlan, reasoning: ReasoningParser | None) -> None:
        self.thinking = ReasoningStream(reasoning) if reasoning is not None else None
        self.answer = plan.stream()
        self.call: ToolCall | None = None  # the named call, once its first chunk is out
        self.done = False


async def stream_tool_chat(plan: ToolPlan, reasoning: ReasoningParser | None, n: int,
                           stream: AsyncGenerator[RequestOutput], head: ChunkFormat,
                           stream_options: StreamOptions | None,
                           prompt_tokens_details: bool = False, role: str = "assistant",
                           opening: dict[str, int] | None = None,
                           prompt_ids: list[int] | None = None, *,
                           include_reasoning: bool = True,
                           logprobs_of: LogprobsOf | None = None) -> AsyncIterator[str]:
    """SSE chunks for a chat request with tools or a reasoning parser (`head` is the response's
    ChunkFormat); thinking streams as `delta.reasoning` (and `delta.reasoning_content`) before the answer.
    `prompt_tokens_details`: the usage chunk reports cached prompt tokens (--enable-prompt-tokens-details); `role` is
    the reply's (serving.reply_role); `opening`: with continuous_usage_stats, the usage before any token
    (serving.opening_usage), and then every chunk carries its choice's usage so far, as vLLM's (the role chunks
    included); `prompt_ids`: with return_token_ids, the prompt's ids, sent on the role chunks, and then each choice's
    new token ids ride on its first chunk of each step (an empty-delta chunk when the parser holds the text back), as
    vLLM sends every step's ids. `include_reasoning` false (vLLM's field): the thinking is parsed apart but not sent.
    `logprobs_of` (the request asked for logprobs): each step's tokens' logprobs ride on the choice's first chunk of
    that step, as the ids do (an empty-delta chunk when the parsers hold the text back), so that joined they are the
    non-streamed reply's."""
    # `stream` yields delta outputs (each step's news), which each choice's parsers take in turn
    tokens = [0] * n  # each choice's completion tokens so far, for the usage
    chars = [0] * n  # each choice's output characters so far: what its parse at the end reads, at most
    unsent: list[list[int]] = [[] for _ in range(n)]  # each choice's new token ids not yet on a chunk
    unlogged: list[tuple[list[int], list[Any]]] = [([], []) for _ in range(n)]  # the same for the logprobs

    def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None,
              stop_reason: int | str | None = None, *, pieces: bool = False) -> str:
        """One choice's chunk; `pieces`: built on a worker thread, encoded in pieces (the same text)."""
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}
        if prompt_ids is not None and "role" not in delta:
            choice["token_ids"], unsent[index] = unsent[index], []
        if logprobs_of is not None and unlogged[index][0]:
            choice["logprobs"], unlogged[index] = logprobs_of(*unlogged[index]), ([], [])
        usage = ""
        if opening is not None:
            prompt = opening["prompt_tokens"]
            usage = (f', "usage": {{"prompt_tokens": {prompt}, "completion_tokens": {tokens[index]}, '
                     f'"total_tokens": {prompt + tokens[index]}}}')
        if prompt_ids is not None and "role" in delta:
            usage += f', "prompt_token_ids": {json.dumps(prompt_ids)}'
        return f"{head.head}{json_text_in_pieces(choice) if pieces else json_text(choice)}]{usage}}}\n\n"

    yield "".join(chunk(i, {"role": role, "content": ""}) for i in range(n))  # one write, n events
    choices = [_Choice(plan, reasoning) for _ in range(n)]

    def step_of(output: RequestOutput, off_loop: bool = False) -> str:
        """The step's events, all choices', written together; `off_loop`: built on a worker thread, each chunk
        encoded in pieces."""
        step: list[str] = []
        encoded = functools.partial(chunk, pieces=off_loop)
        for c in output.outputs:
            state = choices[c.index]
            if state.done:
                continue
            if prompt_ids is not None:
                unsent[c.index] += c.token_ids
            if logprobs_of is not None:
                unlogged[c.index][0].extend(c.token_ids)
                unlogged[c.index][1].extend(c.logprobs or [])
            tokens[c.index] += len(c.token_ids)
            answer = c.text
            if state.thinking is not None:
                split = state.thinking.feed(c.text, finished=c.finish_reason is not None)
                if split.reasoning and include_reasoning:
                    step.append(encoded(c.index, thinking(split.reasoning)))
                answer = split.content or ""
            step += _choice_chunks(plan, c, answer, state, encoded)
            if unsent[c.index] or unlogged[c.index][0]:  # the parser held this step's text back: its ids
                # and logprobs still go out
                step.append(encoded(c.index, {}))
        return "".join(step)

    last = None
    try:
        async for output in stream:
            last = output
            # With the whole vocabulary's logprobs a step holds 49k alternatives a token: a large one is built off
            # the loop (serving.py's chat stream)
            values = logprob_values(output) if logprobs_of is not None else 0
            for c in output.outputs:  # a finishing choice's answer is parsed whole: a long one off the loop too
                chars[c.index] += len(c.text)
                values += parse_values(plan, None, chars[c.index]) if c.finish_reason is not None else 0
            step = await built(functools.partial(step_of, output, values > OFF_LOOP_VALUES), values)
            if step:
                yield step
    finally:
        await stream.aclose()
    if stream_options and stream_options.include_usage and last is not None:
        prompt = len(last.prompt_token_ids)
        completion = sum(tokens)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}
        if prompt_tokens_details and last.num_cached_tokens:  # as the other paths: only when some were cached
            usage["prompt_tokens_details"] = {"cached_tokens": last.num_cached_tokens}
        yield head.head.removesuffix('"choices": [') + f'"choices": [], "usage": {json.dumps(usage)}}}\n\n'
    yield "data: [DONE]\n\n"


def _choice_chunks(plan: ToolPlan, c: CompletionOutput, new: str, state: _Choice, chunk: Any) -> list[str]:
    """Chunks for one choice's step (`new`: the step's new answer text)."""
    out = []
    sent = state.answer.sent  # before this step: a finishing step's text goes out after the parse
    content = state.answer.feed(new)
    if plan.mode == "named":
        assert plan.function is not None
        if state.call is None:
            state.call = ToolCall(name=plan.function, arguments=content)
            out.append(chunk(c.index, {"tool_calls": tool_call_deltas([state.call])}))
        elif content:
            out.append(chunk(c.index, {"tool_calls": [{"index": 0, "function": {"arguments": content}}]}))
    elif content and c.finish_reason is None:
        out.append(chunk(c.index, {"content": content}))
    if c.finish_reason is None:
        return out
    state.done = True
    finish: str | None = c.finish_reason
    if plan.mode != "named":  # a named call's finish stays "stop" (tool_calls_finish)
        text = state.answer.text  # the whole answer, parsed once
        parsed = plan.parse(text)
        if parsed.tool_calls:
            if content:  # text before the calls that came with the last step (it used to be dropped)
                out.append(chunk(c.index, {"content": content}))
            out.append(chunk(c.index, {"tool_calls": tool_call_deltas(parsed.tool_calls)}))
            finish = tool_calls_finish(plan, finish)
        elif text[sent:]:
            out.append(chunk(c.index, {"content": text[sent:]}))
    out.append(chunk(c.index, {}, finish, c.stop_reason))
    return out
