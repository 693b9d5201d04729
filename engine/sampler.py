"""Turn the last position's logits into next tokens, batched on tensors."""

from __future__ import annotations

import torch


def sample(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """Next token per row: argmax where temperature is 0, else a draw from softmax(logits / T).

    The draw uses the exponential-race form of sampling (argmax of p / E, E ~ Exp(1)), which needs
    no cumulative sums and stays on the device.
    """
    greedy = logits.argmax(dim=-1)
    is_greedy = temperatures == 0
    if bool(is_greedy.all()):
        return greedy
    scaled = logits / torch.where(is_greedy, 1.0, temperatures).unsqueeze(-1)
    probs = torch.softmax(scaled.float(), dim=-1)
    race = probs / torch.empty_like(probs).exponential_()
    return torch.where(is_greedy, greedy, race.argmax(dim=-1))
