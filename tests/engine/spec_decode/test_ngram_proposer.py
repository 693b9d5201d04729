"""Prompt lookup finds the longest repeated suffix and proposes what followed it."""

from __future__ import annotations

import numpy as np

from flotilla.engine.spec_decode.ngram_proposer import propose_ngram


def _propose(tokens: list[int], k: int, lo: int = 1, hi: int = 3) -> list[int]:
    return propose_ngram(np.array(tokens), k, lo, hi)


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
