"""Reconcile latency: the median time from applying an InferenceService to all of its children existing.

Printed on every run; written to bench/results/operator-reconcile-latency.json when
FLOTILLA_BENCH_RESULTS=1 (the committed figure comes from COMMAND below).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

from .test_operator_reconcile import child_path, fixed

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "bench" / "results" / "operator-reconcile-latency.json"
COMMAND = ("FLOTILLA_K8S_REQUIRED=1 FLOTILLA_BENCH_RESULTS=1 .venv/bin/pytest "
           "tests/operator/test_operator_latency.py -q -s")
APPLIES = 20
CHILDREN = ["Deployment", "Service", "PodDisruptionBudget"]


def test_median_reconcile_latency_over_20_applies(operator_process, cluster, namespace):
    samples = []
    for i in range(APPLIES):
        name = f"lat-{i}"
        paths = [child_path(kind, namespace, name) for kind in CHILDREN]
        start = time.perf_counter()
        cluster.apply(fixed(name, namespace))
        missing = list(paths)
        while missing:
            missing = [p for p in missing if cluster.kube.get(p) is None]
            assert time.perf_counter() - start < 30, f"{name}: {missing} still missing after 30 s"
            if missing:
                time.sleep(0.005)
        samples.append(time.perf_counter() - start)
    median = statistics.median(samples)
    print(f"\nreconcile latency (apply -> {', '.join(CHILDREN)} present), {APPLIES} applies: "
          f"median {median * 1000:.0f} ms, min {min(samples) * 1000:.0f} ms, max {max(samples) * 1000:.0f} ms")
    if os.environ.get("FLOTILLA_BENCH_RESULTS"):
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps({
            "command": COMMAND,
            "what": f"seconds from a server-side apply of an InferenceService (2 replicas, no autoscaling) to "
                    f"its {', '.join(CHILDREN)} all readable, polled every 5 ms; operator and test client on "
                    "the same machine as a kube-apiserver 1.20.2 + etcd 3.4 control plane",
            "applies": APPLIES,
            "median_s": round(median, 4),
            "min_s": round(min(samples), 4),
            "max_s": round(max(samples), 4),
            "samples_s": [round(s, 4) for s in samples],
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        }, indent=2) + "\n")
    assert median < 5, "reconcile is far slower than it should be"
