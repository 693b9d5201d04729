"""lm-eval's `local-completions` runs a multiple-choice task end to end against the server (issue 24):
log-likelihoods come from `echo` with prompt logprobs, and its scores equal those computed from the
offline engine's prompt logprobs."""

from __future__ import annotations

import json

import lm_eval
import pytest

from .conftest import API_KEY

# The repository's own small task: which word follows (answers are arbitrary for a random model; what is
# checked is that lm-eval's numbers equal the engine's).
DOCS = [
    {"question": "The sea is", "choices": ["blue", "loud", "square"], "answer": 0},
    {"question": "Ships sail on the", "choices": ["water", "mountain", "ceiling"], "answer": 0},
    {"question": "A harbour keeps boats", "choices": ["dry", "safe", "green"], "answer": 1},
    {"question": "At night the lighthouse is", "choices": ["dark", "asleep", "bright"], "answer": 2},
    {"question": "Sailors tie", "choices": ["knots", "clouds", "songs"], "answer": 0},
]
TASK = """task: harbour_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def _offline_loglikelihoods(model_dir) -> list[list[float]]:
    """Each choice's log-likelihood from the offline engine's prompt logprobs, tokenized as lm-eval does
    (the whole text, then the context's tokens split off; no special tokens)."""
    from flotilla.engine.llm import LLM
    from flotilla.engine.sampling_params import SamplingParams

    llm = LLM(str(model_dir), max_model_len=256, block_size=8)
    tokenizer = llm.get_tokenizer()
    scores = []
    for doc in DOCS:
        context = f"Question: {doc['question']}\nAnswer:"
        context_len = len(tokenizer(context, add_special_tokens=False).input_ids)
        wholes = [tokenizer(f"{context} {choice}", add_special_tokens=False).input_ids for choice in doc["choices"]]
        outs = llm.generate(wholes, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0), use_tqdm=False)
        scores.append([sum(entry[token][0] for token, entry in
                           zip(whole[context_len:], out.prompt_logprobs[context_len:], strict=True))
                       for whole, out in zip(wholes, outs, strict=True)])
    return scores


def test_multiple_choice_scores_equal_the_offline_engines(server, tiny_model_dirs, tmp_path, monkeypatch):
    # Only this task: indexing lm-eval's ~14,000 built-in task files would take most of the test's time.
    from lm_eval.tasks import TaskManager

    data = tmp_path / "harbour.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "harbour_mc.yaml").write_text(TASK.format(data=data))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    model_args = {"model": "tiny", "base_url": f"{server.url}/v1/completions", "tokenizer_backend": "huggingface",
                  "tokenizer": str(tiny_model_dirs["llama"]), "num_concurrent": 1, "max_retries": 1}
    results = lm_eval.simple_evaluate(model="local-completions", model_args=model_args, tasks=["harbour_mc"],
                                      task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
                                      log_samples=True)
    expected = _offline_loglikelihoods(tiny_model_dirs["llama"])
    samples = sorted(results["samples"]["harbour_mc"], key=lambda s: s["doc_id"])
    assert len(samples) == len(DOCS)
    for sample, scores in zip(samples, expected, strict=True):
        served = [float(r[0]) for r in sample["filtered_resps"]]
        assert served == pytest.approx(scores, abs=1e-3)
    accuracy = sum(max(range(3), key=s.__getitem__) == d["answer"] for s, d in zip(expected, DOCS, strict=True))
    assert results["results"]["harbour_mc"]["acc,none"] == pytest.approx(accuracy / len(DOCS))
