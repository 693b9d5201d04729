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
class FinishedGroup:
    """A request whose every completion has finished: what it asked for and the longest it got."""

    n: int
    max_tokens: int | None
    max_generation_tokens: int  # the longest of its n completions (vllm:request_max_num_generation_tokens)


@dataclass(frozen=True)
class EngineEvents:
    """Samples since the last drain."""

    ttft: tuple[float, ...] = ()
    inter_token: tuple[float, ...] = ()
    iteration_tokens: tuple[int, ...] = ()
    finished: tuple[FinishedRequest, ...] = ()
    finished_groups: tuple[FinishedGroup, ...] = ()


@dataclass(frozen=True)
class SpecDecodeCounts:
    """Cumulative speculative-decoding counters (vLLM V1's vllm:spec_decode_* meanings): requests-steps
    that carried drafts, draft tokens proposed, draft tokens accepted, and accepted ones per position."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a speculating request gets per step: 1 + accepted drafts per draft (vLLM's figure)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


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
    spec_decode: SpecDecodeCounts | None = None  # None without --speculative-config
    events: EngineEvents = EngineEvents()
    # Names of the LoRA adapters of running and waiting requests (vllm:lora_requests_info).
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()
    sleep_level: int | None = None  # sleep mode: the level the engine sleeps at (vllm:engine_sleep_state); None: awake


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
    finished_groups: deque[FinishedGroup] = field(default_factory=lambda: deque(maxlen=_MAX_EVENTS))
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
            finished_groups=tuple(self.finished_groups),
        )
        self._drained_steps = self.num_steps
        self.ttft.clear()
        self.inter_token.clear()
        self.finished.clear()
        self.finished_groups.clear()
        return events
