"""Sleep mode on a classifier (`--convert classify`): asleep, classify waits its turn as embed does (a busy error,
not a pass over freed weights); a level-2 sleep and reload_weights give the same class scores back, the `score` head
included (made from the LM head's rows for vLLM's Qwen3-Reranker overrides)."""

from __future__ import annotations

import pytest
import torch

from flotilla.engine.errors import EngineBusyError
from flotilla.engine.llm import LLM

PROMPTS = [[1, 2, 3, 4, 5], list(range(100, 133))]
QWEN3_RERANKER = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
                  "is_original_qwen3_reranker": True}


def _probs(llm: LLM) -> torch.Tensor:
    return torch.tensor([o.probs for o in llm.classify(PROMPTS)])


@pytest.fixture(scope="module")
def classifier(tiny_classifier_dirs) -> LLM:
    return LLM(str(tiny_classifier_dirs["qwen3"]), max_model_len=64, device="cpu", enable_sleep_mode=True)


def test_classify_while_asleep_is_busy_and_leaks_no_block(classifier):
    expected = _probs(classifier)
    blocks = classifier.engine.block_manager
    classifier.sleep(level=1)
    with pytest.raises(EngineBusyError, match="asleep"):
        classifier.classify(PROMPTS)
    assert blocks.num_free_blocks == blocks.num_blocks
    classifier.wake_up()
    torch.testing.assert_close(_probs(classifier), expected, atol=1e-5, rtol=1e-5)  # prefix-cache hits differ


def test_level_2_reload_restores_a_sequence_classifier(classifier):
    expected = _probs(classifier)
    classifier.sleep(level=2)
    classifier.wake_up(tags=["weights"])
    classifier.collective_rpc("reload_weights")
    classifier.wake_up(tags=["kv_cache"])
    torch.testing.assert_close(_probs(classifier), expected, atol=1e-5, rtol=1e-5)  # prefix-cache hits differ


def test_level_2_reload_restores_the_qwen3_reranker_head(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["qwen3"]), runner="pooling", hf_overrides=QWEN3_RERANKER, max_model_len=64,
              device="cpu", enable_sleep_mode=True)
    expected = _probs(llm)
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    llm.collective_rpc("reload_weights")
    llm.wake_up(tags=["kv_cache"])
    torch.testing.assert_close(_probs(llm), expected, atol=1e-5, rtol=1e-5)  # prefix-cache hits differ
