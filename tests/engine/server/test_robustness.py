"""No client mistake is a 500 or a crash: random bodies against the real server."""

from __future__ import annotations

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import API_KEY

FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop",
          "seed", "logprobs", "top_logprobs", "logit_bias", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "stream", "stream_options", "max_completion_tokens", "ignore_eos", "min_tokens",
          "stop_token_ids", "response_format"]
SCALARS = st.none() | st.booleans() | st.integers(-5, 300) | st.floats(-3, 3, allow_nan=False) | st.text(max_size=8)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                          max_size=3), max_leaves=6)
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "bogus"]),
                                           "content": st.text(max_size=20)}), max_size=3)
BODIES = st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6).flatmap(
    lambda d: st.fixed_dictionaries({"messages": MESSAGES, "prompt": st.text(max_size=20)}).map(
        lambda extra: {**extra, **d}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES, chat=st.booleans())
def test_random_bodies_never_500(server, body, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    for key in ("max_tokens", "max_completion_tokens", "min_tokens"):
        if isinstance(body.get(key), int) and body[key] > 8:
            body[key] = 8  # keep the valid ones quick
    body.setdefault("max_tokens", 4)
    response = httpx.post(f"{server.url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                          timeout=120)
    assert response.status_code in (200, 400, 404), (response.status_code, response.text[:300], body)
    if response.status_code != 200:
        assert "message" in response.json()["error"]
    assert httpx.get(f"{server.url}/health").status_code == 200
