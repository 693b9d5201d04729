"""POST /invocations (SageMaker's route) against real servers: each body answered by the route its keys choose, as
vLLM's dispatch by request type, on a generate server and on a pooling one."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from flotilla.engine.server.invocations import invocation_target

from .conftest import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"messages": [{"role": "user", "content": "Name a harbour."}], "max_tokens": 4, "temperature": 0}


def post(server, path: str, body, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=headers or HEADERS, timeout=120)


def test_a_chat_body_is_a_chat_completion_and_a_prompt_body_a_completion(server):
    for body, path, kind in ((CHAT, "/v1/chat/completions", "chat.completion"),
                             ({"prompt": "The harbour", "max_tokens": 4, "temperature": 0}, "/v1/completions",
                              "text_completion")):
        invoked, direct = post(server, "/invocations", body), post(server, path, body)
        assert invoked.status_code == 200 and direct.status_code == 200, (invoked.text, direct.text)
        assert invoked.json()["object"] == kind
        assert invoked.json()["choices"] == direct.json()["choices"]  # greedy: the same tokens
        assert invoked.json()["usage"] == direct.json()["usage"]


def test_a_streamed_chat_body_streams(server):
    with httpx.stream("POST", f"{server.url}/invocations", json={**CHAT, "stream": True}, headers=HEADERS,
                      timeout=120) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 2


@pytest.mark.parametrize(("body", "words"), [
    ({"input": "x"}, "a chat body (messages) or a completions body (prompt)"),  # an embeddings body: not served here
    ({}, "found no route"),
    ([1, 2], "dictionary"),  # not a JSON object
])
def test_a_body_of_no_served_shape_is_a_400_naming_the_shapes(server, body, words):
    answer = post(server, "/invocations", body)
    assert answer.status_code == 400 and words in answer.json()["error"]["message"], answer.text


def test_the_chosen_route_names_a_bad_field(server):
    # vLLM would try the next type and end in "cannot find a handler"; here the chat route names the field.
    answer = post(server, "/invocations", {**CHAT, "temperature": "hot"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "temperature", answer.text


def test_the_api_key_guards_invocations(server):
    assert httpx.post(f"{server.url}/invocations", json=CHAT, timeout=60).status_code == 401


@pytest.mark.parametrize("which", ["server", "pooling_server"])
def test_the_schema_lists_invocations_as_vllms(request, which):
    # vLLM's /openapi.json lists it (a FastAPI route there) as operation invocations_invocations_post, no request
    # body; it was missing here (a Starlette route). --disable-fastapi-docs still serves no schema (test_api_key).
    live = request.getfixturevalue(which)
    schema = httpx.get(f"{live.url}/openapi.json", timeout=60).json()
    operation = schema["paths"]["/invocations"]["post"]
    assert operation["operationId"] == "invocations_invocations_post" and operation["summary"] == "Invocations"
    assert "requestBody" not in operation and set(operation["responses"]) == {"200", "400"}
    assert list(schema["paths"]["/invocations"]) == ["post"]
    assert "/v1/chat/completions" in schema["paths"]  # the app's own routes still listed beside it
    assert post(live, "/invocations", {}).status_code == 400  # the schema's route answers, never the description


def test_pooling_bodies_go_to_embeddings_rerank_and_score(pooling_server):
    texts = ["The harbour master counts the boats.", "lanterns"]
    embedded = post(pooling_server, "/invocations", {"input": texts, "encoding_format": "float"})
    direct = post(pooling_server, "/v1/embeddings", {"input": texts, "encoding_format": "float"})
    assert embedded.status_code == 200, embedded.text
    np.testing.assert_allclose([d["embedding"] for d in embedded.json()["data"]],
                               [d["embedding"] for d in direct.json()["data"]], atol=1e-6)
    scored = post(pooling_server, "/invocations", {"text_1": "boats", "text_2": texts})
    assert scored.status_code == 200, scored.text
    scores = [d["score"] for d in scored.json()["data"]]
    ranked = post(pooling_server, "/invocations", {"query": "boats", "documents": texts, "top_n": 1})
    assert ranked.status_code == 200, ranked.text
    (best,) = ranked.json()["results"]
    assert best["index"] == int(np.argmax(scores))
    assert best["relevance_score"] == pytest.approx(max(scores), abs=1e-6)
    conversation = post(pooling_server, "/invocations", {"messages": [{"role": "user", "content": "hi"}]})
    assert conversation.status_code == 200 and conversation.json()["data"][0]["object"] == "embedding"


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"text_1": "a"}, "text_1", "give text_1 and text_2"),  # one side: /score says what to send
    ({"prompt": "x"}, None, "an embeddings body (input or messages)"),  # a completions body on a pooling server
])
def test_pooling_server_refusals(pooling_server, body, param, words):
    answer = post(pooling_server, "/invocations", body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param and words in answer.json()["error"]["message"], answer.text


def test_the_keys_choose_as_vllms_order_of_types():
    # vLLM tries chat before completions, and embeddings, rerank, score in that order; each needs the keys below.
    assert invocation_target(["messages", "prompt"], "generate") == "/v1/chat/completions"
    assert invocation_target(["prompt", "max_tokens"], "generate") == "/v1/completions"
    assert invocation_target(["text_1", "text_2"], "generate") is None  # no scoring on a generate server
    assert invocation_target(["query", "documents", "input"], "embed") == "/v1/embeddings"
    assert invocation_target(["query", "documents"], "embed") == "/rerank"
    assert invocation_target(["queries", "documents"], "embed") == "/score"  # rerank takes one `query`
    assert invocation_target(["data_1", "data_2", "top_n"], "embed") == "/score"
    assert invocation_target(["prompt"], "embed") is None
    # on a classifier vLLM's order is classify, rerank, score: the same keys, /classify in place of embeddings
    assert invocation_target(["query", "documents", "input"], "classify") == "/classify"
    assert invocation_target(["messages"], "classify") == "/classify"
    assert invocation_target(["query", "documents"], "classify") == "/rerank"
    assert invocation_target(["text_1", "text_2"], "classify") == "/score"
