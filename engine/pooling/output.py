"""What the pooling pass returns for one prompt (an embedding, or a classifier's scores): a module without torch, so
that the API process can receive it from the engine-core process without importing the model stack."""

from __future__ import annotations

from dataclasses import dataclass


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
