"""Verification of proposed tokens: the rejection rule that keeps the target's distribution exact.

Every proposer here is deterministic given the sequence (the n-gram lookup, a draft model's argmax),
so a draft token d at a position is a point mass q = 1{d}. The standard speculative-sampling rule
(Leviathan et al., Chen et al.) then reads: accept d with probability p(d), where p is the target's
distribution at that position after every sampling parameter; on rejection draw from p with d
removed and renormalised. For a point mass it has a coupled form: draw x from p exactly as the
sampler would without speculation (the same noise, keyed by seed and output position) and accept d
iff x == d. d is accepted with probability p(d), and the output token is x: exactly p. So every
position's token is the one decoding without speculation draws, which keeps a seeded request's tokens
the same whether a step speculates or not, i.e. whatever else runs (the load rule, the token budget,
the pool decide that). Greedy rows reduce to "accept while the target's argmax equals the draft".

A request with k drafts has k + 1 rows (one per draft position, then the bonus position after the
last draft); its output this step is the accepted prefix of the drafts plus the token of the first
row that was not accepted (its own draw, or the bonus token when all k were accepted).
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
    race,
    raw_values,
    reported_values,
    sampling_logits,
)


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
    raw = raw_values(logits, b)  # the logprobs as sample() reports them (--logprobs-mode)
    logits = apply_bans(apply_logit_bias(logits, b), b)
    if b.any_penalties:  # rows of requests without drafts may have penalties (policy.request_can_speculate)
        logits = apply_penalties(logits, b)
    logits = apply_token_masks(logits, b)
    rows, drafts = _draft_rows(groups, logits.device)
    accepted = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    drawn_from = None
    if b.all_greedy:
        tokens = logits.argmax(dim=-1)
        accepted[rows] = tokens[rows] == drafts
    else:
        drawn_from = sampling_logits(logits, b)
        tokens, accepted = _verify_random(drawn_from, b, logits, rows, drafts, accepted)
    out = SamplerOutput(token_ids=tokens, accepted=accepted)
    if b.max_logprobs is not None:  # the target's logprobs of whatever each row outputs
        add_logprobs(out, reported_values(b, raw, logits, drawn_from), b.max_logprobs, b.logprobs_mode)
    return out


def _verify_random(
    drawn_from: torch.Tensor,
    b: SamplingBatch,
    logits: torch.Tensor,
    rows: torch.Tensor,
    drafts: torch.Tensor,
    accepted: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Every row draws as `sample()` draws (greedy rows their argmax); a draft is accepted iff it was drawn.
    tokens = race(drawn_from, b)
    if b.any_greedy:
        tokens = torch.where(b.temperature == 0, logits.argmax(dim=-1), tokens)
    if rows.numel():
        accepted[rows] = tokens[rows] == drafts
    return tokens, accepted


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
