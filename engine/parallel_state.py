"""Which tensor-parallel rank this process is, and how many there are.

Layers read these to shard their weights. Until tensor parallelism lands the answer is always rank 0
of 1; the layers are already written for any size, so parallelism will be a change here, not in the
model code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # layers pass tensors through; this module itself needs no torch
    import torch

_TP_RANK = 0
_TP_SIZE = 1


def tp_rank() -> int:
    """This process's tensor-parallel rank."""
    return _TP_RANK


def tp_size() -> int:
    """The tensor-parallel group size."""
    return _TP_SIZE


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum a row-parallel layer's partial outputs over the group (a no-op at size 1)."""
    if _TP_SIZE == 1:
        return x
    raise NotImplementedError("tensor parallelism is not implemented yet")
