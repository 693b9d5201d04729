"""bench/quant_gpu.py's in-engine A/B of decode launches (`--jobs bs64ab --relaunch "B1;B2"`): the phase order weighs
the context's growth alike on every side, and the engine's max_model_len leaves room for every phase's tokens (the
requests are prefilled once and decode through all phases; a request past max_model_len would end early and the later
phases would time a smaller batch)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import quant_gpu


@pytest.mark.parametrize("sides", [1, 2, 3])
def test_every_side_sits_at_the_same_mean_position(sides: int) -> None:
    specs = [f"{64 * (i + 1)},4,3,cvtpx,4h2@2@lean" for i in range(sides)]
    order = quant_gpu.ab_phases(specs)
    assert order[0] == order[-1] == ("A", -1)
    names = [name for name, _ in order]
    assert names.count("A") == 2 and all(names.count(name) == 2 for name in names)
    assert {index for _, index in order} == {-1, *range(sides)}
    # a linear drift over the phases adds the same to every side's mean
    means = {name: statistics.fmean(i for i, (n, _) in enumerate(order) if n == name) for name in names}
    assert len(set(means.values())) == 1, means
    if sides == 1:
        assert names == ["A", "B", "B", "A"]


@pytest.mark.parametrize("steps", [8, 32])
@pytest.mark.parametrize("sides", [1, 2, 3, 4])
def test_max_model_len_holds_every_phase(steps: int, sides: int) -> None:
    specs = ["default"] * sides
    extra = quant_gpu.model_len_extra(["bs64ab"], specs, steps)
    asked = len(quant_gpu.ab_phases(specs)) * (steps + 3) + 32  # ab_bs64's max_tokens a request
    assert asked < extra
    if sides == 1:  # A B B A keeps the table every earlier A/B ran with (4,288 tokens at 32 steps)
        assert extra == 4 * steps + 64


def test_jobs_without_the_ab_keep_their_model_len() -> None:
    assert quant_gpu.model_len_extra(["bs1", "bs64"], ["a", "b", "c"], 32) == 4 * 32 + 64
