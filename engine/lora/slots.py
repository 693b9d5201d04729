"""The running step's token -> adapter-slot mapping, visible to every LoRA layer.

A context variable like the attention metadata (forward_context.py): each engine's step thread sees
only its own. None means no token of the step uses an adapter, and the layers skip LoRA entirely.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_current: ContextVar[torch.Tensor | None] = ContextVar("flotilla_lora_token_slots", default=None)


@contextmanager
def lora_slots(token_slots: torch.Tensor | None) -> Iterator[None]:
    """Make `token_slots` (`[T]` int64 on the device, -1 for base-model tokens) the step's mapping."""
    token = _current.set(token_slots)
    try:
        yield
    finally:
        _current.reset(token)


def current_lora_slots() -> torch.Tensor | None:
    """The running step's mapping, or None when no token uses an adapter."""
    return _current.get()
