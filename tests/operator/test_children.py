"""children.plan_children and capabilities.from_group_list: which children, at which versions (no cluster)."""

from __future__ import annotations

import pytest

from flotilla.operator.capabilities import UNKNOWN_VERSION, Capabilities, from_group_list, parse_server_version
from flotilla.operator.children import plan_children
from flotilla.operator.spec import InferenceServiceSpec

AUTOSCALED = {"model": {"source": "pvc://m"}, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}


def _groups(*group_versions: str) -> dict:
    return {"groups": [{"name": gv.split("/")[0], "versions": [{"groupVersion": gv}]} for gv in group_versions]}


def test_capabilities_of_a_1_20_cluster_and_a_current_one():
    old = from_group_list(_groups("autoscaling/v1", "autoscaling/v2beta2", "policy/v1beta1"))
    assert old == Capabilities("autoscaling/v2beta2", "policy/v1beta1", service_monitor=False, keda=False)
    new = from_group_list(_groups("autoscaling/v2", "autoscaling/v2beta2", "policy/v1", "monitoring.coreos.com/v1",
                                  "keda.sh/v1alpha1"))
    assert new == Capabilities("autoscaling/v2", "policy/v1", service_monitor=True, keda=True)


@pytest.mark.parametrize(("served", "version", "kept"), [
    ("policy/v1", (1, 27), True),  # beta, on by default
    ("policy/v1", (1, 31), True),  # GA
    ("policy/v1", (2, 0), True),
    ("policy/v1", (1, 26), False),  # alpha, off by default: the apiserver drops the field
    ("policy/v1", (1, 21), False),  # not in the schema: server-side apply refuses the whole PDB
    ("policy/v1beta1", (1, 20), False),
    ("policy/v1", UNKNOWN_VERSION, False),  # an unreadable version: the field an older apiserver refuses is left out
])
def test_the_pdbs_unhealthy_pod_eviction_policy_needs_policy_v1_and_1_27(served, version, kept):
    caps = from_group_list(_groups("autoscaling/v2", served), version)
    assert caps.pdb_unhealthy_pod_eviction_policy is kept
    pdb = plan_children(InferenceServiceSpec.model_validate({"model": {"source": "pvc://m"}, "replicas": 2}),
                        "x", "ns", caps).apply[-1]
    assert pdb["kind"] == "PodDisruptionBudget"
    assert pdb["spec"].get("unhealthyPodEvictionPolicy") == ("AlwaysAllow" if kept else None)


@pytest.mark.parametrize(("info", "version"), [
    ({"major": "1", "minor": "20", "gitVersion": "v1.20.2"}, (1, 20)),
    ({"major": "1", "minor": "27+", "gitVersion": "v1.27.3-eks-a5565ad"}, (1, 27)),  # EKS and GKE write "27+"
    ({"major": "1", "minor": "31+"}, (1, 31)),
    ({"gitVersion": "v1.30.0-rc.1"}, (1, 30)),
    ({"major": "", "minor": "", "gitVersion": "v0.0.0-master+$Format:%H$"}, (0, 0)),  # a build without version
    ({}, UNKNOWN_VERSION),
])
def test_the_apiservers_version_is_read_from_its_version_document(info, version):
    assert parse_server_version(info) == version


@pytest.mark.parametrize(("caps", "kinds", "autoscaler"), [
    (Capabilities("autoscaling/v2beta2", "policy/v1beta1", False, False),
     [("apps/v1", "Deployment"), ("v1", "Service"), ("autoscaling/v2beta2", "HorizontalPodAutoscaler"),
      ("policy/v1beta1", "PodDisruptionBudget")], "HPA (autoscaling/v2beta2)"),
    (Capabilities("autoscaling/v2", "policy/v1", True, True),
     [("apps/v1", "Deployment"), ("v1", "Service"), ("keda.sh/v1alpha1", "ScaledObject"),
      ("monitoring.coreos.com/v1", "ServiceMonitor"), ("policy/v1", "PodDisruptionBudget")],
     "KEDA ScaledObject (keda.sh/v1alpha1)"),
])
def test_children_follow_what_the_cluster_serves(caps, kinds, autoscaler):
    plan = plan_children(InferenceServiceSpec.model_validate(AUTOSCALED), "x", "ns", caps)
    assert [(o["apiVersion"], o["kind"]) for o in plan.apply] == kinds
    assert plan.autoscaler == autoscaler


def test_unwanted_children_are_listed_for_removal():
    spec = InferenceServiceSpec.model_validate({"model": {"source": "pvc://m"},
                                                "monitoring": {"serviceMonitor": False}})
    plan = plan_children(spec, "x", "ns", Capabilities("autoscaling/v2", "policy/v1", True, False))
    assert [o["kind"] for o in plan.apply] == ["Deployment", "Service"]
    assert sorted(plan.remove) == [("autoscaling/v2", "HorizontalPodAutoscaler"),
                                   ("monitoring.coreos.com/v1", "ServiceMonitor"), ("policy/v1", "PodDisruptionBudget")]
    assert plan.monitoring == "ServiceMonitor disabled by spec.monitoring.serviceMonitor"


@pytest.mark.parametrize(("caps", "autoscaler_kind"), [
    (Capabilities("autoscaling/v2", "policy/v1", False, False), ("autoscaling/v2", "HorizontalPodAutoscaler")),
    (Capabilities("autoscaling/v2", "policy/v1", False, True), ("keda.sh/v1alpha1", "ScaledObject")),
])
def test_replicas_zero_suspends_the_autoscaler_and_scales_the_deployment_to_zero(caps, autoscaler_kind):
    """`kubectl scale fis --replicas 0` with autoscaling set: the autoscaler is removed (an HPA or KEDA would scale
    back up to minReplicas), the Deployment is applied at 0 and status.autoscaler says why and how to resume."""
    spec = InferenceServiceSpec.model_validate({**AUTOSCALED, "replicas": 0})
    plan = plan_children(spec, "x", "ns", caps)
    assert [o["kind"] for o in plan.apply] == ["Deployment", "Service"]
    assert plan.apply[0]["spec"]["replicas"] == 0
    assert autoscaler_kind in plan.remove and ("policy/v1", "PodDisruptionBudget") in plan.remove
    assert plan.autoscaler.startswith("suspended: spec.replicas is 0")
    assert plan.min_replicas == 2
