"""The engine (CPU flavour) and operator images, built here with buildah and run for real."""

from __future__ import annotations

import shutil
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ..k8s_fixtures import REPO, free_port, free_ports, wait_for
from .conftest import Images

pytestmark = pytest.mark.slow
FIS = "/apis/serving.flotilla.dev/v1alpha1"


def config_of(images: Images, image: str) -> dict[str, Any]:
    return images.inspect(image)["OCIv1"]["config"]


@pytest.mark.parametrize("which", ["engine", "operator"])
def test_image_is_labelled_non_root_and_has_no_healthcheck(images: Images, which: str) -> None:
    image = getattr(images, which)
    data = images.inspect(image)
    config = data["OCIv1"]["config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.source"] == "https://github.com/flotilla-dev/flotilla"
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    user = config["User"].split(":")[0]
    assert user not in ("", "0", "root"), config["User"]
    assert "Healthcheck" not in config and "HEALTHCHECK" not in str(data.get("Docker", {}).get("config", {}))
    assert config["Entrypoint"][0] == "flotilla"


def test_oci_archives_are_exported(images: Images) -> None:
    for which, path in images.archives.items():
        assert path.is_file(), which
        with tarfile.open(path) as tar:
            names = set(tar.getnames())
        assert {"oci-layout", "index.json"} <= names, (which, sorted(names)[:5])


def test_no_build_tools_in_either_image(images: Images, container_of: Any) -> None:
    for image in (images.engine, images.operator):
        found = container_of(image).exec("sh", "-c", "for t in gcc cc g++ make; do command -v $t; done; true")
        assert found.returncode == 0 and found.stdout.strip() == "", (image, found.stdout)


def test_operator_image_has_openssl_and_no_torch(images: Images, container_of: Any) -> None:
    c = container_of(images.operator)
    assert c.exec("openssl", "version").returncode == 0
    probe = c.exec("python3", "-c", "import importlib.util as u, sys; "
                                    "sys.exit(int(u.find_spec('torch') is not None or u.find_spec('kopf') is None))")
    assert probe.returncode == 0, probe.stderr


def test_engine_image_serves_the_embedded_model_offline(images: Images, container_of: Any,
                                                        tmp_path: Path) -> None:
    config = config_of(images, images.engine)
    assert config["Cmd"] == ["serve"]  # no MODEL: the baked embedded model
    c = container_of(images.engine)
    port, log = free_port(), tmp_path / "engine.log"
    # The image's own command, plus where to listen (its default is 0.0.0.0:8000).
    command = [*config["Entrypoint"], *config["Cmd"], "--host", "127.0.0.1", "--port", str(port)]
    process = c.start(*command, log=log)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, f"engine exited:\n{log.read_text()[-3000:]}"
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, 180, "the engine in the image to answer /health", interval=0.5)
    models = httpx.get(f"{url}/v1/models", timeout=10).json()
    name = models["data"][0]["id"]
    assert name == "SmolLM2-135M-Instruct"
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": name, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16, "temperature": 0}).json()
    assert "Paris" in reply["choices"][0]["message"]["content"], reply
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'vllm:request_success_total{finished_reason="stop",model_name="SmolLM2-135M-Instruct"} 1.0' in metrics
    assert "HF_HUB_OFFLINE=1" in config["Env"] and "FLOTILLA_CACHE=/opt/flotilla/cache" in config["Env"]


def test_operator_image_reconciles_a_sample(images: Images, container_of: Any, cluster: Any, control_plane: Any,
                                            namespace: str, tmp_path: Path) -> None:
    from flotilla.operator.kube import KubeError

    kube_dir = tmp_path / "kube"
    kube_dir.mkdir(mode=0o755)
    shutil.copy(control_plane.kubeconfig, kube_dir / "config")
    (kube_dir / "config").chmod(0o644)  # the image's user (1000) reads it
    webhook_port, liveness_port = free_ports(2)
    config = config_of(images, images.operator)
    command = [*config["Entrypoint"], "--webhook-host", "127.0.0.1", "--webhook-listen", "127.0.0.1",
               "--webhook-port", str(webhook_port), "--webhook-cert-dir", "/tmp/webhook-certs",
               "--liveness", f"http://127.0.0.1:{liveness_port}/healthz", "--resync-seconds", "5"]
    log = tmp_path / "operator.log"
    process = container_of(images.operator).start(*command, log=log, env={"KUBECONFIG": "/kube/config"},
                                                  volumes=(f"{kube_dir}:/kube:ro",))

    def live() -> bool:
        assert process.poll() is None, f"operator exited:\n{log.read_text()[-3000:]}"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{liveness_port}/healthz", timeout=2).close()
            return True
        except OSError:
            return False

    wait_for(live, 90, "the operator in the image to answer its liveness probe", interval=0.5)
    # The webhook (served with the certificate openssl made inside the image) refuses a bad spec.
    bad = {"apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "bad", "namespace": namespace},
           "spec": {"model": {"source": "pvc://m"}, "parallelism": {"tensor": 2}, "resources": {"gpusPerReplica": 3}}}

    def refused() -> bool:
        try:
            cluster.kube.request("POST", f"{FIS}/namespaces/{namespace}/inferenceservices", bad, {"dryRun": "All"})
        except KubeError as e:
            return "denied the request" in e.message
        return False

    wait_for(refused, 60, "the operator's webhook to refuse an invalid spec", interval=0.5)
    sample = yaml.safe_load((REPO / "crds" / "samples" / "minimal.yaml").read_text())
    sample["metadata"]["namespace"] = namespace
    cluster.apply(sample)
    name = sample["metadata"]["name"]

    def reconciled() -> dict[str, Any] | None:
        try:
            deployment = cluster.kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
            service = cluster.kube.request("GET", f"/api/v1/namespaces/{namespace}/services/{name}")
            fis = cluster.kube.request("GET", f"{FIS}/namespaces/{namespace}/inferenceservices/{name}")
        except KubeError:
            return None
        conditions = {c["type"]: c["status"] for c in fis.get("status", {}).get("conditions", [])}
        return {"deployment": deployment, "service": service, "fis": fis} if conditions.get("Valid") == "True" else None

    t0 = time.monotonic()
    got = wait_for(reconciled, 60, f"the sample to be reconciled (log: {log})", interval=0.5)
    assert time.monotonic() - t0 < 60
    owner = got["deployment"]["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "InferenceService" and owner["name"] == name
    container = got["deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["flotilla", "serve"]
    assert got["service"]["spec"]["selector"]["serving.flotilla.dev/inferenceservice"] == name
