"""What the engine measures: cumulative counters, the latest gauges, and per-event samples.

The server's Prometheus exporter drains the events after every step (`drain_events`); without a
consumer (offline use) the event buffers are bounded so they never grow without limit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

_MAX_EVENTS = 100_000


@dataclass
class FinishedRequest:
    """Timings and sizes of one finished request (its first completion), for the histograms."""

    finish_reason: str
    prompt_tokens: int
    generation_tokens: int
    e2e_seconds: float
    queue_seconds: float
    prefill_seconds: float
    decode_seconds: float


@dataclass
class EngineEvents:
    """Samples since the last drain."""

    ttft: list[float] = field(default_factory=list)
    inter_token: list[float] = field(default_factory=list)
    iteration_tokens: list[int] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)


@dataclass
class EngineStats:
    """Cumulative counters (names follow vLLM's metrics); gauges are read live from the scheduler."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_steps: int = 0
    step_tokens: deque[int] = field(default_factory=lambda: deque(maxlen=_MAX_EVENTS))
    ttft: deque[float] = field(default_factory=lambda: deque(maxlen=_MAX_EVENTS))
    inter_token: deque[float] = field(default_factory=lambda: deque(maxlen=_MAX_EVENTS))
    finished: deque[FinishedRequest] = field(default_factory=lambda: deque(maxlen=_MAX_EVENTS))
    _drained_steps: int = 0

    def drain_events(self) -> EngineEvents:
        """Return and forget the samples recorded since the last call."""
        new_steps = min(self.num_steps - self._drained_steps, len(self.step_tokens))
        events = EngineEvents(
            ttft=list(self.ttft),
            inter_token=list(self.inter_token),
            iteration_tokens=list(self.step_tokens)[len(self.step_tokens) - new_steps :],
            finished=list(self.finished),
        )
        self._drained_steps = self.num_steps
        self.ttft.clear()
        self.inter_token.clear()
        self.finished.clear()
        return events
