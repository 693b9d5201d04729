"""The `status.serving` block, and when it is worth writing (pure functions).

Figures are rounded to what a person reads in `kubectl get fis` (KV % to 0.1, latencies to the
millisecond), and a new block is written only when some figure moved by more than its threshold
(`Thresholds`), a pod came or went, or the last write is older than `max_age_s`. Fifty
InferenceServices read every few seconds would otherwise patch the API server with every scrape.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from flotilla.operator.serving_metrics import Figures
from flotilla.operator.status import ReplicaServing, ServingFigures, ServingStatus

_LATENCIES = ("ttftP50Seconds", "ttftP95Seconds", "interTokenLatencyP95Seconds")


class Thresholds(BaseModel):
    """How far a figure must move before status is written again."""

    requests: int = Field(default=1, ge=0, description="Running or waiting requests (absolute).")
    percent: float = Field(default=2.0, ge=0, description="KV-cache use and prefix hit rate, in points.")
    relative: float = Field(default=0.1, ge=0, description="Tokens/s and latencies: fraction of the old value.")
    max_age_s: float = Field(default=300.0, gt=0, description="Write at least this often, moved or not.")


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _figures(f: Figures) -> dict[str, Any]:
    pct = lambda v: None if v is None else round(100 * v, 1)  # noqa: E731
    return ServingFigures(
        running=f.running, waiting=f.waiting,
        kv_cache_usage_percent=pct(f.kv_cache_usage), prefix_cache_hit_rate_percent=pct(f.prefix_cache_hit_rate),
        generation_tokens_per_second=_round(f.generation_tokens_per_second, 1),
        ttft_p50_seconds=_round(f.ttft_p50_seconds, 3), ttft_p95_seconds=_round(f.ttft_p95_seconds, 3),
        inter_token_latency_p95_seconds=_round(f.inter_token_latency_p95_seconds, 3),
    ).model_dump(by_alias=True, exclude_none=True)


def build_serving(total: Figures, per_pod: dict[str, Figures], window_s: float, observed_at: str,
                  unreachable: int = 0) -> dict[str, Any]:
    """The status.serving block (camelCase, as written)."""
    replicas = [ReplicaServing.model_validate({"pod": pod, **_figures(f)}) for pod, f in sorted(per_pod.items())]
    block = ServingStatus.model_validate({
        **_figures(total), "windowSeconds": window_s, "observedAt": observed_at, "scraped": len(per_pod),
        "unreachable": unreachable, "replicas": [r.model_dump(by_alias=True, exclude_none=True) for r in replicas],
    })
    return block.model_dump(by_alias=True, exclude_none=True)


# Figures that are left out when unknown: a merge patch must name them (null) to remove a stale value.
_OPTIONAL = tuple(f.alias or name for name, f in ServingStatus.model_fields.items() if not f.is_required()
                  and name != "replicas")


def as_merge_patch(block: dict[str, Any]) -> dict[str, Any]:
    """`block` as a JSON merge patch of status.serving: unknown figures set to null, so a value
    written earlier (a p95 before the traffic stopped) is removed rather than kept."""
    return {**dict.fromkeys(_OPTIONAL), **block}


def _moved(old: dict[str, Any], new: dict[str, Any], t: Thresholds) -> bool:
    for key in ("running", "waiting"):
        if abs(new.get(key, 0) - old.get(key, 0)) >= max(t.requests, 1e-9):
            return True
    for key in ("kvCacheUsagePercent", "prefixCacheHitRatePercent"):
        if (key in old) != (key in new) or abs(new.get(key, 0.0) - old.get(key, 0.0)) > t.percent:
            return True
    for key in ("generationTokensPerSecond", *_LATENCIES):
        if (key in old) != (key in new):
            return True
        if key in new and abs(new[key] - old[key]) > t.relative * max(abs(old[key]), 1e-3):
            return True
    return False


def worth_writing(old: dict[str, Any] | None, new: dict[str, Any], age_s: float, thresholds: Thresholds) -> bool:
    """Whether `new` should replace the written block `old` (`age_s`: seconds since it was written)."""
    t = thresholds
    if old is None or age_s >= t.max_age_s:
        return True
    if (old.get("scraped"), old.get("unreachable")) != (new.get("scraped"), new.get("unreachable")):
        return True
    if _moved(old, new, t):
        return True
    before = {r["pod"]: r for r in old.get("replicas", [])}
    after = {r["pod"]: r for r in new.get("replicas", [])}
    return before.keys() != after.keys() or any(_moved(before[p], after[p], t) for p in after)
