"""Spec fields the apiserver checks only in the children, against the real apiserver: admission refuses a pvc://
sub-path exactly when the apiserver would refuse the Deployment's subPath (it did so after admission, and the refusal
reached status as ApplyRefused), an envFrom prefix exactly when it would refuse the Deployment, and an image exactly
when it would refuse the pods (only there: the Deployment was applied and its every pod refused)."""

from __future__ import annotations

import pytest

from flotilla.operator.admission import review
from flotilla.operator.kube import KubeError

from .conftest import FIS_PATH, wait_for

SUB_PATHS = ["models/llama", "..", "../x", "a/..", "a/../b", "./x", "a/.", "..a", "a..", "a/...b", "llama.gguf"]


def _apiserver_refuses_sub_path(cluster, namespace: str, sub_path: str) -> bool:
    labels = {"app": "source-rules"}
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"generateName": "sources-"},
            "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                "containers": [{"name": "c", "image": "registry.local/x:1", "volumeMounts": [
                    {"name": "model", "mountPath": "/model", "readOnly": True, "subPath": sub_path}]}],
                "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}]}}}}
    try:
        cluster.kube.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body, {"dryRun": "All"})
    except KubeError as e:
        assert e.status == 422, e.message
        return True
    return False


@pytest.mark.parametrize("sub_path", SUB_PATHS)
def test_a_pvc_sub_path_is_refused_exactly_when_the_apiserver_refuses_the_mount(cluster, namespace, sub_path):
    source = f"pvc://models/{sub_path}"
    spec = {"model": {"source": source}, "lora": {"adapters": [{"name": "a", "source": source}]}}
    errors = review(spec, "llama").errors
    assert bool(errors) == _apiserver_refuses_sub_path(cluster, namespace, sub_path), errors
    if errors:
        assert errors == [f"spec.model.source: the sub-path {sub_path} has a '..' segment: a claim is mounted only "
                          "within itself", f"spec.lora.adapters[0].source: the sub-path {sub_path} has a '..' "
                          "segment: a claim is mounted only within itself"]


@pytest.mark.parametrize("source", ["hf://org/..", "hf://org/."])
def test_an_hf_repository_named_dot_or_dot_dot_is_refused(source):
    # With a download cache claim its files would land in hf/org/.. (a subPath the apiserver refuses) or hf/org.
    assert review({"model": {"source": source, "cache": {"claimName": "hub"}}}, "llama").errors == [
        f"spec.model.source: {source[5:]} is no Hugging Face repository: its organisation or name is '.' or '..'"]


IMAGES = ["registry.local/engine:1", " registry.local/engine:1", "registry.local/engine:1 ",
          "registry.local/engine:1\n", "\tregistry.local/engine:1"]


@pytest.mark.parametrize("image", IMAGES, ids=range(len(IMAGES)))
def test_an_image_is_refused_exactly_when_the_apiserver_refuses_it_in_a_pod(cluster, namespace, image):
    wait_for(lambda: cluster.kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"), 30,
             "the namespace's default ServiceAccount")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "image-"},
           "spec": {"containers": [{"name": "c", "image": image}], "automountServiceAccountToken": False}}
    try:
        cluster.kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod, {"dryRun": "All"})
        refused = False
    except KubeError as e:
        assert e.status == 422, e.message
        refused = True
    errors = review({"model": {"source": "pvc://m"}, "image": image}, "llama").errors
    assert bool(errors) == refused, errors
    message = f"spec.image {image!r} has leading or trailing whitespace, which a pod's image may not have"
    assert errors in ([], [message])


PREFIXES = ["APP_", "app.x-", "_A", "-a", "1A", "A B", "A/B", "ÄPP_"]


@pytest.mark.parametrize("prefix", PREFIXES, ids=range(len(PREFIXES)))
def test_an_env_from_prefix_is_refused_exactly_when_the_apiserver_refuses_it(cluster, namespace, prefix):
    labels = {"app": "env-from"}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"generateName": "env-from-"},
                  "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                      "containers": [{"name": "c", "image": "registry.local/x:1", "envFrom": [
                          {"prefix": prefix, "configMapRef": {"name": "settings"}}]}]}}}}
    try:
        cluster.kube.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment,
                             {"dryRun": "All"})
        refused = False
    except KubeError as e:
        assert e.status == 422, e.message
        refused = True
    # The CRD's schema refuses it now, where the Deployment's was refused after admission.
    fis = {"apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": "llama"},
           "spec": {"model": {"source": "pvc://m"}, "pod": {"envFrom": [{"prefix": prefix,
                                                                         "configMapRef": {"name": "settings"}}]}}}
    try:
        cluster.kube.request("POST", f"{FIS_PATH}/namespaces/{namespace}/inferenceservices", fis, {"dryRun": "All"})
        schema_refused = False
    except KubeError as e:
        assert e.status == 422 and "spec.pod.envFrom.prefix" in e.message, e.message
        schema_refused = True
    assert schema_refused == refused
