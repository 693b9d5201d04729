"""One completion's position in its grammar: which tokens may come next, advanced token by token."""

from __future__ import annotations

import logging

import torch
import xgrammar as xgr

from flotilla.engine.structured_output.thinking import ThinkingMarkers

logger = logging.getLogger(__name__)


class RequestGrammar:
    """An xgrammar matcher for one completion (each of a request's `n` completions has its own)."""

    def __init__(self, compiled: xgr.CompiledGrammar, thinking: ThinkingMarkers | None = None) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self.num_accepted = 0  # output tokens the matcher has consumed (or passed over while thinking)
        # The reasoning parser's markers while the completion still thinks (thinking.py): until its `</think>` (or,
        # qwen3, a call opening), the matcher neither masks nor advances, and it starts at the token after it.
        # None: constrained from the first output token.
        self.thinking = thinking
        # Set once a bitmask allowed no token, a stop token included: the grammar has no sentence that goes on
        # from the text so far (`root ::= "a" b` with `b ::= b`, after "a"). The request's fault: its next token
        # cannot fit, and the caller refuses the request (a check of the start state alone cannot see this).
        self.dead_end = False

    @property
    def constraining(self) -> bool:
        """False while the completion thinks: its next token is free."""
        return self.thinking is None

    @property
    def is_terminated(self) -> bool:
        """True once the grammar is complete and a stop token has been accepted."""
        return self._matcher.is_terminated()

    def accept(self, tokens: list[int]) -> bool:
        """Advance over the output tokens not yet consumed (`tokens` is the whole output so far).

        False when a token breaks the grammar, which masked sampling rules out; a caller treats it
        as the request's error.
        """
        if self.thinking is not None:
            self._pass_thinking(tokens, self.thinking)
        for token in tokens[self.num_accepted :]:
            if self._matcher.is_terminated():  # a token past the stop token (async scheduling): ignored
                self.num_accepted += 1
                continue
            if not self._matcher.accept_token(token):
                if self.dead_end:  # expected: nothing could have fitted
                    return False
                logger.error("token %d does not fit the grammar after %d tokens", token, self.num_accepted)
                return False
            self.num_accepted += 1
        return True

    def _pass_thinking(self, tokens: list[int], markers: ThinkingMarkers) -> None:
        """Pass over the thinking tokens not yet seen; where the thinking ends, the grammar starts with the next."""
        end = markers.end_in(tokens, self.num_accepted)
        if end is None:
            self.num_accepted = len(tokens)
            return
        self.num_accepted, self.thinking = end + 1, None

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (a terminated grammar leaves it all-allowed:
        its request is finished and the token is discarded; so does a dead end, see `dead_end`, and so does a
        completion that still thinks)."""
        if self.constraining and not self._matcher.is_terminated():
            self._matcher.fill_next_token_bitmask(bitmask, row)
            if not bool(bitmask[row].any()):
                self.dead_end = True
                # All-allowed, as a row with every logit at -inf would sample from NaN probabilities.
                bitmask[row] = -1
