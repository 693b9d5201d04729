"""A real Prometheus scrapes the server under load; PromQL by the vLLM names sees the right values."""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from ...observability.prometheus_server import Prometheus, engine_scrape, start_prometheus
from .conftest import API_KEY, free_port, wait_until_engine_idle

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed")


@pytest.fixture
def prometheus(server, tmp_path) -> Iterator[Prometheus]:
    p = start_prometheus(tmp_path, free_port(), engine_scrape(server.port, API_KEY))
    yield p
    p.stop()


def _poll(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.5)
    return None


def test_promql_by_vllm_names_under_load(server, prometheus):
    body = {"model": "tiny", "prompt": "Under load", "max_tokens": 120, "min_tokens": 120, "temperature": 0}
    errors: list[BaseException] = []
    done: list[int] = []
    stop = threading.Event()

    def client_loop() -> None:  # each client keeps one request in flight until told to stop
        while not stop.is_set():
            try:
                r = httpx.post(
                    f"{server.url}/v1/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {API_KEY}"},
                    timeout=300,
                )
                r.raise_for_status()
                done.append(1)
            except BaseException as exc:
                errors.append(exc)
                return

    wait_until_engine_idle(server)  # no earlier test's request finishing in between
    before = server.metric("vllm:request_success_total")
    ttft_before = server.metric("vllm:time_to_first_token_seconds_count")
    # The rate below needs a stored sample from before the load: under load, Prometheus's first scrape
    # came after the first tokens, every sample then held the final count and the rate was NaN.
    ttft_stored = "sum(vllm:time_to_first_token_seconds_count)"
    assert _poll(lambda: prometheus.scalar(ttft_stored) == ttft_before, timeout=60), "never scraped before the load"
    threads = [threading.Thread(target=client_loop) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        running = _poll(lambda: prometheus.scalar("sum(vllm:num_requests_running)"), timeout=60)
        time.sleep(3)  # a few more scrapes under load, so rates over the window have something to see
    finally:
        stop.set()
        for t in threads:
            t.join()
    targets = httpx.get(f"{prometheus.url}/api/v1/targets").json()["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
    assert not errors
    assert running and 1 <= running <= 8
    # Counters as Prometheus stores them, by their vLLM names, equal what the clients saw.
    expected = before + len(done)
    stored = _poll(lambda: prometheus.scalar("sum(vllm:request_success_total)") == expected)
    assert stored, (prometheus.scalar("sum(vllm:request_success_total)"), expected)
    generated = prometheus.scalar('sum(vllm:generation_tokens_total{model_name="tiny"})')
    assert generated >= len(done) * 120
    ttft_expected = ttft_before + len(done)
    count = _poll(lambda: prometheus.scalar(ttft_stored) == ttft_expected)
    assert count, "TTFT must be observed once per request"
    p99 = "histogram_quantile(0.99, sum by (le) (vllm:time_to_first_token_seconds_bucket))"
    ttft = prometheus.scalar(p99)
    assert ttft is not None and math.isfinite(ttft) and 0 < ttft < 60
    # A 5-minute window: on a loaded 2-core machine the last request can finish more than a minute
    # before this query, and a 1-minute rate over no increase is NaN.
    rate = "histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))"
    assert _poll(lambda: (v := prometheus.scalar(rate)) is not None and math.isfinite(v))
    assert _poll(lambda: prometheus.scalar("sum(vllm:num_requests_running)") == 0.0, timeout=15)
    labels = prometheus.query("vllm:cache_config_info")[0]["metric"]
    assert labels["block_size"] == "8" and labels["enable_prefix_caching"] == "True"
    assert labels["calculate_kv_scales"] == "False"
