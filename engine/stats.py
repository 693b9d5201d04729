"""Counters and gauges the engine keeps for the metrics endpoint and the periodic log line."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """Cumulative counters and the latest step's gauges (names follow vLLM's metrics)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_steps: int = 0
    step_tokens: list[int] = field(default_factory=list)  # tokens per step since last read
