"""Row-wise argmax (Triton) against `torch.argmax`, ties included."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_match_torch_argmax_with_ties_and_a_ragged_last_slice(dtype):
    from flotilla.kernels.triton_argmax import argmax_rows

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 300, generator=g).to(dtype)
    logits[1, [37, 200, 299]] = 9.0  # a tie across slices: the lowest index wins
    logits[2, [70, 71]] = 9.0  # a tie inside one slice
    logits[3, 299] = 9.0  # the best in the ragged last slice
    logits[4] = float("-inf")  # nothing finite: index 0, as torch
    logits = logits.to(DEVICE)
    out = argmax_rows(logits, block=64)
    assert out.dtype == torch.long
    assert out.tolist() == logits.argmax(dim=-1).tolist()
    assert out.tolist()[1:4] == [37, 70, 299]
