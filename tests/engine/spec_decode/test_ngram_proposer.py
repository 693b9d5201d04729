"""Prompt lookup finds the longest repeated suffix and proposes what followed it; a request's index takes in its new
tokens only, and proposes what a scan of the whole sequence does."""

from __future__ import annotations

import numpy as np
import pytest

from flotilla.engine.request import Request
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import ScheduledRequest, SchedulerOutput
from flotilla.engine.spec_decode.ngram_proposer import NgramProposer, propose_ngram


def _propose(tokens: list[int], k: int, lo: int = 1, hi: int = 3) -> list[int]:
    return propose_ngram(tokens, k, lo, hi)


def _scan(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """From the definition, by a scan of the whole sequence (the proposer before its index): the tokens after an
    earlier occurrence of the longest matching suffix, the latest occurrence followed by k tokens, else the
    earliest."""
    a, length = np.asarray(tokens, dtype=np.int64), len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(a[: length - 1], n)
        hits = np.flatnonzero((windows == a[length - n :]).all(axis=1))
        if len(hits):
            full = hits[hits + n + k <= length]
            start = int(full[-1] if len(full) else hits[0]) + n
            return tokens[start : start + k]
    return []


def test_proposes_what_followed_the_suffix_before():
    assert _propose([5, 6, 7, 8, 9, 1, 5, 6, 7], 3) == [8, 9, 1]


def test_longest_match_wins_over_a_later_shorter_one():
    # "6 7" occurred at 1 (followed by 8) and "7" alone later (followed by 3): the 2-gram decides.
    assert _propose([5, 6, 7, 8, 7, 3, 6, 7], 1, lo=1, hi=2) == [8]


def test_latest_occurrence_with_a_full_continuation():
    assert _propose([1, 2, 10, 11, 1, 2, 20, 21, 0, 1, 2], 2, lo=2, hi=2) == [20, 21]


def test_no_match_or_too_short_proposes_nothing():
    assert _propose([1, 2, 3, 4], 3) == []
    assert _propose([1, 2, 3, 1, 2], 3, lo=3, hi=3) == []
    assert _propose([7], 3) == []


def test_continuation_may_be_shorter_than_k():
    # No occurrence has 7 tokens after it: the earliest has the most.
    assert _propose([1, 2, 3, 1, 2, 3, 1, 2], 7, lo=2, hi=2) == [3, 1, 2, 3, 1, 2]


@pytest.mark.parametrize(("lo", "hi", "alphabet"), [(1, 3, 4), (2, 5, 3), (5, 5, 2), (1, 1, 6), (3, 4, 50_000)])
def test_a_request_indexed_step_by_step_gets_the_scans_proposals(lo, hi, alphabet, monkeypatch):
    # Random sequences over small alphabets repeat often (many occurrences, long matches); tokens come a few at a
    # time, as accepted drafts bring them; k varies with the lookahead the scheduler reserved.
    rng = np.random.default_rng(lo * 100 + hi * 10 + alphabet)
    proposer = NgramProposer(4, lo, hi)
    requests = [Request(str(i), rng.integers(0, alphabet, size=3).tolist(), SamplingParams()) for i in range(3)]
    read = []
    token_ids = Request.token_ids
    monkeypatch.setattr(Request, "token_ids", lambda self, s, e: read.append(e - s) or token_ids(self, s, e))
    for step in range(300):
        for r in requests:
            r.output_token_ids += rng.integers(0, alphabet, size=int(rng.integers(1, 4))).tolist()
        plan = [ScheduledRequest(r, 1, r.num_tokens - 1, True, num_lookahead=int(rng.integers(1, 6))) for r in requests]
        read.clear()
        drafts = proposer.propose(SchedulerOutput(scheduled=plan), plan)
        # Each request's new tokens (at most 3; its whole prompt at first) and its draft: nothing that grows.
        assert sum(read) <= len(requests) * ((3 + 3) if step == 0 else 3) + sum(len(d) for d in drafts)
        for s, got in zip(plan, drafts, strict=True):
            tokens = s.request.token_ids(0, s.request.num_tokens)
            assert got == _scan(tokens, min(s.num_lookahead, 4), lo, hi), (step, s.request.request_id)
