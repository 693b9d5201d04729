"""What the pooling pass returns for one prompt (an embedding, or a classifier's scores): a module without torch, so
that the API process can receive it from the engine-core process without importing the model stack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EmbeddingOutput:
    """One prompt's embedding and how many tokens it took."""

    embedding: list[float]
    num_prompt_tokens: int


@dataclass
class ClassificationOutput:
    """One prompt's activated class scores (`probs`: softmax or sigmoid of the head's logits, or the logits
    themselves without activation) and how many tokens it took."""

    probs: list[float]
    num_prompt_tokens: int


@dataclass
class ScoringOutput:
    """One pair's score (vLLM's ScoringOutput): a cross-encoder's activated logit, or a bi-encoder's cosine."""

    score: float


@dataclass
class ScoringRequestOutput:
    """What `LLM.score` returns for one pair, vLLM's shape: `outputs.score`, the pair's `prompt_token_ids` (a
    cross-encoder's pair encoding; a bi-encoder's two texts' tokens, scoring.pair_token_ids), its `request_id` (the
    pair's index; a bi-encoder's "i_j", its two texts' indices among the embedded ones, as vLLM's) and `finished`."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class PoolingOutput:
    """vLLM's raw pooling output: `data`, a torch tensor offline (token_classify: `[num_tokens, num_labels]`)."""

    data: Any


@dataclass
class PoolingRequestOutput:
    """What `LLM.encode` and `LLM.reward` return for one prompt, vLLM's shape: `outputs.data`, the prompt's
    `prompt_token_ids`, its `request_id` (its index in the call) and `finished`."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True
