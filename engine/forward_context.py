"""Per-step attention metadata, visible to every attention layer without threading it through
the model's call signatures (so model code keeps `forward(positions, hidden)`).

The metadata lives in a context variable, not a plain module global: each thread sees only what it
set itself. One engine runs every forward pass on its own step thread, but nothing stops a process
from holding several engines (tests, an offline `LLM` beside a server), and with a module global one
engine's step would read another's slots and block tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """Where each token's K/V goes and what each sequence attends to (see kernels/paged_attention.py)."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 for padding
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, context length including the new tokens
    max_query_len: int
    max_seq_len: int
    # Device tensors derived from the fields above, left by the first layer that needs them for the
    # others (the prefill kernel's tile map): the metadata lives for one step, and so do they.
    derived: dict = field(default_factory=dict, repr=False, compare=False)


_current: ContextVar[AttentionMetadata | None] = ContextVar("flotilla_attention_metadata", default=None)


@contextmanager
def forward_context(metadata: AttentionMetadata | None) -> Iterator[None]:
    """Make `metadata` the calling thread's attention metadata while the model runs."""
    token = _current.set(metadata)
    try:
        yield
    finally:
        _current.reset(token)


def current_attention_metadata() -> AttentionMetadata | None:
    """The running step's metadata; None outside a step (e.g. the memory-profiling dummy pass)."""
    return _current.get()
