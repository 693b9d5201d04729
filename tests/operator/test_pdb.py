"""The PodDisruptionBudget: policy/v1, and policy/v1beta1 applied to a real 1.20 apiserver; its
unhealthyPodEvictionPolicy, rendered only for an apiserver that keeps it (1.27+)."""

from __future__ import annotations

import kubernetes_validate
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


def test_unhealthy_pod_eviction_policy_where_the_apiserver_keeps_it():
    """AlwaysAllow: engine pods that are not Ready (crash-looping, stuck loading) do not hold a node drain."""
    pdb = build_pdb(make(replicas=2), "llama", "ns", unhealthy_pod_eviction_policy=True)
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": {INFERENCESERVICE_LABEL: "llama"}},
                           "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    for version in ("1.30.0", "1.37.0"):
        kubernetes_validate.validate(pdb, version, strict=True)
    # The schema of a Kubernetes before the field (1.25: its strict schema has no such property) refuses it: why the
    # operator renders it only for an apiserver of 1.27 or later (capabilities.from_group_list).
    with pytest.raises(kubernetes_validate.ValidationError, match="unhealthyPodEvictionPolicy"):
        kubernetes_validate.validate(pdb, "1.25.0", strict=True)


def test_no_unhealthy_pod_eviction_policy_in_policy_v1beta1():
    pdb = build_pdb(make(replicas=2), "llama", "ns", api_version="policy/v1beta1", unhealthy_pod_eviction_policy=True)
    assert "unhealthyPodEvictionPolicy" not in pdb["spec"]


def test_the_1_20_apiserver_is_read_as_1_20_and_gets_no_unhealthy_pod_eviction_policy(cluster, namespace):
    """The old side on the real apiserver: its version as the operator reads it at start-up, and a reconcile with
    it applies a PDB without the field; the same PDB with the field is refused by that apiserver, so rendering it
    there would leave the InferenceService without any PDB (ChildrenBlocked)."""
    from flotilla.operator.capabilities import server_version
    from flotilla.operator.kube import KubeError
    from flotilla.operator.reconciler import Reconciler

    from .test_operator_reconcile import child_path, fixed

    version = server_version(cluster.kube)
    assert version == (1, 20)
    cluster.apply(fixed("drained", namespace, replicas=2))
    Reconciler(cluster.kube, post_event=lambda *_: None, server_version=version).reconcile(namespace, "drained")
    stored = cluster.kube.get(child_path("PodDisruptionBudget", namespace, "drained"))
    assert stored["apiVersion"] == "policy/v1beta1" and stored["spec"]["maxUnavailable"] == 1
    assert "unhealthyPodEvictionPolicy" not in stored["spec"]

    with_field = build_pdb(make(replicas=2), "drained", namespace, api_version="policy/v1beta1")
    with_field["spec"]["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    with pytest.raises(KubeError, match="unhealthyPodEvictionPolicy: field not declared in schema") as refused:
        cluster.kube.apply(with_field)
    assert refused.value.status == 500  # 1.20's answer to a server-side apply its schema cannot type
