"""Which steps and which requests speculate. Plain Python: the scheduler reads it."""

from __future__ import annotations

from flotilla.engine.bad_words import reads_output
from flotilla.engine.request import Request


def step_lookahead(num_speculative_tokens: int, disable_by_batch_size: int | None, num_running: int) -> int:
    """Draft slots per request for the next step: none above the load rule's batch size, where a
    verification pass costs more than the tokens it saves."""
    if disable_by_batch_size is not None and num_running >= disable_by_batch_size:
        return 0
    return num_speculative_tokens


def request_can_speculate(request: Request) -> bool:
    """Whether a request's drafts can be verified exactly here.

    Penalties read every earlier output token, so the logits of a draft position would need the
    drafts before it counted in; like vLLM, such requests decode one token per step instead (their
    output is the same either way). Bad words of several tokens read the output too (a ban depends on the
    tokens before it), so they decode one token per step as well; `allowed_token_ids` and one-token bad
    words forbid the same tokens at every position and speculate. A request whose prompt is still being
    forked (n > 1) waits until its completions run on their own.
    """
    return (not request.sampling_params.has_penalties and not reads_output(request.bad_words_token_ids)
            and not request.fork_children)
