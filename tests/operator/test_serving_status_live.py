"""Live serving figures and SLO autoscaling, end to end: the operator (a real process, conftest.py)
reads a real engine (the tiny random Llama on CPU) through a Pod on the test control plane, and a
real Prometheus (Debian's) scrapes the same engine with the chart's rules loaded.

Pods never run on the test control plane: a pod the Deployment's ReplicaSet made has its status
patched to Running with the engine's address as podIP (a loopback address of its own, the engine on
the operator's port 8000), which is what a kubelet would report. The operator reads every second over
a 5 s window (conftest.py's flags).
"""

from __future__ import annotations

import datetime
import importlib.util
import math
import random
import shutil
import sys
import threading
import time
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flotilla.operator.autoscaling import desired_replicas, keda_query
from flotilla.operator.names import HTTP_PORT
from flotilla.operator.spec import InferenceServiceSpec

from .conftest import FIS_PATH, REPO, SERVING_WINDOW_S, Cluster, OperatorProcess, wait_for

pytestmark = pytest.mark.slow

NAME, MODEL = "live", "tiny"
MAX_NUM_SEQS, CLIENTS = 2, 6
TARGET_S = 0.2  # TTFT p95 SLO: queueing behind 2 running requests breaks it, an idle engine keeps it
# How long a wait for a first token inside a 5 s window may take under load: several whole requests (see below).
FIRST_TOKENS_S = 240
SPEC = {"model": {"source": "pvc://models/tiny", "servedName": MODEL},
        "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "metric": "ttft_p95_seconds", "target": TARGET_S,
                        "window": "5s"}}


def _load_observability_helpers() -> Any:
    """tests/observability/conftest.py (start_prometheus, fast_rules, Load, the server helpers), by path.

    Loaded as a submodule of a package named for its folder, so that its relative imports (the shared
    Prometheus helpers beside it) resolve."""
    folder = REPO / "tests" / "observability"
    package = types.ModuleType("flotilla_tests_observability")
    package.__path__ = [str(folder)]
    sys.modules[package.__name__] = package
    spec = importlib.util.spec_from_file_location(f"{package.__name__}.conftest", folder / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


obs = _load_observability_helpers()


@dataclass
class Live:
    cluster: Cluster
    namespace: str
    engine: Any
    prometheus: Any
    pod: str

    def serving(self) -> dict[str, Any]:
        body = self.cluster.kube.get(f"{FIS_PATH}/namespaces/{self.namespace}/inferenceservices/{NAME}")
        return (body or {}).get("status", {}).get("serving") or {}

    def engine_metric(self, name: str) -> float:
        return self.engine.metric(name)

    def promql(self, query: str) -> float | None:
        result = self.prometheus.query(query)
        return float(result[0]["value"][1]) if result else None


def _scrape_config(engine: Any, namespace: str, pod: str) -> dict[str, Any]:
    # The labels the Prometheus Operator's relabeling gives an engine pod of InferenceService `live`.
    labels = {"namespace": namespace, "pod": pod, "serving_flotilla_dev_inferenceservice": NAME}
    return {"job_name": f"serviceMonitor/{namespace}/{NAME}/0", "scrape_interval": "1s",
            "static_configs": [{"targets": [f"{engine.host}:{engine.port}"], "labels": labels}]}


def _pod_address() -> tuple[str, int]:
    """A loopback address of the engine's own, on the port the operator gives engines (it reads no other): the
    pod's IP, as a kubelet would report it."""
    return "127.{}.{}.{}".format(*(random.randint(1, 254) for _ in range(3))), HTTP_PORT


@pytest.fixture(scope="module")
def live(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, cluster: Cluster,
         _session_operator: OperatorProcess) -> Iterator[Live]:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus is not installed")
    work = tmp_path_factory.mktemp("serving-live")
    namespace = f"serving-live-{uuid.uuid4().hex[:6]}"
    cluster.kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    engine = obs.helpers.start_server(
        tiny_model_dirs["llama"], work / "engine.log", "--served-model-name", MODEL, "--max-model-len", "256",
        "--block-size", "8", "--num-gpu-blocks-override", "48", "--max-num-seqs", str(MAX_NUM_SEQS),
        "--disable-log-stats", address=_pod_address)
    prometheus = None
    try:
        kube = cluster.kube
        # Earlier tests may leave KEDA's CRD installed, and with it the operator renders a ScaledObject:
        # this module checks the HPA path, so the cluster has no KEDA here.
        cluster.set_optional_crds(False)
        kube.request("POST", f"{FIS_PATH}/namespaces/{namespace}/inferenceservices",
                     {"apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService",
                      "metadata": {"name": NAME}, "spec": SPEC})
        # The namespace's default ServiceAccount (which Pod admission wants) comes a moment after it.
        wait_for(lambda: kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"), 30,
                 "the default ServiceAccount")
        # One of the pods the Deployment's ReplicaSet made (the operator reads no other), reported Running at the
        # engine's address.
        pods = wait_for(lambda: kube.list(f"/api/v1/namespaces/{namespace}/pods",
                                          f"serving.flotilla.dev/inferenceservice={NAME}"), 60, "the engine pods")
        pod = sorted(p["metadata"]["name"] for p in pods)[0]
        kube.patch_status(f"/api/v1/namespaces/{namespace}/pods/{pod}",
                          {"phase": "Running", "podIP": engine.host, "podIPs": [{"ip": engine.host}]})
        prometheus = obs.start_prometheus(work, obs.free_port(), _scrape_config(engine, namespace, pod),
                                        [obs.fast_rules(work)])
        yield Live(cluster, namespace, engine, prometheus, pod)
    finally:
        if prometheus is not None:
            prometheus.process.terminate()
            prometheus.process.wait(20)
        obs.helpers.stop_server(engine)
        cluster.kube.delete(f"/api/v1/namespaces/{namespace}")


class _CounterTrace:
    """The engine's generation-token counter sampled every 0.25 s on a thread, by wall-clock time.

    status.serving's figure is a rate over the operator's own window, which ends at its last scrape
    (observedAt, truncated to the second) and may be seconds old under a loaded CI machine; the rate it
    is checked against must be the engine's over that same window, not over whatever window the test
    happens to measure next (a load on 2 cores is not steady enough for that)."""

    def __init__(self, live: Live) -> None:
        self.live = live
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.time(), self.live.engine_metric("vllm:generation_tokens_total")))
            self.stop.wait(0.25)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)

    def _at(self, t: float) -> float | None:
        for (t0, c0), (t1, c1) in zip(self.samples, self.samples[1:], strict=False):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
        return None

    def rates(self, observed_at: str, window_s: float) -> list[float]:
        """Engine rates over every window the operator's could have been: ending within 1.5 s of
        observedAt (scrape before the write, second truncation) and 1 s shorter than its length at most
        (its first scrape is the oldest one inside the window)."""
        end = datetime.datetime.strptime(observed_at, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.UTC).timestamp()
        out = []
        for e in (end + d / 4 for d in range(-6, 11)):
            for length in (window_s - 1, window_s - 0.5, window_s):
                a, b = self._at(e - length), self._at(e)
                if a is not None and b is not None:
                    out.append((b - a) / length)
        return out


def _reported(live: Live) -> dict[str, Any]:
    """status.serving once it reports the engine pod (before any load)."""
    # A wait, not a measure: alone this takes seconds, but at the end of the full suite (2026-12-03 s4,
    # engine core in its own process) it once took over 60 s; not understood, see the closing note.
    return wait_for(lambda: (s := live.serving()).get("scraped") == 1 and s, 180, "status.serving to appear")


def test_serving_figures_and_the_slo_autoscaler_follow_the_load(live: Live, operator_process: OperatorProcess,
                                                                ) -> None:
    before = _reported(live)
    assert [r["pod"] for r in before["replicas"]] == [live.pod]
    assert before["running"] == before["waiting"] == 0 and before["windowSeconds"] == SERVING_WINDOW_S

    # Under a load that breaks the SLO: 6 clients on an engine that runs 2 at a time.
    load = obs.Load(live.engine.url)
    trace = _CounterTrace(live)
    started = time.monotonic()
    load.start(CLIENTS)
    try:
        # A TTFT percentile over a 5 s window exists only while a first token falls inside it, and the waiting requests
        # get theirs only as running ones finish: on a loaded 2-core machine a 96-token request took ~40 s, so first
        # tokens came in pairs ~40 s apart (shake of 2026-12-06: the p95 query below read 0 throughout a 30 s wait).
        # The waits therefore span several whole requests.
        busy = wait_for(lambda: (s := live.serving()).get("ttftP95Seconds", 0) > TARGET_S
                        and s.get("generationTokensPerSecond", 0) > 0 and s, FIRST_TOKENS_S,
                        "status.serving to show the load")
        took = time.monotonic() - started
        # What /metrics says over the status's own window, next to what status says for it.
        time.sleep(SERVING_WINDOW_S)
        now = live.serving()
        assert not load.errors, load.errors[:3]
        assert 0 <= now["running"] <= MAX_NUM_SEQS and now["running"] + now["waiting"] <= CLIENTS
        assert now["replicas"][0]["pod"] == live.pod and now["scraped"] == 1 and now["unreachable"] == 0
        engine_rates = wait_for(lambda: trace.rates(now["observedAt"], now["windowSeconds"]), 30,
                                "the engine's counter to be sampled past observedAt")
        assert 0.5 * min(engine_rates) <= now["generationTokensPerSecond"] <= 2 * max(engine_rates), (
            now, engine_rates)
        assert 0 <= now["kvCacheUsagePercent"] <= 100
        # (A 5 s window under this load may hold no first token at all: then both are left out.)
        assert now.get("ttftP50Seconds", 0) <= now.get("ttftP95Seconds", math.inf)

        # The autoscaler's query (KEDA's, over the histogram buckets) reads above target, so the HPA
        # that KEDA drives wants more replicas; the HPA path's recorded series agrees.
        spec = InferenceServiceSpec.model_validate(SPEC)
        query = keda_query(spec, NAME, live.namespace)
        p95 = wait_for(lambda: (v := live.promql(query)) is not None and v > TARGET_S and v, FIRST_TOKENS_S,
                       f"{query} to exceed {TARGET_S}")
        assert desired_replicas(1, p95, TARGET_S, 1, 4) > 1
        recorded = f'inferenceservice:vllm_time_to_first_token_seconds:p95_1m{{namespace="{live.namespace}"}}'
        wait_for(lambda: (v := live.promql(recorded)) is not None and v > TARGET_S, 30,
                 f"{recorded} to exceed {TARGET_S}")
    finally:
        load.finish()
        trace.close()
    print(f"status.serving showed the load {took:.1f} s after it started: {busy}")

    # Idle: the figures fall back, and equal what /metrics says once nothing moves.
    wait_for(lambda: live.engine_metric("vllm:num_requests_running") == 0
             and live.engine_metric("vllm:num_requests_waiting") == 0, 60, "the engine to go idle")
    # (Histograms may take their last observations a moment after the token counter, so both are awaited.)
    idle = wait_for(lambda: (s := live.serving()).get("generationTokensPerSecond") == 0
                    and "ttftP95Seconds" not in s and "interTokenLatencyP95Seconds" not in s and s, 60,
                    "status.serving to fall back")
    assert idle["running"] == idle["waiting"] == 0
    kv = live.engine_metric("vllm:kv_cache_usage_perc")
    assert idle["kvCacheUsagePercent"] == round(100 * kv, 1)
    wait_for(lambda: live.promql(query) == 0, 30, f"{query} to read 0 idle")
    assert desired_replicas(4, 0.0, TARGET_S, 1, 4) == 1

    # Nothing moves: the status is not written again (its observedAt stays).
    time.sleep(3 * 1.0)
    assert live.serving()["observedAt"] == idle["observedAt"]


def test_operator_renders_an_hpa_on_the_external_slo_metric(live: Live, operator_process: OperatorProcess) -> None:
    hpa = wait_for(lambda: live.cluster.kube.get(
        f"/apis/autoscaling/v2beta2/namespaces/{live.namespace}/horizontalpodautoscalers/{NAME}"), 30, "the HPA")
    metric = hpa["spec"]["metrics"][0]
    assert metric["type"] == "External"
    assert metric["external"]["metric"] == {
        "name": "flotilla_ttft_p95_seconds",
        "selector": {"matchLabels": {"serving_flotilla_dev_inferenceservice": NAME}}}
    assert metric["external"]["target"] == {"type": "Value", "value": "200m"}
    assert math.isclose(float(hpa["spec"]["maxReplicas"]), 4)
