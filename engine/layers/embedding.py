"""Token embedding and the LM head, split over the vocabulary for tensor parallelism.

Each rank holds a contiguous slice of `ceil(vocab / tp_size)` rows (the last slice zero-padded).
The embedding looks up the tokens its slice holds, zeroes the others and sums over ranks; the LM head
computes its slice's logits and gathers them, so every rank (and the sampler on it) sees the whole
vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flotilla.engine.parallel_state import all_gather, all_reduce, tp_rank, tp_size
from flotilla.kernels.cpu_int_linear import CpuIntWeight, cpu_int_linear
from flotilla.kernels.dispatch import lm_head_linear


class VocabParallelEmbedding(nn.Module):
    """Embedding table `[vocab, hidden]`; each rank holds a contiguous slice of the vocabulary."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // tp_size())
        self.vocab_start = tp_rank() * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Take this rank's rows of the vocabulary; rows past its end stay zero."""
        if loaded.shape[0] != self.vocab_size:  # config.json's vocab_size and the checkpoint disagree
            raise ValueError(f"{loaded.shape[0]} rows, where config.json's vocab_size is {self.vocab_size}")
        end = min(self.vocab_start + self.shard_size, loaded.shape[0])
        rows = max(end - self.vocab_start, 0)
        param.data[:rows].copy_(loaded[self.vocab_start : self.vocab_start + rows])
        param.data[rows:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Look up the tokens' vectors."""
        if tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.shard_size)
        vectors = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(vectors.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits (weights possibly tied to the embedding)."""

    # a CPU integer copy of the weight that the loader may attach (`--quantization gguf`'s Q8_0 head)
    cpu_int_weight: CpuIntWeight | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits `[tokens, vocab]`, gathered from every rank's slice."""
        packed = self.cpu_int_weight
        if packed is not None and not hidden.is_cuda and hidden.dtype == packed.scales.dtype:
            return cpu_int_linear(hidden, packed)  # one rank only: the loader attaches it at tp 1
        logits = lm_head_linear(hidden, self.weight)  # one row: the Triton GEMV where FLOTILLA_LM_HEAD_GEMV is on
        if tp_size() == 1:
            return logits
        return all_gather(logits)[..., : self.vocab_size]
