"""Per-step attention metadata, visible to every attention layer without threading it through
the model's call signatures (so model code keeps `forward(positions, hidden)`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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


_current: AttentionMetadata | None = None


@contextmanager
def forward_context(metadata: AttentionMetadata | None) -> Iterator[None]:
    """Make `metadata` the current step's attention metadata while the model runs."""
    global _current
    previous, _current = _current, metadata
    try:
        yield
    finally:
        _current = previous


def current_attention_metadata() -> AttentionMetadata | None:
    """The running step's metadata; None outside a step (e.g. the memory-profiling dummy pass)."""
    return _current
