"""Streams are built from the engine's delta outputs: with the real `openai` client, a long stream with n > 1, logprobs,
a stop string and continuous usage, joined, is the non-streamed reply exactly (which comes from final outputs)."""

from __future__ import annotations

PROMPT = "Once upon a time in a harbour far away"
LONG = dict(max_tokens=200, temperature=1.0, seed=5, n=2)


def _stop(text: str) -> str:
    """A stop string met mid-way through `text` (the choices are seeded: the same text again)."""
    return text[len(text) // 2 : len(text) // 2 + 3]


def test_a_long_completion_stream_joined_is_the_reply(client):
    kwargs = dict(model="tiny", prompt=PROMPT, logprobs=2, **LONG)
    # This first call also puts the prompt in the prefix cache for both compared replies (numerics alike).
    stop = _stop(client.completions.create(**kwargs).choices[0].text)
    full = client.completions.create(**kwargs, stop=[stop])
    assert full.choices[0].stop_reason == stop
    chunks = list(client.completions.create(**kwargs, stop=[stop], stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    for choice in full.choices:
        mine = [c for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(c.choices[0].text for c in mine) == choice.text
        for field in ("tokens", "token_logprobs", "top_logprobs"):  # (a stream's text_offset counts sent text, as vLLM)
            assert [x for c in mine for x in getattr(c.choices[0].logprobs, field)] == getattr(choice.logprobs, field)
        assert (mine[-1].choices[0].finish_reason, mine[-1].choices[0].stop_reason) == (choice.finish_reason,
                                                                                        choice.stop_reason)
        assert mine[-1].usage.completion_tokens == len(choice.logprobs.tokens)  # this choice's tokens so far
    assert chunks[-1].usage == full.usage and not chunks[-1].choices


def test_a_long_chat_stream_joined_is_the_reply(client):
    messages = [{"role": "user", "content": PROMPT}]
    kwargs = dict(model="tiny", messages=messages, logprobs=True, top_logprobs=2, **LONG)
    # This first call also puts the prompt in the prefix cache for both compared replies (numerics alike).
    stop = _stop(client.chat.completions.create(**kwargs).choices[0].message.content)
    kwargs["stop"] = [stop]
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    for choice in full.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content
        assert [e for c in mine if c.logprobs for e in c.logprobs.content] == choice.logprobs.content
        assert mine[-1].finish_reason == choice.finish_reason
    assert chunks[-1].usage == full.usage
    assert full.choices[0].finish_reason == "stop" and full.usage.completion_tokens > 100  # long: many steps
