"""The exponential race (`sampler.race`): what a seed draws, pinned token for token, and the CPU's shortcuts (no hash
for greedy rows, and for a row with few tokens of probability > 0 only theirs) drawing exactly what the whole-row
race draws."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from flotilla.engine import sampler
from flotilla.engine.request import Request
from flotilla.engine.sampler import (
    apply_bans,
    apply_logit_bias,
    apply_token_masks,
    exponential_noise,
    sample,
    sampling_logits,
)
from flotilla.engine.sampling_metadata import SamplingRow, build_sampling_batch
from flotilla.engine.sampling_params import SamplingParams

CASES = {
    "temperature": {"temperature": 0.8},
    "top_k": {"temperature": 0.8, "top_k": 50},
    "top_p": {"temperature": 0.8, "top_p": 0.9},
    "min_p": {"temperature": 1.0, "min_p": 0.1},
    "cold": {"temperature": 0.05},  # most probabilities underflow to 0
}
# What sample() drew at 0b8bf54a (before the CPU's shortcuts): 6 rows, row 4 greedy, seeds 0, 1, 2, 12345, -, 99 at
# output positions 0, 7, 40, 40, 3, 1000, logits NumPy's default_rng(vocab) normals x 3.
GOLDEN = {
    49152: {"temperature": [43444, 34465, 16727, 4835, 35893, 42781],
            "top_k": [43444, 4654, 16727, 4835, 35893, 42781],
            "top_p": [43444, 34465, 16727, 4835, 35893, 42781],
            "min_p": [43444, 23736, 16727, 4835, 35893, 42781],
            "cold": [39401, 5438, 30494, 8795, 35893, 39041]},
    50: {"temperature": [27, 29, 46, 30, 31, 48],
         "top_k": [27, 29, 46, 30, 31, 48],
         "top_p": [27, 29, 46, 30, 31, 48],
         "min_p": [4, 29, 46, 30, 31, 48],
         "cold": [40, 29, 46, 29, 31, 48]},
}


def _batch(params: list[SamplingParams], vocab: int, positions: list[int]) -> sampler.SamplingBatch:
    rows = [SamplingRow(Request(str(i), [1, 2, 3], p), i, pos) for i, (p, pos) in enumerate(zip(params, positions,
                                                                                                 strict=True))]
    return build_sampling_batch(rows, vocab, torch.device("cpu"), torch.Generator().manual_seed(0))


@pytest.mark.parametrize("vocab", sorted(GOLDEN))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_seed_draws_the_tokens_it_drew_before(vocab, case):
    """Seeded requests reproduce across versions: the same seed, position and logits draw the same token as the
    sampler of 0b8bf54a did, whichever path (whole row, kept tokens, greedy) each row takes now."""
    logits = torch.from_numpy(np.random.default_rng(vocab).standard_normal((6, vocab), dtype=np.float32) * 3)
    params = [SamplingParams(seed=seed, **CASES[case]) for seed in (0, 1, 2, 12345, 2**40 + 7, 99)]
    params[4] = SamplingParams(temperature=0)
    b = _batch(params, vocab, [0, 7, 40, 40, 3, 1000])
    assert sample(logits, b).token_ids.tolist() == GOLDEN[vocab][case]


def _whole_row_race(logits: torch.Tensor, b: sampler.SamplingBatch) -> list[int]:
    """The race by its definition, every row and token hashed: argmax of softmax / E over whole rows of the masked,
    scaled and truncated logits (greedy rows: the masked logits' argmax)."""
    masked = apply_token_masks(apply_bans(apply_logit_bias(logits.clone(), b), b), b)
    drawn = torch.softmax(sampling_logits(masked, b), dim=-1) / exponential_noise(b.seeds, b.positions,
                                                                                  logits.shape[1])
    return torch.where(b.temperature == 0, masked.argmax(dim=-1), drawn.argmax(dim=-1)).tolist()


class _HashSpy:
    """Records the shape of what each `sampler._noise_rows` call hashes (and still computes it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, ...]] = []
        real = sampler._noise_rows

        def counted(row_keys: torch.Tensor, token_keys: torch.Tensor, bits: torch.Tensor,
                    scratch: torch.Tensor) -> torch.Tensor:
            draws = real(row_keys, token_keys, bits, scratch)
            self.calls.append(tuple(draws.shape))
            return draws

        monkeypatch.setattr(sampler, "_noise_rows", counted)


def test_the_cpu_hashes_only_tokens_that_can_win(monkeypatch):
    """A greedy row is not hashed, nor a token of probability 0 in a row with few others (top-k 5 here): its p / E
    is 0 whatever E. A plain sampled row is hashed whole. The draws are the whole-row race's."""
    vocab = 49152
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3)) * 3
    spy = _HashSpy(monkeypatch)
    b = _batch([SamplingParams(temperature=0.9, top_k=5, seed=1), SamplingParams(temperature=0),
                SamplingParams(temperature=0.9, top_k=5, seed=2), SamplingParams(temperature=0.7, seed=3)],
               vocab, [5, 5, 6, 7])
    expected = _whole_row_race(logits, b)
    spy.calls.clear()
    assert sample(logits.clone(), b).token_ids.tolist() == expected
    assert spy.calls == [(10,), (1, vocab)]  # the two top-k rows' 5 + 5 tokens, then the plain row whole
    greedy = _batch([SamplingParams(temperature=0.8, seed=4), SamplingParams(temperature=0)], vocab, [1, 1])
    spy.calls.clear()
    sample(logits[:2].clone(), greedy)
    assert spy.calls == [(1, vocab)]


def test_every_path_draws_what_the_whole_row_race_draws(monkeypatch):
    """Random batches mixing greedy, plain, truncated, cold, restricted, NaN and all -inf rows, on fp32 and bf16
    (tied) logits, at vocabularies that are and are not a multiple of the vector width: the same tokens as the
    race over whole rows, with both the kept-token path and the whole-row path taken."""
    rng = random.Random(0)
    spy = _HashSpy(monkeypatch)
    kept_pairs = whole_rows = 0
    for case in range(120):
        vocab = rng.choice([50, 97, 1000, 4099, 49152])
        params, positions = [], []
        for _ in range(rng.randint(1, 7)):
            kw: dict = {"temperature": rng.choice([0, 0.05, 0.3, 0.8, 1.0, 2.0]),
                        "seed": rng.randint(0, 2**40) if rng.random() < 0.8 else None}
            if rng.random() < 0.4:
                kw["top_k"] = rng.choice([1, 2, 5, 50, vocab // 3])
            if rng.random() < 0.4:
                kw["top_p"] = rng.choice([0.1, 0.5, 0.9, 0.99])
            if rng.random() < 0.2:
                kw["min_p"] = rng.choice([0.01, 0.2])
            if rng.random() < 0.1:
                kw["allowed_token_ids"] = rng.sample(range(vocab), min(vocab, 5))
            params.append(SamplingParams(**kw))
            positions.append(rng.randint(0, 100))
        b = _batch(params, vocab, positions)
        logits = torch.randn(len(params), vocab, generator=torch.Generator().manual_seed(case)) * rng.choice([1, 3, 10])
        if rng.random() < 0.5:
            logits = logits.bfloat16().float()
        if rng.random() < 0.1:
            logits[0] = float("nan")
        if rng.random() < 0.1:
            logits[-1] = float("-inf")
        expected = _whole_row_race(logits, b)  # (its exponential_noise calls are counted too: reset after)
        spy.calls.clear()
        assert sample(logits.clone(), b).token_ids.tolist() == expected, case
        kept_pairs += sum(1 for shape in spy.calls if len(shape) == 1)
        whole_rows += sum(shape[0] for shape in spy.calls if len(shape) == 2)
    assert kept_pairs > 20 and whole_rows > 50
