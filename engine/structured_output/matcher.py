"""One completion's position in its grammar: which tokens may come next, advanced token by token."""

from __future__ import annotations

import logging

import torch
import xgrammar as xgr

logger = logging.getLogger(__name__)


class RequestGrammar:
    """An xgrammar matcher for one completion (each of a request's `n` completions has its own)."""

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self.num_accepted = 0  # output tokens the matcher has consumed

    @property
    def is_terminated(self) -> bool:
        """True once the grammar is complete and a stop token has been accepted."""
        return self._matcher.is_terminated()

    def accept(self, tokens: list[int]) -> bool:
        """Advance over the output tokens not yet consumed (`tokens` is the whole output so far).

        False when a token breaks the grammar, which masked sampling rules out; a caller treats it
        as the request's error.
        """
        for token in tokens[self.num_accepted :]:
            if self._matcher.is_terminated():  # a token past the stop token (async scheduling): ignored
                self.num_accepted += 1
                continue
            if not self._matcher.accept_token(token):
                logger.error("token %d does not fit the grammar after %d tokens", token, self.num_accepted)
                return False
            self.num_accepted += 1
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (a terminated grammar leaves it all-allowed:
        its request is finished and the token is discarded)."""
        if not self._matcher.is_terminated():
            self._matcher.fill_next_token_bitmask(bitmask, row)
