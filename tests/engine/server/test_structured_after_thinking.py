"""Structured output after the thinking (vLLM's behaviour with --reasoning-parser): the grammar leaves the thinking
free and starts at the token after `</think>`; a prompt that already ended the thinking is constrained from its first
token; a completion that never ends it is never constrained. The real openai client against the real server, on a
tiny random model whose vocabulary has `<think>` and `</think>` as tokens (as Qwen3's and DeepSeek-R1's have).

The model is steered with logit_bias: a word ("maybe") at +100 and `</think>` at +99, sampled at temperature 1, so a
completion thinks "maybe" a few times (each step ends the thinking with probability ~0.27) and then answers; the
grammar masks both tokens from the answer, whose enum schema has no room for them."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from .conftest import API_KEY, start_tiny_server, stop_server, streamed_reasoning_and_content, tiny_llama_with_markers

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Is the sky blue?"}]
# deepseek_r1's template shape: the prompt opens <think>; enable_thinking false writes an empty, closed one.
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
            "{% else %}<think>\n{% endif %}")


@pytest.fixture(scope="module")
def thinking_model(embedded_model_dir, tmp_path_factory):
    """A tiny random Llama with the embedded tokenizer plus `<think>` and `</think>` (added, not special: they stay
    in the text, as Qwen3's), and the ids of the markers and of the steering word."""
    path = tmp_path_factory.mktemp("thinking-model")
    tokenizer = tiny_llama_with_markers(embedded_model_dir, path, ("<think>", "</think>"), seed=31)
    (path / "template.jinja").write_text(TEMPLATE)
    [word] = tokenizer.encode("maybe", add_special_tokens=False)
    return path, tokenizer.convert_tokens_to_ids("</think>"), word


@pytest.fixture(scope="module")
def client(thinking_model, tmp_path_factory):
    path, _, _ = thinking_model
    server = start_tiny_server(path, tmp_path_factory.mktemp("after-thinking") / "server.log",
                               "--reasoning-parser", "deepseek_r1", "--chat-template", str(path / "template.jinja"),
                               "--structured-outputs-config", '{"warm_up": false, "disable_any_whitespace": true}')
    yield OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    stop_server(server)


def _bias(thinking_model, closes: bool = True) -> dict[str, int]:
    _, end, word = thinking_model
    return {str(word): 100, **({str(end): 99} if closes else {})}


def _valid(content: str | None) -> dict:
    reply = json.loads(content or "")
    assert reply in ({"answer": "yes"}, {"answer": "no"})
    return reply


def test_the_thinking_runs_free_and_the_answer_after_it_matches_the_schema(client, thinking_model):
    _, end, word = thinking_model
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                           n=4, seed=7, temperature=1.0, max_tokens=64,
                                           logit_bias=_bias(thinking_model), extra_body={"return_token_ids": True})
    thoughts = []
    for choice in reply.choices:
        ids = choice.model_extra["token_ids"]
        assert end in ids, ids  # the biased </think> was drawn: the grammar did not mask the thinking
        cut = ids.index(end)
        assert set(ids[:cut]) <= {word} and word not in ids[cut:]  # free thinking, then the grammar's answer
        assert choice.message.model_extra["reasoning"] == "maybe" * cut
        _valid(choice.message.content)
        assert choice.finish_reason == "stop"
        thoughts.append(cut)
    assert max(thoughts) > 0  # some completion did think before its answer


def test_a_streamed_reply_sends_the_thinking_then_the_valid_json(client, thinking_model):
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                            n=3, seed=11, temperature=1.0, max_tokens=64, stream=True,
                                            logit_bias=_bias(thinking_model))
    reasoning, content = streamed_reasoning_and_content(stream, 3)
    for thought, answer in zip(reasoning, content, strict=True):
        assert thought == "maybe" * (len(thought) // 5)
        _valid(answer)
    assert any(reasoning)


def test_a_prompt_that_ended_the_thinking_is_constrained_from_its_first_token(client, thinking_model):
    # enable_thinking false: the template writes <think>\n\n</think> into the prompt (vLLM: is_reasoning_end of the
    # prompt), so the biased word and </think> are masked from the first token and the whole output is the answer.
    _, end, word = thinking_model
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                           n=2, seed=7, temperature=1.0, max_tokens=64,
                                           logit_bias=_bias(thinking_model),
                                           extra_body={"return_token_ids": True,
                                                       "chat_template_kwargs": {"enable_thinking": False}})
    for choice in reply.choices:
        ids = choice.model_extra["token_ids"]
        assert word not in ids and end not in ids
        _valid(choice.message.content)
        assert choice.message.model_extra.get("reasoning") is None


def test_a_model_that_never_ends_the_thinking_runs_unconstrained_to_max_tokens(client, thinking_model):
    # vLLM's behaviour: the grammar waits for </think>, which never comes; the output is all thinking.
    _, _, word = thinking_model
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT,
                                           max_tokens=6, logit_bias=_bias(thinking_model, closes=False),
                                           extra_body={"return_token_ids": True})
    [choice] = reply.choices
    assert choice.model_extra["token_ids"] == [word] * 6 and choice.finish_reason == "length"
    assert choice.message.model_extra["reasoning"] == "maybe" * 6 and choice.message.content is None


@pytest.mark.parametrize("stream", [False, True])
def test_responses_give_the_thinking_as_a_reasoning_item_and_the_json_as_the_message(client, thinking_model, stream):
    text = {"format": {"type": "json_schema", "name": "verdict", "schema": SCHEMA}}
    kw = dict(model="tiny", input="Is the sky blue?", text=text, temperature=1.0, max_output_tokens=64,
              extra_body={"logit_bias": _bias(thinking_model), "seed": 5})
    if stream:
        events = list(client.responses.create(**kw, stream=True))
        response = events[-1].response
        assert any(e.type == "response.reasoning_text.delta" for e in events)
    else:
        response = client.responses.create(**kw)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"], kinds
    thought = response.output[0].content[0].text
    assert thought and thought == "maybe" * (len(thought) // 5)
    _valid(response.output_text)


TOOL = {"type": "function", "function": {"name": "verdict", "parameters": SCHEMA}}


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "verdict"}}])
@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_call_comes_after_the_thinking(client, thinking_model, tool_choice, stream):
    # A forced call's grammar (required: a list of calls; named: the function's arguments) starts after </think> too.
    _, end, _ = thinking_model
    kw = dict(model="tiny", messages=MESSAGES, tools=[TOOL], tool_choice=tool_choice, seed=3, temperature=1.0,
              max_tokens=64, logit_bias=_bias(thinking_model), extra_body={"return_token_ids": True})
    if stream:
        thought, names, arguments, ids = "", "", "", []
        for chunk in client.chat.completions.create(**kw, stream=True):
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is None:
                continue
            ids += chunk.choices[0].model_extra.get("token_ids") or []
            thought += delta.model_extra.get("reasoning") or ""
            for call in delta.tool_calls or []:
                names += call.function.name or ""
                arguments += call.function.arguments or ""
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        message, ids = choice.message, choice.model_extra["token_ids"]
        thought = message.model_extra["reasoning"]
        [call] = message.tool_calls
        names, arguments = call.function.name, call.function.arguments
    assert end in ids and thought == "maybe" * ids.index(end)  # the thinking ran free, then the call
    assert names == "verdict"
    _valid(arguments)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_offline_llm_waits_for_the_thinking_as_the_engine_rule(thinking_model, async_scheduling):
    # The engine's rule, without the server: --structured-outputs-config's reasoning_parser (vLLM's key). A prompt
    # opening <think> thinks first, one ending it is constrained at once; overlapped steps (async scheduling) too,
    # whose bitmask is built after the step in flight's </think> has reached the grammar.
    from transformers import AutoTokenizer

    from flotilla.engine import LLM, SamplingParams, StructuredOutputsParams

    path, end, word = thinking_model
    tokenizer = AutoTokenizer.from_pretrained(path)
    llm = LLM(str(path), device="cpu", max_model_len=256, block_size=8, async_scheduling=async_scheduling,
              structured_outputs_config={"reasoning_parser": "deepseek_r1", "disable_any_whitespace": True})
    try:
        sp = SamplingParams(n=4, seed=7, temperature=1.0, max_tokens=64, logit_bias={word: 100, end: 99},
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))
        thinking, answered = (tokenizer.encode(p, add_special_tokens=False)
                              for p in ("Is the sky blue?<think>\n", "Is the sky blue?<think>\n\n</think>\n\n"))
        [first, second] = llm.generate([thinking, answered], sp)
    finally:
        llm.engine.shutdown()
    cuts = []
    for out in first.outputs:
        ids = list(out.token_ids)
        cut = ids.index(end)
        assert set(ids[:cut]) <= {word} and word not in ids[cut:]
        _valid(tokenizer.decode(ids[cut + 1 :], skip_special_tokens=True))
        cuts.append(cut)
    assert max(cuts) > 0
    for out in second.outputs:
        assert word not in out.token_ids and end not in out.token_ids
        _valid(out.text)


def test_the_offline_llms_reasoning_parser_argument_feeds_the_same_rule(thinking_model):
    # vLLM's LLM(reasoning_parser=...), an engine argument there: the same gate as structured_outputs_config's key.
    from flotilla.engine import LLM, SamplingParams, StructuredOutputsParams

    path, end, word = thinking_model
    llm = LLM(str(path), device="cpu", max_model_len=256, block_size=8, reasoning_parser="deepseek_r1",
              structured_outputs_config='{"disable_any_whitespace": true}')
    try:
        assert llm.engine.config.structured_outputs.reasoning_parser == "deepseek_r1"
        assert llm.engine.config.structured_outputs.disable_any_whitespace  # the config's own keys are kept
        sp = SamplingParams(n=3, seed=7, temperature=1.0, max_tokens=64, logit_bias={word: 100, end: 99},
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))
        [out] = llm.generate([llm.get_tokenizer().encode("Is the sky blue?<think>\n", add_special_tokens=False)], sp)
    finally:
        llm.engine.shutdown()
    cuts = []
    for choice in out.outputs:
        ids = list(choice.token_ids)
        cut = ids.index(end)  # the biased </think> was drawn: the grammar waited for the thinking's end
        assert set(ids[:cut]) <= {word} and word not in ids[cut:]
        _valid(choice.text[choice.text.index("</think>") + len("</think>") :])
        cuts.append(cut)
    assert max(cuts) > 0


@pytest.mark.parametrize("config, reason", [({"reasoning_parser": "qwen3"}, "differ"), (None, "not one of")])
def test_the_offline_llms_reasoning_parser_is_refused_when_it_disagrees_or_is_unknown(config, reason):
    from flotilla.engine import LLM

    with pytest.raises(ValueError, match=reason):  # before any model is loaded
        LLM(reasoning_parser="deepseek_r1" if config else "deepseek", structured_outputs_config=config)


def test_enable_in_reasoning_constrains_the_thinking_too(thinking_model):
    # vLLM's enable_in_reasoning: the grammar applies from the first token whatever the prompt.
    from flotilla.engine import LLM, SamplingParams, StructuredOutputsParams

    path, end, word = thinking_model
    llm = LLM(str(path), device="cpu", max_model_len=256, block_size=8, structured_outputs_config={
        "reasoning_parser": "deepseek_r1", "enable_in_reasoning": True, "disable_any_whitespace": True})
    try:
        sp = SamplingParams(n=2, seed=7, temperature=1.0, max_tokens=64, logit_bias={word: 100, end: 99},
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))
        [out] = llm.generate([llm.get_tokenizer().encode("Is the sky blue?<think>\n", add_special_tokens=False)], sp)
    finally:
        llm.engine.shutdown()
    for choice in out.outputs:
        assert word not in choice.token_ids and end not in choice.token_ids
        _valid(choice.text)
