"""The operator's periodic resync at scale: N InferenceServices on a real kube-apiserver 1.20.2 + etcd 3.4.

    .venv/bin/python bench/operator_resync.py [--services 200] [--rounds 3] [--rtt-ms 0] [--concurrency N] \
        [--json out.json]

Starts a control plane of its own (scripts/k8s-control-plane.sh start, on free ports in a temporary directory;
`make k8s` builds it), installs the CRD, applies N InferenceServices (the Llama sample with 2 replicas and no
autoscaling: a Deployment, a Service and a PodDisruptionBudget each) and runs `handlers.resync_once`, the function
the operator's resync loop calls every --resync-seconds, on the real Reconciler: once to make the children (the
warm-up, as the first resync after a restart), then `--rounds` times on the converged objects, as every later one.

Reported per round: wall seconds, this process's CPU seconds (the operator's side: user + system), the apiserver
requests sent, and for every InferenceService the seconds from the round's start to the end of its reconcile (how
long one waits for its turn: median, p90, max). `--rtt-ms` puts a TCP relay in front of the apiserver that holds
every client-to-server chunk that long: an apiserver a network hop away, or a loaded one. `--concurrency` is passed
to resync_once only when given (the default is the operator's own).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slow_relay import through_relay  # noqa: E402  (the relay the operator's tests use too)

SCRIPT = REPO / "scripts" / "k8s-control-plane.sh"
CRD = REPO / "crds" / "inferenceservices.serving.flotilla.dev.yaml"
SAMPLE = REPO / "crds" / "samples" / "llama-3.1-8b-h200.yaml"
NAMESPACE = "resync-bench"
FIS_PATH = f"/apis/serving.flotilla.dev/v1alpha1/namespaces/{NAMESPACE}/inferenceservices"
APPLY = {"fieldManager": "bench", "force": "true"}


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free now."""
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@contextlib.contextmanager
def control_plane(run: Path) -> Iterator[Path]:
    """A fresh kube-apiserver + etcd (no controller manager: no pods are needed); yields its kubeconfig."""
    api, etcd, peer = free_ports(3)
    env = {**os.environ, "K8S_RUN": str(run), "API_PORT": str(api), "ETCD_PORT": str(etcd),
           "ETCD_PEER_PORT": str(peer), "K8S_CONTROLLERS": "0"}
    started = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=180)
    try:
        if started.returncode != 0:
            raise SystemExit(f"control plane did not start:\n{started.stdout}\n{started.stderr}")
        yield run / "kubeconfig"
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--services", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rtt-ms", type=float, default=0.0)
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    import kubernetes
    import urllib3

    from flotilla.operator import handlers
    from flotilla.operator.kube import Kube, KubeError
    from flotilla.operator.reconciler import Reconciler

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` still stops the control plane (finally)

    class CountingKube(Kube):
        """The operator's client, counting the requests it sends."""

        requests = 0

        def request(self, *a: Any, **kw: Any) -> dict[str, Any]:
            CountingKube.requests += 1  # an int += under the GIL may lose a count between threads: near enough
            return super().request(*a, **kw)

    class TimedReconciler(Reconciler):
        """The operator's reconciler, noting when each reconcile ends."""

        ends: ClassVar[dict[str, float]] = {}

        def reconcile(self, namespace: str, name: str) -> Any:
            try:
                return super().reconcile(namespace, name)
            finally:
                TimedReconciler.ends[name] = time.perf_counter()

    extra = {} if args.concurrency is None else {"concurrency": args.concurrency}
    with tempfile.TemporaryDirectory(prefix="resync-bench-") as tmp, control_plane(Path(tmp) / "run") as kubeconfig:
        admin = Kube(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))
        crd = yaml.safe_load(CRD.read_text())
        admin.request("PATCH", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
                      crd, APPLY, "application/apply-patch+yaml")
        admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        sample = yaml.safe_load(SAMPLE.read_text())
        spec = {**sample["spec"], "replicas": 2}
        spec.pop("autoscaling")
        spec.pop("monitoring")
        for i in range(args.services):
            name = f"is-{i:04d}"
            body = {"apiVersion": sample["apiVersion"], "kind": "InferenceService",
                    "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}
            for attempt in range(300):  # the CRD's resource is served a moment after discovery lists it: 404 till then
                try:
                    admin.request("PATCH", f"{FIS_PATH}/{name}", body, APPLY, "application/apply-patch+yaml")
                    break
                except KubeError as e:
                    if e.status != 404 or attempt == 299:
                        raise
                    time.sleep(0.1)

        config = kubeconfig
        if args.rtt_ms:
            _, config = through_relay(kubeconfig, args.rtt_ms / 1000, Path(tmp) / "relay")
        reconciler = TimedReconciler(CountingKube(kubernetes.config.new_client_from_config(config_file=str(config))))

        rounds = []
        for r in range(args.rounds + 1):
            TimedReconciler.ends.clear()
            CountingKube.requests = 0
            cpu0, t0 = cpu_s(), time.perf_counter()
            handlers.resync_once(reconciler, [NAMESPACE], **extra)
            wall, cpu = time.perf_counter() - t0, cpu_s() - cpu0
            waits = sorted(end - t0 for end in TimedReconciler.ends.values())
            row = {"round": "warm-up (children made)" if r == 0 else r, "wall_s": round(wall, 3),
                   "operator_cpu_s": round(cpu, 3), "requests": CountingKube.requests,
                   "reconciled": len(waits), "done_after_s": {
                       "median": round(statistics.median(waits), 3),
                       "p90": round(waits[int(0.9 * (len(waits) - 1))], 3), "max": round(waits[-1], 3)}}
            rounds.append(row)
            print(json.dumps(row), flush=True)
        children = len(admin.list(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"))
        assert children == args.services, f"{children} Deployments for {args.services} InferenceServices"

    steady = rounds[1:]
    result = {
        "command": " ".join([".venv/bin/python", "bench/operator_resync.py", *sys.argv[1:]]),
        "services": args.services, "rtt_ms": args.rtt_ms, "concurrency": args.concurrency,
        "rounds": rounds,
        "steady_wall_s_median": round(statistics.median(r["wall_s"] for r in steady), 3),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_1m_at_end": round(os.getloadavg()[0], 2)},
    }
    print(f"steady resync of {args.services}: median {result['steady_wall_s_median']} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
