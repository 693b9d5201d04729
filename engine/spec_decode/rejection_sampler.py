"""Verification of proposed tokens: the rejection rule that keeps the target's distribution exact.

Every proposer here is deterministic given the sequence (the n-gram lookup, a draft model's argmax),
so a draft token d at a position is a point mass q = 1{d}. The standard speculative-sampling rule
(Leviathan et al., Chen et al.) then reads: accept d with probability p(d), where p is the target's
distribution at that position after every sampling parameter; on rejection draw from p with d
removed and renormalised. The output token is d with probability p(d), and x != d with probability
(1 - p(d)) * p(x) / (1 - p(d)) = p(x): exactly p. Greedy rows reduce to "accept while the target's
argmax equals the draft", so greedy output is token-identical to decoding without speculation.

A request with k drafts has k + 1 rows (one per draft position, then the bonus position after the
last draft); its output this step is the accepted prefix of the drafts plus the token of the first
row that was not accepted (the recovered token, or the bonus token when all k were accepted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flotilla.engine.sampler import (
    SamplerOutput,
    SamplingBatch,
    add_logprobs,
    apply_bans,
    apply_logit_bias,
    apply_penalties,
    apply_token_masks,
    exponential_noise,
    sampling_probs,
)

# Mixed into the seed for the acceptance coin, so that it is independent of the draw's noise.
_COIN_SALT = 0x5DEECE66D


@dataclass(frozen=True)
class DraftGroup:
    """One request's drafts in a step: its rows are `first_row` .. `first_row + len(draft_ids)`."""

    first_row: int
    draft_ids: tuple[int, ...]


def verify(logits: torch.Tensor, b: SamplingBatch, groups: list[DraftGroup]) -> SamplerOutput:
    """Draw every row of fp32 logits `[R, V]` and judge the draft rows.

    Rows outside any group's draft rows are drawn as `sample()` draws them (the bonus rows and the
    requests without drafts). `token_ids[r]` is a draft row's output token when all drafts before it
    were accepted: the draft itself if `accepted[r]`, else the recovered token.
    """
    logits = apply_bans(apply_logit_bias(logits, b), b)
    if b.any_penalties:  # rows of requests without drafts may have penalties (policy.request_can_speculate)
        logits = apply_penalties(logits, b)
    reported, logits = logits, apply_token_masks(logits, b)  # logprobs before the masks, as sample()'s
    rows, drafts = _draft_rows(groups, logits.device)
    greedy = logits.argmax(dim=-1)
    accepted = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    if b.all_greedy:
        tokens = greedy
        accepted[rows] = greedy[rows] == drafts
    else:
        tokens, accepted = _verify_random(logits, b, greedy, rows, drafts, accepted)
    out = SamplerOutput(token_ids=tokens, accepted=accepted)
    if b.max_logprobs is not None:  # the target's logprobs of whatever each row outputs
        add_logprobs(out, torch.log_softmax(reported, dim=-1), b.max_logprobs)
    return out


def _verify_random(
    logits: torch.Tensor,
    b: SamplingBatch,
    greedy: torch.Tensor,
    rows: torch.Tensor,
    drafts: torch.Tensor,
    accepted: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    is_greedy = b.temperature == 0
    probs = sampling_probs(logits, b)
    # A greedy row's distribution is the point mass on its argmax: the same rule then accepts exactly
    # the drafts equal to the argmax and recovers the argmax.
    probs = torch.where(is_greedy.unsqueeze(1), torch.nn.functional.one_hot(greedy, probs.shape[1]).float(), probs)
    noise = exponential_noise(b.seeds, b.positions, logits.shape[1])
    tokens = (probs / noise).argmax(dim=-1)
    if rows.numel():
        p_draft = probs[rows, drafts]
        coin = torch.exp(-exponential_noise(b.seeds ^ _COIN_SALT, b.positions, 1)[rows, 0])  # U(0, 1]
        ok = coin <= p_draft
        residual = _residual(probs[rows], drafts)
        recovered = (residual / noise[rows]).argmax(dim=-1)
        tokens[rows] = torch.where(ok, drafts, recovered)
        accepted[rows] = ok
    return tokens, accepted


def _residual(probs: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """What a rejected row draws from: its distribution without the draft token (unnormalised; the
    exponential race normalises)."""
    return probs.scatter(1, drafts.unsqueeze(1), 0.0)


def _draft_rows(groups: list[DraftGroup], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [g.first_row + j for g in groups for j in range(len(g.draft_ids))]
    drafts = [t for g in groups for t in g.draft_ids]
    return (
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(drafts, dtype=torch.long, device=device),
    )


def greedy_accepted(token_ids: list[int], groups: list[DraftGroup]) -> list[bool]:
    """`verify()`'s `accepted` for all-greedy rows, from their argmax ids on the host: a draft row is
    accepted when its argmax is the draft."""
    accepted = [False] * len(token_ids)
    for g in groups:
        for j, draft in enumerate(g.draft_ids):
            accepted[g.first_row + j] = token_ids[g.first_row + j] == draft
    return accepted


def accepted_prefix(token_ids: list[int], accepted: list[bool], group: DraftGroup) -> list[int]:
    """The tokens a group outputs: its accepted drafts, then the first non-accepted row's token."""
    m = 0
    while m < len(group.draft_ids) and accepted[group.first_row + m]:
        m += 1
    return token_ids[group.first_row : group.first_row + m + 1]
