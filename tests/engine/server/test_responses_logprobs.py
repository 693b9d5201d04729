"""Output logprobs on POST /v1/responses, as vLLM's: `include: ["message.output_text.logprobs"]` with `top_logprobs`
alternatives, on the `output_text` part and on the stream's `output_text.delta`/`.done` events; read through the
real openai SDK over loopback on the tiny model."""

from __future__ import annotations

import openai
import pytest

QUESTION = "Name a colour of the sea."
INCLUDE = ["message.output_text.logprobs"]


def _chat_logprobs(client, top: int, max_tokens: int) -> list:
    answer = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                            max_tokens=max_tokens, temperature=0, logprobs=True, top_logprobs=top)
    return answer.choices[0].logprobs.content


def _same(ours: list, chats: list) -> None:
    """Token for token, the chat completion's logprobs (the same greedy request, chat's conversion)."""
    assert [e.token for e in ours] == [e.token for e in chats]
    assert [e.logprob for e in ours] == pytest.approx([e.logprob for e in chats], abs=1e-3)
    for mine, theirs in zip(ours, chats, strict=True):
        assert [t.token for t in mine.top_logprobs] == [t.token for t in theirs.top_logprobs]
        assert [t.logprob for t in mine.top_logprobs] == pytest.approx([t.logprob for t in theirs.top_logprobs],
                                                                         abs=1e-3)


def test_output_text_logprobs_equal_chats_with_top_logprobs_alternatives(client):
    response = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=6, temperature=0,
                                       include=INCLUDE, top_logprobs=3)
    part = response.output[0].content[0]
    assert part.type == "output_text" and len(part.logprobs) == response.usage.output_tokens == 6
    assert all(len(e.top_logprobs) == 3 and e.bytes == list(e.token.encode()) for e in part.logprobs)
    assert all(e.top_logprobs[0].logprob >= e.logprob for e in part.logprobs)  # greedy: the token is the best
    _same(part.logprobs, _chat_logprobs(client, 3, 6))
    assert response.top_logprobs == 3  # echoed, as vLLM's


def test_include_alone_gives_the_tokens_logprobs_without_alternatives(client):
    response = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=4, temperature=0,
                                       include=INCLUDE)
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == 4 and all(e.top_logprobs == [] for e in logprobs)
    _same(logprobs, _chat_logprobs(client, 0, 4))
    # Not asked for: none, as before (and as vLLM)
    plain = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=4, temperature=0)
    assert plain.output[0].content[0].logprobs == []
    assert response.top_logprobs == 0 and plain.top_logprobs is None


def test_stream_deltas_carry_the_logprobs_of_their_tokens(client):
    whole = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=8, temperature=0,
                                    include=INCLUDE, top_logprobs=2)
    events = list(client.responses.create(model="tiny", input=QUESTION, max_output_tokens=8, temperature=0,
                                          include=INCLUDE, top_logprobs=2, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    streamed = [entry for d in deltas for entry in d.logprobs]
    expected = whole.output[0].content[0].logprobs
    _same(streamed, expected)
    assert all(len(e.top_logprobs) == 2 for e in streamed)
    # a delta with text carries its tokens' logprobs: their tokens join into its text
    assert all(d.logprobs for d in deltas if d.delta)
    done = next(e for e in events if e.type == "response.output_text.done")
    _same(done.logprobs, expected)
    final = events[-1].response.output[0].content[0].logprobs
    _same(final, expected)


def test_the_sdk_stream_helper_reads_them(client):
    with client.responses.stream(model="tiny", input=QUESTION, max_output_tokens=5, temperature=0,
                                 include=INCLUDE, top_logprobs=1) as stream:
        events = list(stream)
    assert len([entry for e in events if e.type == "response.output_text.delta" for entry in e.logprobs]) == 5
    last = events[-1]  # max_output_tokens reached: response.incomplete, which get_final_response does not take
    assert last.type == "response.incomplete" and len(last.response.output[0].content[0].logprobs) == 5


@pytest.mark.parametrize(("body", "param"), [
    ({"top_logprobs": 2}, "top_logprobs"),  # alternatives without include asking for logprobs: not dropped unsaid
    ({"include": INCLUDE, "top_logprobs": 21}, "top_logprobs"),  # past vLLM's max_logprobs default, as chat
    ({"include": INCLUDE, "top_logprobs": -1}, "top_logprobs"),
    ({"include": ["message.output_text.tokens"]}, "include"),  # not one of the include values vLLM knows
])
@pytest.mark.parametrize("stream", [False, True])
def test_unservable_logprob_requests_are_a_400_naming_the_field(client, body, param, stream):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2, stream=stream, **body)
    assert param in str(err.value.body)


def test_vllms_other_include_values_are_accepted(client):
    # Codex and the SDK send `reasoning.encrypted_content` with store false; vLLM accepts them, nothing to add here
    response = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2, store=False,
                                       include=["reasoning.encrypted_content", "file_search_call.results"])
    assert response.output[0].content[0].logprobs == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_function_call_with_logprobs_asked_is_served_without_a_message(client, stream):
    # The call's tokens have no output_text to ride on (vLLM's too): the call is served as without them
    tool = {"type": "function", "name": "paint", "parameters": {"type": "object", "properties": {
        "colour": {"type": "string"}}, "required": ["colour"]}}
    kw = {"model": "tiny", "input": QUESTION, "max_output_tokens": 40, "temperature": 0, "tools": [tool],
          "tool_choice": {"type": "function", "name": "paint"}, "include": INCLUDE, "top_logprobs": 2}
    if stream:
        events = list(client.responses.create(**kw, stream=True))
        assert not [e for e in events if e.type.startswith("response.output_text")]
        response = events[-1].response
    else:
        response = client.responses.create(**kw)
    assert [item.type for item in response.output] == ["function_call"]
