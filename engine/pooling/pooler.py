"""Last-token pooling (Qwen3-Embedding, vLLM's `embed` convert): the hidden state at each prompt's
last position, cut to `dimensions`, then L2-normalised."""

from __future__ import annotations

import torch

from flotilla.engine.pooling.params import PoolingParams


def last_token_pool(last_hidden: torch.Tensor, params: PoolingParams) -> torch.Tensor:
    """Each prompt's last hidden state `[B, H]` -> float32 embeddings `[B, D]`."""
    pooled = last_hidden.float()
    if params.dimensions is not None:
        pooled = pooled[:, : params.dimensions]  # matryoshka: cut before normalising, as vLLM
    if params.normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
    return pooled
