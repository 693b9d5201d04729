"""schemathesis over the server's own /openapi.json (valid and invalid data for every operation): no
input is a 5xx, every refusal is OpenAI's error JSON, and the server stays healthy.

Bounded for CI: a few examples per operation and mode (derandomized, so a run is repeatable) and
generation lengths capped (also where a body leaves them out), so the run takes about a minute on two
cores and each request stays far from its 120 s under load."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.modes import GenerationMode

from .conftest import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
EXAMPLES = 25  # per operation and mode
LIMITS = {"max_tokens": 8, "max_completion_tokens": 8, "max_output_tokens": 8, "min_tokens": 8, "n": 4}
# A generating route's body without a length generates to the end of the context (256 tokens): at
# load 11 one such completion of three prompts took 35 s and the round 9 minutes, against a fixed 120 s
# per request. Such a body gets its route's length field.
LENGTHS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
LENGTH_FIELD = {"/v1/completions": "max_tokens", "/v1/chat/completions": "max_tokens",
                "/v1/responses": "max_output_tokens"}


def _bounded(path: str, body: object) -> object:
    """Keep valid bodies quick: cap the lengths and counts that only cost time, and give a generating
    route's body a length when it has none."""
    if isinstance(body, dict):
        if path in LENGTH_FIELD and not any(_is_int(body.get(k)) for k in LENGTHS):
            body[LENGTH_FIELD[path]] = LIMITS["max_tokens"]
        for key, limit in LIMITS.items():
            if _is_int(body.get(key)) and body[key] > limit:
                body[key] = limit
    return body


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_generated_request_is_a_5xx(server, mode):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/tokenize"}
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and not list(operation.body):
            continue  # nothing to make invalid in a GET without parameters

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case) -> None:
            if isinstance(case.body, dict):
                case.body = _bounded(case.path, case.body)
            response = case.call(headers=HEADERS, timeout=120)
            assert response.status_code < 500, (case.method, case.path, case.body, response.status_code,
                                                response.text[:500])
            if response.status_code >= 400:
                assert response.json()["error"]["message"], response.text[:300]

        check()


def test_server_is_healthy_and_serving_after_the_fuzz(server):
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 3},
                          headers=HEADERS, timeout=60)
    assert response.status_code == 200, response.text
    assert server.process.poll() is None
