"""`LLM.score` (vLLM's offline scoring) against HF: a tiny random one-label Llama classifier as a cross-encoder (HF's
logit of the tokenizer's pair encoding), a tiny Qwen3 as a bi-encoder (the cosine of HF's last-token states)."""

from __future__ import annotations

import pytest
import torch

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.llm import LLM

QUERY = "where do the harbour lights go"
DOCS = ["out past the breakwater", "the lights go green at dusk", "a recipe for bread"]


@pytest.fixture(scope="module")
def cross_encoder(tiny_classifier_dirs):
    return LLM(str(tiny_classifier_dirs["llama"]), max_model_len=64, max_num_batched_tokens=64, device="cpu")


def hf_pair_logits(model_dir, pairs: list[tuple[str, str]], **cut) -> tuple[torch.Tensor, list[list[int]]]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    encodings = [tokenizer(a, text_pair=b, **cut)["input_ids"] for a, b in pairs]
    with torch.no_grad():  # one at a time: no padding in the oracle
        return torch.stack([model(torch.tensor([ids])).logits[0, 0] for ids in encodings]), encodings


def test_cross_encoder_one_to_n_is_the_sigmoid_of_hfs_pair_logit(cross_encoder, tiny_classifier_dirs):
    logits, encodings = hf_pair_logits(tiny_classifier_dirs["llama"], [(QUERY, d) for d in DOCS])
    blocks = cross_encoder.engine.block_manager
    free_before = blocks.num_free_blocks
    out = cross_encoder.score(QUERY, DOCS)
    torch.testing.assert_close(torch.tensor([o.outputs.score for o in out]), torch.sigmoid(logits), atol=1e-4,
                               rtol=1e-4)
    assert [o.prompt_token_ids for o in out] == encodings
    assert [o.request_id for o in out] == ["0", "1", "2"] and all(o.finished for o in out)
    raw = cross_encoder.score(QUERY, DOCS, use_activation=False)
    torch.testing.assert_close(torch.tensor([o.outputs.score for o in raw]), logits, atol=1e-4, rtol=1e-4)
    assert blocks.num_free_blocks == free_before


def test_cross_encoder_n_to_n_token_prompts_and_truncation(cross_encoder, tiny_classifier_dirs):
    tokenizer = cross_encoder.get_tokenizer()
    firsts = [QUERY, {"prompt_token_ids": tokenizer.encode("lights", add_special_tokens=False)}]
    logits, _ = hf_pair_logits(tiny_classifier_dirs["llama"], [(QUERY, DOCS[0]), ("lights", DOCS[1])])
    out = cross_encoder.score(firsts, [DOCS[0], {"prompt": DOCS[1]}])
    torch.testing.assert_close(torch.tensor([o.outputs.score for o in out]), torch.sigmoid(logits), atol=1e-4,
                               rtol=1e-4)
    cut_logits, cut = hf_pair_logits(tiny_classifier_dirs["llama"], [(QUERY, DOCS[1])], truncation=True,
                                     max_length=9)
    [short] = cross_encoder.score(QUERY, DOCS[1], truncate_prompt_tokens=9)
    assert short.prompt_token_ids == cut[0] and len(cut[0]) == 9
    assert short.outputs.score == pytest.approx(torch.sigmoid(cut_logits)[0].item(), abs=1e-4)


@pytest.mark.parametrize(("first", "second", "words"), [
    (["a", "b"], ["c", "d", "e"], "1 to 1, 1 to N or N to N"),
    ([], ["c"], "data_1 must not be empty"),
    ("a", [], "data_2 must not be empty"),
])
def test_a_bad_pairing_is_refused_before_any_work(cross_encoder, first, second, words):
    with pytest.raises(InvalidParamError, match=words):
        cross_encoder.score(first, second)


def test_a_classifier_of_several_labels_and_a_generate_engine_refuse_to_score(tiny_classifier_dirs, tiny_model_dirs):
    several = LLM(str(tiny_classifier_dirs["qwen2"]), max_model_len=64, device="cpu")
    with pytest.raises(InvalidParamError, match="2 labels"):
        several.score("a", "b")
    generate = LLM(str(tiny_model_dirs["qwen3"]), max_model_len=64, device="cpu")
    with pytest.raises(InvalidParamError, match="pooling runner"):
        generate.score("a", "b")


def test_bi_encoder_scores_the_cosine_of_hfs_last_token_states(tiny_model_dirs):
    from transformers import AutoModel

    path = tiny_model_dirs["qwen3"]
    llm = LLM(str(path), runner="pooling", max_model_len=64, device="cpu")
    tokenizer = llm.get_tokenizer()
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        states = {t: model(torch.tensor([tokenizer.encode(t)])).last_hidden_state[0, -1] for t in [QUERY, *DOCS]}
    expected = [torch.cosine_similarity(states[QUERY], states[d], dim=0).item() for d in DOCS]
    out = llm.score(QUERY, DOCS)
    assert [o.outputs.score for o in out] == pytest.approx(expected, abs=1e-4)
    pad = tokenizer.pad_token_id
    assert out[1].prompt_token_ids == tokenizer.encode(QUERY) + ([] if pad is None else [pad]) + tokenizer.encode(
        DOCS[1])
    assert [o.request_id for o in out] == ["0_1", "0_2", "0_3"]  # the query embedded once, then the documents
    pairwise = llm.score(DOCS, DOCS[::-1])
    assert pairwise[1].outputs.score == pytest.approx(1.0, abs=1e-5)  # the middle document against itself
