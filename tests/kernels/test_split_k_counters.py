"""Split-K arrival counters (kernels/split_k_counters.py): allocated zeroed once per device and reused;
None where a launch has more tiles than counters."""

import torch

from flotilla.kernels.split_k_counters import arrival_counters


def test_counters_are_allocated_once_zeroed_and_reused():
    cache: dict[torch.device, torch.Tensor] = {}
    device = torch.device("cpu")
    first = arrival_counters(cache, device, 3, 8)
    assert first is not None and first.dtype == torch.int32 and first.numel() == 8 and not first.any()
    assert arrival_counters(cache, device, 8, 8) is first and cache == {device: first}


def test_more_tiles_than_counters_gets_none():
    cache: dict[torch.device, torch.Tensor] = {}
    device = torch.device("cpu")
    assert arrival_counters(cache, device, 9, 8) is None and cache == {}  # nothing allocated for it
    arrival_counters(cache, device, 1, 8)
    assert arrival_counters(cache, device, 9, 8) is None
