"""A real Prometheus (Debian's) for tests: started on a scrape job, queried over its HTTP API.

Shared by the observability tests (the chart's rules and dashboard) and the engine server's metric tests
(vLLM's names, the published dashboards' queries).
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml


@dataclass
class Prometheus:
    """A running Prometheus and its HTTP API."""

    url: str
    process: subprocess.Popen

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant query's result vector (asserting the query itself succeeded)."""
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = at
        body = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=20).json()
        assert body["status"] == "success", (promql, body)
        return body["data"]["result"]

    def scalar(self, promql: str) -> float | None:
        """The first sample's value, or None when the query returns nothing."""
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def series_labels(self, match: str, label: str) -> set[str]:
        """What Grafana's label_values(match, label) lists."""
        body = httpx.get(f"{self.url}/api/v1/series", params={"match[]": match}, timeout=20).json()
        assert body["status"] == "success", body
        return {s[label] for s in body["data"] if label in s}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)


def engine_scrape(engine_port: int, api_key: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A job scraping one engine every second with its API key (the server's /metrics needs none, but a
    ServiceMonitor may send one), its target labelled with `labels`."""
    return {"job_name": "flotilla", "scrape_interval": "1s", "authorization": {"credentials": api_key},
            "static_configs": [{"targets": [f"127.0.0.1:{engine_port}"], "labels": labels or {}}]}


def _wait_ready(url: str, process: subprocess.Popen, log: Path, timeout: float = 120) -> bool:
    """True once Prometheus answers ready, False if it exited because its port was taken (a wait, not a timing
    assertion: a start on a loaded 2-core machine can take long)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = log.read_text()
            if "address already in use" in text:
                return False
            raise RuntimeError(f"prometheus exited with {process.returncode}:\n{text[-3000:]}")
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("prometheus did not become ready")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prometheus(workdir: Path, port: int, scrape: dict[str, Any], rule_files: list[Path] = ()) -> Prometheus:
    """Prometheus on 127.0.0.1:`port` with one scrape job and `rule_files`, its config checked by promtool,
    ready to answer; its data and log under `workdir`. The port was free when chosen, but something may take it
    before Prometheus binds it: then another free port (the returned `url` says which)."""
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                                      "rule_files": [str(p) for p in rule_files], "scrape_configs": [scrape]}))
    check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log = workdir / "prometheus.log"
    for attempt in range(3):
        port = port if attempt == 0 else _free_port()
        with log.open("w") as stderr:
            process = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--query.lookback-delta=30s"],
                stdout=subprocess.DEVNULL, stderr=stderr)
        url = f"http://127.0.0.1:{port}"
        try:
            if _wait_ready(url, process, log):
                return Prometheus(url, process)
        except RuntimeError:
            process.kill()
            raise
    raise RuntimeError(f"three free ports were taken before Prometheus bound them:\n{log.read_text()[-3000:]}")
