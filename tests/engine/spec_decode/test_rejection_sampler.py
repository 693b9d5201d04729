"""The acceptance rule keeps the target's distribution exact: a chi-square test over many seeded
draws, with a deliberately poor proposer; and every row draws exactly what the sampler draws."""

from __future__ import annotations

import pytest
import torch

from flotilla.engine.request import Request
from flotilla.engine.sampler import sample
from flotilla.engine.sampling_metadata import SamplingRow, build_sampling_batch
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.spec_decode.rejection_sampler import DraftGroup, accepted_prefix, greedy_accepted, verify
from flotilla.kernels.dispatch import greedy_tokens

VOCAB = 6
DRAWS = 6000
# 99.9th percentile of chi-square with VOCAB - 1 = 5 degrees of freedom.
CHI2_CRITICAL = 20.52
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0])


def _verify_one_draft(draft: int, temperature: float = 1.0, top_k: int = 0) -> tuple[list[int], list[bool]]:
    """DRAWS independent requests, each drafting `draft` after its last token: 2 rows per request."""
    rows = []
    # Unseeded: each row gets its own stream from the (seeded) generator.
    params = SamplingParams(temperature=temperature, top_k=top_k, max_tokens=8)
    for i in range(DRAWS):
        req = Request(f"r{i}", [1, 2, 3], params)
        rows += [SamplingRow(req, 2 * i, 0), SamplingRow(req, 2 * i + 1, 1)]
    batch = build_sampling_batch(rows, VOCAB, torch.device("cpu"), torch.Generator().manual_seed(0))
    groups = [DraftGroup(2 * i, (draft,)) for i in range(DRAWS)]
    out = verify(LOGITS.repeat(2 * DRAWS, 1), batch, groups)
    assert out.accepted is not None
    tokens, accepted = out.token_ids.tolist(), out.accepted.tolist()
    firsts = [accepted_prefix(tokens, accepted, g)[0] for g in groups]
    return firsts, [accepted[g.first_row] for g in groups]


def _chi_square(tokens: list[int], probs: torch.Tensor) -> float:
    observed = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
    expected = probs.double() * len(tokens)
    keep = expected > 0
    assert observed[~keep].sum() == 0, "a token of probability 0 was output"
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_poor_drafts_leave_the_distribution_exact():
    target = torch.softmax(LOGITS, dim=0)
    for draft in (5, 0):  # the least likely token (mostly rejected), the most likely (mostly accepted)
        firsts, accepted = _verify_one_draft(draft)
        assert _chi_square(firsts, target) < CHI2_CRITICAL
        rate = sum(accepted) / DRAWS
        assert abs(rate - float(target[draft])) < 0.03  # accepted with probability p(draft)


def test_truncated_distribution_is_the_one_verified():
    # top_k=2 at temperature 0.5: the draft outside the top 2 is never accepted or output.
    target = torch.softmax(LOGITS / 0.5, dim=0)
    target[2:] = 0
    target /= target.sum()
    firsts, accepted = _verify_one_draft(3, temperature=0.5, top_k=2)
    assert not any(accepted)
    assert _chi_square(firsts, target) < CHI2_CRITICAL


def test_every_row_draws_what_the_sampler_draws_and_a_draft_is_accepted_iff_drawn():
    """The coupled rule: a row's token is the one `sample()` draws for it (the same seed and position), so
    speculation never changes a seeded request's tokens; its draft is accepted exactly when drawn."""
    torch.manual_seed(0)
    rows = []
    for i in range(40):
        req = Request(f"s{i}", [1, 2], SamplingParams(temperature=[0.0, 0.5, 1.0, 2.0][i % 4], top_k=[0, 3][i % 2],
                                                      seed=i, max_tokens=8))
        rows += [SamplingRow(req, 3 * i + j, 5 + j) for j in range(3)]
    batch = build_sampling_batch(rows, VOCAB, torch.device("cpu"), torch.Generator())
    logits = torch.randn(len(rows), VOCAB) * 2
    groups = [DraftGroup(3 * i, (i % VOCAB, (i // 2) % VOCAB)) for i in range(40)]
    out = verify(logits.clone(), batch, groups)
    assert out.accepted is not None
    assert out.token_ids.tolist() == sample(logits.clone(), batch).token_ids.tolist()
    tokens, accepted = out.token_ids.tolist(), out.accepted.tolist()
    for g in groups:
        for j, draft in enumerate(g.draft_ids):
            assert accepted[g.first_row + j] == (tokens[g.first_row + j] == draft)
    assert 0 < sum(accepted) < 80  # some of each


def test_greedy_rows_accept_exactly_the_argmax():
    rows = []
    for i, _ in enumerate((0, 1)):
        req = Request(f"g{i}", [1], SamplingParams(temperature=0.0, max_tokens=8))
        rows += [SamplingRow(req, 3 * i + j, j) for j in range(3)]
    batch = build_sampling_batch(rows, VOCAB, torch.device("cpu"), torch.Generator())
    logits = torch.zeros(6, VOCAB)
    logits[torch.arange(6), torch.tensor([4, 1, 3, 4, 2, 5])] = 5.0  # argmax per row
    groups = [DraftGroup(0, (4, 1)), DraftGroup(3, (4, 0))]
    out = verify(logits, batch, groups)
    assert out.accepted is not None
    tokens, accepted = out.token_ids.tolist(), out.accepted.tolist()
    assert accepted_prefix(tokens, accepted, groups[0]) == [4, 1, 3]  # both accepted, then the bonus
    assert accepted_prefix(tokens, accepted, groups[1]) == [4, 2]  # second draft rejected: the argmax


TIE_VOCAB = 400
LOW, HIGH = 28, 314  # the two allowed tokens whose logits tied exactly in session 34's token_masks case


def _tied_logits(rows: int, dtype: torch.dtype) -> torch.Tensor:
    logits = torch.randn(rows, TIE_VOCAB, generator=torch.Generator().manual_seed(3)).clamp(max=3.0)
    logits[:, HIGH] = 5.0  # the later index written first: its position must not decide
    logits[:, LOW] = 5.0
    return logits.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mixed", [False, True], ids=["all-greedy", "beside-a-sampled-row"])
@pytest.mark.parametrize("allowed", [None, [7, HIGH, LOW]], ids=["free", "allowed_token_ids"])
def test_an_exact_tie_goes_to_the_lowest_index_in_every_greedy_pick(dtype, mixed, allowed):
    """Plain decoding (`greedy_tokens`, `sample`) and verification (`verify`, `greedy_accepted` on the host ids)
    break an exact tie of the top logits alike, at the lowest token id as torch.argmax and vLLM do: so a draft of
    the higher tied id is rejected and speculative decoding outputs what plain greedy decoding does."""
    greedy = SamplingParams(temperature=0.0, max_tokens=8, allowed_token_ids=allowed)
    rows = [SamplingRow(Request("g", [1], greedy), j, j) for j in range(3)]  # two drafts and the bonus row
    if mixed:
        rows.append(SamplingRow(Request("s", [1], SamplingParams(temperature=1.0, seed=5, max_tokens=8)), 3, 0))
    batch = build_sampling_batch(rows, TIE_VOCAB, torch.device("cpu"), torch.Generator())
    logits = _tied_logits(len(rows), dtype)
    plain = sample(logits.float(), batch).token_ids.tolist()
    assert plain[:3] == [LOW] * 3
    if not mixed and allowed is None:  # the model runner's argmax-only path, on bf16 logits as they come
        assert greedy_tokens(logits).tolist() == plain
    groups = [DraftGroup(0, (LOW, HIGH))]
    out = verify(logits.float(), batch, groups)
    assert out.accepted is not None
    assert out.token_ids.tolist() == plain
    assert out.accepted.tolist()[:2] == [True, False] == greedy_accepted(plain, groups)[:2]
    assert accepted_prefix(out.token_ids.tolist(), out.accepted.tolist(), groups[0]) == [LOW, LOW]
