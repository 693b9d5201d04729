"""qwen3's thinking, as vLLM's qwen3 reasoning parser has it for Qwen3.5: a template that opens `<think>` in the prompt
makes the output thinking from its first token, and a call opening (`<tool_call>`, whitespace, `<function=`) ends the
thinking as `</think>` does, both in the reply's split and where the engine starts the grammar. The real openai
client against the real server (`--reasoning-parser qwen3`), on a tiny random model whose vocabulary has Qwen's
markers as tokens, `<function=` among them so that logit_bias can steer the model to write a call opening.

Steering: `<tool_call>` at +100 and `<function=` at +99, sampled at temperature 1, so a completion thinks in those
two tokens (a `<tool_call>` that another `<tool_call>` follows is a mention, not an opening) until a `<function=`
follows a `<tool_call>`: that completes the opening, and the grammar, whose enum schema has no room for either token,
starts at the next token."""

from __future__ import annotations

import json
import re

import pytest
from openai import OpenAI

from .conftest import API_KEY, start_tiny_server, stop_server, streamed_reasoning_and_content, tiny_llama_with_markers
from .test_structured_after_thinking import MESSAGES, RESPONSE_FORMAT, TEMPLATE

# The verdict schema, the question and Qwen3.5's template shape (the prompt opens <think>; enable_thinking false
# writes an empty, closed one) are the deepseek_r1 module's.
MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<function=")


@pytest.fixture(scope="module")
def qwen_model(embedded_model_dir, tmp_path_factory):
    """A tiny random Llama with the embedded tokenizer plus the markers (added, not special: they stay in the text,
    as Qwen3's), and the markers' ids by text."""
    path = tmp_path_factory.mktemp("qwen3-model")
    tokenizer = tiny_llama_with_markers(embedded_model_dir, path, MARKERS, seed=35)
    (path / "template.jinja").write_text(TEMPLATE)
    [word] = tokenizer.encode("maybe", add_special_tokens=False)
    return path, {m: tokenizer.convert_tokens_to_ids(m) for m in MARKERS} | {"maybe": word}


@pytest.fixture(scope="module")
def client(qwen_model, tmp_path_factory):
    path, _ = qwen_model
    server = start_tiny_server(path, tmp_path_factory.mktemp("qwen3-thinking") / "server.log",
                               "--reasoning-parser", "qwen3", "--chat-template", str(path / "template.jinja"),
                               "--structured-outputs-config", '{"warm_up": false, "disable_any_whitespace": true}')
    yield OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    stop_server(server)


def _call_bias(ids: dict[str, int]) -> dict[str, int]:
    return {str(ids["<tool_call>"]): 100, str(ids["<function="]): 99}


def _opening(token_ids: list[int], ids: dict[str, int]) -> int:
    """The index of the `<function=` that completes the first call opening (right after a `<tool_call>`)."""
    return next(i for i in range(1, len(token_ids))
                if token_ids[i] == ids["<function="] and token_ids[i - 1] == ids["<tool_call>"])


def test_a_call_opening_ends_the_thinking_and_starts_the_grammar(client, qwen_model):
    _, ids = qwen_model
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                           n=4, seed=7, temperature=1.0, max_tokens=64, logit_bias=_call_bias(ids),
                                           extra_body={"return_token_ids": True})
    runs = []
    for choice in reply.choices:
        token_ids = choice.model_extra["token_ids"]
        done = _opening(token_ids, ids)
        # free thinking up to the opening: the two biased tokens, no <tool_call> right before a <function= (that
        # would have been the opening)
        assert set(token_ids[:done]) <= {ids["<tool_call>"], ids["<function="]}
        answer = token_ids[done + 1 :]
        assert ids["<tool_call>"] not in answer and ids["<function="] not in answer  # the grammar's answer
        # the split: the thinking before the opening's <tool_call>, the answer from it on
        names = {ids["<tool_call>"]: "<tool_call>", ids["<function="]: "<function="}
        assert choice.message.model_extra["reasoning"] == "".join(names[t] for t in token_ids[: done - 1])
        content = choice.message.content
        assert content.startswith("<tool_call><function=")
        assert json.loads(content[len("<tool_call><function=") :]) in ({"answer": "yes"}, {"answer": "no"})
        assert choice.finish_reason == "stop"
        runs.append(done)
    assert max(runs) > 1  # some completion thought before its opening


def test_a_streamed_reply_splits_at_the_call_opening_too(client, qwen_model):
    _, ids = qwen_model
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                            n=3, seed=11, temperature=1.0, max_tokens=64, stream=True,
                                            logit_bias=_call_bias(ids))
    reasoning, content = streamed_reasoning_and_content(stream, 3)
    for thought, answer in zip(reasoning, content, strict=True):
        assert re.fullmatch("(<tool_call>|<function=)*", thought), thought
        assert answer.startswith("<tool_call><function=")
        assert json.loads(answer[len("<tool_call><function=") :]) in ({"answer": "yes"}, {"answer": "no"})


def test_a_prompt_that_opened_the_thinking_makes_the_output_thinking_until_its_end(client, qwen_model):
    # Qwen3.5's template writes <think> into the prompt, so the model's output starts inside the thinking.
    _, ids = qwen_model
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                           n=3, seed=5, temperature=1.0, max_tokens=64,
                                           logit_bias={str(ids["maybe"]): 100, str(ids["</think>"]): 99},
                                           extra_body={"return_token_ids": True})
    for choice in reply.choices:
        token_ids = choice.model_extra["token_ids"]
        cut = token_ids.index(ids["</think>"])
        assert choice.message.model_extra["reasoning"] == "maybe" * cut
        assert json.loads(choice.message.content) in ({"answer": "yes"}, {"answer": "no"})


def test_a_prompt_that_closed_the_thinking_is_all_answer(client, qwen_model):
    _, ids = qwen_model
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                           seed=5, temperature=1.0, max_tokens=64, logit_bias=_call_bias(ids),
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = reply.choices[0].message
    assert message.model_extra.get("reasoning") is None
    assert json.loads(message.content) in ({"answer": "yes"}, {"answer": "no"})
