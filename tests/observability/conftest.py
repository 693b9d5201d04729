"""A real engine under load, scraped by a real Prometheus (Debian's) with the chart's rules loaded.

The engine serves the tiny random Llama (fast on 2 cores) with a small KV pool, so the load produces
queueing, preemptions and prefix-cache hits. Prometheus scrapes it as three targets, labelled by
relabeling exactly as the Prometheus Operator does for the operator's ServiceMonitor (namespace and
pod from the endpoints, `serving_flotilla_dev_inferenceservice` from the Service label through
targetLabels): two pods of InferenceService `smollm2` and one of `other`, all in namespace `demo`.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from .prometheus_server import Prometheus, start_prometheus

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "flotilla" / "files" / "rules.yaml"
DASHBOARD = REPO / "charts" / "flotilla" / "dashboards" / "flotilla.json"
NAMESPACE, SERVICE, OTHER = "demo", "smollm2", "other"
PODS = {"smollm2-7d9f-a": SERVICE, "smollm2-7d9f-b": SERVICE, "other-5c4b-a": OTHER}
MODEL = "tiny"
ISVC_LABEL = "serving_flotilla_dev_inferenceservice"
MAX_NUM_SEQS, CLIENTS = 4, 8


def _server_helpers() -> Any:
    """tests/engine/server/conftest.py (start_server, stop_server, free_port), loaded by path."""
    path = REPO / "tests" / "engine" / "server" / "conftest.py"
    spec = importlib.util.spec_from_file_location("flotilla_tests_server_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


helpers = _server_helpers()
free_port = helpers.free_port


def scrape_config(engine_port: int) -> dict[str, Any]:
    """One job, three targets on one engine (their `pod` labels keep them apart); labels made by the
    relabeling rules the Prometheus Operator generates for the operator's ServiceMonitor."""
    targets = [{"targets": [f"127.0.0.1:{engine_port}"],
                "labels": {"__meta_kubernetes_namespace": NAMESPACE, "__meta_kubernetes_pod_name": pod,
                           "__meta_kubernetes_service_name": svc,
                           "__meta_kubernetes_service_label_serving_flotilla_dev_inferenceservice": svc}}
               for pod, svc in PODS.items()]
    relabel = [
        {"source_labels": ["__meta_kubernetes_service_label_serving_flotilla_dev_inferenceservice"],
         "regex": "(.+)", "target_label": ISVC_LABEL, "replacement": "${1}"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "container", "replacement": "engine"},
        {"target_label": "endpoint", "replacement": "http"},
    ]
    return {"job_name": "serviceMonitor/demo/smollm2/0", "scrape_interval": "1s", "static_configs": targets,
            "relabel_configs": relabel}


@dataclass
class Load:
    """Clients that each keep one request in flight (a shared long prefix, then a distinct tail)."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    done: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, clients: int) -> None:
        for i in range(clients):
            t = threading.Thread(target=self._loop, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)

    def _loop(self, i: int) -> None:
        prefix = "You are a helpful assistant. Answer briefly and precisely. " * 3
        n = 0
        while not self.stop.is_set():
            n += 1
            body = {"model": MODEL, "prompt": f"{prefix} Client {i}, question {n}.", "max_tokens": 96,
                    "min_tokens": 96, "temperature": 0}
            try:
                httpx.post(f"{self.url}/v1/completions", json=body, timeout=300).raise_for_status()
                self.done.append(1)
            except BaseException as exc:
                self.errors.append(exc)
                return

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(300)


def fast_rules(workdir: Path) -> Path:
    """The chart's rules, evaluated every second instead of every 30 s (expressions unchanged)."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    path = workdir / "rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


@dataclass
class Observed:
    """The engine, Prometheus, and the load still running while the tests query."""

    engine: Any
    prometheus: Prometheus
    load: Load
    since: float  # when the load started (Unix time): a range query's window can cover all the traffic


@pytest.fixture(scope="session")
def observed(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    """Engine + Prometheus + load, warmed until every series the rules and panels need exists."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("Debian's prometheus (and promtool) is not installed")
    work = tmp_path_factory.mktemp("observability")
    engine = helpers.start_server(
        tiny_model_dirs["llama"], work / "engine.log", "--served-model-name", MODEL, "--max-model-len", "256",
        "--block-size", "8", "--num-gpu-blocks-override", "48", "--max-num-seqs", str(MAX_NUM_SEQS),
        "--disable-log-stats")
    prometheus = start_prometheus(work, free_port(), scrape_config(engine.port), [fast_rules(work)])
    load = Load(engine.url)
    since = time.time()
    load.start(CLIENTS)
    try:
        needed = ["vllm:num_preemptions_total", "vllm:prefix_cache_hits_total", "vllm:request_success_total",
                  "inferenceservice:vllm_ttft_slo_errors:ratio_rate5m", "inferenceservice:vllm_num_preemptions:rate5m"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            missing = [m for m in needed if not prometheus.query(m)]
            # rate() needs two samples of a series in its window (Requests/s for one pod found none on a loaded
            # CI run): wait until every target was scraped twice and no engine series has fewer samples.
            stored = prometheus.query('{__name__=~"vllm:.+"}[1h]')  # every engine series and its samples
            thin = [s["metric"] for s in stored if len(s["values"]) < 2]
            if (not missing and prometheus.query("sum(rate(vllm:num_preemptions_total[1m])) > 0")
                    and load.done and {s["metric"]["pod"] for s in stored} == set(PODS) and not thin):
                break
            assert not load.errors, load.errors[:3]
            time.sleep(1)
        else:
            raise AssertionError(f"series still missing after 120 s: {missing}; with one sample: {thin[:3]}; "
                                 f"engine log:\n{(work / 'engine.log').read_text()[-2000:]}")
        yield Observed(engine, prometheus, load, since)
    finally:
        load.finish()
        prometheus.stop()
        helpers.stop_server(engine)
