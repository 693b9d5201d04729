"""Host lists to device tensors without a host sync.

`torch.tensor(values, device="cuda")` copies from pageable memory, and such a copy waits for
everything already queued on the stream: called after a step's forward has been launched, it
stalls the host until the GPU is done, and the launches behind it start late. Building the tensor
in pinned memory and copying it asynchronously keeps the host running ahead. (PyTorch's pinned
allocator does not reuse a block until the copies that read it have finished.)
"""

from __future__ import annotations

import torch


def device_tensor(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` as a tensor on `device`; asynchronous from pinned memory when that is a GPU."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
