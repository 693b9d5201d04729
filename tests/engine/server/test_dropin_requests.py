"""Requests as vLLM users' clients send them (issue 24, items 1 and 3): unknown fields are accepted and
logged, vLLM's extras change what they say, `echo` returns the prompt with its logprobs, and the
small endpoints and fields that lm-eval and SDKs read are there."""

from __future__ import annotations

import json
import random
import re
import string
import threading

import httpx
import pytest

from .conftest import API_KEY, prefix_cache_hits_of, wait_until_engine_idle

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The harbour at dawn was quiet, and the boats"


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=HEADERS, timeout=120)


def events(response: httpx.Response) -> list[dict]:
    lines = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# --- 1. lenient requests and vLLM's extras ---------------------------------------------------------------

SDK_DEFAULTS = {"store": False, "metadata": {"k": "v"}, "parallel_tool_calls": True, "reasoning_effort": None,
                "prompt_cache_key": None, "safety_identifier": None, "service_tier": "auto", "frobnicate": None,
                "add_special_tokens": True}


def test_unknown_fields_are_accepted_and_logged(server):
    chat = post(server, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 3, **SDK_DEFAULTS})
    assert chat.status_code == 200, chat.text
    completion = post(server, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 3,
                                                  "stream_options": None, "frobnicate": {"x": 1}})
    assert completion.status_code == 200, completion.text
    log = server.log.read_text()
    assert "were present in the request but ignored" in log and "frobnicate" in log


def test_a_known_field_with_a_bad_value_is_still_a_400(server):
    response = post(server, "/v1/completions", {"model": "tiny", "prompt": "x", "priority": "high"})
    assert response.status_code == 400 and "priority" in response.json()["error"]["message"]


def test_request_id_is_echoed_in_the_response_id(server):
    completion = post(server, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2,
                                                  "request_id": "trace-42"})
    assert completion.json()["id"] == "cmpl-trace-42"
    chat = post(server, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 2, "request_id": "trace-43", "stream": True})
    assert {e["id"] for e in events(chat)} == {"chatcmpl-trace-43"}


def test_truncate_prompt_tokens_keeps_the_last_tokens(server, client):
    long = "one two three four five six seven eight nine ten " * 4
    full = client.completions.create(model="tiny", prompt=long, max_tokens=1, temperature=0)
    assert full.usage.prompt_tokens > 12
    cut = client.completions.create(model="tiny", prompt=long, max_tokens=1, temperature=0,
                                    extra_body={"truncate_prompt_tokens": 12})
    assert cut.usage.prompt_tokens == 12
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": long}, headers=HEADERS).json()["tokens"]
    same = client.completions.create(model="tiny", prompt=ids[-12:], max_tokens=1, temperature=0)
    assert cut.choices[0].text == same.choices[0].text
    chat = post(server, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": long}],
                                                 "max_tokens": 1, "truncate_prompt_tokens": 7})
    assert chat.json()["usage"]["prompt_tokens"] == 7
    too_long = post(server, "/v1/completions", {"model": "tiny", "prompt": "x", "truncate_prompt_tokens": 1000})
    assert too_long.status_code == 400 and "truncate_prompt_tokens" in too_long.json()["error"]["message"]


def test_a_huge_truncated_prompt_is_served_before_its_whole_text_could_be_tokenized(client, embedded_model_dir):
    # A body-sized prompt (7.5M characters) cut to its last tokens. Its whole text was tokenized, one Rust call of
    # 20-140 s that went on after a client that left: the server now tokenizes only the part that holds the kept
    # tokens. Order, not time: the reply comes before this process tokenizes even half the text (the server tokenized
    # all of it, before it could reply).
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)  # the tiny models' tokenizer
    rng = random.Random(7)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 9))) for _ in range(500)]
    text = " ".join(rng.choice(words) for _ in range(1_500_000))[:7_500_000]
    replies = []
    thread = threading.Thread(target=lambda: replies.append(client.with_options(timeout=600).completions.create(
        model="tiny", prompt=text, max_tokens=1, extra_body={"truncate_prompt_tokens": 64})))
    thread.start()
    tokenizer.encode(text[:len(text) // 2])  # the clock: half the work the server did before
    answered_first = bool(replies)
    thread.join(600)
    assert replies[0].usage.prompt_tokens == 64
    assert answered_first


def test_add_special_tokens_is_passed_to_the_tokenizer(server, tiny_model_dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    for flag in (True, False):
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "add_special_tokens": flag}
        usage = post(server, "/v1/completions", body).json()["usage"]
        assert usage["prompt_tokens"] == len(tokenizer.encode(PROMPT, add_special_tokens=flag))


def test_return_tokens_as_token_ids(server):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "min_tokens": 4, "logprobs": 2, "temperature": 0,
            "return_tokens_as_token_ids": True}
    logprobs = post(server, "/v1/completions", body).json()["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 4
    assert all(t.startswith("token_id:") and t[len("token_id:"):].isdigit() for t in logprobs["tokens"])
    assert all(k.startswith("token_id:") for top in logprobs["top_logprobs"] for k in top)
    chat = post(server, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 3, "logprobs": True, "top_logprobs": 1,
                                                 "return_tokens_as_token_ids": True}).json()
    assert all(c["token"].startswith("token_id:") for c in chat["choices"][0]["logprobs"]["content"])


def test_priority_needs_the_priority_policy(server):
    response = post(server, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2, "priority": 3})
    assert response.status_code == 400 and "--scheduling-policy priority" in response.json()["error"]["message"]
    assert post(server, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2,
                                            "priority": 0}).status_code == 200


@pytest.mark.parametrize("route", ["completions", "chat", "responses"])
def test_cache_salt_shares_the_prefix_cache_only_within_a_salt(server, route):
    """A salted request's blocks are hits for the same salt only: not for another salt nor for none, and an unsalted
    request's blocks are no hits for a salted one (the timing side channel cache_salt closes), on every route."""
    import openai

    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    # Several full 8-token blocks of this route's own from the first block on (a system message's: the chat
    # template's opening tokens before a user's message would be hits from any earlier unsalted chat request).
    prompt = f"{route} salted prefix " * 12

    def send(salt: str | None) -> None:
        extra = {"cache_salt": salt} if salt is not None else None
        if route == "completions":
            oai.completions.create(model="tiny", prompt=prompt, max_tokens=1, extra_body=extra)
        elif route == "chat":
            oai.chat.completions.create(model="tiny", messages=[{"role": "system", "content": prompt},
                                                                {"role": "user", "content": "x"}],
                                        max_tokens=1, extra_body=extra)
        else:
            oai.responses.create(model="tiny", instructions=prompt, input="x", max_output_tokens=1, store=False,
                                 extra_body=extra)

    def hits(salt: str | None) -> float:
        # Salts of this route's own: the chat template's opening tokens are the same on chat and responses.
        return prefix_cache_hits_of(server, lambda: send(None if salt is None else f"{route}-{salt}"))

    assert hits("a") == 0
    assert hits("a") > 0
    assert hits("b") == 0
    assert hits(None) == 0  # the salted blocks are no hits unsalted ...
    assert hits(None) > 0
    assert hits("c") == 0  # ... nor the unsalted blocks salted
    with pytest.raises(openai.BadRequestError):
        send("")


# --- 3. echo, prompt logprobs, text offsets, continuous usage, GET /v1/models/{id} -------------------------


def test_echo_returns_the_prompt_and_its_logprobs_as_the_offline_engine_computes_them(server, tiny_model_dirs):
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams

    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
    choice = post(server, "/v1/completions", body).json()["choices"][0]
    assert choice["text"].startswith(PROMPT) and len(choice["text"]) > len(PROMPT)
    lp = choice["logprobs"]
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=256, block_size=8)
    offline = llm.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1),
                           use_tqdm=False)[0]
    ids = offline.prompt_token_ids
    assert len(lp["tokens"]) == len(ids) + 1 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    expected = [entry[token][0] for token, entry in zip(ids[1:], offline.prompt_logprobs[1:], strict=True)]
    assert lp["token_logprobs"][1:len(ids)] == pytest.approx(expected, abs=1e-4)
    assert lp["tokens"][-1] == llm.get_tokenizer().decode(offline.outputs[0].token_ids)
    # Character offsets: each token starts where the previous one's text ends.
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]


def test_streamed_echo_equals_the_whole_answer(server):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "min_tokens": 5, "logprobs": 1, "echo": True,
            "temperature": 0}
    whole = post(server, "/v1/completions", body).json()["choices"][0]
    chunks = events(post(server, "/v1/completions", {**body, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == whole["logprobs"]["text_offset"]
    assert [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]] == whole["logprobs"]["tokens"]


def test_text_offset_counts_characters_without_echo(server):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "min_tokens": 6, "logprobs": 0, "temperature": 0}
    lp = post(server, "/v1/completions", body).json()["choices"][0]["logprobs"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(6)]
    assert lp["text_offset"][-1] > 0


def test_prompt_logprobs_zero_is_returned_not_null(server):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 0}
    prompt_logprobs = post(server, "/v1/completions", body).json()["choices"][0]["prompt_logprobs"]
    assert prompt_logprobs[0] is None and len(prompt_logprobs) > 5
    first = prompt_logprobs[1]
    assert len(first) == 1 and {"logprob", "rank", "decoded_token"} <= set(next(iter(first.values())))


def test_a_one_token_prompts_prompt_logprobs_are_one_none(server):
    # Its only token has no predecessor, so no step computed a prompt logprob and the field came back null, as
    # if prompt_logprobs had not been asked for; vLLM answers [None] (one entry per prompt token, the first None).
    body = {"model": "tiny", "prompt": [5], "max_tokens": 1, "prompt_logprobs": 1}
    assert post(server, "/v1/completions", body).json()["choices"][0]["prompt_logprobs"] == [None]
    unasked = post(server, "/v1/completions", {"model": "tiny", "prompt": [5], "max_tokens": 1})
    assert unasked.json()["choices"][0]["prompt_logprobs"] is None


def test_continuous_usage_stats_puts_usage_in_every_chunk(server):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "min_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = events(post(server, "/v1/completions", body))
    with_choices = [c for c in chunks if c["choices"]]
    assert all("usage" in c for c in with_choices)
    assert with_choices[-1]["usage"]["completion_tokens"] == 4
    chat = events(post(server, "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    assert all("usage" in c for c in chat if c["choices"])


def test_continuous_usage_counts_each_choices_own_tokens_as_vllm(server):
    # vLLM's per-chunk usage: the prompt and the tokens of that chunk's choice so far (previous_num_tokens[i]);
    # the usage summed over every choice comes once, in the include_usage chunk. Was: the sum over all choices.
    for path, extra in (("/v1/completions", {"prompt": [5, 6, 7, 8]}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        body = {"model": "tiny", "max_tokens": 3, "min_tokens": 3, "n": 2, "stream": True, "seed": 3, **extra,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        chunks = events(post(server, path, body))
        counts: dict[int, list[int]] = {0: [], 1: []}
        prompt_tokens = chunks[-1]["usage"]["prompt_tokens"]
        for c in chunks[:-1]:
            if "usage" in c and (c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content")
                                 or c["choices"][0]["finish_reason"]):
                assert c["usage"]["prompt_tokens"] == prompt_tokens
                counts[c["choices"][0]["index"]].append(c["usage"]["completion_tokens"])
        assert all(v and v[-1] == 3 and v == sorted(v) for v in counts.values()), (path, counts)
        assert chunks[-1]["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("stream", [False, True])
def test_chat_echo_returns_the_continued_message_whole_as_vllm(server, stream):
    # vLLM's chat `echo`: the last message's content comes first in the reply when its role is the reply's (an
    # assistant message continued with continue_final_message); other conversations echo nothing. Was a 400.
    def reply(messages: list[dict], **extra) -> list[str]:
        body = {"model": "tiny", "messages": messages, "max_tokens": 3, "min_tokens": 3, "temperature": 0,
                "n": 2, "echo": True, "stream": stream, **extra}
        if not stream:
            return [c["message"]["content"] for c in post(server, "/v1/chat/completions", body).json()["choices"]]
        texts = ["", ""]
        for chunk in events(post(server, "/v1/chat/completions", body)):
            for c in chunk["choices"]:
                texts[c["index"]] += c["delta"].get("content") or ""
        return texts

    user = [{"role": "user", "content": "Name a colour."}]
    prefill = [*user, {"role": "assistant", "content": "My favourite is"}]
    continued = reply(prefill, add_generation_prompt=False, continue_final_message=True)
    plain = reply(prefill, add_generation_prompt=False, continue_final_message=True, echo=False)
    assert continued == ["My favourite is" + t for t in plain]
    assert reply(user) == reply(user, echo=False)  # the reply's role (assistant) is not the last message's


def test_chat_prompt_logprobs_as_vllm(server):
    # vLLM's chat takes prompt_logprobs: the response's top-level `prompt_logprobs`, as a completions choice's (None
    # for the first prompt token, then token id -> logprob, rank, decoded_token). Was a 400; a stream still is one.
    messages = [{"role": "user", "content": "Hello there"}]
    reply = post(server, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 1,
                                                  "prompt_logprobs": 2})
    assert reply.status_code == 200, reply.text
    entries = reply.json()["prompt_logprobs"]
    assert entries[0] is None and len(entries) == reply.json()["usage"]["prompt_tokens"]
    assert all(2 <= len(e) <= 3 and {"logprob", "rank", "decoded_token"} <= set(next(iter(e.values())))
               for e in entries[1:])
    assert post(server, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 1}
                ).json().get("prompt_logprobs") is None
    streamed = post(server, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 1,
                                                     "prompt_logprobs": 1, "stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"


@pytest.mark.parametrize("stream", [False, True])
def test_the_reply_role_without_a_generation_prompt_is_the_last_messages_as_vllm(server, stream):
    # vLLM's get_chat_request_role: "assistant" with add_generation_prompt, else the last message's role (the
    # model continues that message). Was "assistant" always.
    def role(messages: list[dict], add_generation_prompt: bool) -> str:
        body = {"model": "tiny", "messages": messages, "max_tokens": 2, "stream": stream,
                "add_generation_prompt": add_generation_prompt}
        if not stream:
            return post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["role"]
        return next(c["choices"][0]["delta"]["role"] for c in events(post(server, "/v1/chat/completions", body))
                    if c["choices"] and "role" in c["choices"][0]["delta"])

    user = [{"role": "user", "content": "Name a colour."}]
    assert role(user, True) == "assistant"
    assert role(user, False) == "user"
    assert role([*user, {"role": "assistant", "content": "Blue"}], False) == "assistant"


def test_a_message_with_null_content_renders_as_empty_text_as_vllm(server):
    # vLLM parses a null content as no parts, which the string content format renders as "": served. Was a 400
    # from the template ("'dict object' has no attribute 'content'") unless the message carried tool calls.
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": None}, {"role": "user", "content": None}]}
    reply = post(server, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    empty = post(server, "/v1/chat/completions", {**body, "messages": [{"role": "system", "content": ""},
                                                                       {"role": "user", "content": ""}]})
    assert reply.json()["usage"] == empty.json()["usage"]


def test_models_by_id(server):
    one = httpx.get(f"{server.url}/v1/models/tiny-alias", headers=HEADERS)
    assert one.status_code == 200 and one.json()["id"] == "tiny-alias" and one.json()["object"] == "model"
    # the card names the KV element dtype as the start-up log does, and the (absent) weight quantization
    logged = re.search(r"KV cache: \d+ blocks x \d+ tokens, (\w+)", server.log.read_text())
    assert logged and one.json()["kv_cache_dtype"] == logged.group(1) and one.json()["quantization"] is None
    missing = httpx.get(f"{server.url}/v1/models/nope", headers=HEADERS)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_an_empty_model_id_is_the_list_and_odd_ids_are_404s(server):
    """`/v1/models/` answered the first served model's card, as if its id were that model's name: now the list, where
    vLLM's redirect (to /v1/models) ends. Ids with slashes (encoded or not), NUL, spaces or invalid UTF-8 are names
    this server does not serve: OpenAI's 404."""
    listed = httpx.get(f"{server.url}/v1/models", headers=HEADERS).json()
    empty = httpx.get(f"{server.url}/v1/models/", headers=HEADERS)
    assert empty.status_code == 200, empty.text
    assert empty.json()["object"] == "list" and [m["id"] for m in empty.json()["data"]] == [m["id"] for m in
                                                                                          listed["data"]]
    for odd in ("tiny%2Fx", "%2F", "a/b", "tiny/", "%00", "%ff", "%20", "..%2F..%2Fmetrics", "/"):
        missing = httpx.get(f"{server.url}/v1/models/{odd}", headers=HEADERS)
        assert missing.status_code == 404, (odd, missing.text)
        assert missing.json()["error"]["code"] == "model_not_found", odd


@pytest.mark.parametrize(("route", "field", "value"), [
    ("/v1/completions", "priority", 2**31),
    ("/v1/chat/completions", "priority", -(2**31) - 1),
    ("/v1/responses", "priority", 10**30),
    ("/v1/completions", "cache_salt", "s" * 4097),
    ("/v1/chat/completions", "cache_salt", "s" * 4097),
    ("/v1/responses", "cache_salt", "s" * 4097),
    ("/v1/completions", "truncate_prompt_tokens", 0),
    ("/v1/chat/completions", "truncate_prompt_tokens", -2),
    ("/v1/completions", "truncate_prompt_tokens", 257),  # the model's context is 256
])
def test_out_of_range_request_extras_are_a_400_naming_the_field(server, route, field, value):
    body = {"model": "tiny", "max_tokens": 1, field: value}
    body |= ({"prompt": "x"} if route == "/v1/completions" else {"input": "x"} if route == "/v1/responses"
             else {"messages": [{"role": "user", "content": "x"}]})
    if route == "/v1/responses":
        body["max_output_tokens"] = body.pop("max_tokens")
    response = post(server, route, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and field in error["message"]


def test_request_extras_at_their_bounds_are_served(server):
    for extras in ({"priority": 0, "cache_salt": "s" * 4096, "truncate_prompt_tokens": 1},
                   {"truncate_prompt_tokens": 256}, {"truncate_prompt_tokens": -1}):
        response = post(server, "/v1/completions", {"model": "tiny", "prompt": "a b c", "max_tokens": 1, **extras})
        assert response.status_code == 200, (extras, response.text)


def test_a_client_abort_is_not_counted_as_a_finished_request_as_in_vllm(server):
    # vLLM v1 counts vllm:request_success_total (and the per-request histograms) from the engine core's finished
    # outputs; a client abort goes through OutputProcessor.abort_requests and is counted nowhere, so the
    # finished_reason="abort" series stays 0 (vLLM issues #31503, #55634). The same here, and checked so.
    import time

    def finished() -> dict[str, float]:
        metrics = server.metrics()
        return {reason: sum(v for k, v in metrics.items()
                            if k.startswith("vllm:request_success_total{") and f'finished_reason="{reason}"' in k)
                for reason in ("stop", "length", "abort")} | {
            "e2e": sum(v for k, v in metrics.items() if k.startswith("vllm:e2e_request_latency_seconds_count"))}

    wait_until_engine_idle(server)  # no earlier test's request finishing in between
    before = finished()
    with httpx.stream("POST", f"{server.url}/v1/completions", headers=HEADERS, timeout=120, json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True}) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
    deadline = time.monotonic() + 30
    while server.metric("vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.5)  # a later stats update would carry a late count
    assert finished() == before
    post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "ignore_eos": True})
    # Its count comes with a later stats update (in order: after the aborted stream's, had that one been counted); a
    # wait for it, not a fixed 0.5 s that a loaded machine may not keep.
    deadline = time.monotonic() + 60
    while (after := finished())["length"] == before["length"]:
        assert time.monotonic() < deadline, "the finished request was never counted"
        time.sleep(0.1)
    assert after["length"] == before["length"] + 1 and after["abort"] == before["abort"] == 0


# --- vLLM's allowed_token_ids and bad_words, through the openai client (extra_body) ---------------------


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_allowed_token_ids_and_bad_words_through_the_openai_client(server, client, tiny_model_dirs, route):
    from transformers import AutoTokenizer

    from flotilla.engine.bad_words import bad_word_token_ids

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])

    def ask(**extra) -> list[int]:
        """The greedy output's token ids (logprob tokens named `token_id:<id>`)."""
        base = dict(model="tiny", max_tokens=8, temperature=0, logprobs=True if route == "chat" else 1,
                    extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True, **extra})
        if route == "chat":
            got = client.chat.completions.create(messages=[{"role": "user", "content": PROMPT}], **base)
            names = [t.token for t in got.choices[0].logprobs.content]
        else:
            names = client.completions.create(prompt=PROMPT, **base).choices[0].logprobs.tokens
        return [int(name.removeprefix("token_id:")) for name in names]

    free = ask()
    allowed = [t for t in range(1000, 1010) if t not in free]
    masked = ask(allowed_token_ids=allowed)
    assert set(masked) <= set(allowed)
    # A word whose one-token forms (with and without a space) hold a token of the free greedy output.
    words = [w for w in (tokenizer.decode([t]).strip() for t in free) if w]
    forms = {w: bad_word_token_ids([w], tokenizer, len(tokenizer)) for w in words}
    word = next(w for w in words if {seq[0] for seq in forms[w] if len(seq) == 1} & set(free))
    banned = ask(bad_words=[word])
    assert banned != free and not {seq[0] for seq in forms[word] if len(seq) == 1} & set(banned)


@pytest.mark.parametrize(("field", "value", "words"), [
    ("allowed_token_ids", [], "empty"),
    ("allowed_token_ids", [5, 10**9], "outside the vocabulary"),
    ("bad_words", [" "], "whitespace"),
])
def test_bad_allowed_token_ids_and_bad_words_are_a_400_naming_the_field(server, field, value, words):
    for path, prompt in [("/v1/completions", {"prompt": "hi"}),
                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})]:
        response = post(server, path, {"model": "tiny", **prompt, "max_tokens": 2, field: value})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and words in error["message"], error


def test_completions_without_max_tokens_generate_16_tokens_as_vllm(server):
    # vLLM's CompletionRequest (and OpenAI's legacy completions) default max_tokens to 16; here a completion without
    # it ran to the end of the context (240 tokens on the 256-token server).
    out = post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "ignore_eos": True})
    assert out.status_code == 200, out.text
    assert out.json()["usage"]["completion_tokens"] == 16 and out.json()["choices"][0]["finish_reason"] == "length"
    chat = post(server, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}],
                                                 "ignore_eos": True})
    assert chat.json()["usage"]["completion_tokens"] > 16  # chat's default is the context left, as vLLM's


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_returns_the_prompt_alone_with_its_logprobs(server, stream):
    # vLLM's echo_without_generation (OpenAI's scoring idiom: echo, max_tokens 0, logprobs): was a 400.
    body = {"model": "tiny", "prompt": PROMPT, "echo": True, "max_tokens": 0, "logprobs": 1, "stream": stream}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    if stream:
        choices = [c for e in events(response) for c in e["choices"]]
        text = "".join(c["text"] for c in choices)
        tokens = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
        first_logprob = choices[0]["logprobs"]["token_logprobs"][0]
    else:
        choice = response.json()["choices"][0]
        text, tokens = choice["text"], choice["logprobs"]["tokens"]
        first_logprob = choice["logprobs"]["token_logprobs"][0]
    prompt_ids = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, headers=HEADERS).json()["tokens"]
    assert text == PROMPT and len(tokens) == len(prompt_ids) and first_logprob is None
    refused = post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 0})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


def test_truncation_side_right_keeps_the_first_tokens_as_vllm(server, client):
    """vLLM's `truncation_side` (beside `truncate_prompt_tokens`): "right" cuts the end, keeping the first N tokens;
    "left" (and unset) the last N. It was ignored (logged), so "right" got the last N."""
    long = "one two three four five six seven eight nine ten " * 4
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": long}, headers=HEADERS).json()["tokens"]
    for side, kept in (("right", ids[:12]), ("left", ids[-12:])):
        cut = client.completions.create(model="tiny", prompt=long, max_tokens=2, temperature=0,
                                        extra_body={"truncate_prompt_tokens": 12, "truncation_side": side})
        same = client.completions.create(model="tiny", prompt=kept, max_tokens=2, temperature=0)
        assert cut.usage.prompt_tokens == 12 and cut.choices[0].text == same.choices[0].text, side
    chat = post(server, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": long}],
                                                 "max_tokens": 1, "truncate_prompt_tokens": 7,
                                                 "truncation_side": "right", "return_token_ids": True})
    assert len(chat.json()["prompt_token_ids"]) == 7
    assert "truncation_side" not in server.log.read_text()  # served, not in the ignored-fields line
