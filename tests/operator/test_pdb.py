"""The PodDisruptionBudget: policy/v1, and policy/v1beta1 applied to a real 1.20 apiserver."""

from __future__ import annotations

import pytest

from flotilla.operator.names import INFERENCESERVICE_LABEL
from flotilla.operator.pdb import build_pdb
from flotilla.operator.spec import InferenceServiceSpec


def make(**spec) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"source": "pvc://models/m"}, **spec})


@pytest.mark.parametrize(("fields", "made"), [
    ({}, False),
    ({"replicas": 1}, False),
    ({"replicas": 2}, True),
    ({"replicas": 5, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}}, False),  # can scale down to one
    ({"replicas": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 8}}, True),
    ({"replicas": 0, "autoscaling": {"minReplicas": 2, "maxReplicas": 8}}, False),  # scaled to zero, suspended
])
def test_made_only_when_more_than_one_replica_is_guaranteed(fields, made, validate_manifest):
    pdb = build_pdb(make(**fields), "llama", "serving")
    assert (pdb is not None) == made
    if pdb:
        validate_manifest(pdb)
        assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": {INFERENCESERVICE_LABEL: "llama"}}}


def test_v1beta1_has_the_same_spec():
    v1 = build_pdb(make(replicas=3), "llama", "ns")
    beta = build_pdb(make(replicas=3), "llama", "ns", api_version="policy/v1beta1")
    assert beta["apiVersion"] == "policy/v1beta1" and beta["spec"] == v1["spec"]


def test_unknown_api_version_is_an_error():
    with pytest.raises(ValueError, match="policy/v2"):
        build_pdb(make(replicas=3), "llama", "ns", api_version="policy/v2")


def test_v1beta1_is_accepted_by_the_1_20_control_plane(kube_api, namespace):
    import kubernetes

    pdb = build_pdb(make(replicas=3), "llama", namespace, api_version="policy/v1beta1")
    dyn = kubernetes.dynamic.DynamicClient(kube_api)
    stored = dyn.resources.get(api_version="policy/v1beta1", kind="PodDisruptionBudget").create(
        body=pdb, namespace=namespace)
    assert stored.spec.maxUnavailable == 1
    assert stored.spec.selector.matchLabels[INFERENCESERVICE_LABEL] == "llama"
