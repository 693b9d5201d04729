"""Requests that vLLM's OpenAI server serves, sent as vLLM users' clients send them (the real `openai` client on
the shared tiny server), and the answers' forms those clients read."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import API_KEY, start_tiny_server, stop_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "hi"}]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=HEADERS, timeout=120)


def test_explicit_nulls_that_vllm_takes_as_unset_are_served(server, client):
    # The SDK sends an argument given as None as JSON null; vLLM declares these fields optional (None = unset).
    completion = client.completions.create(model="tiny", prompt="hi", max_tokens=2, presence_penalty=None,
                                           frequency_penalty=None, echo=None, stream=None,
                                           extra_body={"return_tokens_as_token_ids": None})
    assert completion.choices[0].text and not completion.choices[0].text.startswith("hi")
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, presence_penalty=None,
                                          frequency_penalty=None, logprobs=None, n=None, stream=None,
                                          extra_body={"return_tokens_as_token_ids": None})
    assert len(chat.choices) == 1 and chat.choices[0].logprobs is None


@pytest.mark.parametrize("temperature", [2.5, 50.0, 1e300])
def test_temperature_above_2_is_a_400_in_vllms_words(server, client, temperature):
    # vLLM 0.24's SamplingParams takes temperature in [0, 2] (vllm-project/vllm#44965) and answers a 400 naming it.
    from openai import BadRequestError

    calls = [lambda: client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=temperature),
             lambda: client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3,
                                                    temperature=temperature, stream=True),
             lambda: client.responses.create(model="tiny", input="hi", max_output_tokens=3, temperature=temperature)]
    for call in calls:
        with pytest.raises(BadRequestError) as refused:
            call()
        error = refused.value.body
        assert error["param"] == "temperature", error
        assert f"temperature must be in [0, 2], got {temperature}." in error["message"], error
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=2.0,
                                     seed=1).usage.completion_tokens == 3


def _refusal(call) -> str:
    from openai import BadRequestError

    with pytest.raises(BadRequestError) as refused:
        call()
    return refused.value.body["message"]


def test_context_length_refusals_are_worded_as_vllms(server, client):
    # Clients recognise (case-sensitively) "This model's maximum context length is", and read the two numbers
    # of vLLM's max_tokens refusal to retry with what fits: the wording is part of the interface.
    def tokens(text: str) -> int:
        return len(post(server, "/tokenize", {"prompt": text}).json()["tokens"])

    long = "word " * 300
    message = _refusal(lambda: client.completions.create(model="tiny", prompt=long, max_tokens=3))
    assert re.fullmatch(r"This model's maximum context length is 256 tokens\. However, your request has "
                        rf"{tokens(long)} input tokens\. Please reduce the length of the input messages\.", message)
    message = _refusal(lambda: client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                                        "content": long}]))
    assert message.startswith("This model's maximum context length is 256 tokens. However, your request has ")
    prompt = "word " * 100
    message = _refusal(lambda: client.completions.create(model="tiny", prompt=prompt, max_tokens=200))
    used = tokens(prompt)
    assert message == (f"'max_tokens' or 'max_completion_tokens' is too large: 200. This model's maximum context "
                       f"length is 256 tokens and your request has {used} input tokens (200 > 256 - {used}).")
    message = _refusal(lambda: client.chat.completions.create(model="tiny", messages=MESSAGES,
                                                              max_completion_tokens=250))
    found = re.search(r"maximum context length is (\d+) tokens and your request has (\d+) input tokens", message)
    assert found and found.group(1) == "256" and message.startswith("'max_tokens' or 'max_completion_tokens' is too "
                                                                    "large: 250. This model's maximum context")
    # Longer in characters than any tokenization could fit: refused before tokenizing, in the same opening words.
    message = _refusal(lambda: client.completions.create(model="tiny", prompt="x" * 200_000, max_tokens=3))
    assert message.startswith("This model's maximum context length is 256 tokens.")


TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"city": "Lima"}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}} for name in ("get_weather", "get_time")]


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_only_the_first_call_as_vllm(tool_server, stream):
    # vLLM's maybe_filter_parallel_tool_calls: with parallel_tool_calls false an `auto` answer that calls two
    # tools returns the first only (the choice constraint makes the tiny model's answer those two calls).
    from openai import OpenAI

    oai = OpenAI(base_url=f"{tool_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)

    def calls(parallel: bool | None) -> list[tuple[str, str]]:
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        reply = oai.chat.completions.create(model="x", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=200,
                                            stream=stream, extra_body={"structured_outputs": {"choice": [TWO_CALLS]}},
                                            **extra)
        if not stream:
            return [(c.function.name, c.function.arguments) for c in reply.choices[0].message.tool_calls]
        found = [d for chunk in reply for c in chunk.choices for d in (c.delta.tool_calls or [])]
        return [(d.function.name, d.function.arguments) for d in found]

    # The three at once: the engine batches their steps (one after another they cost CI ~25 s a parameter).
    with ThreadPoolExecutor(3) as pool:
        both, explicit, first = pool.map(calls, [None, True, False])
    assert [name for name, _ in both] == ["get_weather", "get_time"]
    assert explicit == both
    assert first == both[:1]


def test_tokenize_returns_token_strings_when_asked_as_vllm(server, tiny_model_dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    plain = post(server, "/tokenize", {"prompt": "Hello there, harbour"}).json()
    assert plain["token_strs"] is None  # vLLM's TokenizeResponse always has the key
    asked = post(server, "/tokenize", {"prompt": "Hello there, harbour", "return_token_strs": True}).json()
    assert asked["token_strs"] == tokenizer.convert_ids_to_tokens(asked["tokens"])
    chat = post(server, "/tokenize", {"messages": MESSAGES, "return_token_strs": True}).json()
    assert chat["token_strs"] == tokenizer.convert_ids_to_tokens(chat["tokens"]) and len(chat["tokens"]) > 3


@pytest.fixture(scope="module")
def thinking_server(tiny_model_dirs, tmp_path_factory):
    # deepseek_r1: the output is thinking until </think>, so the tiny model's whole answer is reasoning.
    s = start_tiny_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("thinking") / "server.log",
                          "--reasoning-parser", "deepseek_r1", "--trust-request-chat-template")
    yield s
    stop_server(s)


def test_reasoning_is_returned_as_reasoning_and_reasoning_content(thinking_server):
    # vLLM returns the thinking as `reasoning` (its name since 2025-11; `reasoning_content`, the older one, was kept
    # beside it for a while, then removed): clients of either vintage read one or the other.
    from openai import OpenAI

    oai = OpenAI(base_url=f"{thinking_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    message = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                          extra_body={"min_tokens": 4}).choices[0].message
    extra = message.model_extra
    assert extra["reasoning"] and extra["reasoning"] == extra["reasoning_content"]
    deltas = [c.choices[0].delta.model_extra for c in oai.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, stream=True, extra_body={"min_tokens": 4})
        if c.choices]
    streamed = [d for d in deltas if d.get("reasoning") is not None]
    assert "".join(d["reasoning"] for d in streamed) == extra["reasoning"]
    assert all(d["reasoning_content"] == d["reasoning"] for d in streamed)


def test_include_reasoning_false_leaves_the_thinking_out_as_vllm(thinking_server):
    # vLLM's chat field include_reasoning (default true): false drops the reasoning parser's thinking from the reply
    # and from the stream's deltas, the answer unchanged. It was logged and ignored (the thinking was returned).
    from openai import OpenAI

    oai = OpenAI(base_url=f"{thinking_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    shown = oai.chat.completions.create(**kw, extra_body={"min_tokens": 4}).choices[0].message
    hidden = oai.chat.completions.create(**kw, extra_body={"min_tokens": 4, "include_reasoning": False})
    message = hidden.choices[0].message
    assert shown.model_extra["reasoning"]  # the tiny model's whole answer is thinking (deepseek_r1)
    assert "reasoning" not in message.model_extra and "reasoning_content" not in message.model_extra
    assert message.content == shown.content and hidden.usage.completion_tokens == 4
    chunks = list(oai.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True},
                                              extra_body={"min_tokens": 4, "include_reasoning": False}))
    deltas = [c.choices[0].delta.model_extra or {} for c in chunks if c.choices]
    assert not any(d.get("reasoning") or d.get("reasoning_content") for d in deltas)
    assert chunks[-1].usage.completion_tokens == 4
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_a_vocabulary_without_think_tokens_constrains_from_the_first_token(thinking_server):
    # This vocabulary spells </think> in pieces, so the engine cannot see the thinking end (it logs so at start): the
    # grammar applies from the first token and the reply is all answer, not split into an empty `content` and a
    # `reasoning` holding the JSON (docs/structured-output.md "Thinking models"; the markers' own case:
    # test_structured_after_thinking.py).
    from openai import OpenAI

    oai = OpenAI(base_url=f"{thinking_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "extra_body": {"structured_outputs": {
        "choice": ["yes", "no"]}}}
    message = oai.chat.completions.create(**kw).choices[0].message
    assert message.content in ("yes", "no") and "reasoning" not in message.model_extra
    deltas = [c.choices[0].delta for c in oai.chat.completions.create(**kw, stream=True) if c.choices]
    assert "".join(d.content or "" for d in deltas) in ("yes", "no")
    assert not any(d.model_extra.get("reasoning") for d in deltas)
    assert "are not single tokens of this vocabulary" in thinking_server.log.read_text()


@pytest.mark.parametrize("parsed", ["reasoning", "tools"])
def test_a_parsed_chat_stream_carries_the_logprobs_the_reply_has_as_vllm(thinking_server, tool_server, parsed):
    # vLLM streams each step's logprobs on its chunk when a reasoning or tool parser reads the stream too; these
    # streams (every chat stream on a --reasoning-parser server, any with tools on an auto-tool-choice one) sent
    # logprobs null on every chunk, while the non-streamed reply had them. Joined, they are the reply's.
    from openai import OpenAI

    server, model = (thinking_server, "tiny") if parsed == "reasoning" else (tool_server, "x")
    oai = OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}] if parsed == "tools" else None
    kw = {"model": model, "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "logprobs": True,
          "top_logprobs": 2, "extra_body": {"min_tokens": 6}, **({"tools": tools} if tools else {})}
    oai.chat.completions.create(**kw)  # puts the prompt in the prefix cache for both compared replies (numerics alike)
    whole = oai.chat.completions.create(**kw).choices[0].logprobs.content
    chunks = [c.choices[0] for c in oai.chat.completions.create(**kw, stream=True) if c.choices]
    streamed = [entry for c in chunks if c.logprobs for entry in c.logprobs.content]
    assert len(whole) == 6 and streamed == whole


def test_responses_return_the_thinking_as_a_reasoning_item_as_vllm(thinking_server):
    # vLLM's Responses API with --reasoning-parser: a `reasoning` output item (one `reasoning_text` content part, no
    # summary) before the message, streamed as response.reasoning_text.delta / .done; the route kept the thinking
    # in the output text. deepseek_r1 on the tiny model: its whole answer is thinking (no message item then).
    from openai import OpenAI

    oai = OpenAI(base_url=f"{thinking_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    question = [{"role": "user", "content": "Name a colour of the sea."}]
    chat = oai.chat.completions.create(model="tiny", messages=question, max_tokens=8, temperature=0)
    thought = chat.choices[0].message.model_extra["reasoning"]
    assert thought and chat.usage.completion_tokens == 8  # the tiny model does not stop before 8 tokens here
    kw = {"model": "tiny", "input": question, "max_output_tokens": 8, "temperature": 0}
    whole = oai.responses.create(**kw)
    assert [item.type for item in whole.output] == ["reasoning"]
    assert whole.output[0].id.startswith("rs_") and whole.output[0].summary == []
    assert [(c.type, c.text) for c in whole.output[0].content] == [("reasoning_text", thought)]
    assert whole.output_text == "" and whole.usage.output_tokens == 8

    events = list(oai.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"]
    assert events[2].item.type == "reasoning" and events[3].part.type == "reasoning_text"
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert [d.text for d in done] == [thought] and kinds[-2:] == ["response.output_item.done", "response.incomplete"]
    assert [(i.type, i.content[0].text) for i in events[-1].response.output] == [("reasoning", thought)]
    with oai.responses.stream(**kw) as stream:  # the SDK's helper reads the reasoning events into its snapshot
        helped = list(stream)
    assert "".join(e.delta for e in helped if e.type == "response.reasoning_text.delta") == thought
    assert helped[-1].response.output[0].content[0].text == thought  # response.incomplete (max_output_tokens)

    # A client that sends the output back as input (the stateless pattern) is served, as vLLM reads reasoning items
    again = [*question, *[item.model_dump(exclude_none=True) for item in whole.output],
             {"role": "user", "content": "And another?"}]
    assert oai.responses.create(model="tiny", input=again, max_output_tokens=2).status in ("completed", "incomplete")
    chained = oai.responses.create(model="tiny", input="And another?", previous_response_id=whole.id,
                                   max_output_tokens=2)
    assert chained.previous_response_id == whole.id


def test_responses_include_reasoning_false_leaves_the_reasoning_item_out(thinking_server):
    # Chat's include_reasoning on /v1/responses (vLLM issue #56428 asked it of vLLM's): false leaves the thinking out
    # of the output, streamed or not; it is still generated and split off (the same tokens, no message text from it).
    # It was a 400. deepseek_r1 on the tiny model: its whole answer is thinking, so the output is one empty message.
    from openai import OpenAI

    oai = OpenAI(base_url=f"{thinking_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    kw = {"model": "tiny", "input": "Name a colour of the sea.", "max_output_tokens": 6, "temperature": 0}
    shown = oai.responses.create(**kw)
    assert [item.type for item in shown.output] == ["reasoning"]
    hidden = oai.responses.create(**kw, extra_body={"include_reasoning": False})
    assert [(item.type, item.content[0].text) for item in hidden.output] == [("message", "")]
    assert hidden.usage.output_tokens == shown.usage.output_tokens == 6 and hidden.status == "incomplete"
    events = list(oai.responses.create(**kw, stream=True, extra_body={"include_reasoning": False}))
    assert not [e for e in events if "reasoning" in e.type or getattr(getattr(e, "item", None), "type", "") ==
                "reasoning"]
    assert [(i.type, i.content[0].text) for i in events[-1].response.output] == [("message", "")]
    assert events[-1].response.usage.output_tokens == 6


def test_an_assistant_messages_reasoning_reaches_the_template_as_reasoning_content(thinking_server):
    # vLLM hands a message's `reasoning` to the chat template as `reasoning_content` too (the name templates such
    # as Qwen3's read), so a client sending back what it was given keeps the thinking in the prompt.
    template = "{% for m in messages %}{{ m.content }}|{{ m.reasoning_content }};{% endfor %}"
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes", "reasoning": "think"}]
    body = {"model": "tiny", "messages": history, "max_tokens": 1, "chat_template": template,
            "add_generation_prompt": False}
    reply = post(thinking_server, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    expected = post(thinking_server, "/tokenize", {"prompt": "hi|;yes|think;", "add_special_tokens": False})
    assert reply.json()["usage"]["prompt_tokens"] == expected.json()["count"]


def test_text_parts_are_joined_with_newlines_as_vllm(server, client):
    # vLLM renders a content list for a template that reads plain strings as its text parts joined by "\n"
    # ("input_text" and "output_text" parts, the Responses API's names, are text too).
    parts = [{"type": "text", "text": "What is"}, {"type": "input_text", "text": "two plus two?"},
             {"type": "output_text", "text": "Four."}]
    joined = post(server, "/tokenize", {"messages": [{"role": "user", "content": parts}]})
    plain = post(server, "/tokenize", {"messages": [{"role": "user", "content": "What is\ntwo plus two?\nFour."}]})
    assert joined.status_code == 200, joined.text
    assert joined.json()["tokens"] == plain.json()["tokens"]
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=1)
    assert reply.usage.prompt_tokens == plain.json()["count"]


def test_the_ith_of_n_seeded_completions_is_the_one_seed_plus_i_draws_as_vllm(client):
    # vLLM gives completion i of a seeded request the seed `seed + i` (ParentRequest._get_child_sampling_params), so
    # one of n is reproduced alone with its own seed.
    three = client.completions.create(model="tiny", prompt="Hello", n=3, max_tokens=6, temperature=1, seed=7)
    alone = [client.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=1, seed=7 + i)
             for i in range(3)]
    assert [c.text for c in three.choices] == [a.choices[0].text for a in alone]
    assert len({c.text for c in three.choices}) == 3


def test_a_message_of_any_role_is_rendered_as_vllm(server, client, tiny_model_dirs):
    # vLLM takes any role string (CustomChatCompletionMessageParam): Llama 3.1's template reads tool results as
    # "ipython", GLM's "observation"; the template decides what a role means.
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "weather?"}, {"role": "ipython", "content": "12 C"}]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    text = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"]).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    expected = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["count"]
    assert reply.usage.prompt_tokens == expected


def test_return_token_ids_gives_the_prompts_and_each_choices_ids_as_vllm(server):
    # vLLM's return_token_ids (RL and agent frameworks read the ids instead of re-tokenizing the text): completions put
    # prompt_token_ids and token_ids on each choice, chat puts prompt_token_ids on the response and token_ids on each
    # choice. Here the ids are checked against what the same request reports as token_id logprobs.
    body = {"model": "tiny", "max_tokens": 4, "n": 2, "temperature": 1, "seed": 3, "logprobs": 0,
            "return_token_ids": True, "return_tokens_as_token_ids": True}
    prompt_ids = post(server, "/tokenize", {"prompt": "Hello there"}).json()["tokens"]
    reply = post(server, "/v1/completions", {**body, "prompt": "Hello there"}).json()
    for choice in reply["choices"]:
        assert choice["prompt_token_ids"] == prompt_ids
        assert choice["token_ids"] == [int(t.split(":")[1]) for t in choice["logprobs"]["tokens"]]
    chat_body = {**body, "messages": MESSAGES, "logprobs": True}
    chat = post(server, "/v1/chat/completions", chat_body).json()
    assert chat["prompt_token_ids"] == post(server, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    for choice in chat["choices"]:
        assert choice["token_ids"] == [int(e["token"].split(":")[1]) for e in choice["logprobs"]["content"]]
    plain = post(server, "/v1/completions", {"model": "tiny", "prompt": "Hello", "max_tokens": 2}).json()
    assert plain["choices"][0].get("token_ids") is None


@pytest.mark.parametrize("parsed", [False, True])
def test_return_token_ids_on_streams_as_vllm(server, client, thinking_server, parsed):
    # vLLM's streams: a completions choice's first chunk carries its prompt_token_ids and every chunk the choice's
    # new token_ids; a chat stream's role chunks carry prompt_token_ids and its choices' chunks their new token_ids.
    # Joined, each choice's ids are the whole reply's (same seed). `parsed`: the reasoning-parser stream path.
    from openai import OpenAI

    url = (thinking_server if parsed else server).url
    oai = OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120) if parsed else client
    kw = {"model": "tiny", "max_tokens": 4, "n": 2, "temperature": 1, "seed": 3,
          "extra_body": {"return_token_ids": True}}
    whole = oai.completions.create(prompt="Hello there", **kw)
    joined: dict[int, list[int]] = {0: [], 1: []}
    prompts: dict[int, list] = {0: [], 1: []}
    for chunk in oai.completions.create(prompt="Hello there", stream=True, **kw):
        for c in chunk.choices:
            joined[c.index] += c.model_extra["token_ids"]
            prompts[c.index].append(c.model_extra["prompt_token_ids"])
    for c in whole.choices:
        assert joined[c.index] == c.model_extra["token_ids"]
        assert prompts[c.index][0] == c.model_extra["prompt_token_ids"] and not any(prompts[c.index][1:])
    chat = oai.chat.completions.create(messages=MESSAGES, **kw)
    joined = {0: [], 1: []}
    role_prompts = []
    for chunk in oai.chat.completions.create(messages=MESSAGES, stream=True, **kw):
        for c in chunk.choices:
            if c.delta.role is not None:
                role_prompts.append(chunk.model_extra["prompt_token_ids"])
            else:
                joined[c.index] += c.model_extra["token_ids"]
    assert role_prompts == [chat.model_extra["prompt_token_ids"]] * 2
    for c in chat.choices:
        assert joined[c.index] == c.model_extra["token_ids"] and len(joined[c.index]) > 0


@pytest.mark.parametrize("tool_choice", [None, "auto", "none", "required"])
def test_an_empty_tools_array_is_refused_as_vllm(tool_server, tool_choice):
    # vLLM (as OpenAI) refuses `tools: []` whatever the tool_choice, a 400 naming `tools`: an empty list is a client
    # bug to report, not a request for no tools (omitting the field is that).
    from openai import BadRequestError, OpenAI

    oai = OpenAI(base_url=f"{tool_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    extra = {} if tool_choice is None else {"tool_choice": tool_choice}
    with pytest.raises(BadRequestError) as refused:
        oai.chat.completions.create(model="x", messages=MESSAGES, tools=[], max_tokens=1, **extra)
    assert refused.value.body["param"] == "tools" and "must not be an empty array" in refused.value.body["message"]


def test_an_unknown_models_error_is_vllms_404(server, client):
    # vLLM answers a request for a model it does not serve with a 404 whose error is type NotFoundError, code 404
    # (the status, an int), param model, "The model `X` does not exist." (the openai client raises NotFoundError).
    import openai

    with pytest.raises(openai.NotFoundError) as chat:
        client.chat.completions.create(model="nope", messages=MESSAGES, max_tokens=1)
    with pytest.raises(openai.NotFoundError) as completion:
        client.completions.create(model="nope", prompt="hi", max_tokens=1)
    for refused in (chat, completion):
        body = refused.value.body
        assert (body["type"], body["code"], body["param"]) == ("NotFoundError", 404, "model")
        assert body["message"].startswith("The model `nope` does not exist.")


@pytest.fixture(scope="module")
def wordpiece_server(tiny_model_dirs, tmp_path_factory):
    # The tiny Llama with a WordPiece tokenizer, whose decoder spaces special tokens apart.
    from ..spaced_tokenizer import with_wordpiece_tokenizer

    root = tmp_path_factory.mktemp("wordpiece")
    s = start_tiny_server(with_wordpiece_tokenizer(tiny_model_dirs["llama"], root / "model"), root / "server.log")
    yield s
    stop_server(s)


@pytest.mark.parametrize("stream", [False, True])
def test_spaces_between_special_tokens_false_joins_special_tokens_as_vllm(wordpiece_server, stream):
    # vLLM's sampling extra (default true): false writes an added token that follows another without the space the
    # decoder puts before it, in whole replies and streams alike (only where special tokens are kept).
    from openai import OpenAI

    oai = OpenAI(base_url=f"{wordpiece_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)

    def text(**extra) -> str:
        # Only [A] (4) and [B] (5) may be drawn: the output is special tokens alone.
        body = {"allowed_token_ids": [4, 5], "ignore_eos": True, "skip_special_tokens": False, **extra}
        reply = oai.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0, stream=stream,
                                       extra_body=body)
        return "".join(c.choices[0].text for c in reply if c.choices) if stream else reply.choices[0].text

    spaced = text()
    assert re.fullmatch(r"( \[[AB]\]){4}", spaced) and text(spaces_between_special_tokens=True) == spaced
    assert text(spaces_between_special_tokens=False) == " " + spaced.replace(" ", "")
    # Special tokens skipped, there is nothing to join: the flag changes nothing.
    assert text(skip_special_tokens=True, spaces_between_special_tokens=False) == text(skip_special_tokens=True)


# A template that reads OpenAI's content parts: it loops over each message's content.
PARTS_TEMPLATE = ("{% for message in messages %}<{{ message['role'] }}>{% for part in message['content'] %}"
                  "[{{ part['text'] }}]{% endfor %}{% endfor %}")
PARTS_MESSAGES = [{"role": "user", "content": "hi"},
                  {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]


@pytest.fixture
def string_content_server(flags_server):
    """--trust-request-chat-template and --chat-template-content-format string: the session's `flags_server`
    (conftest.py)."""
    return flags_server


def _prompt_tokens(server, messages: list[dict]) -> int:
    from openai import OpenAI

    oai = OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    return oai.chat.completions.create(model="tiny", messages=messages, max_tokens=1,
                                       extra_body={"chat_template": PARTS_TEMPLATE}).usage.prompt_tokens


def _count(server, text: str) -> int:
    return post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["count"]


def test_a_template_that_loops_over_content_parts_gets_them_as_vllm(thinking_server, string_content_server):
    # vLLM's --chat-template-content-format auto (the default) gives such a template OpenAI's parts, a plain string
    # as one text part; `string` gives it the text, whose characters it then loops over.
    assert _prompt_tokens(thinking_server, PARTS_MESSAGES) == _count(thinking_server, "<user>[hi]<user>[a][b]")
    tokens = post(thinking_server, "/tokenize", {"messages": PARTS_MESSAGES, "chat_template": PARTS_TEMPLATE})
    assert tokens.json()["count"] == _count(thinking_server, "<user>[hi]<user>[a][b]")
    # forced to string: "hi" and "a\nb" are iterated character by character, none of which has a text
    assert _prompt_tokens(string_content_server, PARTS_MESSAGES) == _count(thinking_server, "<user>[][]<user>[][][]")


# Numbers each part it gets: parts joined into one text would read "<user 1: a\nb>", with fewer tokens.
NUMBERED_PARTS_TEMPLATE = ("{% for message in messages %}{% for part in message['content'] %}"
                           "<{{ message['role'] }} {{ loop.index }}: {{ part['text'] }}>{% endfor %}{% endfor %}")


@pytest.fixture(scope="module")
def parts_template_server(tiny_model_dirs, tmp_path_factory):
    # the operator's template (--chat-template) loops over content: auto gives it the openai format
    s = start_tiny_server(tiny_model_dirs["llama"], tmp_path_factory.mktemp("parts-template") / "server.log",
                          "--chat-template", NUMBERED_PARTS_TEMPLATE)
    yield s
    stop_server(s)


def test_responses_input_parts_reach_the_template_one_by_one_as_chats(parts_template_server):
    # vLLM hands a Responses message's content parts to the template as chat does (each input_text a text part),
    # not joined into one text.
    from openai import OpenAI

    oai = OpenAI(base_url=f"{parts_template_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    parts = [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]
    response = oai.responses.create(model="tiny", input=[{"role": "user", "content": parts}], max_output_tokens=1)
    expected = _count(parts_template_server, "<user 1: a><user 2: b>")
    assert response.usage.input_tokens == expected
    chat = oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=1)
    assert chat.usage.prompt_tokens == expected
    assistant = [{"role": "user", "content": "hi"},
                 {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"},
                                                                      {"type": "output_text", "text": "d"}]}]
    again = oai.responses.create(model="tiny", input=assistant, max_output_tokens=1)
    assert again.usage.input_tokens == _count(parts_template_server, "<user 1: hi><assistant 1: c><assistant 2: d>")


def test_model_cards_carry_vllms_fields(server, client):
    # vLLM's ModelCard: id, object, created, owned_by, root, parent, max_model_len and a `permission` list of one
    # ModelPermission with its defaults (clients written for OpenAI's older API read it).
    card = httpx.get(f"{server.url}/v1/models", headers=HEADERS).json()["data"][0]
    assert {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"} <= card.keys()
    (permission,) = card["permission"]
    assert permission.pop("id").startswith("modelperm-") and isinstance(permission.pop("created"), int)
    assert permission == {"object": "model_permission", "allow_create_engine": False, "allow_sampling": True,
                          "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                          "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}
    retrieved = client.models.retrieve("tiny").model_extra
    assert retrieved["max_model_len"] == 256 and retrieved["permission"][0]["object"] == "model_permission"


def test_a_function_call_output_list_reaches_the_template_part_by_part_as_a_chat_tool_message(parts_template_server):
    # vLLM hands a function_call_output's list of parts on as the tool message's content: the template gets each
    # input_text as a text part (a part without text adds nothing), as it gets a chat tool message's parts. They were
    # joined into one text ("a\nb", and an empty line for the part without text).
    from openai import OpenAI

    oai = OpenAI(base_url=f"{parts_template_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    output = [{"type": "input_text", "text": "a"}, {"type": "input_text"}, {"type": "input_text", "text": "b"}]
    result = {"type": "function_call_output", "call_id": "call_1", "output": output}
    response = oai.responses.create(model="tiny", max_output_tokens=1,
                                    input=[{"role": "user", "content": "hi"}, call, result])
    assert response.usage.input_tokens == _count(parts_template_server, "<user 1: hi><tool 1: a><tool 2: b>")
    chat = oai.chat.completions.create(model="tiny", max_tokens=1, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a"}, {"type": "text"},
                                                                {"type": "text", "text": "b"}]}])
    assert chat.usage.prompt_tokens == response.usage.input_tokens
