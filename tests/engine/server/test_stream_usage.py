"""`stream_options.continuous_usage_stats` with the real `openai` client against the real server, as vLLM
streams it (serving_chat.chat_completion_stream_generator, serving_completion.completion_stream_generator):
with include_usage, every chunk that carries a choice has a usage block (the prompt and that choice's tokens
so far), the chat stream's first role chunks and its echo chunks included (0 completion tokens there)."""

from __future__ import annotations

import pytest

CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _per_choice_counts(chunks, prompt_tokens: int) -> dict[int, list[int]]:
    """Each choice's completion-token counts, chunk by chunk; every chunk with a choice must carry usage."""
    counts: dict[int, list[int]] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        assert chunk.usage is not None, chunk
        assert chunk.usage.prompt_tokens == prompt_tokens
        assert chunk.usage.total_tokens == prompt_tokens + chunk.usage.completion_tokens
        counts.setdefault(chunk.choices[0].index, []).append(chunk.usage.completion_tokens)
    return counts


def test_chat_role_and_echo_chunks_carry_usage_as_vllm(client):
    # A continued assistant message (add_generation_prompt false) echoed back: per choice, a role chunk and an
    # echo chunk before any token, each with usage {prompt, 0, prompt}. Was: no usage on either.
    chunks = list(client.chat.completions.create(
        model="tiny", n=2, max_tokens=3, seed=1, stream=True, stream_options=CONTINUOUS,
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}],
        extra_body={"echo": True, "add_generation_prompt": False, "min_tokens": 3}))
    prompt_tokens = chunks[-1].usage.prompt_tokens
    counts = _per_choice_counts(chunks, prompt_tokens)
    assert [c.choices[0].delta.role for c in chunks[:2]] == ["assistant", "assistant"]
    assert [c.choices[0].delta.content for c in chunks[2:4]] == ["Hello", "Hello"]
    assert all(c.usage.completion_tokens == 0 for c in chunks[:4])
    assert {i: (v[:2], v[-1], v == sorted(v)) for i, v in counts.items()} == {i: ([0, 0], 3, True) for i in (0, 1)}
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices


def test_tool_call_stream_chunks_carry_usage_as_vllm(client):
    # The tool-call stream (a named function's arguments), the same rule: usage on every chunk, the role one too.
    pytest.importorskip("xgrammar")
    chunks = list(client.chat.completions.create(
        model="tiny", max_tokens=4, seed=1, stream=True, stream_options=CONTINUOUS,
        messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER], tool_choice=NAMED))
    prompt_tokens = chunks[-1].usage.prompt_tokens
    counts = _per_choice_counts(chunks, prompt_tokens)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].usage.completion_tokens == 0
    assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert counts[0] == sorted(counts[0]) and counts[0][-1] == chunks[-1].usage.completion_tokens


def test_completion_stream_chunks_carry_usage_as_vllm(client):
    # Each chunk's usage counts its choice's tokens so far, the echoed prompt's chunk its first token(s). A chunk
    # can carry several tokens (a reader that falls behind gets the latest cumulative output: request_stream;
    # vLLM's RequestOutputCollector merges deltas alike), so each count is checked against the tokens the chunks
    # delivered (their logprobs), not against one token a chunk.
    chunks = list(client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=3, n=2, seed=1, echo=True, logprobs=0, stream=True,
        stream_options=CONTINUOUS, extra_body={"min_tokens": 3}))
    prompt_tokens = chunks[-1].usage.prompt_tokens
    counts = _per_choice_counts(chunks, prompt_tokens)
    delivered: dict[int, list[int]] = {}
    for chunk in chunks[:-1]:
        choice = chunk.choices[0]
        so_far = delivered.setdefault(choice.index, [])
        echoed = 0 if so_far else prompt_tokens  # the first chunk starts with the prompt's tokens
        so_far.append((so_far[-1] if so_far else 0) + len(choice.logprobs.tokens) - echoed)
    assert counts == delivered
    assert {i: (v[0] >= 1, v[-1]) for i, v in counts.items()} == {0: (True, 3), 1: (True, 3)}
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices


def test_continuous_usage_stats_without_include_usage_sends_no_usage_as_vllm(client):
    # vLLM's include_continuous_usage = include_usage and continuous_usage_stats (should_include_usage): asked
    # alone, no chunk carries usage. Was: every chunk did.
    chat = list(client.chat.completions.create(
        model="tiny", max_tokens=2, stream=True, stream_options={"continuous_usage_stats": True},
        messages=[{"role": "user", "content": "hi"}]))
    completion = list(client.completions.create(
        model="tiny", prompt="hi", max_tokens=2, stream=True, stream_options={"continuous_usage_stats": True}))
    assert chat and completion
    assert all(c.usage is None and c.choices for c in chat + completion)
