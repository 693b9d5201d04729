"""Fixtures for the operator's tests: schema validation and a real control plane.

The control plane (kube-apiserver 1.20 + etcd + controller manager) is started once per test run by
`scripts/k8s-control-plane.sh start` on free ports in a temporary directory, and stopped at the end.
Its binaries come from `scripts/k8s-control-plane.sh build`. Without them the cluster tests are
skipped, unless FLOTILLA_K8S_REQUIRED is set (as in CI), when they fail instead.
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import urllib3

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s-control-plane.sh"
# Schemas the built v1 objects must satisfy: the oldest and newest that kubernetes-validate ships
# from 1.25 on, and one in between.
SCHEMA_VERSIONS = ("1.25.0", "1.30.0", "1.37.0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.fixture(scope="session")
def kube_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A `kubernetes.client.ApiClient` connected to a fresh control plane for this test session."""
    import kubernetes

    binaries = _binaries_dir()
    if not all((binaries / b).exists() for b in ("etcd", "kube-apiserver", "kube-controller-manager")):
        reason = f"control plane binaries not found in {binaries}: run `scripts/k8s-control-plane.sh build`"
        if os.environ.get("FLOTILLA_K8S_REQUIRED"):
            pytest.fail(reason)
        pytest.skip(reason)
    run = tmp_path_factory.mktemp("k8s-run")
    env = {**os.environ, "K8S_BIN": str(binaries), "K8S_RUN": str(run), "API_PORT": str(_free_port()),
           "ETCD_PORT": str(_free_port()), "ETCD_PEER_PORT": str(_free_port())}
    started = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, f"control plane did not start:\n{started.stdout}\n{started.stderr}"
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        client = kubernetes.config.new_client_from_config(config_file=str(run / "kubeconfig"))
        yield client
        client.close()
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)


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
