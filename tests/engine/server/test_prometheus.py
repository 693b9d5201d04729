"""A real Prometheus scrapes the server under load; PromQL by the vLLM names sees the right values."""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from .conftest import API_KEY, free_port

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed")


@pytest.fixture
def prometheus(server, tmp_path) -> Iterator[str]:
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: flotilla\n"
        f"    authorization: {{credentials: {API_KEY}}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{server.port}']}}]\n"
    )
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def query(url: str, promql: str) -> list[dict]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def scalar(url: str, promql: str) -> float | None:
    result = query(url, promql)
    return float(result[0]["value"][1]) if result else None


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

    before = server.metric("vllm:request_success_total")
    ttft_before = server.metric("vllm:time_to_first_token_seconds_count")
    threads = [threading.Thread(target=client_loop) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        running = _poll(lambda: scalar(prometheus, "sum(vllm:num_requests_running)"), timeout=60)
        time.sleep(3)  # a few more scrapes under load, so rates over the window have something to see
    finally:
        stop.set()
        for t in threads:
            t.join()
    targets = httpx.get(f"{prometheus}/api/v1/targets").json()["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
    assert not errors
    assert running and 1 <= running <= 8
    # Counters as Prometheus stores them, by their vLLM names, equal what the clients saw.
    expected = before + len(done)
    stored = _poll(lambda: scalar(prometheus, "sum(vllm:request_success_total)") == expected)
    assert stored, (scalar(prometheus, "sum(vllm:request_success_total)"), expected)
    generated = scalar(prometheus, 'sum(vllm:generation_tokens_total{model_name="tiny"})')
    assert generated >= len(done) * 120
    ttft_expected = ttft_before + len(done)
    count = _poll(lambda: scalar(prometheus, "sum(vllm:time_to_first_token_seconds_count)") == ttft_expected)
    assert count, "TTFT must be observed once per request"
    p99 = "histogram_quantile(0.99, sum by (le) (vllm:time_to_first_token_seconds_bucket))"
    ttft = scalar(prometheus, p99)
    assert ttft is not None and math.isfinite(ttft) and 0 < ttft < 60
    # A 5-minute window: on a loaded 2-core machine the last request can finish more than a minute
    # before this query, and a 1-minute rate over no increase is NaN.
    rate = "histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))"
    assert _poll(lambda: (v := scalar(prometheus, rate)) is not None and math.isfinite(v))
    assert _poll(lambda: scalar(prometheus, "sum(vllm:num_requests_running)") == 0.0, timeout=15)
    labels = query(prometheus, "vllm:cache_config_info")[0]["metric"]
    assert labels["block_size"] == "8" and labels["enable_prefix_caching"] == "True"
