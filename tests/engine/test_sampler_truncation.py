"""Top-k / top-p truncation (`apply_top_k_top_p`): the tokens it keeps, tied ones at the cut included, must be
those of the full-row sort it was first written as (`_by_full_sort`, the code of 48664cc), on every row shape:
per-row k and p, k >= V, p = 1, ties, -inf / NaN / +inf logits, probabilities that underflow to 0."""

from __future__ import annotations

import pytest
import torch

from flotilla.engine.sampler import apply_min_p, apply_top_k_top_p

_NEG_INF = float("-inf")


def _by_full_sort(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The definition: sort each row ascending (torch.sort, not stable), drop values below the k-th largest, then
    drop the sorted prefix whose cumulative softmax stays <= 1 - p (never the last position)."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    kth = sorted_logits.gather(1, (vocab - k).unsqueeze(1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, _NEG_INF)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1 - top_p).unsqueeze(1)
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, _NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _assert_same_bits(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit for bit (NaN payloads and -0.0 included): a kept token keeps its own logit, a dropped one is -inf."""
    mismatched = (got.view(torch.int32) != expected.view(torch.int32)).any(dim=1).nonzero().flatten().tolist()
    assert not mismatched, f"rows {mismatched[:10]} differ"


def test_top_k_keeps_every_token_tied_with_the_kth():
    logits = torch.tensor([[5.0, 3.0, 4.0, 3.0, 1.0, 3.0, 0.0]])
    got = apply_top_k_top_p(logits, torch.tensor([3]), torch.tensor([1.0]))
    assert torch.isinf(got[0]).nonzero().flatten().tolist() == [4, 6]


def _tied_cut_row(vocab: int, tied: list[int], seed: int) -> torch.Tensor:
    """One token at 4.0, the `tied` tokens at exactly 2.0 and the rest spread well below: a nucleus of mass 0.9
    takes the top token and only part of the tied group."""
    rest = torch.rand(vocab, generator=torch.Generator().manual_seed(seed)) * 2 - 8
    row = rest
    row[tied] = 2.0
    row[vocab // 2] = 4.0
    return row


@pytest.mark.parametrize("vocab", [64, 1000, 49152])
def test_top_p_cutting_through_tied_tokens_keeps_those_the_row_sort_places_last(vocab):
    # Today's rule, pinned: the cut falls inside the group of equal logits, and the survivors are the group's
    # tokens that torch.sort (ascending, unstable) puts after the cut: not the lowest ids, not the highest.
    tied = sorted({(i * 7919 + 11) % vocab for i in range(24)} - {vocab // 2})
    row = _tied_cut_row(vocab, tied, seed=vocab)
    probs = torch.softmax(row.double(), dim=0)
    kept_mass_of_top = probs[vocab // 2].item()
    # Keep the top token, then whole tied tokens from the top until the mass reaches p.
    per_tied = probs[tied[0]].item()
    need = 9  # tied tokens to keep
    p = kept_mass_of_top + (need - 0.5) * per_tied
    got = apply_top_k_top_p(row.unsqueeze(0), torch.tensor([0]), torch.tensor([p]))[0]
    kept_tied = [t for t in tied if got[t] == 2.0]
    assert len(kept_tied) == need
    order = row.sort().indices.tolist()
    placed_last = [t for t in order if t in set(tied)][-need:]
    assert sorted(kept_tied) == sorted(placed_last)
    # The same row inside a batch of others keeps the same tied tokens.
    batch = torch.stack([_tied_cut_row(vocab, tied, seed=s) for s in (1, 2)] + [row])
    got_in_batch = apply_top_k_top_p(batch, torch.zeros(3, dtype=torch.long), torch.full((3,), p))[2]
    _assert_same_bits(got_in_batch.unsqueeze(0), got.unsqueeze(0))


def _rows_of_every_kind(vocab: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch mixing what a step can hold: bf16-valued logits (ties everywhere, as a bf16 model's), coarse
    grids, fp32 noise, rows with banned (-inf) tokens, all -inf, NaN, +inf, a spread past exp's range; and each
    row its own k (off, small, tied at the k-th, >= V) and p (off, small, mid, near 1)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 4
    kinds = torch.arange(rows) % 10
    logits[kinds == 1] = logits[kinds == 1].bfloat16().float()
    logits[kinds == 2] = (logits[kinds == 2] * 2).round() / 2
    logits[kinds == 3] = (logits[kinds == 3] > 2).float()  # two values only
    banned = (torch.rand(rows, vocab, generator=g) < 0.6) & (kinds == 4).unsqueeze(1)
    logits[banned] = _NEG_INF
    logits[kinds == 5] = _NEG_INF
    logits[kinds == 6, 3] = float("nan")
    logits[kinds == 7, 5] = float("inf")
    logits[kinds == 8] = logits[kinds == 8] * 40  # exp underflows to 0 far below the max
    logits[kinds == 9] = logits[kinds == 9].bfloat16().float() * 10
    k_choices = torch.tensor([0, 1, 2, 5, 20, 50, 5000, vocab - 1, vocab, vocab + 7])
    p_choices = torch.tensor([1.0, 1.0, 0.9, 0.5, 0.99, 0.3, 0.95, 0.05, 0.999999])
    top_k = k_choices[torch.randint(len(k_choices), (rows,), generator=g)]
    top_p = p_choices[torch.randint(len(p_choices), (rows,), generator=g)]
    return logits, top_k, top_p


@pytest.mark.parametrize(("vocab", "rows", "seed"), [(50, 400, 0), (1000, 200, 1), (49152, 40, 2), (128256, 10, 3)])
def test_matches_the_full_sort_on_every_kind_of_row(vocab, rows, seed):
    logits, top_k, top_p = _rows_of_every_kind(vocab, rows, seed)
    _assert_same_bits(apply_top_k_top_p(logits.clone(), top_k, top_p), _by_full_sort(logits, top_k, top_p))


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.5])
def test_matches_the_full_sort_on_bf16_logits_with_one_k_and_p_for_the_batch(temperature):
    # A decode step of a bf16 model: tied logits around most cuts, the batch's rows sharing one k and p.
    g = torch.Generator().manual_seed(int(temperature * 10))
    raw = (torch.randn(32, 49152, generator=g) * 2.5).bfloat16().float()
    raw[:, :40] += torch.linspace(12, 4, 40)  # a head of likely tokens, as a language model's
    logits = raw / temperature
    for k, p in [(0, 0.9), (50, 1.0), (40, 0.8), (0, 0.95), (1000, 0.9)]:
        top_k, top_p = torch.full((32,), k), torch.full((32,), p)
        _assert_same_bits(apply_top_k_top_p(logits.clone(), top_k, top_p), _by_full_sort(logits, top_k, top_p))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_logits_of_other_float_types_give_the_full_sorts_tokens(dtype):
    # The runner hands float32 logits to the sampler, but the function is public: bfloat16 has no NumPy type.
    logits, top_k, top_p = _rows_of_every_kind(1000, 50, 5)
    logits = logits.to(dtype)
    got, expected = apply_top_k_top_p(logits.clone(), top_k, top_p), _by_full_sort(logits, top_k, top_p)
    assert torch.equal(got.isneginf(), expected.isneginf())
    kept = ~expected.isneginf()
    assert torch.equal(got[kept].nan_to_num(), expected[kept].nan_to_num())


def test_leaves_its_input_as_it_was():
    logits, top_k, top_p = _rows_of_every_kind(1000, 50, 7)
    before = logits.clone()
    apply_top_k_top_p(logits, top_k, top_p)
    _assert_same_bits(logits, before)


def test_an_empty_batch_gives_an_empty_batch():
    got = apply_top_k_top_p(torch.empty(0, 10), torch.empty(0, dtype=torch.long), torch.empty(0))
    assert got.shape == (0, 10)


def test_min_p_of_zero_leaves_every_row_as_it_was():
    # A batch with top-k or top-p but no min_p skips min-p's passes: which must change nothing, NaN rows included.
    logits, _, _ = _rows_of_every_kind(1000, 50, 8)
    _assert_same_bits(apply_min_p(logits.clone(), torch.zeros(50)), logits)
    with_one = torch.zeros(50)
    with_one[0] = 0.2
    expected = logits.clone()
    probs = torch.softmax(logits[0], dim=-1)
    expected[0] = logits[0].masked_fill(probs < probs.max() * 0.2, _NEG_INF)
    _assert_same_bits(apply_min_p(logits.clone(), with_one), expected)


@pytest.mark.parametrize("p", [0.9, 1.0])
def test_rows_without_a_finite_max_keep_top_k_alone_whatever_k(p):
    # NaN, +inf or all -inf: the softmax is NaN, top-p drops nothing; top-k still applies, k small or large.
    vocab = 10000
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(5))
    logits[0:2, 7] = float("nan")
    logits[2:4, 9] = float("inf")
    logits[4:6] = _NEG_INF
    top_k = torch.tensor([5000, 20, 9000, 3, 5000, 20])
    top_p = torch.full((6,), p)
    _assert_same_bits(apply_top_k_top_p(logits.clone(), top_k, top_p), _by_full_sort(logits, top_k, top_p))
