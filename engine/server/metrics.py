"""Prometheus metrics with vLLM V1's names, types, labels and buckets.

Existing vLLM dashboards, KEDA scalers and routers read these unchanged. The names they still query
that vLLM has deprecated or kept from V0 (what `--show-hidden-metrics-for-version` brings back:
`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_{hits,queries}_total`,
`vllm:time_per_output_token_seconds`; and V0's `vllm:gpu_prefix_cache_hit_rate`,
`vllm:num_requests_swapped`) are served too, with the same values as their current names. Every
labelled series exists from the start, at zero. Served in the classic text
format (0.0.4) whatever the scraper asks for: with OpenMetrics, recent prometheus_client versions
rewrite the `vllm:` colons.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from flotilla.engine.config import EngineConfig
from flotilla.engine.server.lora_metrics import LoRAInfoGauge
from flotilla.engine.server.spec_decode_metrics import SpecDecodeMetrics, log_spec_decode
from flotilla.engine.stats import EngineEvents, StatsSnapshot

logger = logging.getLogger("flotilla.stats")

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
CONTENT_TYPE = CONTENT_TYPE_LATEST
# vllm:engine_sleep_state's sleep_state label for each sleep level (level 0, a pause only, sets none of them).
SLEEP_STATE_LABELS = {1: "weights_offloaded", 2: "discard_all"}


def one_two_five_buckets(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's token-count buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class EngineMetrics:
    """Owns the registry; `update(snapshot)` runs after every step, on the engine thread."""

    def __init__(self, config: EngineConfig, model_name: str) -> None:
        # vLLM exposes no `_created` series. prometheus_client's switch is process-wide; the metrics'
        # owner flips it, before its first metric exists, rather than an import doing so.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        r, labels, name = self.registry, ["model_name"], model_name
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).", labels, registry=r)
        cache = config.cache
        # vLLM labels it with every CacheConfig field; these are the ones this engine has (the hash algo: which
        # prefix-cache keys, so a scrape tells a sha256 pool from a builtin-hash one).
        info = Gauge("vllm:cache_config_info", "Information of the KV cache configuration.",
                     ["block_size", "cache_dtype", "calculate_kv_scales", "enable_prefix_caching",
                      "gpu_memory_utilization", "num_gpu_blocks", "prefix_caching_hash_algo"], registry=r)
        self._cache_info = (info, cache)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens processed.", labels, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix-cache tokens queried.", labels, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix-cache tokens hit.", labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative preemptions.", labels, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests.", [*labels, "finished_reason"], registry=r)
        self.lora_info = LoRAInfoGauge(r, config.lora.max_loras) if config.lora.enable_lora else None
        self.sleep_state = Gauge("vllm:engine_sleep_state", "Engine sleep state: awake 1 while awake, 0 asleep; "
                                 "weights_offloaded 1 at sleep level 1, discard_all 1 at level 2.",
                                 [*labels, "sleep_state"], registry=r)
        max_len = config.model.max_model_len
        h: dict[str, tuple[str, str, list[float] | list[int]]] = {
            "ttft": ("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS),
            "itl": ("vllm:inter_token_latency_seconds", "Time between output tokens.", ITL_BUCKETS),
            "e2e": ("vllm:e2e_request_latency_seconds", "End-to-end request latency.", REQUEST_LATENCY_BUCKETS),
            "queue": ("vllm:request_queue_time_seconds", "Time waiting before first scheduled.",
                      REQUEST_LATENCY_BUCKETS),
            "prefill": ("vllm:request_prefill_time_seconds", "Time in prefill.", REQUEST_LATENCY_BUCKETS),
            "decode": ("vllm:request_decode_time_seconds", "Time in decode.", REQUEST_LATENCY_BUCKETS),
            "prompt_len": ("vllm:request_prompt_tokens", "Prompt tokens per request.", one_two_five_buckets(max_len)),
            "gen_len": ("vllm:request_generation_tokens", "Generated tokens per request.",
                        one_two_five_buckets(max_len)),
            "iteration": ("vllm:iteration_tokens_total", "Tokens per engine step.",
                          [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]),
            "tpot": ("vllm:request_time_per_output_token_seconds", "Mean time per output token of each request.",
                     ITL_BUCKETS),
            "max_gen": ("vllm:request_max_num_generation_tokens",
                        "Longest generation among a request's n completions.", one_two_five_buckets(max_len)),
            "param_n": ("vllm:request_params_n", "The n request parameter.", [1, 2, 5, 10, 20]),
            "param_max_tokens": ("vllm:request_params_max_tokens", "The max_tokens request parameter.",
                                 one_two_five_buckets(max_len)),
            # Deprecated name of inter_token_latency_seconds (vLLM 0.11), still on its own dashboard.
            "itl_alias": ("vllm:time_per_output_token_seconds", "Time between output tokens (deprecated name).",
                          ITL_BUCKETS),
        }
        self.hist = {k: Histogram(n, d, labels, buckets=b, registry=r) for k, (n, d, b) in h.items()}
        # Each histogram's one series, looked up once: `labels()` takes a lock and builds a key per call, and the
        # inter-token histograms observe every running request's token every step (hundreds a step).
        self._series = {k: hist.labels(name) for k, hist in self.hist.items()}
        self._aliases(labels)
        self._name = name
        self._last = StatsSnapshot()
        self.spec_decode = SpecDecodeMetrics(r, name) if config.speculative is not None else None
        self._zero_series()

    def _aliases(self, labels: list[str]) -> None:
        """vLLM's deprecated and V0 names that dashboards and routers still query."""
        r = self.registry
        self.kv_usage_alias = Gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (1 = full; deprecated name).",
                                    labels, registry=r)
        self.prefix_queries_alias = Counter("vllm:gpu_prefix_cache_queries",
                                            "Prefix-cache tokens queried (deprecated name).", labels, registry=r)
        self.prefix_hits_alias = Counter("vllm:gpu_prefix_cache_hits", "Prefix-cache tokens hit (deprecated name).",
                                         labels, registry=r)
        self.prefix_hit_rate = Gauge("vllm:gpu_prefix_cache_hit_rate",
                                     "Prefix-cache hit rate since start, hits over queried tokens (V0 name).",
                                     labels, registry=r)
        # Preemption recomputes; nothing is ever swapped. Kept at 0 for V0 dashboards and routers.
        self.swapped = Gauge("vllm:num_requests_swapped", "Requests swapped to CPU (always 0: no swapping).",
                             labels, registry=r)

    def _zero_series(self) -> None:
        """Every series with its labels at zero from the start, as vLLM does: a rate() over a counter
        that appears only at its first event misses that event."""
        n = self._name
        for metric in (self.running, self.waiting, self.kv_usage, self.prompt_tokens, self.generation_tokens,
                       self.prefix_queries, self.prefix_hits, self.preemptions, self.kv_usage_alias,
                       self.prefix_queries_alias, self.prefix_hits_alias, self.prefix_hit_rate, self.swapped,
                       *self.hist.values()):
            metric.labels(n)
        for reason in ("stop", "length", "abort"):
            self.success.labels(n, reason)
        self._set_sleep_state(None)

    def _publish_cache_info(self, num_blocks: int) -> None:
        """vllm:cache_config_info, once the pool size is known (the first snapshot, before serving)."""
        info, cache = self._cache_info
        info.labels(block_size=str(cache.block_size), cache_dtype=cache.kv_cache_dtype,
                    calculate_kv_scales=str(cache.calculate_kv_scales),
                    enable_prefix_caching=str(cache.enable_prefix_caching),
                    gpu_memory_utilization=str(cache.gpu_memory_utilization),
                    num_gpu_blocks=str(num_blocks), prefix_caching_hash_algo=cache.prefix_caching_hash_algo).set(1)

    def update(self, s: StatsSnapshot) -> None:
        """Copy a snapshot's gauges, counters and samples into the registry (after a step, or idle)."""
        if self.lora_info is not None:
            self.lora_info.publish(s)
        if s.num_gpu_blocks != self._last.num_gpu_blocks:
            self._publish_cache_info(s.num_gpu_blocks)
        self._set_gauges(s)
        self._advance_counters(s, self._last)
        self._last = s
        if self.spec_decode is not None and s.spec_decode is not None:
            self.spec_decode.update(s.spec_decode)
        self._observe(s.events)

    def _set_gauges(self, s: StatsSnapshot) -> None:
        """Running, waiting and KV use as the scheduler held them (also between steps, after aborts), and the
        prefix cache's hit rate once it has been asked."""
        n = self._name
        self.running.labels(n).set(s.num_running)
        self.waiting.labels(n).set(s.num_waiting)
        self.kv_usage.labels(n).set(s.kv_cache_usage)
        self.kv_usage_alias.labels(n).set(s.kv_cache_usage)
        if s.prefix_cache_queries:
            self.prefix_hit_rate.labels(n).set(s.prefix_cache_hits / s.prefix_cache_queries)
        self._set_sleep_state(s.sleep_level)

    def _set_sleep_state(self, level: int | None) -> None:
        """vllm:engine_sleep_state's three series: awake, or the level asleep at (level 0 sets none of them)."""
        n = self._name
        self.sleep_state.labels(n, "awake").set(level is None)
        for label_level, label in SLEEP_STATE_LABELS.items():
            self.sleep_state.labels(n, label).set(level == label_level)

    def _advance_counters(self, s: StatsSnapshot, last: StatsSnapshot) -> None:
        """Add what the snapshot's cumulative counts gained since `last` to the counters (and their aliases)."""
        n = self._name
        for counters, now, before in (
            ((self.prompt_tokens,), s.prompt_tokens, last.prompt_tokens),
            ((self.generation_tokens,), s.generation_tokens, last.generation_tokens),
            ((self.prefix_queries, self.prefix_queries_alias), s.prefix_cache_queries, last.prefix_cache_queries),
            ((self.prefix_hits, self.prefix_hits_alias), s.prefix_cache_hits, last.prefix_cache_hits),
            ((self.preemptions,), s.num_preemptions, last.num_preemptions),
        ):
            if now > before:
                for counter in counters:
                    counter.labels(n).inc(now - before)

    def _observe(self, events: EngineEvents) -> None:
        """The samples recorded since the last snapshot into the histograms; finished requests' reasons into the
        success counter."""
        h = self._series
        for value in events.ttft:
            h["ttft"].observe(value)
        itl, itl_alias = h["itl"], h["itl_alias"]
        for value in events.inter_token:
            itl.observe(value)
            itl_alias.observe(value)
        for g in events.finished_groups:
            h["max_gen"].observe(g.max_generation_tokens)
            h["param_n"].observe(g.n)
            if g.max_tokens is not None:
                h["param_max_tokens"].observe(g.max_tokens)
        for value in events.iteration_tokens:
            h["iteration"].observe(value)
        for f in events.finished:
            self.success.labels(self._name, f.finish_reason).inc()
            for key, value in (("e2e", f.e2e_seconds), ("queue", f.queue_seconds), ("prefill", f.prefill_seconds),
                               ("decode", f.decode_seconds), ("prompt_len", f.prompt_tokens),
                               ("gen_len", f.generation_tokens)):
                h[key].observe(value)
            # vLLM's per-request mean: decode time over the tokens after the first (0 for one token).
            tpot = f.decode_seconds / (f.generation_tokens - 1) if f.generation_tokens > 1 else 0.0
            h["tpot"].observe(tpot)

    def render(self) -> bytes:
        """The registry in Prometheus' classic text format."""
        return generate_latest(self.registry)


class StatsLogger:
    """Logs running, waiting, KV use, prefix hit rate and token rates every `interval` seconds."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self._last_time = time.monotonic()
        self._last = StatsSnapshot()

    def maybe_log(self, s: StatsSnapshot) -> None:
        """Emit the line if the interval has passed."""
        now = time.monotonic()
        elapsed = now - self._last_time
        if elapsed < self.interval:
            return
        last = self._last
        idle = not s.num_running and not s.num_waiting
        if idle and s.generation_tokens == last.generation_tokens and s.prompt_tokens == last.prompt_tokens:
            return  # nothing happened: no line
        queries = s.prefix_cache_queries - last.prefix_cache_queries
        hits = s.prefix_cache_hits - last.prefix_cache_hits
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
            "Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
            (s.prompt_tokens - last.prompt_tokens) / elapsed, (s.generation_tokens - last.generation_tokens) / elapsed,
            s.num_running, s.num_waiting, 100 * s.kv_cache_usage, 100 * hits / queries if queries else 0.0,
        )
        if s.spec_decode is not None:
            log_spec_decode(s.spec_decode, last.spec_decode)
        self._last_time = now
        self._last = s
