"""/pooling (vLLM's raw pooling route) against a real `flotilla serve --runner pooling`: /v1/embeddings' vectors in
vLLM's PoolingResponse envelope."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from .conftest import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
TEXTS = ["The harbour master counts the boats.", "lanterns"]


def post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": "tiny", **body}, headers=headers or HEADERS, timeout=120)


@pytest.mark.parametrize("given", [{"input": TEXTS}, {"input": TEXTS[0], "task": "embed"},
                                   {"messages": [{"role": "user", "content": TEXTS[0]}]},
                                   {"input": TEXTS, "normalize": False, "truncate_prompt_tokens": 3}])
def test_pooling_returns_the_embeddings_vectors_in_vllms_envelope(pooling_server, given):
    embedded = post(pooling_server, "/v1/embeddings", {**given, "encoding_format": "float"})
    pooled = post(pooling_server, "/pooling", {**given, "encoding_format": "float"})
    assert embedded.status_code == 200 and pooled.status_code == 200, (embedded.text, pooled.text)
    body = pooled.json()
    assert body["id"].startswith("pool-") and body["object"] == "list" and body["model"] == "tiny"
    assert [(d["index"], d["object"]) for d in body["data"]] == [(i, "pooling") for i in range(len(body["data"]))]
    expected = [d["embedding"] for d in embedded.json()["data"]]
    np.testing.assert_allclose([d["data"] for d in body["data"]], expected, atol=1e-6)
    assert body["usage"] == embedded.json()["usage"]


def test_base64_and_request_id_as_on_embeddings(pooling_server):
    floats = post(pooling_server, "/pooling", {"input": TEXTS[0], "encoding_format": "float"}).json()
    packed = post(pooling_server, "/pooling", {"input": TEXTS[0], "encoding_format": "base64", "request_id": "r-1"})
    assert packed.status_code == 200, packed.text
    assert packed.json()["id"] == "pool-r-1"
    decoded = np.frombuffer(base64.b64decode(packed.json()["data"][0]["data"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(floats["data"][0]["data"], dtype=np.float32))


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "task": "classify"}, "task"),  # vLLM's other pooling tasks: no such pooler here
    ({"input": "x", "task": "token_embed"}, "task"),
    ({"input": []}, "input"),
    ({"input": [[5] * 300]}, "input"),  # past the 256-token context
    ({"input": ["x"] * 2049}, "input"),  # the embeddings cap
    ({"input": "x", "dimensions": 8}, "dimensions"),
    ({}, "input"),
])
def test_bad_requests_get_openai_error_json(pooling_server, body, param):
    answer = post(pooling_server, "/pooling", body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text
    assert post(pooling_server, "/pooling", {"input": "ok"}).status_code == 200


def test_the_api_key_guards_pooling(pooling_server):
    answer = httpx.post(f"{pooling_server.url}/pooling", json={"input": "x"}, timeout=60)
    assert answer.status_code == 401, answer.text


def test_a_generate_server_answers_404_as_vllm(server):
    # vLLM registers /pooling only for pooling models; the input is not read (the empty text is not named).
    answer = post(server, "/pooling", {"input": [""]})
    assert answer.status_code == 404 and "--runner pooling" in answer.json()["error"]["message"], answer.text
