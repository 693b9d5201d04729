"""Sleep mode (vLLM's --enable-sleep-mode): give the device memory of the weights and the KV cache back between uses
(an RL trainer colocated with the engine trains meanwhile), and take it again on wake-up.

The weights are freed storage by storage: every parameter and buffer of the model (tied ones once) keeps its tensor
object, views and all, and only its storage is resized to 0 bytes, then allocated again on wake-up and refilled. So
the views the engine gathered at start-up (the CPU decode plan's weights, fused layers' slices) stay valid without
being rebound. Level 1 keeps a host copy of every storage (pinned on CUDA, for fast copies back); level 2 keeps only
the buffers' (the rotary tables: the model's own, not the checkpoint's), as vLLM does, and leaves the weights
uninitialised until `reload_weights` fills them. The KV pools are dropped whole and allocated again (zeroed): their
contents are forgotten at either level.

CUDA graphs cannot survive this: a graph replays the device addresses it captured, and memory allocated again lies
elsewhere. vLLM keeps the addresses with an allocator of its own (cuMemCreate/cuMemMap: the physical pages are
unmapped and mapped again under the same virtual addresses); torch's caching allocator cannot, so sleeping drops the
graphs and the last wake-up (weights and KV cache both resident again) captures them again, as start-up did.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

logger = logging.getLogger(__name__)


def _storages(tensors: Iterable[torch.Tensor]) -> dict[int, torch.UntypedStorage]:
    """The distinct non-empty storages under `tensors` (a tied weight's once), by address."""
    found: dict[int, torch.UntypedStorage] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.nbytes() > 0:
            found.setdefault(storage.data_ptr(), storage)
    return found


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over the whole of `storage` (to copy it as it is, whatever its tensors' dtypes)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),), (1,))


def _host_copy(storage: torch.UntypedStorage) -> torch.Tensor:
    source = _as_bytes(storage)
    pinned = source.device.type == "cuda"  # pinned host memory copies back at full bus speed
    host = torch.empty(source.numel(), dtype=torch.uint8, pin_memory=pinned)
    host.copy_(source)
    return host


class SleepingWeights:
    """The weights of `modules` while asleep: their storages freed, with the host copies that come back on
    `restore` (every storage at level 1; only the buffers' at level 2, whose weights come back uninitialised)."""

    def __init__(self, modules: list[nn.Module], keep_weights: bool) -> None:
        buffers = _storages(b for m in modules for b in m.buffers())
        params = _storages(p for m in modules for p in m.parameters())
        storages = params | buffers
        fixed = [s for s in storages.values() if not s.resizable()]
        if fixed:  # checked before anything is freed: a sleep happens whole or not at all
            raise RuntimeError(f"sleep: {len(fixed)} weight storage(s) cannot be freed in place (not resizable)")
        self._parked: list[tuple[torch.UntypedStorage, int, torch.Tensor | None]] = [
            (s, s.nbytes(), _host_copy(s) if keep_weights or ptr in buffers else None) for ptr, s in storages.items()
        ]
        for storage, _, _ in self._parked:
            storage.resize_(0)
        self.nbytes = sum(n for _, n, _ in self._parked)
        logger.info("sleep: %.1f MiB of weights freed on the device (%s)", self.nbytes / 2**20,
                    "copied to host memory" if keep_weights else "discarded; buffers kept")

    def restore(self) -> None:
        """Allocate every storage again and copy back what was kept."""
        for storage, nbytes, host in self._parked:
            storage.resize_(nbytes)
            if host is not None:
                _as_bytes(storage).copy_(host)
        self._parked = []
