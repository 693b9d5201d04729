"""/score, /v1/score, /rerank, /v1/rerank and /v2/rerank (vLLM's bi-encoder scoring) against a real
`flotilla serve --runner pooling`: scores are the cosine similarity of the texts' /v1/embeddings vectors and of HF's."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from flotilla.engine.server.score import MAX_SCORE_TEXTS, RERANK_PATHS, SCORE_PATHS

from .conftest import API_KEY, prefix_cache_hits_of

openai = pytest.importorskip("openai")

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
QUERY = "Where do the boats sleep?"
DOCUMENTS = ["The harbour master counts the boats.", "lanterns", "Ein Schiff wird kommen", "boats sleep in the harbour"]


@pytest.fixture(scope="module")
def hf(tiny_model_dirs):
    from transformers import AutoModel, AutoTokenizer

    path = tiny_model_dirs["qwen3"]
    return AutoModel.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def hf_embedding(hf, text_or_ids: str | list[int]) -> np.ndarray:
    model, tokenizer = hf
    ids = tokenizer.encode(text_or_ids) if isinstance(text_or_ids, str) else text_or_ids
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1).numpy()


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": "tiny", **body}, headers=headers or HEADERS, timeout=120)


def embeddings(server, texts: list[str]) -> list[list[float]]:
    answer = post(server, "/v1/embeddings", {"input": texts, "encoding_format": "float"})
    assert answer.status_code == 200, answer.text
    return [d["embedding"] for d in answer.json()["data"]]


def vllm_usage(hf, first: list[str], second: list[str]) -> int:
    """vLLM's usage of a bi-encoder score or rerank: each pair's tokens (1 to N: the first text in every pair) with
    one more between the two, the tokenizer's pad token that vLLM's pair output joins them with."""
    tokenizer = hf[1]
    assert tokenizer.pad_token_id is not None  # the tiny Qwen3 has one (<|endoftext|>): the + 1 is visible
    firsts = first * len(second) if len(first) == 1 else first
    return sum(len(tokenizer.encode(a)) + 1 + len(tokenizer.encode(b)) for a, b in zip(firsts, second, strict=True))


def scores_of(answer: httpx.Response) -> list[float]:
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    assert all(d["object"] == "score" for d in data)
    return [d["score"] for d in data]


@pytest.mark.parametrize("path", SCORE_PATHS)
def test_one_to_n_scores_are_the_cosine_of_the_embeddings_and_of_hf(pooling_server, hf, path):
    answer = post(pooling_server, path, {"text_1": QUERY, "text_2": DOCUMENTS})
    scores = scores_of(answer)
    query, *docs = embeddings(pooling_server, [QUERY, *DOCUMENTS])
    np.testing.assert_allclose(scores, [cosine(query, d) for d in docs], atol=1e-5)
    np.testing.assert_allclose(scores, [cosine(hf_embedding(hf, QUERY), hf_embedding(hf, d)) for d in DOCUMENTS],
                               atol=1e-4)
    body = answer.json()
    assert body["object"] == "list" and body["model"] == "tiny" and body["id"].startswith("score-")
    assert body["usage"] == {"prompt_tokens": vllm_usage(hf, [QUERY], DOCUMENTS), "total_tokens":
                             vllm_usage(hf, [QUERY], DOCUMENTS), "completion_tokens": 0}
    assert len(set(scores)) == len(scores)  # distinct texts, distinct scores: the pairing is visible


def test_one_to_one_and_n_to_n_pair_as_vllm(pooling_server, hf):
    vectors = dict(zip([QUERY, *DOCUMENTS], embeddings(pooling_server, [QUERY, *DOCUMENTS]), strict=True))
    one = scores_of(post(pooling_server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[0]}))
    np.testing.assert_allclose(one, [cosine(vectors[QUERY], vectors[DOCUMENTS[0]])], atol=1e-5)
    listed = scores_of(post(pooling_server, "/score", {"text_1": [QUERY], "text_2": DOCUMENTS}))
    np.testing.assert_allclose(listed, [cosine(vectors[QUERY], vectors[d]) for d in DOCUMENTS], atol=1e-5)
    firsts, seconds = DOCUMENTS[:2], DOCUMENTS[2:]  # N to N: index by index
    n_to_n = post(pooling_server, "/score", {"text_1": firsts, "text_2": seconds})
    pairs = scores_of(n_to_n)
    assert n_to_n.json()["usage"]["prompt_tokens"] == vllm_usage(hf, firsts, seconds)
    np.testing.assert_allclose(pairs, [cosine(vectors[a], vectors[b]) for a, b in zip(firsts, seconds, strict=True)],
                               atol=1e-5)
    # The same text on both sides scores 1.
    np.testing.assert_allclose(scores_of(post(pooling_server, "/score", {"text_1": QUERY, "text_2": QUERY})), [1.0],
                               atol=1e-5)


@pytest.mark.parametrize(("first", "second"), [("queries", "documents"), ("queries", "items"), ("data_1", "data_2")])
def test_vllms_other_spellings_of_the_two_sides_score_alike(pooling_server, first, second):
    expected = scores_of(post(pooling_server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS}))
    np.testing.assert_allclose(scores_of(post(pooling_server, "/score", {first: QUERY, second: DOCUMENTS})), expected,
                               atol=1e-6)


def test_the_openai_client_reaches_v1_score_and_v1_rerank(pooling_server):
    # The SDK's generic post: how a client of the OpenAI SDK calls vLLM's extra routes under its base URL.
    client = openai.OpenAI(base_url=f"{pooling_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    scored = client.post("/score", body={"model": "tiny", "text_1": QUERY, "text_2": DOCUMENTS}, cast_to=object)
    ranked = client.post("/rerank", body={"model": "tiny", "query": QUERY, "documents": DOCUMENTS}, cast_to=object)
    by_index = {r["index"]: r["relevance_score"] for r in ranked["results"]}
    np.testing.assert_allclose([by_index[i] for i in range(len(DOCUMENTS))], [d["score"] for d in scored["data"]],
                               atol=1e-6)
    with pytest.raises(openai.BadRequestError, match="1 to 1, 1 to N or N to N"):
        client.post("/score", body={"model": "tiny", "text_1": DOCUMENTS[:2], "text_2": DOCUMENTS}, cast_to=object)


@pytest.mark.parametrize("path", RERANK_PATHS)
def test_rerank_sorts_the_documents_by_their_scores(pooling_server, hf, path):
    scores = scores_of(post(pooling_server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS}))
    answer = post(pooling_server, path, {"query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    order = sorted(range(len(DOCUMENTS)), key=lambda i: scores[i], reverse=True)
    assert [r["index"] for r in body["results"]] == order
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], [scores[i] for i in order], atol=1e-6)
    assert [r["document"] for r in body["results"]] == [{"text": DOCUMENTS[i]} for i in order]
    assert body["model"] == "tiny" and body["id"].startswith("rerank-")  # vLLM names rerank replies rerank-
    assert body["usage"] == {"prompt_tokens": vllm_usage(hf, [QUERY], DOCUMENTS),
                             "total_tokens": vllm_usage(hf, [QUERY], DOCUMENTS)}  # vLLM's, the query in each pair


def test_rerank_top_n_and_return_documents(pooling_server):
    full = post(pooling_server, "/rerank", {"query": QUERY, "documents": DOCUMENTS}).json()["results"]
    top = post(pooling_server, "/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 2}).json()["results"]
    assert [r["index"] for r in top] == [r["index"] for r in full[:2]]
    many = post(pooling_server, "/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 99}).json()["results"]
    assert [r["index"] for r in many] == [r["index"] for r in full]
    for every in (0, -1, -5):  # vLLM's: 0 or below returns every document (it was a 400 here)
        answer = post(pooling_server, "/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": every})
        assert answer.status_code == 200, answer.text
        assert [r["index"] for r in answer.json()["results"]] == [r["index"] for r in full]
    bare = post(pooling_server, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS, "return_documents": False})
    assert bare.status_code == 200, bare.text
    assert [set(r) for r in bare.json()["results"]] == [{"index", "relevance_score"}] * len(DOCUMENTS)


def test_truncate_prompt_tokens_scores_the_kept_tokens(pooling_server, hf):
    ids = [hf[1].encode(t) for t in (QUERY, DOCUMENTS[0])]
    answer = post(pooling_server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[0], "truncate_prompt_tokens": 3})
    expected = cosine(hf_embedding(hf, ids[0][-3:]), hf_embedding(hf, ids[1][-3:]))
    np.testing.assert_allclose(scores_of(answer), [expected], atol=1e-4)
    assert answer.json()["usage"]["prompt_tokens"] == 3 + 1 + 3  # the kept tokens and vLLM's pad between


def test_request_id_names_the_response_and_the_header_wins(pooling_server):
    named = post(pooling_server, "/score", {"text_1": "a", "text_2": "b", "request_id": "batch-7"})
    assert named.json()["id"] == "score-batch-7"
    header = post(pooling_server, "/rerank", {"query": "a", "documents": ["b"], "request_id": "x"},
                  headers={**HEADERS, "X-Request-Id": "from-header"})
    assert header.json()["id"] == "rerank-from-header"


def test_a_repeated_score_hits_the_prefix_cache_as_embeddings_do(pooling_server):
    # The texts are embedded by the embeddings' pooling pass, so its metrics count them as they count embeddings.
    text = " ".join(["harbour"] * 40)  # several full 8-token blocks
    send = lambda: post(pooling_server, "/score", {"text_1": text, "text_2": "lanterns at dawn"})  # noqa: E731
    prefix_cache_hits_of(pooling_server, send)
    assert prefix_cache_hits_of(pooling_server, send) > 0


TOO_LONG = "harbour " * 300  # past the server's 256-token context


@pytest.mark.parametrize(("path", "body", "param", "words"), [
    ("/score", {"text_1": [], "text_2": ["a"]}, "text_1", "must not be empty"),
    ("/score", {"text_1": "a", "text_2": []}, "text_2", "must not be empty"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2", "1 to 1, 1 to N or N to N"),
    ("/score", {"text_1": ["a", "b"], "text_2": "c"}, "text_2", "1 to 1, 1 to N or N to N"),  # N to 1: as vLLM
    ("/score", {"text_1": "a", "text_2": ["b"] * MAX_SCORE_TEXTS}, "text_2", f"at most {MAX_SCORE_TEXTS}"),
    ("/score", {"text_1": "a", "text_2": ["b", TOO_LONG]}, "text_2", "text_2 1 has"),
    ("/score", {"text_1": TOO_LONG, "text_2": "b"}, "text_1", "text_1 0 has"),
    ("/score", {"text_1": "a", "text_2": ["b", ""]}, "text_2", "text_2 1 is empty"),
    ("/score", {"text_1": "a"}, "text_1", "give text_1 and text_2"),
    ("/score", {}, "text_1", "got none"),
    ("/score", {"text_1": "a", "documents": ["b"]}, "text_1", "one pair of them"),  # two spellings mixed
    ("/score", {"text_1": "a", "text_2": "b", "queries": "a", "documents": "b"}, "text_1", "one pair of them"),
    ("/score", {"text_1": "a", "text_2": [{"content": [{"type": "image_url"}]}]}, "text_2", "string"),  # multimodal
    ("/score", {"text_1": "a", "text_2": [5, 6]}, "text_2", "string"),
    ("/score", {"text_1": "a", "text_2": "b", "priority": 1}, "priority", "priority"),
    ("/score", {"text_1": "a", "text_2": "b", "mm_processor_kwargs": {"x": 1}}, "mm_processor_kwargs", "text only"),
    ("/score", {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", ""),
    ("/score", {"text_1": "a", "text_2": "b", "cache_salt": ""}, "cache_salt", ""),
    ("/rerank", {"query": "a", "documents": []}, "documents", "must not be empty"),
    ("/rerank", {"query": "", "documents": ["b"]}, "query", "query 0 is empty"),
    ("/rerank", {"query": ["a"], "documents": ["b"]}, "query", "string"),
    ("/rerank", {"documents": ["b"]}, "query", ""),
    ("/rerank", {"query": "a", "documents": "b"}, "documents", "list"),
    ("/rerank", {"query": "a", "documents": ["b"], "top_n": 1.5}, "top_n", ""),
    ("/v2/rerank", {"query": "a", "documents": ["b"] * MAX_SCORE_TEXTS}, "documents", f"at most {MAX_SCORE_TEXTS}"),
])
def test_bad_requests_get_openai_error_json(pooling_server, path, body, param, words):
    answer = post(pooling_server, path, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "BadRequestError" and error["param"] == param, error
    assert words in error["message"], error
    assert post(pooling_server, "/score", {"text_1": "ok", "text_2": "ok"}).status_code == 200


@pytest.mark.parametrize("path", SCORE_PATHS + RERANK_PATHS)
def test_a_generate_server_answers_404_as_vllm_which_does_not_serve_them(server, path):
    # vLLM registers these routes only for pooling models; the message here says how to start one. The texts are
    # not read: a bad one is not named, the runner is.
    body = {"text_1": "a", "text_2": [""]} if path in SCORE_PATHS else {"query": "a", "documents": [""]}
    answer = post(server, path, body)
    assert answer.status_code == 404, answer.text
    assert "--runner pooling" in answer.json()["error"]["message"]


@pytest.mark.parametrize("path", SCORE_PATHS + RERANK_PATHS)
def test_the_api_key_guards_every_route(pooling_server, path):
    body = {"text_1": "a", "text_2": "b"} if path in SCORE_PATHS else {"query": "a", "documents": ["b"]}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = httpx.post(f"{pooling_server.url}{path}", json=body, headers=headers, timeout=60)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key", answer.text
    assert post(pooling_server, path, body).status_code == 200


def test_unknown_model_is_404(pooling_server):
    answer = post(pooling_server, "/score", {"model": "nope", "text_1": "a", "text_2": "b"})
    assert answer.status_code == 404 and answer.json()["error"]["param"] == "model"


# SIGTERM's drain of a rerank in flight, and its 503 for a new score: test_lifecycle.py, beside the embeddings'.
