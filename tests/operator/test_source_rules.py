"""Model, tokenizer and adapter sources that become a mount's subPath, against the real apiserver: admission refuses a
pvc:// sub-path exactly when the apiserver would refuse the Deployment's subPath (it did so after admission, and the
refusal reached status as ApplyRefused)."""

from __future__ import annotations

import pytest

from flotilla.operator.admission import review
from flotilla.operator.kube import KubeError

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
