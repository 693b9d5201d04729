"""Prompt lookup (n-gram) proposals: when the sequence's last n tokens occurred before, guess that
what followed them then follows them again. Costs no model pass; pays off on copy-heavy text
(editing, quoting, code refactors, retrieval answers).

Each request keeps an index of its n-grams (`NgramIndex`), extended with its new tokens only: a step's
proposal costs O(new tokens + k), not a scan of the whole sequence."""

from __future__ import annotations

import weakref
from array import array

from flotilla.engine.request import Request
from flotilla.engine.scheduler import ScheduledRequest, SchedulerOutput

_BITS = 32  # bits per token id in a packed n-gram key (ids are below 2^32)


class NgramProposer:
    """Proposes up to `k` tokens by matching the last n tokens, n from `max_n` down to `min_n`."""

    def __init__(self, k: int, min_n: int, max_n: int) -> None:
        self.k = k
        self.min_n = min_n
        self.max_n = max_n
        # Each request's index, dropped with the request.
        self._indexes: weakref.WeakKeyDictionary[Request, NgramIndex] = weakref.WeakKeyDictionary()

    def propose(self, plan: SchedulerOutput, speculating: list[ScheduledRequest]) -> list[list[int]]:
        """Up to each request's lookahead of tokens that may follow its known tokens."""
        del plan  # a lookup needs nothing but each request's own tokens
        drafts = []
        for s in speculating:
            request = s.request
            index = self._indexes.get(request)
            if index is None or index.length > request.num_tokens:  # new (or, never yet, a shortened sequence)
                index = self._indexes[request] = NgramIndex(self.min_n, self.max_n)
            index.extend(request.token_ids(index.length, request.num_tokens))
            start, end = index.proposal(min(s.num_lookahead, self.k))
            drafts.append(request.token_ids(start, end))
        return drafts


class NgramIndex:
    """Every n-gram (`min_n` <= n <= `max_n`) of a sequence but those that end at its last token, for the lookup of
    its suffix: per n, each n-gram's latest start, and per start the previous start of the same n-gram and its
    first one. The sequence itself is not kept; `proposal` gives a span of it."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.length = 0  # tokens taken in
        self._packed = 0  # the last max_n tokens, _BITS bits each (the latest the lowest)
        self._masks = {n: (1 << (_BITS * n)) - 1 for n in range(min_n, max_n + 1)}
        self._latest: dict[int, dict[int, int]] = {n: {} for n in self._masks}  # packed n-gram -> its latest start
        self._previous = {n: array("i") for n in self._masks}  # start -> the same n-gram's start before (-1: none)
        self._first = {n: array("i") for n in self._masks}  # start -> the same n-gram's first start

    def extend(self, tokens: list[int]) -> None:
        """Take in the sequence's next tokens."""
        packed, masks, length = self._packed, self._masks, self.length
        for token in tokens:
            if length:  # the n-grams ending at the token before this one are no longer the suffix
                last = length - 1
                for n, mask in masks.items():
                    start = last - n + 1
                    if start >= 0:
                        key = packed & mask
                        latest = self._latest[n]
                        before = latest.get(key, -1)
                        self._previous[n].append(before)
                        self._first[n].append(start if before < 0 else self._first[n][before])
                        latest[key] = start
            packed = ((packed << _BITS) | token) & masks[self.max_n]
            length += 1
        self._packed, self.length = packed, length

    def proposal(self, k: int) -> tuple[int, int]:
        """The span of the sequence that follows an earlier occurrence of its longest matching suffix (length
        `max_n` down to `min_n`): the latest occurrence followed by `k` tokens, else the earliest (the longest
        continuation there is); an empty span when none occurs."""
        length = self.length
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            latest = self._latest[n].get(self._packed & self._masks[n])
            if latest is None:
                continue
            start, previous = latest, self._previous[n]
            while start > length - n - k:  # at most k - 1 occurrences lack a full continuation
                start = previous[start]
                if start < 0:
                    start = self._first[n][latest]
                    break
            return start + n, min(start + n + k, length)
        return 0, 0


def propose_ngram(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The tokens `NgramIndex.proposal` picks for the whole sequence `tokens` (Python ints), indexed at once."""
    index = NgramIndex(min_n, max_n)
    index.extend(tokens)
    start, end = index.proposal(k)
    return tokens[start:end]
