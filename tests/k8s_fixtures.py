"""Kubernetes test fixtures shared by tests/operator and tests/charts: schema validation, a real control
plane, API clients and a few helpers.

Each conftest that imports a session fixture from here gets its own instance (pytest keys fixtures by
the conftest that defines them), so tests/charts runs on a control plane of its own and never meets
the operator that tests/operator keeps running.

The control plane (kube-apiserver 1.20 + etcd + controller manager) is started by
`scripts/k8s-control-plane.sh start` on free ports in a temporary directory, and stopped at the end.
Its binaries come from `scripts/k8s-control-plane.sh build`. Without them the cluster tests are
skipped, unless FLOTILLA_K8S_REQUIRED is set (as in CI), when they fail instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import urllib3

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "k8s-control-plane.sh"
# Schemas the built v1 objects must satisfy: the oldest and newest that kubernetes-validate ships
# from 1.25 on, and one in between.
SCHEMA_VERSIONS = ("1.25.0", "1.30.0", "1.37.0")


def free_port() -> int:
    """A loopback port free now (closed again: the caller's process binds it)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free now: each held open until all are chosen, since a port closed
    after one call may come back from the next."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def _binaries_dir() -> Path:
    work = Path(os.environ.get("K8S_WORK") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "k8s-control-plane")
    return Path(os.environ.get("K8S_BIN") or work / "bin")


@pytest.fixture(scope="session")
def validate_manifest() -> Callable[[dict[str, Any]], None]:
    """Validate an object against the Kubernetes schemas of SCHEMA_VERSIONS (strict: no unknown fields)."""

    def validate(obj: dict[str, Any]) -> None:
        for version in SCHEMA_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                first = str(e).splitlines()[0]
                raise AssertionError(f"{obj['kind']} invalid for Kubernetes {version}: {first}") from None

    return validate


class ControlPlane:
    """The running control plane: its kubeconfig, and the script's environment for restarts."""

    def __init__(self, run: Path, env: dict[str, str]):
        self.run, self.env = run, env
        self.kubeconfig = run / "kubeconfig"

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit log's events so far (requests made with service-account tokens). The apiserver appends to the
        file while it is read: a last line without its newline is still being written and is left for the next read
        (json.loads failed on it under load)."""
        text = (self.run / "audit.log").read_text()
        return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]

    def restart_apiserver(self) -> None:
        """Kill kube-apiserver and start it again (same port, same etcd); returns once it is ready."""
        done = subprocess.run(["bash", str(SCRIPT), "restart-apiserver"], env=self.env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"apiserver did not restart:\n{done.stdout}\n{done.stderr}"


def run_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Start a fresh control plane, yield it, stop it (the body of a fixture of any scope)."""
    binaries = _binaries_dir()
    if not all((binaries / b).exists() for b in ("etcd", "kube-apiserver", "kube-controller-manager")):
        reason = f"control plane binaries not found in {binaries}: run `scripts/k8s-control-plane.sh build`"
        if os.environ.get("FLOTILLA_K8S_REQUIRED"):
            pytest.fail(reason)
        pytest.skip(reason)
    for _ in range(3):  # the free ports are closed again before etcd and the apiserver bind them: retaken, retry
        run = tmp_path_factory.mktemp("k8s-run")
        api_port, etcd_port, etcd_peer_port = free_ports(3)
        env = {**os.environ, "K8S_BIN": str(binaries), "K8S_RUN": str(run), "API_PORT": str(api_port),
               "ETCD_PORT": str(etcd_port), "ETCD_PEER_PORT": str(etcd_peer_port)}
        started = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120)
        if started.returncode == 0 or not _port_was_taken(run, started.stdout + started.stderr):
            break
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)
    try:
        assert started.returncode == 0, f"control plane did not start:\n{started.stdout}\n{started.stderr}"
        yield ControlPlane(run, env)
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)


def _port_was_taken(run: Path, output: str) -> bool:
    """Whether the start failed because etcd or the apiserver found its port taken."""
    logs = [output, *(p.read_text(errors="replace") for p in (run / "etcd.log", run / "apiserver.log") if p.exists())]
    return any("address already in use" in text for text in logs)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A fresh control plane for this test session, stopped at the end."""
    yield from run_control_plane(tmp_path_factory)


@pytest.fixture(scope="session")
def kube_api(control_plane: ControlPlane) -> Iterator[Any]:
    """A `kubernetes.client.ApiClient` connected to the session's control plane."""
    import kubernetes

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    client = kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def namespace(kube_api: Any) -> Iterator[str]:
    """A fresh namespace on the test control plane, deleted afterwards."""
    import kubernetes

    core = kubernetes.client.CoreV1Api(kube_api)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def pytest_configure(config: pytest.Config) -> None:
    # The test apiserver has a self-signed certificate on 127.0.0.1; its warning is noise here.
    config.addinivalue_line("filterwarnings", "ignore::urllib3.exceptions.InsecureRequestWarning")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "a condition",
             interval: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy (returned) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# Minimal, schema-less stand-ins for the Prometheus Operator's and KEDA's CRDs: enough for the
# apiserver to serve the kinds (unknown fields preserved), so "present" and "absent" are testable.
OPTIONAL_CRDS = {
    "servicemonitors.monitoring.coreos.com": ("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors"),
    "scaledobjects.keda.sh": ("keda.sh", "v1alpha1", "ScaledObject", "scaledobjects"),
}


def _schemaless_crd(name: str) -> dict[str, Any]:
    group, version, kind, plural = OPTIONAL_CRDS[name]
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": name},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": version, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


class Cluster:
    """Test-side calls on the control plane, through the operator's own small JSON client."""

    def __init__(self, kube: Any):
        self.kube = kube

    def apply(self, obj: dict[str, Any], manager: str = "tests") -> dict[str, Any]:
        """Server-side apply, like `kubectl apply --server-side`."""
        from flotilla.operator.kube import path_of

        return self.kube.request("PATCH", path_of(obj), obj, {"fieldManager": manager, "force": "true"},
                                 "application/apply-patch+yaml")

    def apply_crd(self, crd: dict[str, Any], touch: bool = True) -> None:
        """Install a CRD, wait until its group/version is served, then (`touch`) touch it once more (see below)."""
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
        self.kube.request("PATCH", path, crd, {"fieldManager": "tests", "force": "true"},
                          "application/apply-patch+yaml")
        group_version = f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
        wait_for(lambda: self.served(group_version), 30, f"{group_version} to be served")
        if not touch:
            return
        # A running operator's kopf rescans discovery on each watch event of a CRD, but the apiserver's discovery
        # can lag the CRD's last event (ADDED, then Established) by milliseconds, more on a loaded machine: kopf
        # then never watches the new kind (seen as no servicemonitors list/watch in the chart's RBAC audit when
        # tests/operator's control plane and operator were still running beside it). One more event, now that
        # discovery serves the kind, makes the operator's view deterministic.
        self.kube.request("PATCH", path, {"metadata": {"annotations": {"tests.flotilla.dev/served": uuid.uuid4().hex}}},
                          {"fieldManager": "tests-touch"}, "application/merge-patch+json")

    def served(self, group_version: str) -> bool:
        return any(v["groupVersion"] == group_version for g in self.kube.request("GET", "/apis")["groups"]
                   for v in g["versions"])

    def set_optional_crds(self, present: bool, touch: bool = True) -> None:
        """Install or remove the ServiceMonitor and ScaledObject CRDs (`touch`: as apply_crd)."""
        for name, (group, version, _, _) in OPTIONAL_CRDS.items():
            if present:
                self.apply_crd(_schemaless_crd(name), touch)
            else:
                self._remove_crd(name, f"{group}/{version}")

    def _remove_crd(self, name: str, group_version: str) -> None:
        """Delete a CRD and wait until its group/version is no longer served. The apiserver first deletes every
        object of the kind, those in the namespaces that earlier tests left terminating too: late in a whole run on
        2 cores that took over 60 s (session 32's CI check), so the wait is long and its failure says what held."""
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        self.kube.delete(path)
        try:
            wait_for(lambda: not self.served(group_version), 240, f"{group_version} to go away")
        except AssertionError as e:
            crd = self.kube.get(path) or {}
            held = (crd.get("status") or {}).get("conditions")
            raise AssertionError(f"{e}; the CRD's conditions: {held}") from None


def token_kubeconfig(admin: Path, token: str, path: Path) -> Path:
    """A copy of the `admin` kubeconfig that authenticates with `token` instead, written to `path`."""
    import yaml

    config = yaml.safe_load(admin.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    path.write_text(yaml.safe_dump(config))
    return path


def service_account_token(kube: Any, namespace: str, name: str) -> str | None:
    """The token the token controller made for a ServiceAccount (1.20: a Secret it references), once made."""
    import base64

    account = kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}") or {}
    for ref in account.get("secrets", []):
        secret = kube.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}") or {}
        if secret.get("type") == "kubernetes.io/service-account-token" and "token" in secret.get("data", {}):
            return base64.b64decode(secret["data"]["token"]).decode()
    return None
