"""`vllm:lora_requests_info`, as vLLM exposes it: a gauge whose labels name the adapters of the running
and waiting requests (comma-separated) and `--max-loras`, set to the time of the update.

Only the latest label set is kept (vLLM keeps every one it ever set): the names are the clients' choice
(which adapters they run together, and with runtime loading the names themselves), so old series would
grow /metrics and the scraper's series without bound, and an old series' value (its update time) says
nothing once a newer one exists."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from flotilla.engine.stats import StatsSnapshot


class LoRAInfoGauge:
    """The gauge, published from each stats snapshot (only when LoRA is enabled, as in vLLM)."""

    def __init__(self, registry: CollectorRegistry, max_loras: int) -> None:
        self.max_loras = str(max_loras)
        self._labels: tuple[str, str, str] | None = None  # the series published last
        self.gauge = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                           ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=registry)

    def publish(self, s: StatsSnapshot) -> None:
        """Set the series of the snapshot's adapter names to now (Unix seconds)."""
        # In the gauge's label order (max_lora, waiting, running); the new series is set before the old one goes,
        # so that a scrape in between never finds none.
        labels = (self.max_loras, ",".join(s.waiting_lora_adapters), ",".join(s.running_lora_adapters))
        self.gauge.labels(*labels).set_to_current_time()
        if self._labels is not None and self._labels != labels:
            self.gauge.remove(*self._labels)
        self._labels = labels
