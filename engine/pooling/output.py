"""What the pooling pass returns for one prompt: a module without torch, so that the API process can
receive it from the engine-core process without importing the model stack."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EmbeddingOutput:
    """One prompt's embedding and how many tokens it took."""

    embedding: list[float]
    num_prompt_tokens: int
