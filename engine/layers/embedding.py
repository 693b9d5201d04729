"""Token embedding and the LM head, split over the vocabulary for tensor parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flotilla.engine.parallel_state import tp_rank, tp_size


class VocabParallelEmbedding(nn.Module):
    """Embedding table `[vocab, hidden]`; each rank holds a contiguous slice of the vocabulary."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        if tp_size() > 1:
            raise NotImplementedError("vocabulary-parallel embedding needs tensor parallelism")
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_size // tp_size(), hidden_size), requires_grad=False)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Take this rank's rows of the vocabulary."""
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, tp_rank() * size, size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Look up the tokens' vectors."""
        return F.embedding(input_ids, self.weight)


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits (weights possibly tied to the embedding)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits `[tokens, vocab]`."""
        return F.linear(hidden, self.weight)
