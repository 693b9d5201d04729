"""The real `openai` client against the real server: the API surface behaves as vLLM's."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}

PROMPT = "Once upon a time in a harbour far away"


def test_models_lists_every_served_name(client, tiny_model_dirs):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny", "tiny-alias"]
    # as vLLM's model cards: `root` is the model as given on the command line (each served name's), no parent
    assert {m.root for m in models} == {str(tiny_model_dirs["llama"])}
    assert all(m.parent is None and m.max_model_len == 256 for m in models)
    assert client.models.retrieve("tiny-alias").root == str(tiny_model_dirs["llama"])


def test_completion_and_its_stream_agree(client):
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    full = client.completions.create(**kwargs)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12 and full.usage.prompt_tokens > 5
    assert full.usage.total_tokens == full.usage.prompt_tokens + 12
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices


def test_chat_applies_the_template_and_streams(client, server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a ship."}]
    full = client.chat.completions.create(model="tiny-alias", messages=messages, max_tokens=10, temperature=0)
    templated = httpx.post(f"{server.url}/tokenize", json={"messages": messages}, headers=AUTH).json()
    assert full.usage.prompt_tokens == templated["count"]
    assert full.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_template_matches_the_tokenizer(server, tiny_model_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    messages = [{"role": "user", "content": "Hello"}]
    expected = tok.encode(
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    assert httpx.post(f"{server.url}/tokenize", json={"messages": messages}, headers=AUTH).json()["tokens"] == expected


def test_n_choices_stop_and_seed(client):
    many = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=11)
    assert sorted(c.index for c in many.choices) == [0, 1, 2]
    again = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=11)
    assert [c.text for c in many.choices] == [c.text for c in again.choices]
    other = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=12)
    assert [c.text for c in many.choices] != [c.text for c in other.choices]
    base = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    stop = base[len(base) // 2 : len(base) // 2 + 3]
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].text == base[: base.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs_in_both_apis(client):
    comp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(
        len(top) >= 3 and max(top.values()) == pytest.approx(t)
        for top, t in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.logprob == pytest.approx(c.top_logprobs[0].logprob) for c in content)


def test_vllm_extra_sampling_fields(client):
    out = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=5,
        temperature=0.7,
        seed=1,
        extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2, "ignore_eos": True},
    )
    assert out.usage.completion_tokens == 5


def test_tokenize_and_detokenize_round_trip(server):
    tokens = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, headers=AUTH).json()["tokens"]
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": tokens}, headers=AUTH).json()["prompt"]
    assert text.endswith(PROMPT)


def test_health_and_version(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/version").json()["version"]


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body["error"]) >= {"message", "type", "code"}
    return body["error"]


def test_api_key_is_required_on_v1_routes(server):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 1}
    assert _error(httpx.post(f"{server.url}/v1/completions", json=body))["type"] == "AuthenticationError"
    wrong = httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="bad", max_retries=0).models.list()


def test_api_key_is_required_on_every_path_but_the_public_probes(server):
    # As vLLM (PUBLIC_ENDPOINTS): /tokenize and /detokenize were open, so a client without the key could make the
    # server parse and tokenize bodies up to the body limit.
    key = {"Authorization": f"Bearer {API_KEY}"}
    for path, body in (("/tokenize", {"prompt": PROMPT}), ("/detokenize", {"tokens": [1, 2]})):
        refused = httpx.post(f"{server.url}{path}", json=body)
        assert refused.status_code == 401 and _error(refused)["type"] == "AuthenticationError", (path, refused.text)
        assert httpx.post(f"{server.url}{path}", json=body, headers=key).status_code == 200
    for path in ("/health", "/ping", "/load", "/version", "/metrics", "/openapi.json"):
        assert httpx.get(f"{server.url}{path}").status_code == 200, path
    assert httpx.get(f"{server.url}/load").json() == {"server_load": 0}  # vLLM's: 0 without load tracking
    assert httpx.post(f"{server.url}/ping").status_code == 200  # vLLM's SageMaker probe, GET or POST
    assert httpx.get(f"{server.url}/healthz").status_code == 401  # public on segment boundaries only


def test_browsers_may_call_from_other_origins_as_vllm_allows_by_default(server):
    # vLLM answers CORS (--allowed-origins, default any; a preflight needs no key); here a browser's preflight got a
    # 401 and no response carried Access-Control-Allow-Origin, so web UIs on another origin could not call the server.
    origin = {"Origin": "https://chat.example"}
    preflight = httpx.options(f"{server.url}/v1/chat/completions", headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] in ("*", "https://chat.example")
    assert "POST" in preflight.headers["access-control-allow-methods"]
    models = httpx.get(f"{server.url}/v1/models", headers={**origin, **AUTH})
    assert models.status_code == 200 and models.headers["access-control-allow-origin"] == "*"
    assert httpx.get(f"{server.url}/v1/models", headers=origin).status_code == 401  # the key still applies


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"model": "nope", "prompt": "x"}, 404, "The model `nope` does not exist"),
        ({"model": "tiny", "prompt": "x", "temperature": -1}, 400, "temperature"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "tiny", "prompt": "x", "n": "many"}, 400, "n:"),
        ({"model": "tiny", "prompt": "word " * 400}, 400, "maximum context length is 256 tokens"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 1000}, 400, "is too large: 1000"),
        ({"model": "tiny"}, 400, "prompt: Field required"),
        ({"model": "tiny", "prompt": [10**9]}, 400, "outside the vocabulary"),
        ({"model": "tiny", "prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias keys must be token ids"),
        ({"model": "tiny", "prompt": "x", "stop": [""]}, 400, "stop strings must not be empty"),
        ({"model": "tiny", "prompt": []}, 400, "prompt must not be empty"),
        ({"model": "tiny", "prompt": "x", "suffix": "y"}, 400, "suffix and best_of are not supported"),
        ({"model": "tiny", "prompt": "x", "best_of": 3}, 400, "best_of=3 must be left out or equal n=1"),
    ],
)
def test_bad_requests_get_openai_errors(server, body, status, fragment):
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == status
    assert fragment in _error(response)["message"]
    if "best_of" in body:  # the field at fault, not `suffix`
        assert _error(response)["param"] == "best_of"
    if "stop" in body:  # was null: the check ran across fields
        assert _error(response)["param"] == "stop"


def test_malformed_json_and_unsupported_features_are_400(server):
    headers = {"Authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    bad = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", headers=headers)
    assert bad.status_code == 400 and "JSON" in _error(bad)["message"]
    tools = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers=headers,
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
    )
    # tool_choice defaults to "auto", which this server (started without a tool-call parser) cannot honour.
    message = _error(tools)["message"]
    assert tools.status_code == 400 and "--enable-auto-tool-choice" in message and "--tool-call-parser" in message
