"""What the engine measures: cumulative counters, the latest gauges, and per-event samples.

Front ends read them only through `StatsSnapshot` (`LLMEngine.stats_snapshot()`), a frozen copy taken
on the engine thread: the server's metrics and stats log never touch the scheduler or the block manager.
Taking a snapshot drains the per-event samples; without a consumer (offline use) the event buffers are
bounded so they never grow without limit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice

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


@dataclass(frozen=True)
class EngineEvents:
    """Samples since the last drain."""

    ttft: tuple[float, ...] = ()
    inter_token: tuple[float, ...] = ()
    iteration_tokens: tuple[int, ...] = ()
    finished: tuple[FinishedRequest, ...] = ()


@dataclass(frozen=True)
class StatsSnapshot:
    """The engine as the server reports it, at one instant: gauges, cumulative counters (vLLM's metric
    meanings) and the samples recorded since the previous snapshot."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # 0..1
    num_gpu_blocks: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    events: EngineEvents = EngineEvents()
    # Names of the LoRA adapters of running and waiting requests (vllm:lora_requests_info).
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()


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
            ttft=tuple(self.ttft),
            inter_token=tuple(self.inter_token),
            # Only the newest steps, read from the right: a snapshot is taken every step, and copying
            # the whole (bounded, never cleared) deque would cost O(100k) per step once it is full.
            iteration_tokens=tuple(reversed(tuple(islice(reversed(self.step_tokens), new_steps)))),
            finished=tuple(self.finished),
        )
        self._drained_steps = self.num_steps
        self.ttft.clear()
        self.inter_token.clear()
        self.finished.clear()
        return events
