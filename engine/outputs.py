"""What the engine hands back, shaped like vLLM's `RequestOutput`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One generated sequence of a request."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    # Per generated token: {token id: (logprob, rank)} for the drawn token and the top-N.
    logprobs: list[dict[int, tuple[float, int]]] | None = None


@dataclass
class RequestOutput:
    """A request's prompt and its outputs so far (final once `finished`)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    # Per prompt token (None for the first), as CompletionOutput.logprobs; when asked for.
    prompt_logprobs: list[dict[int, tuple[float, int]] | None] | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (usage's cached_tokens)
