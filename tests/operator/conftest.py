"""Fixtures for the operator's tests: the InferenceService CRD on the control plane and the operator
as a subprocess. The control plane itself and the generic helpers live in tests/k8s_fixtures.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .. import k8s_fixtures
from ..k8s_fixtures import REPO, SCHEMA_VERSIONS, Cluster, ControlPlane, free_port, free_ports, wait_for  # noqa: F401

# The shared fixtures, instantiated for this directory (its own control plane).
control_plane = k8s_fixtures.control_plane
kube_api = k8s_fixtures.kube_api
namespace = k8s_fixtures.namespace
validate_manifest = k8s_fixtures.validate_manifest
pytest_configure = k8s_fixtures.pytest_configure

# --- the operator on the control plane ------------------------------------------------------------

CRD_FILE = REPO / "crds" / "inferenceservices.serving.flotilla.dev.yaml"
WEBHOOK_CONFIGURATION = "flotilla.serving.flotilla.dev"
FIS_PATH = "/apis/serving.flotilla.dev/v1alpha1"
HOST_PATH_PREFIX = "/models"
SERVING_PERIOD_S, SERVING_WINDOW_S = 1.0, 5.0
# The admin's engine image, as the chart always passes one (--engine-image).
ENGINE_IMAGE = "registry.local/flotilla-engine:mirror"


@pytest.fixture(scope="session")
def cluster(kube_api: Any) -> Cluster:
    """The control plane with the InferenceService CRD installed."""
    from flotilla.operator.kube import Kube

    c = Cluster(Kube(kube_api))
    c.apply_crd(yaml.safe_load(CRD_FILE.read_text()))
    return c


# What kopf's servers (liveness, webhook) log when their port is taken (asyncio's bind error).
PORT_TAKEN = "address already in use"


class _PortTaken(AssertionError):
    """The operator could not bind its liveness or webhook port."""


class OperatorProcess:
    """`python -m flotilla.cli operator` as a real subprocess, so it can be SIGKILLed and restarted."""

    def __init__(self, control_plane: ControlPlane, cluster: Cluster, workdir: Path):
        self.control_plane, self.cluster, self.workdir = control_plane, cluster, workdir
        self.webhook_port, self.liveness_port = free_ports(2)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def start(self, webhook: bool = True, extra_args: tuple[str, ...] = (), kubeconfig: Path | None = None) -> None:
        """Start it and return once it serves: liveness answers and the webhook refuses a bad spec (with
        `webhook` False: --no-webhook, and liveness alone). `extra_args` come last (argparse: the last of a
        repeated option wins); `kubeconfig` replaces the admin's (an operator with fewer rights)."""
        for attempt in range(3):
            try:
                self._start_once(webhook, extra_args, kubeconfig)
                return
            except _PortTaken:
                # The ports were free when chosen, but the operator stopped in between (a test's stop or kill): any
                # outgoing connection on the machine may take one as its local port meanwhile, and then kopf cannot
                # bind it, stopping and restarting in-process for ever. Other free ports, then.
                self.stop()
                if attempt == 2:
                    raise
                self.webhook_port, self.liveness_port = free_ports(2)

    def _start_once(self, webhook: bool, extra_args: tuple[str, ...], kubeconfig: Path | None) -> None:
        self.starts += 1
        serving = (["--webhook-host", "127.0.0.1", "--webhook-listen", "127.0.0.1", "--webhook-port",
                    str(self.webhook_port), "--webhook-cert-dir", str(self.workdir / "certs")] if webhook
                   else ["--no-webhook"])
        command = [sys.executable, "-m", "flotilla.cli", "operator", *serving,
                   "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz", "--resync-seconds", "5",
                   # status.serving read every second over a 5 s window (test_serving_status_live.py).
                   "--serving-period", str(SERVING_PERIOD_S), "--serving-window", str(SERVING_WINDOW_S),
                   # The admin allows one node directory, so the corpus can try to escape it.
                   "--host-path-prefix", HOST_PATH_PREFIX, "--engine-image", ENGINE_IMAGE, *extra_args]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.control_plane.kubeconfig), "PYTHONWARNINGS": "ignore"}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        wait_for(self._serving if webhook else self._alive, 60, f"the operator to serve (log: {self.log_path})",
                 interval=0.2)

    def ensure_serving(self) -> None:
        """Start the operator again unless it is running and its webhook answers."""
        running = self.proc is not None and self.proc.poll() is None
        if running:
            try:
                wait_for(self._serving, 20, "the operator to serve", interval=0.2)
                return
            except AssertionError:
                pass
        self.stop()
        self.start()

    def _alive(self) -> bool:
        assert self.proc is not None
        if PORT_TAKEN in self.log_path.read_text(errors="replace"):
            raise _PortTaken(self.tail())
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            # Generous: on a loaded 2-core machine kopf's event loop may take seconds to answer, and a test may ask
            # once (test_optional_kinds.py) where a short timeout reads as "not serving".
            urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=10).close()
        except OSError:
            return False
        return True

    def _serving(self) -> bool:
        from flotilla.operator.kube import KubeError

        if not self._alive():
            return False
        probe = {"apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService",
                 "metadata": {"name": "webhook-probe", "namespace": "default"},
                 "spec": {"model": {"source": "pvc://m"}, "parallelism": {"tensor": 2},
                          "resources": {"gpusPerReplica": 3}}}
        try:
            self.cluster.kube.request("POST", f"{FIS_PATH}/namespaces/default/inferenceservices", probe,
                                      {"dryRun": "All"})
        except KubeError as e:
            return "denied the request" in e.message
        return False  # admitted: the webhook is not answering yet (failure policy Ignore)

    def kill(self) -> None:
        """SIGKILL: no clean-up at all (its webhook configurations stay behind)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM, as Kubernetes stops a pod."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def _session_operator(control_plane: ControlPlane, cluster: Cluster,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The one operator process of the session (started once: a start costs seconds)."""
    op = OperatorProcess(control_plane, cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()


@pytest.fixture
def operator_process(_session_operator: OperatorProcess) -> OperatorProcess:
    """The session's operator, serving when the test starts.

    A test that kills the operator or restarts the apiserver under it may leave it stopped or
    not serving when it fails; starting it again here keeps that failure from cascading into
    every later test as a misleading "DID NOT RAISE".
    """
    _session_operator.ensure_serving()
    return _session_operator
