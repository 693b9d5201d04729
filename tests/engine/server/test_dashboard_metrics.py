"""The metric names that vLLM's Grafana dashboard, production-stack's dashboards and its router query
(issue 24, item 4): a real Prometheus scraping a real engine answers every query with series, and the
deprecated aliases carry the same values as their current names."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ...observability.prometheus_server import Prometheus, engine_scrape, start_prometheus
from .conftest import API_KEY, free_port
from .dashboard_queries import ALL_QUERIES, ROUTER_SAMPLES

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def _samples(server) -> dict[str, float]:
    """name{labels} -> value, parsed the way production-stack's router parses /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _by_name(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k.split("[", 1)[0] == name)


def _load(server, n: int = 3) -> None:
    for i in range(n):
        body = {"model": "tiny", "prompt": f"dashboards {i} " * 10, "max_tokens": 6, "min_tokens": 6}
        assert httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=120).status_code == 200


def test_aliases_equal_their_current_names_and_the_router_finds_its_samples(server):
    _load(server, 2)
    samples = _samples(server)
    for name in ROUTER_SAMPLES:
        assert any(k.split("[", 1)[0] == name for k in samples), name
    for alias, current in [("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
                           ("vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits_total"),
                           ("vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_queries_total"),
                           ("vllm:time_per_output_token_seconds_count", "vllm:inter_token_latency_seconds_count"),
                           ("vllm:time_per_output_token_seconds_sum", "vllm:inter_token_latency_seconds_sum")]:
        assert _by_name(samples, alias) == pytest.approx(_by_name(samples, current)), alias
    queries = _by_name(samples, "vllm:prefix_cache_queries_total")
    assert _by_name(samples, "vllm:gpu_prefix_cache_hit_rate") == pytest.approx(
        _by_name(samples, "vllm:prefix_cache_hits_total") / queries)
    assert _by_name(samples, "vllm:num_requests_swapped") == 0
    # Each finished request is observed once in the per-request histograms.
    finished = _by_name(samples, "vllm:request_success_total")
    for name in ("vllm:request_time_per_output_token_seconds_count", "vllm:request_max_num_generation_tokens_count"):
        assert _by_name(samples, name) == finished, name


def test_prompt_tokens_total_counts_cached_tokens_as_usage_does(server):
    body = {"model": "tiny", "prompt": "the same long prompt " * 8, "max_tokens": 1}
    before = _by_name(_samples(server), "vllm:prompt_tokens_total")
    usage = [httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=120).json()["usage"]
             for _ in range(2)]  # the second is mostly a prefix-cache hit
    after = _samples(server)
    assert _by_name(after, "vllm:prompt_tokens_total") - before == sum(u["prompt_tokens"] for u in usage)


@pytest.fixture
def prometheus(server, tmp_path) -> Iterator[Prometheus]:
    """A real Prometheus scraping the server every second; `endpoint` as a ServiceMonitor labels targets."""
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus is not installed (make system-deps)")
    p = start_prometheus(tmp_path, free_port(), engine_scrape(server.port, API_KEY, {"endpoint": "service-port"}))
    yield p
    p.stop()


def test_every_dashboard_query_returns_series_from_a_real_engine(server, prometheus):
    deadline = time.monotonic() + 30
    while not prometheus.query("vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.5)
    _load(server)  # requests inside the rate window, after a scrape
    texts = [q.replace("$model_name", "tiny").replace("$__rate_interval", "1m") for q in ALL_QUERIES]
    # A wait, not a window: rate() needs two scrapes after the load's series appeared, and a loaded machine can
    # stretch the 1 s scrapes apart (fixed 2 s and 3 s sleeps assumed they would not).
    deadline = time.monotonic() + 120
    while (empty := [q for q in texts if not prometheus.query(q)]) and time.monotonic() < deadline:
        time.sleep(1)
    assert not empty, empty
