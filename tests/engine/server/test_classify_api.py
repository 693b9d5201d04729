"""A classifier on the pooling runner behind a real `flotilla serve`: /classify (vLLM's classification route),
cross-encoder /score and /rerank, /pooling's classify task and /invocations, against HF's
`*ForSequenceClassification` and the causal Qwen3 that vLLM's --hf-overrides turn into a reranker."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from flotilla.engine.server.score import RERANK_PATHS, SCORE_PATHS

from .conftest import API_KEY, Server, start_tiny_server, stop_server

openai = pytest.importorskip("openai")

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
TEXTS = ["The harbour master counts the boats.", "lanterns", "Ein Schiff wird kommen"]
QUERY = "Where do the boats sleep?"
DOCUMENTS = ["The harbour master counts the boats.", "lanterns", "Ein Schiff wird kommen", "boats sleep in harbour"]
QWEN3_RERANKER = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
                  "is_original_qwen3_reranker": True}


@pytest.fixture(scope="module")
def classifier_server(tiny_classifier_dirs, tmp_path_factory) -> Iterator[Server]:
    """The tiny Qwen3ForSequenceClassification (3 labels), --runner left at auto."""
    s = start_tiny_server(tiny_classifier_dirs["qwen3"], tmp_path_factory.mktemp("classifier") / "server.log")
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def reranker_dir(tiny_model_dirs, tmp_path_factory) -> Path:
    """The tiny causal Qwen3 with a tokenizer whose pair encoding puts <|im_end|> between the two texts (as BERT's
    [SEP]), so that a pair's prompt differs from its texts' encodings put end to end."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("reranker-model") / "qwen3"
    shutil.copytree(tiny_model_dirs["qwen3"], path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    sep = "<|im_end|>"
    template = TemplateProcessing(single="$A", pair=f"$A {sep} $B:1",
                                  special_tokens=[(sep, tokenizer.convert_tokens_to_ids(sep))])
    setattr(tokenizer.backend_tokenizer, "post_processor", template)  # noqa: B010 - a property vulture cannot see
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reranker_server(reranker_dir, tmp_path_factory) -> Iterator[Server]:
    """The tiny causal Qwen3 as vLLM serves Qwen3-Reranker: --hf-overrides make the yes-minus-no head."""
    s = start_tiny_server(reranker_dir, tmp_path_factory.mktemp("reranker") / "server.log",
                          "--runner", "pooling", "--hf-overrides", json.dumps(QWEN3_RERANKER))
    yield s
    stop_server(s)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": "tiny", **body}, headers=HEADERS, timeout=120)


def hf_classifier_logits(model_dir, ids_list: list[list[int]]) -> torch.Tensor:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.stack([model(torch.tensor([ids])).logits[0] for ids in ids_list])


@pytest.fixture(scope="module")
def hf_reranker(reranker_dir):
    """(the pair encoding of (query, document), HF's yes-minus-no logit of a token-id prompt) for the reranker."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = reranker_dir
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    no, yes = tokenizer.convert_tokens_to_ids(["no", "yes"])

    def margin(ids: list[int]) -> float:
        with torch.no_grad():
            last = model(torch.tensor([ids])).logits[0, -1]
        return float(last[yes] - last[no])

    def pair_ids(a: str, b: str, **cut: object) -> list[int]:
        ids = tokenizer(a, text_pair=b, **cut)["input_ids"]
        if not cut:  # the separator is there: a pair is not its texts end to end
            assert ids == tokenizer.encode(a) + [tokenizer.convert_tokens_to_ids("<|im_end|>")] + tokenizer.encode(b)
        return ids

    return pair_ids, margin


def test_classify_answers_vllms_shape_with_hf_probabilities(classifier_server, tiny_classifier_dirs):
    from transformers import AutoTokenizer

    answer = post(classifier_server, "/classify", {"input": TEXTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"].startswith("classify-") and body["object"] == "list" and body["model"] == "tiny"
    tokenizer = AutoTokenizer.from_pretrained(tiny_classifier_dirs["qwen3"])
    ids = [tokenizer.encode(t) for t in TEXTS]
    expected = torch.softmax(hf_classifier_logits(tiny_classifier_dirs["qwen3"], ids), dim=-1)
    data = body["data"]
    assert [d["index"] for d in data] == [0, 1, 2] and all(d["num_classes"] == 3 for d in data)
    torch.testing.assert_close(torch.tensor([d["probs"] for d in data]), expected, atol=1e-4, rtol=1e-4)
    labels = ["negative", "neutral", "positive"]
    assert [d["label"] for d in data] == [labels[int(row.argmax())] for row in expected]
    tokens = sum(map(len, ids))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                             "prompt_tokens_details": None}
    raw = post(classifier_server, "/classify", {"input": ids[0], "use_activation": False}).json()["data"][0]
    logits = hf_classifier_logits(tiny_classifier_dirs["qwen3"], ids[:1])[0]
    torch.testing.assert_close(torch.tensor(raw["probs"]), logits, atol=1e-4, rtol=1e-4)


def test_the_openai_client_reaches_classify(classifier_server):
    client = openai.OpenAI(base_url=f"{classifier_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    answer = client.post(f"{classifier_server.url}/classify", body={"model": "tiny", "input": "lanterns"},
                         cast_to=object)
    assert answer["data"][0]["num_classes"] == 3
    with pytest.raises(openai.BadRequestError, match="input must not be empty"):
        client.post(f"{classifier_server.url}/classify", body={"model": "tiny", "input": []}, cast_to=object)


def test_pooling_and_invocations_answer_with_the_classifier(classifier_server):
    classified = post(classifier_server, "/classify", {"input": TEXTS}).json()["data"]
    pooled = post(classifier_server, "/pooling", {"input": TEXTS, "task": "classify"})
    assert pooled.status_code == 200, pooled.text
    assert pooled.json()["id"].startswith("pool-")
    # close, not equal: the second request takes the first one's cached blocks, whose K/V differ in the last bits
    # from a prompt's own pass (the test alone, or first on its server, showed it)
    np.testing.assert_allclose([d["data"] for d in pooled.json()["data"]], [d["probs"] for d in classified],
                               atol=1e-5)
    assert post(classifier_server, "/pooling", {"input": TEXTS}).json()["data"] == pooled.json()["data"]
    invoked = post(classifier_server, "/invocations", {"input": TEXTS})
    assert invoked.status_code == 200 and invoked.json()["id"].startswith("classify-"), invoked.text
    assert [d["label"] for d in invoked.json()["data"]] == [d["label"] for d in classified]
    np.testing.assert_allclose([d["probs"] for d in invoked.json()["data"]], [d["probs"] for d in classified],
                               atol=1e-5)


def test_pooling_token_classify_is_hfs_score_head_at_every_token(classifier_server, tiny_classifier_dirs):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = tiny_classifier_dirs["qwen3"]
    ids = [AutoTokenizer.from_pretrained(path).encode(t) for t in TEXTS]
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    post(classifier_server, "/classify", {"input": TEXTS})  # cached blocks: every token is computed all the same
    answer = post(classifier_server, "/pooling", {"input": TEXTS, "task": "token_classify"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"].startswith("pool-") and body["usage"]["prompt_tokens"] == sum(map(len, ids))
    for item, prompt in zip(body["data"], ids, strict=True):
        with torch.no_grad():
            logits = model.score(model.model(torch.tensor([prompt])).last_hidden_state[0])
        torch.testing.assert_close(torch.tensor(item["data"]), torch.softmax(logits, dim=-1), atol=1e-4, rtol=1e-4)
    raw = post(classifier_server, "/pooling", {"input": TEXTS[1], "task": "token_classify", "use_activation": False})
    with torch.no_grad():
        logits = model.score(model.model(torch.tensor([ids[1]])).last_hidden_state[0])
    torch.testing.assert_close(torch.tensor(raw.json()["data"][0]["data"]), logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("path", "body", "status", "param", "words"), [
    ("/classify", {"input": ""}, 400, "input", "input 0 is empty"),
    ("/classify", {"input": [[1, 10**9]]}, 400, "input", "outside the vocabulary"),
    ("/classify", {"input": "a", "priority": 3}, 400, "priority", "priority"),
    ("/classify", {"input": "a", "truncate_prompt_tokens": -2}, 400, "truncate_prompt_tokens", ""),
    ("/classify", {"input": ["a"] * 3000}, 400, "input", "at most 2048"),
    ("/pooling", {"input": "a", "task": "embed"}, 400, "task", "classify and token_classify tasks only"),
    ("/pooling", {"input": "a", "task": "token_classify", "dimensions": 8}, 400, "dimensions", "classifier"),
    ("/pooling", {"input": "a", "dimensions": 8}, 400, "dimensions", "classifier"),
    ("/v1/embeddings", {"input": "a"}, 400, "model", "classifier"),
    ("/score", {"text_1": "a", "text_2": "b"}, 400, "model", "3 labels"),
])
def test_bad_requests_get_openai_error_json(classifier_server, path, body, status, param, words):
    answer = post(classifier_server, path, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert post(classifier_server, "/classify", {"input": "ok"}).status_code == 200


def test_servers_of_other_models_answer_classify_404(server, pooling_server):
    # vLLM registers /classify only for classifiers; the input is not read (an empty one is not named)
    for other, words in ((server, "pooling runner"), (pooling_server, "ForSequenceClassification")):
        answer = post(other, "/classify", {"input": ""})
        assert answer.status_code == 404 and words in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize("path", SCORE_PATHS)
def test_cross_encoder_scores_are_the_sigmoid_of_hfs_yes_minus_no_logit(reranker_server, hf_reranker, path):
    pair_ids, margin = hf_reranker
    answer = post(reranker_server, path, {"text_1": QUERY, "text_2": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    scores = [d["score"] for d in answer.json()["data"]]
    expected = [1 / (1 + np.exp(-margin(pair_ids(QUERY, d)))) for d in DOCUMENTS]
    np.testing.assert_allclose(scores, expected, atol=1e-4)
    assert len(set(scores)) == len(scores)
    tokens = sum(len(pair_ids(QUERY, d)) for d in DOCUMENTS)  # each pair is one prompt: the query in every one
    assert answer.json()["usage"]["prompt_tokens"] == tokens
    raw = post(reranker_server, path, {"text_1": [QUERY], "text_2": DOCUMENTS[:1], "use_activation": False})
    np.testing.assert_allclose(raw.json()["data"][0]["score"], margin(pair_ids(QUERY, DOCUMENTS[0])), atol=1e-4)


@pytest.mark.parametrize("path", RERANK_PATHS)
def test_rerank_sorts_by_the_cross_encoder_score(reranker_server, path):
    scored = post(reranker_server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS}).json()["data"]
    scores = [d["score"] for d in scored]
    answer = post(reranker_server, path, {"query": QUERY, "documents": DOCUMENTS, "top_n": 3})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])[:3]
    np.testing.assert_allclose([r["relevance_score"] for r in results], sorted(scores, reverse=True)[:3], atol=1e-6)


def test_n_to_n_pairs_and_truncation_as_the_tokenizer_cuts_a_pair(reranker_server, hf_reranker):
    pair_ids, margin = hf_reranker
    answer = post(reranker_server, "/score", {"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[2:]})
    expected = [1 / (1 + np.exp(-margin(pair_ids(a, b)))) for a, b in zip(DOCUMENTS[:2], DOCUMENTS[2:], strict=True)]
    np.testing.assert_allclose([d["score"] for d in answer.json()["data"]], expected, atol=1e-4)
    # truncate_prompt_tokens: the tokenizer's own cut of a pair (the longer text first), as vLLM's max_length
    cut = post(reranker_server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[0], "truncate_prompt_tokens": 6})
    assert cut.status_code == 200, cut.text
    ids = pair_ids(QUERY, DOCUMENTS[0], truncation=True, max_length=6)
    assert len(ids) == cut.json()["usage"]["prompt_tokens"] == 6
    np.testing.assert_allclose(cut.json()["data"][0]["score"], 1 / (1 + np.exp(-margin(ids))), atol=1e-4)


def test_the_reranker_classifies_with_one_sigmoid_label(reranker_server, hf_reranker):
    pair_ids, margin = hf_reranker
    ids = pair_ids(QUERY, DOCUMENTS[3])
    [item] = post(reranker_server, "/classify", {"input": [ids]}).json()["data"]
    assert item["label"] == "LABEL_0" and item["num_classes"] == 1
    np.testing.assert_allclose(item["probs"][0], 1 / (1 + np.exp(-margin(ids))), atol=1e-4)
    refused = post(reranker_server, "/score", {"text_1": "a", "text_2": "b", "truncation_side": "right"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "truncation_side", refused.text


def test_the_api_key_guards_classify(classifier_server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = httpx.post(f"{classifier_server.url}/classify", json={"input": "a"}, headers=headers, timeout=60)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key", answer.text
