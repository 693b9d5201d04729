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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_greedy_tokens_of_reduced_logits_equal_their_own_argmax(dtype):
    # the CPU path argmaxes an fp32 upcast (faster): the same values, the same first index on ties
    from flotilla.kernels.dispatch import greedy_tokens

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 49152, generator=g).to(dtype)
    logits[1, [37, 200, 49151]] = 9.0
    logits[2, [70, 71]] = 9.0
    logits[3] = float("-inf")
    logits[4, 5] = float("nan")  # NaN wins, as in torch's argmax
    logits[5, 1000:1010] = logits[5].max()  # ties at the maximum of random values
    out = greedy_tokens(logits)
    assert out.dtype == torch.long and out.tolist() == logits.argmax(dim=-1).tolist()
