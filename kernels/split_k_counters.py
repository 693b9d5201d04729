"""Split-K arrival counters shared by the kernels whose last-arriving K range sums the partials.

A split-K launch whose programs count their arrivals per output tile (an int32 each, atomic) lets the
last one of a tile sum the partials and reset its counter: no reduce launch. The counters must be zero
between launches, so they are allocated once per device and kept; launches on one stream run one after
the other and reuse them. Each kernel module keeps its own table (`cache`), so that two kernels in
flight at once (programmatic dependent launch) never count on the same slots.
"""

from __future__ import annotations

import torch


def arrival_counters(
    cache: dict[torch.device, torch.Tensor], device: torch.device, tiles: int, slots: int
) -> torch.Tensor | None:
    """`device`'s counters from `cache` (`slots` of them, allocated zeroed by the first call), or None where
    the call must do without them: more tiles than counters, or the first use inside a CUDA-graph capture
    (a zeroing there would be a graph node, replayed as a reset of counters the graph does not own)."""
    counters = cache.get(device)
    if counters is None:
        if tiles > slots or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return None
        counters = cache[device] = torch.zeros(slots, dtype=torch.int32, device=device)
    return counters if tiles <= counters.numel() else None
