"""Prompt lookup (n-gram) proposals: when the sequence's last n tokens occurred before, guess that
what followed them then follows them again. Costs no model pass; pays off on copy-heavy text
(editing, quoting, code refactors, retrieval answers)."""

from __future__ import annotations

import numpy as np

from flotilla.engine.scheduler import ScheduledRequest, SchedulerOutput


class NgramProposer:
    """Proposes up to `k` tokens by matching the last n tokens, n from `max_n` down to `min_n`."""

    def __init__(self, k: int, min_n: int, max_n: int) -> None:
        self.k = k
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, plan: SchedulerOutput, speculating: list[ScheduledRequest]) -> list[list[int]]:
        """Up to each request's lookahead of tokens that may follow its known tokens."""
        del plan  # a lookup needs nothing but each request's own tokens
        drafts = []
        for s in speculating:
            tokens = np.asarray(s.request.token_ids(0, s.request.num_tokens), dtype=np.int64)
            drafts.append(propose_ngram(tokens, min(s.num_lookahead, self.k), self.min_n, self.max_n))
        return drafts


def propose_ngram(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """The tokens after an earlier occurrence of the longest matching suffix (length `max_n` down to
    `min_n`): the latest occurrence followed by `k` tokens, else the earliest (the longest
    continuation there is); empty when none occurs."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        # Windows starting at 0 .. length-n-1: every earlier occurrence, not the suffix itself.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            full = hits[hits + n + k <= length]
            start = int(full[-1] if len(full) else hits[0]) + n
            return tokens[start : start + k].tolist()
    return []
