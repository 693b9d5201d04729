"""`vllm:lora_requests_info`, as vLLM exposes it: a gauge whose labels name the adapters of the running
and waiting requests (comma-separated) and `--max-loras`, set to the time of the update."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from flotilla.engine.stats import StatsSnapshot


class LoRAInfoGauge:
    """The gauge, published from each stats snapshot (only when LoRA is enabled, as in vLLM)."""

    def __init__(self, registry: CollectorRegistry, max_loras: int) -> None:
        self.max_loras = str(max_loras)
        self.gauge = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                           ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=registry)

    def publish(self, s: StatsSnapshot) -> None:
        """Set the series of the snapshot's adapter names to now (Unix seconds)."""
        self.gauge.labels(max_lora=self.max_loras, waiting_lora_adapters=",".join(s.waiting_lora_adapters),
                          running_lora_adapters=",".join(s.running_lora_adapters)).set_to_current_time()
