"""What the engine needs of a model class, whatever its architecture."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import nn


class CausalLM(nn.Module, ABC):
    """A decoder-only language model: token ids at positions in, final hidden states out.

    The model runner calls the model and `compute_logits`; the loader places checkpoint tensors
    with `checkpoint_name` and `packed_modules`.
    """

    # checkpoint name fragment -> (our merged parameter, shard id)
    packed_modules: ClassVar[dict[str, tuple[str, str | int]]] = {}

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`[T]` token ids at `[T]` positions -> final hidden states `[T, hidden]`."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits for the selected hidden states."""

    @property
    @abstractmethod
    def ties_lm_head(self) -> bool:
        """True when the LM head shares the embedding's weight (the checkpoint may omit `lm_head.weight`)."""

    def holds(self, name: str) -> bool:
        """Whether this process holds parameter `name` (a pipeline stage holds only its layers)."""
        return True

    @staticmethod
    @abstractmethod
    def checkpoint_name(hf_name: str) -> str:
        """Our parameter name for an HF checkpoint tensor name."""
