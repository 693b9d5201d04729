"""The classifier's pooling pass (`--convert classify`): each prompt's last hidden state through the `score` head
(engine/pooling/score_head.py) and, unless the request turns it off (vLLM's `use_activation`), the activation
config.json implies (classifier_config.activation). /classify reports the rows; a cross-encoder's /score and /rerank
report a one-label model's single value for each pair's prompt. vLLM's token_classify task (`LLM.encode(...,
pooling_task="token_classify")`, `LLM.reward`) is the same head and activation on every token's hidden state."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from flotilla.engine.model_runner import ModelRunner
from flotilla.engine.pooling.classifier_config import activation
from flotilla.engine.pooling.embed import Head, check_pooling, pool_prompts
from flotilla.engine.pooling.output import ClassificationOutput
from flotilla.engine.pooling.score_head import activate

if TYPE_CHECKING:
    from flotilla.engine.llm_engine import LLMEngine


def classify_prompts(engine: LLMEngine, prompts: list[list[int]], use_activation: bool = True,
                     cache_salt: str | None = None) -> list[ClassificationOutput]:
    """Each token-id prompt's class scores, in order (runs on the engine's thread; `cache_salt` as embeddings')."""
    rows = pool_prompts(engine, prompts, _classifier_head(engine, use_activation), cache_salt)
    return [ClassificationOutput(probs, len(ids)) for probs, ids in zip(rows, prompts, strict=True)]


def token_classify_prompts(engine: LLMEngine, prompts: list[list[int]], use_activation: bool = True,
                           cache_salt: str | None = None) -> list[list[list[float]]]:
    """Each token-id prompt's class scores at every token, `[num_tokens, num_labels]` per prompt, in order (vLLM's
    token_classify task; runs on the engine's thread)."""
    return pool_prompts(engine, prompts, _classifier_head(engine, use_activation), cache_salt, all_tokens=True)


def _classifier_head(engine: LLMEngine, use_activation: bool) -> Head:
    check_pooling(engine, "classify")
    how = activation(engine.config.model.hf_config) if use_activation else "identity"

    def head(hidden: torch.Tensor) -> torch.Tensor:  # called once pool_prompts has checked the runner holds the model
        score = cast(ModelRunner, engine.runner).model.get_submodule("score")  # score_head.attach_score_head's
        return activate(score(hidden.float()), how)

    return head
