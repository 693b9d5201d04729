"""Speculative-decoding metrics with vLLM V1's names: counters of drafts, draft tokens, accepted
tokens and accepted tokens per draft position, and the stats log's acceptance line."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter

from flotilla.engine.stats import SpecDecodeCounts

logger = logging.getLogger("flotilla.stats")


class SpecDecodeMetrics:
    """The four vllm:spec_decode_* counters, advanced from cumulative snapshots."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = ["model_name"]
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels,
                              registry=registry)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels,
                                    registry=registry)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels,
                                registry=registry)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                               "Accepted tokens per draft position.", [*labels, "position"], registry=registry)
        self._name = model_name
        self._last = SpecDecodeCounts()

    def update(self, counts: SpecDecodeCounts) -> None:
        """Add what a new snapshot's cumulative counts have beyond the last one's."""
        last, n = self._last, self._name
        for counter, now, before in (
            (self.drafts, counts.num_drafts, last.num_drafts),
            (self.draft_tokens, counts.num_draft_tokens, last.num_draft_tokens),
            (self.accepted, counts.num_accepted_tokens, last.num_accepted_tokens),
        ):
            if now > before:
                counter.labels(n).inc(now - before)
        for pos, now in enumerate(counts.accepted_per_pos):
            before = last.accepted_per_pos[pos] if pos < len(last.accepted_per_pos) else 0
            # Every position is exported from the start (0 until a draft there is accepted).
            self.per_pos.labels(n, str(pos)).inc(now - before)
        self._last = counts


def log_spec_decode(now: SpecDecodeCounts, last: SpecDecodeCounts | None) -> None:
    """vLLM's SpecDecoding log line over the interval: mean acceptance length, rates per position."""
    last = last or SpecDecodeCounts(accepted_per_pos=(0,) * len(now.accepted_per_pos))
    drafts = now.num_drafts - last.num_drafts
    if not drafts:
        return
    drafted = now.num_draft_tokens - last.num_draft_tokens
    accepted = now.num_accepted_tokens - last.num_accepted_tokens
    per_pos = [(a - b) / drafts for a, b in zip(now.accepted_per_pos, last.accepted_per_pos, strict=False)]
    logger.info(
        "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted: %d tokens, Drafted: %d tokens, "
        "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
        1 + accepted / drafts, accepted, drafted, ", ".join(f"{r:.3f}" for r in per_pos),
        100 * accepted / drafted if drafted else 0.0,
    )
