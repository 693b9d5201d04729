"""operator/scheduling_rules.py against the real apiserver: the affinity, topology spread constraints and tolerations
that admission refuses are exactly those the apiserver refuses in a Deployment's pod template (it did so after
admission, and the refusal reached status as ApplyRefused)."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.operator.admission import review
from flotilla.operator.kube import KubeError
from flotilla.operator.scheduling_rules import affinity_problems, toleration_problems, topology_spread_problems
from flotilla.operator.spec import Toleration

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _node(*terms: Any) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(terms)}}}


def _expr(key: Any = "pool", operator: Any = "In", values: Any = ("gpu",)) -> dict[str, Any]:
    out = {"key": key, "operator": operator}
    return out if values is None else {**out, "values": list(values) if isinstance(values, tuple) else values}


def _anti(term: dict[str, Any], preferred: bool = False, weight: Any = 50) -> dict[str, Any]:
    if preferred:
        return {"podAntiAffinity": {PREFERRED: [{"weight": weight, "podAffinityTerm": term}]}}
    return {"podAntiAffinity": {REQUIRED: [term]}}


HOST = "kubernetes.io/hostname"
AFFINITIES: list[Any] = [
    {}, _node({"matchExpressions": [_expr()]}), _node(), {"nodeAffinity": {REQUIRED: {}}},
    _node({"matchExpressions": [_expr(values=())]}),
    _node({"matchExpressions": [_expr(operator="Exists", values=None)]}),
    _node({"matchExpressions": [_expr(operator="Exists")]}),
    _node({"matchExpressions": [_expr(operator="Gt", values=("8",))]}),
    _node({"matchExpressions": [_expr(operator="Lt", values=("1", "2"))]}),
    _node({"matchExpressions": [_expr(operator="Near")]}),
    _node({"matchExpressions": [_expr(key="bad key!")]}), _node({"matchExpressions": [_expr(key="")]}),
    _node({"matchExpressions": [_expr(values="gpu")]}), _node({"matchExpressions": [_expr(values=[1])]}),
    _node({"matchFields": [_expr(key="metadata.name", values=("node-1",))]}),
    _node({"matchFields": [_expr(key="metadata.name", values=("a", "b"))]}),
    _node({"matchFields": [_expr(key="metadata.uid", values=("a",))]}),
    _node({"matchFields": [_expr(key="metadata.name", values=("Node_1",))]}),
    _node({"matchFields": [_expr(key="metadata.name", operator="Exists", values=None)]}),
    _node({}), _node("term"), {"nodeAffinity": "gpu"}, "anywhere",
    {"nodeAffinity": {PREFERRED: [{"weight": 1, "preference": {"matchExpressions": [_expr()]}}]}},
    {"nodeAffinity": {PREFERRED: [{"weight": 0, "preference": {}}]}},
    {"nodeAffinity": {PREFERRED: [{"weight": 101, "preference": {}}]}},
    {"nodeAffinity": {PREFERRED: [{"preference": {}}]}},
    {"nodeAffinity": {PREFERRED: [{"weight": "5", "preference": {}}]}},
    {"nodeAffinity": {PREFERRED: [{"weight": 2**31, "preference": {}}]}},
    _anti({"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "llama"}}}),
    _anti({"labelSelector": {"matchLabels": {"app": "llama"}}}),
    _anti({"topologyKey": "bad key!"}),
    _anti({"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "bad value!"}}}),
    _anti({"topologyKey": HOST, "labelSelector": {"matchExpressions": [_expr(operator="Gt", values=("1",))]}}),
    _anti({"topologyKey": HOST, "labelSelector": {"matchExpressions": [_expr(values=())]}}),
    _anti({"topologyKey": HOST, "labelSelector": {"matchExpressions": [_expr(operator="DoesNotExist", values=None)]}}),
    _anti({"topologyKey": HOST, "namespaces": ["team-a"]}), _anti({"topologyKey": HOST, "namespaces": ["Team_A"]}),
    _anti({"topologyKey": HOST, "namespaces": ["a" * 64]}), _anti({"topologyKey": HOST, "namespaces": "team-a"}),
    _anti({"topologyKey": HOST}, preferred=True), _anti({"topologyKey": HOST}, preferred=True, weight=0),
    _anti({"topologyKey": ""}, preferred=True),
    {"podAffinity": {REQUIRED: [{"topologyKey": "topology.kubernetes.io/zone"}]}},
    {"podAffinity": {REQUIRED: [{}]}}, {"podAffinity": {REQUIRED: {"topologyKey": HOST}}},
]


def _spread(**fields: Any) -> dict[str, Any]:
    return {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", **fields}


SPREADS: list[list[Any]] = [
    [], [_spread()], [_spread(maxSkew=0)], [_spread(maxSkew=-1)], [_spread(maxSkew="1")], [_spread(maxSkew=2**31)],
    [{"topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}], [_spread(topologyKey="")],
    [_spread(topologyKey="bad key!")], [_spread(whenUnsatisfiable="Never")], [_spread(whenUnsatisfiable=None)],
    [_spread(), _spread()], [_spread(), _spread(whenUnsatisfiable="ScheduleAnyway")],
    [_spread(labelSelector={"matchLabels": {"app": "llama"}})], [_spread(labelSelector="app=llama")], ["zone"],
]

TOLERATIONS: list[dict[str, Any]] = [
    {"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, {"key": "pool", "value": "gpu"},
    {"operator": "Exists"}, {"key": "", "operator": "Equal"}, {"value": "gpu"},
    {"key": "bad key!", "operator": "Exists"},
    {"key": "pool", "value": "bad value!"}, {"key": "pool", "value": "v" * 64},
    {"key": "pool", "operator": "Exists", "value": "gpu"},
    {"key": "pool", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    {"key": "pool", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30},
    {"key": "pool", "operator": "Exists", "tolerationSeconds": -1},
    {"key": "example.com/pool", "operator": "Exists", "effect": "PreferNoSchedule"},
]


def _apiserver_refuses(cluster, namespace: str, pod_spec: dict[str, Any]) -> bool:
    """Whether the apiserver refuses a Deployment whose pod template carries `pod_spec` (a dry run)."""
    labels = {"app": "scheduling-rules"}
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"generateName": "rules-"},
            "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                "containers": [{"name": "c", "image": "registry.local/x:1"}], **pod_spec}}}}
    try:
        cluster.kube.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body, {"dryRun": "All"})
    except KubeError as e:
        assert e.status in (400, 422), e.message  # 400: a JSON type Go cannot decode; 422: a field's rule
        return True
    return False


@pytest.mark.parametrize("affinity", AFFINITIES, ids=range(len(AFFINITIES)))
def test_an_affinity_is_refused_exactly_when_the_apiserver_refuses_it(cluster, namespace, affinity):
    problems = affinity_problems(affinity)
    assert bool(problems) == _apiserver_refuses(cluster, namespace, {"affinity": affinity}), problems


@pytest.mark.parametrize("constraints", SPREADS, ids=range(len(SPREADS)))
def test_topology_spread_constraints_are_refused_exactly_when_the_apiserver_refuses_them(cluster, namespace,
                                                                                         constraints):
    problems = topology_spread_problems(constraints)
    assert bool(problems) == _apiserver_refuses(cluster, namespace, {"topologySpreadConstraints": constraints}), \
        problems


@pytest.mark.parametrize("toleration", TOLERATIONS, ids=range(len(TOLERATIONS)))
def test_a_toleration_is_refused_exactly_when_the_apiserver_refuses_it(cluster, namespace, toleration):
    problems = toleration_problems([Toleration.model_validate(toleration)])
    assert bool(problems) == _apiserver_refuses(cluster, namespace, {"tolerations": [toleration]}), problems


def test_the_review_names_each_field_the_apiserver_would_refuse():
    spec = {"model": {"source": "pvc://m"},
            "pod": {"affinity": {"podAntiAffinity": {PREFERRED: [{"weight": 0, "podAffinityTerm": {
                "topologyKey": HOST}}]}}, "topologySpreadConstraints": [_spread(), _spread(maxSkew=2)]},
            "resources": {"tolerations": [{"key": "pool", "operator": "Exists", "tolerationSeconds": 60}]}}
    assert review(spec, "llama").errors == [
        f"spec.pod.affinity.podAntiAffinity.{PREFERRED}[0].weight: 0 is not in the range 1-100",
        "spec.pod.topologySpreadConstraints[1]: {topology.kubernetes.io/zone, DoNotSchedule} is given twice: one "
        "constraint per topologyKey and whenUnsatisfiable",
        "spec.resources.tolerations[0].effect: must be NoExecute when tolerationSeconds is set"]
