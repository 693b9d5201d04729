"""The running step's token -> adapter-slot mapping, visible to every LoRA layer.

A context variable like the attention metadata (forward_context.py): each engine's step thread sees
only its own. None means no token of the step uses an adapter, and the layers skip LoRA entirely.

The step's tokens grouped by slot (`segments`, for the segment kernels) are computed on the device at
the start of each model forward (`LoRAManager`'s pre-hook), so that a CUDA graph captures that kernel
too; they are kept beside the slot tensor they were computed from and only ever used with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_current: ContextVar[torch.Tensor | None] = ContextVar("flotilla_lora_token_slots", default=None)
Segments = tuple[torch.Tensor, torch.Tensor]
_segments: ContextVar[tuple[torch.Tensor, Segments] | None] = ContextVar("flotilla_lora_segments", default=None)


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


def set_lora_segments(token_slots: torch.Tensor, segments: Segments | None) -> None:
    """Record the step's segments (`kernels.dispatch.lora_step_segments`) of `token_slots`."""
    _segments.set(None if segments is None else (token_slots, segments))


def current_lora_segments(token_slots: torch.Tensor) -> Segments | None:
    """The segments recorded for exactly this slot tensor in this forward, or None."""
    held = _segments.get()
    return held[1] if held is not None and held[0] is token_slots else None
