"""Serving figures from engine `/metrics` scrapes (pure functions, no I/O).

An engine pod's `/metrics` (vLLM's names, Prometheus text format) is parsed into a `Scrape`: its
gauges, counters and the cumulative TTFT and inter-token-latency histograms. Two scrapes of one pod
taken a window apart give its figures over that window: requests running and waiting, KV-cache use,
prefix-cache hit rate, generation tokens/s, TTFT p50/p95 and inter-token latency p95. Replicas
are summed the way PromQL's `sum by (le) (rate(...))` does before `histogram_quantile`, so the
totals are what the dashboard and the autoscaler's query compute from the same series.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
_SUMMED = (RUNNING, WAITING, PREFIX_QUERIES, PREFIX_HITS, GENERATION_TOKENS)

# Cumulative histogram: (upper bound `le`, observations <= le), ascending, ending with +Inf.
Buckets = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Scrape:
    """One pod's `/metrics` at time `at` (seconds on any monotonic clock), summed over model names."""

    at: float
    values: dict[str, float]
    ttft: Buckets
    itl: Buckets


@dataclass(frozen=True)
class Figures:
    """What one replica, or all of them together, did over a window. None: not known (no traffic,
    or no earlier scrape to take a rate against)."""

    running: int
    waiting: int
    kv_cache_usage: float | None  # 0..1; the replicas' mean for a total
    prefix_cache_hit_rate: float | None  # 0..1
    generation_tokens_per_second: float | None
    ttft_p50_seconds: float | None
    ttft_p95_seconds: float | None
    inter_token_latency_p95_seconds: float | None


class MetricsFormatError(ValueError):
    """The body is not Prometheus text, or lacks the engine's gauges."""


def parse(text: str, at: float) -> Scrape:
    """A Scrape from an engine's `/metrics` body (classic Prometheus text format)."""
    values: dict[str, float] = {}
    hist: dict[str, dict[float, float]] = {TTFT: {}, ITL: {}}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _SUMMED or sample.name == KV_USAGE:
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
                    values[f"{sample.name}#n"] = values.get(f"{sample.name}#n", 0.0) + 1
                elif sample.name.endswith("_bucket") and sample.name[: -len("_bucket")] in hist:
                    le = float(sample.labels["le"])
                    series = hist[sample.name[: -len("_bucket")]]
                    series[le] = series.get(le, 0.0) + sample.value
    except (ValueError, KeyError, TypeError) as e:
        raise MetricsFormatError(f"not Prometheus text: {e}") from e
    # The engine image is its author's: a NaN or infinite value (or finite ones whose sum overflows) makes no figure,
    # and one such pod must cost only its own InferenceService its status.serving.
    numbers = [*values.values(), *(x for series in hist.values() for pair in series.items() for x in pair
                                   if x != math.inf)]
    if not all(math.isfinite(x) for x in numbers):
        raise MetricsFormatError("a sample value or bucket bound is NaN or infinite")
    if RUNNING not in values or WAITING not in values:
        raise MetricsFormatError(f"no {RUNNING} / {WAITING} series: not a vLLM-compatible engine")
    if KV_USAGE in values:  # one value per model name: the pod's figure is their mean
        values[KV_USAGE] /= values[f"{KV_USAGE}#n"]
    return Scrape(at=at, values={k: v for k, v in values.items() if not k.endswith("#n")},
                  ttft=tuple(sorted(hist[TTFT].items())), itl=tuple(sorted(hist[ITL].items())))


def _increase(new: float, old: float) -> float:
    # A counter that went down was reset (the engine restarted): it counted `new` since.
    return new - old if new >= old else new


def bucket_increase(new: Buckets, old: Buckets) -> Buckets:
    """Per-bucket increase from `old` to `new` (a reset, or changed bounds, counts `new` whole)."""
    before = dict(old)
    if set(before) != {le for le, _ in new} or any(count < before[le] for le, count in new):
        return new
    return tuple((le, count - before[le]) for le, count in new)


def sum_buckets(histograms: Iterable[Buckets]) -> Buckets:
    """Bucket-wise sum of histograms with the same bounds (`sum by (le)`)."""
    total: dict[float, float] = {}
    for buckets in histograms:
        for le, count in buckets:
            total[le] = total.get(le, 0.0) + count
    return tuple(sorted(total.items()))


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile of a cumulative histogram, as PromQL's histogram_quantile estimates it:
    linear within the bucket holding the rank, the lowest bucket starting at 0, and the highest
    finite bound when the rank falls in +Inf. None when nothing was observed."""
    if not buckets or buckets[-1][0] != math.inf or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for i, (le, count) in enumerate(buckets):
        if count >= rank:
            if le == math.inf:
                return buckets[i - 1][0] if i > 0 else None
            if i == 0 and le <= 0:
                return le
            return lower + (le - lower) * (rank - below) / (count - below) if count > below else le
        lower, below = le, count
    return None


@dataclass(frozen=True)
class Window:
    """A pod's scrapes at the start and end of a window (first is None until it has two)."""

    first: Scrape | None
    last: Scrape


def _rate(window: Window, name: str) -> float | None:
    if window.first is None or window.last.at <= window.first.at:
        return None
    return _increase(window.last.values.get(name, 0.0), window.first.values.get(name, 0.0)) / (
        window.last.at - window.first.at)


def _hit_rate(windows: list[Window]) -> float | None:
    rates = [(_rate(w, PREFIX_HITS), _rate(w, PREFIX_QUERIES)) for w in windows]
    hits = sum(h for h, q in rates if h is not None and q is not None)
    queries = sum(q for h, q in rates if h is not None and q is not None)
    return hits / queries if queries > 0 else None


def _increases(windows: list[Window], which: str) -> list[Buckets]:
    return [bucket_increase(getattr(w.last, which), getattr(w.first, which))
            for w in windows if w.first is not None]


def figures(windows: list[Window]) -> Figures:
    """Figures of one replica (one window) or of several together (summed, KV use averaged)."""
    kv = [w.last.values[KV_USAGE] for w in windows if KV_USAGE in w.last.values]
    tokens = [r for r in (_rate(w, GENERATION_TOKENS) for w in windows) if r is not None]
    ttft, itl = sum_buckets(_increases(windows, "ttft")), sum_buckets(_increases(windows, "itl"))
    return Figures(
        running=round(sum(w.last.values.get(RUNNING, 0.0) for w in windows)),
        waiting=round(sum(w.last.values.get(WAITING, 0.0) for w in windows)),
        kv_cache_usage=sum(kv) / len(kv) if kv else None,
        prefix_cache_hit_rate=_hit_rate(windows),
        generation_tokens_per_second=sum(tokens) if tokens else None,
        ttft_p50_seconds=histogram_quantile(0.5, ttft),
        ttft_p95_seconds=histogram_quantile(0.95, ttft),
        inter_token_latency_p95_seconds=histogram_quantile(0.95, itl),
    )


def window_of(history: list[Scrape], seconds: float) -> Window:
    """The window ending at the newest scrape and starting at the oldest one at most `seconds` older
    (as PromQL's rate over `[seconds]` uses the samples inside its range)."""
    last = history[-1]
    inside = [s for s in history[:-1] if last.at - s.at <= seconds + 1e-9]
    return Window(first=inside[0] if inside else None, last=last)
