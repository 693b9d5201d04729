"""Issue 17: the sampling fields at their extremes, in any combination, never take the engine down:
each request is served or refused with a 400, and /health and real requests keep working."""

from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
VOCAB = 49152  # the tiny models share the embedded model's tokenizer
EDGE_INTS = [-(2**70), -(2**63) - 1, -(2**63), -(2**31), -2, -1, 0, 1, 2, 20, 21, 128, 129, VOCAB - 1, VOCAB,
             2**31, 2**62, 4611686018427387904, 2**63 - 1, 2**63, 2**64, 2**70]
EDGE_FLOATS = [0.0, -0.0, 5e-324, 1e-50, 1e-30, 1e-6, 1e-5, 0.01, 0.5, 1.0, 2.0, 2.5, 100.0, 1e10, 1e38, 1e300,
               -1e-50, -1.0, -2.0, -100.0, -1e300]
INTS = st.sampled_from(EDGE_INTS) | st.integers(-(2**66), 2**66)
FLOATS = st.sampled_from(EDGE_FLOATS) | st.floats(allow_nan=False, allow_infinity=False)
TOKEN_IDS = st.lists(st.sampled_from([-1, 0, 1, 2, VOCAB - 1, VOCAB, 10**9, 2**63, 2**70]), max_size=3)
FIELDS = {
    "seed": INTS, "top_k": INTS, "n": INTS, "logprobs": INTS, "min_tokens": INTS, "max_tokens": INTS,
    "temperature": FLOATS, "top_p": FLOATS, "min_p": FLOATS, "repetition_penalty": FLOATS,
    "presence_penalty": FLOATS, "frequency_penalty": FLOATS,
    "stop_token_ids": TOKEN_IDS,
    "logit_bias": st.dictionaries(st.sampled_from(["0", "2", str(VOCAB), "-1", str(2**70), "x"]), FLOATS,
                                  max_size=2),
}
PROMPTS = st.just("Hello") | TOKEN_IDS.filter(bool) | st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4)
BODIES = st.fixed_dictionaries({"prompt": PROMPTS}, optional=FIELDS)


def _quick(body: dict) -> dict:
    """Cap what only costs time (valid long generations), leaving every edge that could break things."""
    for key, limit in (("max_tokens", 4), ("min_tokens", 4), ("n", 3)):
        value = body.get(key)
        if isinstance(value, int) and value > limit:
            body[key] = limit
    body.setdefault("max_tokens", 4)
    if body.get("min_tokens", 0) > body["max_tokens"] >= 1:
        body["min_tokens"] = body["max_tokens"]
    return body


def _no_nan(text: str) -> None:
    def refuse(constant: str) -> None:
        raise AssertionError(f"response carries {constant}: {text[:300]}")

    json.loads(text, parse_constant=refuse)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=BODIES, stream=st.booleans())
def test_extreme_sampling_fields_never_take_the_engine_down(server, body, stream):
    body = {**_quick(body), "stream": stream}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=120)
    assert response.status_code in (200, 400), (response.status_code, response.text[:300], body)
    if response.status_code == 400:
        assert response.json()["error"]["message"]
    elif stream:
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", response.text[-300:]
        for event in events[:-1]:
            _no_nan(event)
            assert "error" not in json.loads(event), (event, body)
    else:
        _no_nan(response.text)
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_engine_serves_after_the_sampling_fuzz(server):
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "seed": 7},
                          headers=HEADERS, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert server.process.poll() is None
