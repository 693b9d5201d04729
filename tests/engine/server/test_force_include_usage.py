"""--enable-force-include-usage (vLLM's flag): every streamed chat and completions response carries usage, the final
usage chunk and each chunk's usage so far, whatever its stream_options ask (vLLM's should_include_usage returns
(True, True) with the flag)."""

from __future__ import annotations

import openai
import pytest

from .conftest import API_KEY

TOKENS = 5


@pytest.fixture
def oai(flags_server):
    """A client of the session's `flags_server` (conftest.py), which has the flag."""
    return openai.OpenAI(base_url=f"{flags_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _check(chunks: list, prompt_tokens: int | None = None) -> None:
    """Each content chunk counts the tokens so far; the last chunk is usage alone, over the whole answer."""
    *content, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == TOKENS
    assert last.usage.total_tokens == last.usage.prompt_tokens + TOKENS
    assert all(c.usage is not None and c.usage.prompt_tokens == last.usage.prompt_tokens for c in content)
    counts = [c.usage.completion_tokens for c in content]
    assert counts == sorted(counts) and counts[-1] == TOKENS


def test_a_chat_stream_without_stream_options_carries_usage(oai):
    chunks = list(oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                              max_tokens=TOKENS, stream=True, extra_body={"ignore_eos": True}))
    _check(chunks)


def test_a_completions_stream_that_turns_usage_off_still_carries_it(oai):
    # vLLM's flag wins over the request, include_usage false included
    chunks = list(oai.completions.create(model="tiny", prompt="Once upon a time", max_tokens=TOKENS, stream=True,
                                         stream_options={"include_usage": False}, extra_body={"ignore_eos": True}))
    _check(chunks)


def test_answers_that_are_not_streamed_carry_usage_as_always(oai):
    out = oai.completions.create(model="tiny", prompt="Once upon a time", max_tokens=TOKENS,
                                 extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == TOKENS
    # the Responses API reports usage in its last event (incomplete: max_output_tokens), with or without the flag
    events = list(oai.responses.create(model="tiny", input="Hello", max_output_tokens=TOKENS, stream=True,
                                       store=False))
    assert events[-1].type == "response.incomplete" and events[-1].response.usage.output_tokens == TOKENS
