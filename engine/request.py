"""A request's state as it moves through the engine: tokens, progress and KV blocks."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from flotilla.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    """Where a request is in its life cycle."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        """True for the three terminal states."""
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)


@dataclass(eq=False)
class Request:
    """One generation request.

    `num_computed_tokens` counts the tokens whose K/V are in the cache. Prefill, chunked prefill,
    decode and recompute after preemption are all the same thing: feed the tokens from
    `num_computed_tokens` up to (at most) the end of `all_token_ids`; when the end is reached, the
    step produces the next token.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    prompt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    stop_reason: int | str | None = None

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then generated tokens."""
        return self.prompt_token_ids + self.output_token_ids

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens `start:end` of prompt-then-output, without concatenating the whole sequence."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    @property
    def finish_reason(self) -> str | None:
        """vLLM's finish_reason: "stop", "length", "abort", or None while running."""
        return self.status.value if self.status.finished else None
