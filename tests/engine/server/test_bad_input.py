"""Issue 17 item 5: bad input is a 4xx with OpenAI's error JSON, never a 500 or a plain-text body."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from .conftest import API_KEY, wait_until_engine_idle

HEADERS = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
LONE = "\\ud800"  # a JSON escape for an unpaired UTF-16 surrogate


def raw_post(server, path: str, raw: str) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=raw.encode(), headers=HEADERS, timeout=120)


def assert_openai_400(response: httpx.Response, param: str | None = None) -> None:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["message"] and error["type"] == "BadRequestError"
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/completions", '{"prompt": "Hello ' + LONE + ' there", "max_tokens": 2}'),
        ("/v1/completions", '{"prompt": ["ok", "' + LONE + '"], "max_tokens": 2}'),
        ("/v1/completions", '{"prompt": "Hello", "max_tokens": 2, "model": "tiny' + LONE + '"}'),
        ("/v1/completions", '{"prompt": "Hello", "max_tokens": 2, "stop": ["' + LONE + '"]}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi ' + LONE + '"}], "max_tokens": 2}'),
        ("/v1/chat/completions",
         '{"messages": [{"role": "user", "content": [{"type": "text", "text": "' + LONE + '"}]}], "max_tokens": 2}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], "model": "' + LONE + '"}'),
        ("/tokenize", '{"prompt": "' + LONE + '"}'),
        ("/tokenize", '{"messages": [{"role": "user", "content": "' + LONE + '"}]}'),
    ],
)
def test_lone_surrogates_are_a_400(server, path, raw):
    assert_openai_400(raw_post(server, path, raw))
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_body_nested_past_the_bound_is_a_400_and_one_within_it_is_served(server, path):
    """The body's text is checked string by string (lone surrogates, above) before any field is read: a body nested
    hundreds of levels deep (here an ignored field; a `response_format` schema alike) overflowed that walk's stack
    into a plain-text 500. Past the bound it is a 400; within it the request is served. Past json.loads' own depth
    (~1,000: Python's recursion limit) the parse itself raised RecursionError: a plain-text 500 too."""
    base = ('{"prompt": "Hello", ' if path == "/v1/completions"
            else '{"messages": [{"role": "user", "content": "Hi"}], ')
    for depth, status in ((600, 400), (100_000, 400), (60, 200)):
        raw = base + '"max_tokens": 2, "extra": ' + "[" * depth + "]" * depth + "}"
        response = raw_post(server, path, raw)
        if status == 400:
            assert_openai_400(response)
            assert "nest" in response.json()["error"]["message"]
        else:
            assert response.status_code == 200, response.text
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize("text", [5, None, ["a"], {"t": 1}])
def test_a_text_part_whose_text_is_not_a_string_is_a_400(server, text):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}], "max_tokens": 2}
    if text is None:
        body["messages"][0]["content"][0]["text"] = None
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    if text is None:  # an absent/null text is an empty part, as before
        assert response.status_code == 200, response.text
        return
    assert_openai_400(response, "messages")


def test_text_parts_are_still_joined(server):
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "two plus two?"}]
    joined = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": parts}]},
                        headers=HEADERS, timeout=60)
    plain = httpx.post(f"{server.url}/tokenize",  # joined by a newline, as vLLM (test_vllm_compat.py)
                       json={"messages": [{"role": "user", "content": "What is\ntwo plus two?"}]},
                       headers=HEADERS, timeout=60)
    assert joined.status_code == 200 and joined.json()["tokens"] == plain.json()["tokens"]


def test_tokenize_with_empty_messages_is_a_400(server):
    response = httpx.post(f"{server.url}/tokenize", json={"messages": []}, headers=HEADERS, timeout=60)
    assert_openai_400(response, "messages")


def test_invalid_utf8_body_is_a_400(server):
    response = httpx.post(f"{server.url}/v1/completions", content=b'{"prompt": "\xff\xfe", "max_tokens": 2}',
                          headers=HEADERS, timeout=60)
    assert 400 <= response.status_code < 500, response.text
    assert "error" in response.json()


def test_a_refused_prompt_in_a_completions_batch_stops_the_others(server):
    """One prompt of a non-streamed batch is refused (a 400): the batch's other prompts, already
    queued, are aborted with it rather than generating to max_tokens for a reply nobody gets."""
    import time

    wait_until_engine_idle(server)  # no earlier test's tokens in the count
    before = server.metric("vllm:generation_tokens_total")
    body = {"model": "tiny", "prompt": [[5, 6, 7], [10**9]], "max_tokens": 250, "ignore_eos": True}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=120)
    assert_openai_400(response, "prompt")
    time.sleep(0.5)  # the 400 can come before the valid prompt's first step: let it start, if it runs on
    deadline = time.monotonic() + 60
    while server.metric("vllm:num_requests_running") + server.metric("vllm:kv_cache_usage_perc"):
        assert time.monotonic() < deadline, "the batch's valid prompt never ended"
        time.sleep(0.05)
    assert server.metric("vllm:generation_tokens_total") - before < 100  # aborted, not run to its 250 tokens


# One-token requests on the three generation routes that take a client's request id.
ONE_TOKEN_REQUESTS = [
    ("/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 1}),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
    ("/v1/responses", {"model": "tiny", "input": "Hi", "max_output_tokens": 1}),
]


@pytest.mark.parametrize(("path", "body"), ONE_TOKEN_REQUESTS)
def test_an_x_request_id_longer_than_the_body_limit_is_a_400(server, path, body):
    """The X-Request-Id header takes the body's `request_id` place (the response id, the engine's id), so
    the body's 256-character bound holds for it too: a 4,000-character header is refused, not used as the id."""
    too_long = {**HEADERS, "X-Request-Id": "r" * 4000}
    assert_openai_400(httpx.post(f"{server.url}{path}", json=body, headers=too_long, timeout=120), "X-Request-Id")
    at_limit = {**HEADERS, "X-Request-Id": "r" * 256}
    response = httpx.post(f"{server.url}{path}", json=body, headers=at_limit, timeout=120)
    assert response.status_code == 200, response.text
    assert "r" * 256 in response.json()["id"]


# Control bytes h11 lets through in a header (all but NUL, CR, LF and whitespace), as raw bytes: an ESC starting a
# terminal escape, DEL, a C0 and a C1 control (latin-1, as the server decodes headers).
CONTROL_HEADERS = [b"trace\x1b[2Jx", b"a\x7fb", b"a\x01b", b"id-\x9b31m"]


@pytest.mark.parametrize(("path", "body"), ONE_TOKEN_REQUESTS)
def test_a_request_id_with_a_control_character_is_a_400(server, path, body):
    """A client's id (the X-Request-Id header or the body's `request_id`) becomes the response id and the name of the
    request in every log line: with a control character it is refused, not copied there (raw HTTP: the SDKs refuse
    to send such a header). Printable non-ASCII ids are served as before."""
    for value in CONTROL_HEADERS:
        response = httpx.post(f"{server.url}{path}", json=body, headers={**HEADERS, "X-Request-Id": value},
                              timeout=120)
        assert_openai_400(response, "X-Request-Id")
        assert "unprintable character" in response.json()["error"]["message"]
        assert value.decode("latin-1") not in response.text
    for value in ("trace\x1b[2Jx", "a\u202eb", "line\nbreak", "a\x85b"):  # an ESC, a bidi override, LF, NEL
        response = httpx.post(f"{server.url}{path}", json={**body, "request_id": value}, headers=HEADERS, timeout=120)
        assert_openai_400(response, "request_id")
    for header, given in ((b"caf\xc3\xa9 42", "caf\xc3\xa9 42"), (None, "café-ü 42")):  # UTF-8 bytes, read as latin-1
        response = httpx.post(f"{server.url}{path}", json=body if header else {**body, "request_id": given},
                              headers={**HEADERS, "X-Request-Id": header} if header else HEADERS, timeout=120)
        assert response.status_code == 200, response.text
        assert given in response.json()["id"]


@pytest.mark.parametrize("calls", [5, True, "f", {"id": "c1"}, [5], ["c1"], [None]])
@pytest.mark.parametrize("stream", [False, True])
def test_assistant_tool_calls_that_are_not_a_list_of_objects_are_a_400(server, calls, stream):
    """A history message's `tool_calls` of 5 was iterated for the chat template: a TypeError, a plain-text 500 (found
    by fuzzing the real server); a string or an object reached the template as characters or keys. vLLM's message
    schema takes a list of call objects or null."""
    body = {"model": "tiny", "max_tokens": 2, "stream": stream, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "tool_calls": calls},
        {"role": "user", "content": "and?"}]}
    response = raw_post(server, "/v1/chat/completions", json.dumps(body))
    assert_openai_400(response, "messages")
    assert "tool_calls" in response.json()["error"]["message"]
    for fine in (None, []):  # null and an empty list are no calls, as before
        body["messages"][1]["tool_calls"] = fine
        response = raw_post(server, "/v1/chat/completions", json.dumps(body))
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(("field", "value"), [("tool_call_id", 5), ("tool_call_id", ["c1"]), ("reasoning", 5),
                                            ("reasoning", {"text": "hmm"})])
def test_a_message_field_the_template_reads_as_text_that_is_not_text_is_a_400(server, field, value):
    """vLLM's message schema types a tool message's `tool_call_id` and a reply's `reasoning` as strings; here they
    reached the chat template as numbers or objects (a 200). A string is served."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"},
                {"role": "tool", "content": "ok"}]
    messages[1 if field == "reasoning" else 2][field] = value
    body = {"model": "tiny", "max_tokens": 2, "messages": messages}
    assert_openai_400(raw_post(server, "/v1/chat/completions", json.dumps(body)), "messages")
    messages[1 if field == "reasoning" else 2][field] = "c1"
    response = raw_post(server, "/v1/chat/completions", json.dumps(body))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("function", [{"name": 5, "arguments": "{}"}, {"name": None, "arguments": "{}"},
                                      {"name": {"n": "f"}, "arguments": "{}"}, {"arguments": "{}"}, None, "f"])
def test_an_assistant_tool_call_whose_function_name_is_not_a_string_is_a_400(client, function):
    """A history tool call named 5 (or null, an object, no function at all) was rendered by the chat template as is
    (found by fuzzing the real server); the Responses API's function_call item refused it already. vLLM's message
    schema, and OpenAI, want the name as a string."""
    call = {"id": "c1", "type": "function", "function": function}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", max_tokens=2, messages=messages)
    assert refused.value.body["param"] == "messages" and "string name" in refused.value.body["message"]


@pytest.mark.parametrize("depth", [5000, 100000])
def test_an_assistant_tool_call_whose_arguments_nest_too_deeply_is_a_400(server, depth):
    """History tool-call arguments are parsed for the chat template; JSON nested past the parser's depth
    raised RecursionError, which came back as a plain-text 500."""
    arguments = '{"a": ' + "[" * depth + "]" * depth + "}"
    body = {"model": "tiny", "max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    assert_openai_400(response, "messages")


def test_a_required_tool_call_nested_past_the_json_depth_limit_is_content_not_a_500(tiny_model_dirs, tmp_path):
    """tool_choice "required" with logit_bias on "[[" makes the model nest its call's arguments ~1,170 deep
    (greedy: nearly every token a "[[") until max_tokens: parsing the output raised RecursionError, a plain-text
    500. The text (cut short by max_tokens, not a call) now comes back as content, as other unparsable outputs
    do. Greedy and 600 tokens, not sampled 1,100: the sampling race's noise over the 49k vocabulary was ~40 % of
    each step's CPU (60 s vs 37 s for 600 tokens on 2 loaded cores), and 600 "[[" already nest past the limit."""
    import json
    import shutil

    from .conftest import start_server, stop_server

    model = tmp_path / "llama"  # the tiny Llama with room for 600 output tokens
    shutil.copytree(tiny_model_dirs["llama"], model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 700}))
    server = start_server(model, tmp_path / "server.log", "--served-model-name", "tiny", "--max-model-len", "700",
                          "--disable-log-stats", "--structured-outputs-config",
                          '{"backend": "xgrammar", "disable_any_whitespace": true}', env={"VLLM_API_KEY": API_KEY})
    try:
        tools = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]}}}]
        body = {"model": "tiny", "max_tokens": 600, "messages": [{"role": "user", "content": "hi"}], "tools": tools,
                "tool_choice": "required", "logit_bias": {"32803": 100, "75": 90}, "temperature": 0}  # "[[" and "["
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=300)
        assert response.status_code == 200, response.text[:300]
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "length" and choice["message"]["content"].count("[") > 1000
    finally:
        stop_server(server)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "constraint",
    [
        {"grammar": "root ::= root"},  # no sentence at all
        {"grammar": "root ::= a\na ::= b\nb ::= a"},
        {"regex": "[^\\x00-\\U0010FFFF]"},  # a character class with no character
    ],
)
def test_a_constraint_that_matches_no_text_is_a_400(server, constraint, stream):
    # The grammar allows no first token: sampling had nothing to draw from and the request failed in the
    # engine as a 500 (which the openai SDK retries), though the request alone is at fault.
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "structured_outputs": constraint, "stream": stream}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    assert_openai_400(response, "structured_outputs")
    assert "matches no text" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/completions", "use_beam_search", True),
        ("/v1/chat/completions", "logits_processors", ["my.module:Processor"]),
        ("/v1/completions", "prompt_embeds", "AAAAAA=="),  # a base64 tensor: vLLM needs --enable-prompt-embeds
        # SamplingParams.extra_args, for custom extensions (vLLM's logits-processor plugins): this server loads none
        ("/v1/completions", "vllm_xargs", {"target_token": 7}),
        # a P/D proxy's prefill request: it reads the reply's kv_transfer_params back for the decode instance
        ("/v1/chat/completions", "kv_transfer_params", {"do_remote_decode": True, "do_remote_prefill": False}),
        ("/v1/completions", "ec_transfer_params", {"do_remote_encode": True}),
    ],
)
def test_a_vllm_field_that_would_change_the_output_is_refused_not_ignored(server, path, field, value):
    # Ignored, these answered 200 with output that the field would have changed (unconstrained tokens, no
    # prompt logprobs), and the client could not tell.
    prompt = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    body = {"model": "tiny", **prompt, "max_tokens": 2, field: value}
    response = httpx.post(f"{server.url}{path}", json=body, headers=HEADERS, timeout=120)
    assert_openai_400(response, field)
    # Their off values change nothing and stay accepted (clients send defaults).
    off = {"use_beam_search": False, "logits_processors": [], "prompt_embeds": None, "vllm_xargs": {},
           "kv_transfer_params": None, "ec_transfer_params": {}}[field]
    ok = httpx.post(f"{server.url}{path}", json={**body, field: off}, headers=HEADERS, timeout=120)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(("prompts", "n"), [(2049, 1), (17, 128)])
def test_a_completions_request_past_the_sequence_bound_is_a_400_before_any_work(server, prompts, n):
    # n is bounded (128), but a prompt list multiplied it without bound: 20,000 one-token prompts (a 100 KB
    # body) took 195 s and 630 MB of the server's memory; the 8 MB body limit allows ~2 million.
    started = time.monotonic()
    body = {"model": "tiny", "prompt": [[5]] * prompts, "n": n, "max_tokens": 1}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=300)
    assert_openai_400(response, "prompt")
    assert "2048" in response.json()["error"]["message"]
    assert time.monotonic() - started < 10
    # At the bound it is served.
    ok = httpx.post(f"{server.url}/v1/completions", json={**body, "prompt": [[5]] * (2048 // n)}, headers=HEADERS,
                    timeout=300)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == (2048 // n) * n


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "constraint",
    [
        {"grammar": 'root ::= "a" b\nb ::= b'},  # a sentence may start, none can end
        {"regex": "ab[^\\x00-\\U0010FFFF]"},  # a character class with no character, after two
    ],
)
def test_a_constraint_that_dead_ends_after_its_first_tokens_is_a_400_and_frees_the_request(server, constraint, stream):
    # The starting state allows tokens, so the compile-time check passes; after them the grammar allows none,
    # sampling drew an arbitrary token, the grammar refused it, and the request failed as a 500 (which the
    # openai SDK retries). The request alone is at fault: a 400 (in-band once a stream has begun).
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
            "structured_outputs": constraint, "stream": stream}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    if not stream or response.status_code != 200:
        assert_openai_400(response, "structured_outputs")
        error = response.json()["error"]
    else:
        events = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", response.text
        error = json.loads(events[-2])["error"]
        assert error["code"] == 400 and error["param"] == "structured_outputs", error
    assert "dead end" in error["message"], error
    deadline = time.monotonic() + 60  # nothing of it is left running, and the server serves on
    while server.metric("vllm:num_requests_running") + server.metric("vllm:num_requests_waiting") > 0:
        assert time.monotonic() < deadline, "the failed request was left in the engine"
        time.sleep(0.1)
    ok = httpx.post(f"{server.url}/v1/chat/completions", headers=HEADERS, timeout=120,
                    json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("options", [{"include_usage": True}, {"continuous_usage_stats": False}])
def test_stream_options_without_a_stream_is_a_400(server, path, options):
    # Accepted and ignored before; vLLM refuses it (validate_stream_options: "Stream options can only be defined
    # when `stream=True`"), so a client learns that it asked for usage chunks it will not get.
    prompt = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    for stream in (False, None):
        body = {"model": "tiny", **prompt, "max_tokens": 2, "stream_options": options}
        if stream is not None:
            body["stream"] = stream
        response = httpx.post(f"{server.url}{path}", json=body, headers=HEADERS, timeout=120)
        assert_openai_400(response, "stream_options")
        assert "stream=True" in response.json()["error"]["message"]
    # As vLLM's check (a truthy value): null and {} stay accepted without a stream, and with one it is served.
    for extra in ({"stream_options": None}, {"stream_options": {}}):
        response = httpx.post(f"{server.url}{path}", json={"model": "tiny", **prompt, "max_tokens": 2, **extra},
                              headers=HEADERS, timeout=120)
        assert response.status_code == 200, response.text
    response = httpx.post(f"{server.url}{path}", headers=HEADERS, timeout=120,
                          json={"model": "tiny", **prompt, "max_tokens": 2, "stream": True, "stream_options": options})
    assert response.status_code == 200 and response.text.rstrip().endswith("data: [DONE]"), response.text


def test_prompt_logprobs_on_a_completions_stream_is_a_400(server):
    # The stream's chunks carry no prompt_logprobs, so they were computed and dropped; vLLM refuses the pair
    # ("`prompt_logprobs` are not available when `stream=True`."), 0 excepted (no alternatives asked for).
    body = {"model": "tiny", "prompt": "Hi there", "max_tokens": 2, "stream": True, "prompt_logprobs": 1}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=120)
    assert_openai_400(response, "prompt_logprobs")
    assert "stream=True" in response.json()["error"]["message"]
    for value in (0, None):
        response = httpx.post(f"{server.url}/v1/completions", json={**body, "prompt_logprobs": value},
                              headers=HEADERS, timeout=120)
        assert response.status_code == 200 and response.text.rstrip().endswith("data: [DONE]"), response.text


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_body_sent_as_another_media_type_is_a_400_that_says_so(server, content_type, path):
    """A JSON body sent without the JSON Content-Type (curl's -d sends a form's) was not read, and the 400 said only
    "Input should be a valid dictionary". vLLM's words name the media type; the same body as JSON is served."""
    body = (b'{"prompt": "Hi", "max_tokens": 2}' if path != "/v1/chat/completions"
            else b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}')
    headers = {"Authorization": HEADERS["Authorization"], **({"Content-Type": content_type} if content_type else {})}
    response = httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=120)
    assert_openai_400(response)
    assert "Only 'application/json' is allowed" in response.json()["error"]["message"]
    assert (content_type or "missing") in response.json()["error"]["message"]
    for fine in ("application/json", "application/json; charset=utf-8", "application/vnd.api+json"):
        response = httpx.post(f"{server.url}{path}", content=body, timeout=120,
                              headers={"Authorization": HEADERS["Authorization"], "Content-Type": fine})
        assert response.status_code == 200, response.text


def test_a_body_that_is_not_json_is_a_400_without_a_param(server):
    # FastAPI's location of a JSON syntax error is a character position: it came back as param "11" and the message
    # "invalid request: 11: JSON decode error". vLLM's param is null there.
    response = raw_post(server, "/v1/completions", '{"prompt": ')
    assert_openai_400(response)
    error = response.json()["error"]
    assert error["param"] is None and "not valid JSON" in error["message"] and "character 11" in error["message"]


@pytest.mark.parametrize("choice", [{"type": "function", "function": 5}, {"type": "function", "function": "f"},
                                    {"type": "function"}, {"type": "tool"}])
@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_that_is_not_shaped_as_one_is_a_400(server, choice, stream):
    # {"function": 5} was read as a dict: an AttributeError, a plain-text 500 (found by fuzzing the real server)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": stream,
            "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": choice}
    response = raw_post(server, "/v1/chat/completions", json.dumps(body))
    assert_openai_400(response, "tool_choice")
    assert "function" in response.json()["error"]["message"]


TOOL_WITH = '[{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "number", "default": VALUE}}}}]'  # noqa: E501


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
@pytest.mark.parametrize(("path", "raw"), [
    # A Responses reply echoes its tools: json.dumps refused the float on the way out, a plain-text 500 (the stream
    # wrote `Infinity` into its events, text no standard JSON parser reads).
    ("/v1/responses", '{"input": "Hi", "max_output_tokens": 2, "tool_choice": "none", "tools": ' + TOOL_WITH + '}'),
    ("/v1/responses", '{"input": "Hi", "max_output_tokens": 2, "tool_choice": "none", "stream": true, "tools": '
     + TOOL_WITH + '}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, '
     '"chat_template_kwargs": {"x": VALUE}}'),
    ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "vllm_xargs": {"x": VALUE}}'),
])
def test_nan_or_infinity_anywhere_in_a_body_is_a_400_naming_it(server, path, raw, literal):
    # Python's json.loads reads NaN and Infinity, which JSON (RFC 8259) does not have, and reads 1e999 as infinity;
    # the sampling fields refused them (non-finite), but in free-form fields they were kept and came back in replies
    # (found by fuzzing the real server). The body is refused.
    response = raw_post(server, path, raw.replace("VALUE", literal))
    assert_openai_400(response)
    assert literal.lstrip("-") in response.json()["error"]["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize(("path", "raw"), [
    ("/v1/completions", '{"prompt": "Hi", "max_tokens": VALUE}'),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "metadata": {"x": VALUE}}'),
    ("/v1/responses", '{"input": "Hi", "max_output_tokens": 2, "tool_choice": "none", "tools": ' + TOOL_WITH + '}'),
])
def test_an_integer_of_more_digits_than_python_reads_is_a_400_that_says_why(server, path, raw):
    # Python's int() refuses a decimal text of more than 4,300 digits (sys.get_int_max_str_digits); json.loads raised
    # a ValueError that the body parser answered "There was an error parsing the body", no reason given (found by
    # fuzzing the real server)
    response = raw_post(server, path, raw.replace("VALUE", "1" * 5000))
    assert_openai_400(response)
    message = response.json()["error"]["message"]
    assert "5000 digits" in message and "4300" in message, message
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize("where", ['{"type": "integer", "minimum": HUGE}', '{"type": "string", "default": HUGE}',
                                   '{"enum": [1, HUGE]}'])
def test_a_schema_number_past_a_doubles_range_is_a_400_that_says_why(server, where):
    # xgrammar's JSON reader raises RuntimeError('') on such an integer anywhere in a schema: the 400 said
    # "invalid json constraint for structured output: " and nothing more (found by fuzzing the real server)
    schema = where.replace("HUGE", "1" + "0" * 309)
    raw = ('{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "response_format": '
           '{"type": "json_schema", "json_schema": {"name": "x", "schema": ' + schema + '}}}')
    response = raw_post(server, "/v1/chat/completions", raw)
    assert_openai_400(response, "structured_outputs")
    reason = response.json()["error"]["message"].partition("structured output:")[2]
    assert "range" in reason, response.text


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 2}),
])
@pytest.mark.parametrize("suffix", ["the end", ""])
def test_a_suffix_where_the_endpoint_has_none_is_a_400_not_ignored(server, path, body, suffix):
    """`suffix` (the completions API's insertion point, refused there too) was ignored on chat and Responses: a 200
    whose text did not lead up to it. A null suffix, what some clients send for none, is still served."""
    assert_openai_400(httpx.post(f"{server.url}{path}", json={**body, "suffix": suffix}, headers=HEADERS,
                                 timeout=120), "suffix")
    served = httpx.post(f"{server.url}{path}", json={**body, "suffix": None}, headers=HEADERS, timeout=120)
    assert served.status_code == 200, served.text


def test_an_empty_previous_response_id_is_a_400(client, server):
    """`previous_response_id: ""` names no response: it was taken as absent (a new conversation, and the reply echoed
    the empty id), where OpenAI refuses an empty string and vLLM answers 404."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input="Hi", max_output_tokens=2, previous_response_id="")
    assert refused.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="Hi", max_output_tokens=2, previous_response_id="resp_nope",
                                stream=True)
    assert server.metric("vllm:num_requests_running") == 0
