"""operator/names.py's label rules against the real apiserver's: what admission refuses in a map the spec passes on
as labels or annotations is exactly what the apiserver would refuse in the children later."""

from __future__ import annotations

import pytest

from flotilla.operator.kube import KubeError
from flotilla.operator.names import annotations_size_problem, label_key_problem, label_problems, label_value_problem

KEYS = ["team", "Team_1.x", "a" * 63, "a" * 64, "example.com/team", "Example.com/team", "example.com/", "/team",
        "a/b/c", "bad key!", "-team", "team-", "x" * 253 + "/team", "x" * 254 + "/team", "example..com/team", ""]
VALUES = ["", "gpu", "GPU_pool-1.a", "v" * 63, "v" * 64, "gpu pool", "ml/x", "-gpu", "gpu.", "ünï"]


def _apiserver_refuses(cluster, namespace: str, metadata: dict) -> bool:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "labels-", **metadata}}
    try:
        cluster.kube.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body, query={"dryRun": "All"})
    except KubeError as e:
        assert e.status == 422, e.message
        return True
    return False


@pytest.mark.parametrize("key", KEYS, ids=range(len(KEYS)))
def test_a_label_or_annotation_key_is_refused_exactly_when_the_apiserver_refuses_it(cluster, namespace, key):
    assert (label_key_problem(key) is not None) == _apiserver_refuses(cluster, namespace, {"labels": {key: "x"}})
    refused = _apiserver_refuses(cluster, namespace, {"annotations": {key: "any text / at all"}})
    assert bool(label_problems("f", {key: "any text / at all"}, kind="annotation")) == refused


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_a_label_value_is_refused_exactly_when_the_apiserver_refuses_it(cluster, namespace, value):
    assert (label_value_problem(value) is not None) == _apiserver_refuses(cluster, namespace,
                                                                         {"labels": {"team": value}})


def test_each_problem_names_the_field_and_the_key():
    assert label_problems("spec.resources.nodeSelector", {"bad key!": "x", "pool": "gpu pool", "ok": "fine"}) == [
        "spec.resources.nodeSelector: 'bad key!' is not a valid label key: its name 'bad key!' must be 1 to 63 "
        "letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
        "spec.resources.nodeSelector: the value of pool, 'gpu pool', is not a valid label value: it must be empty or "
        "letters, digits, '-', '_' and '.', starting and ending with a letter or digit"]
    assert label_problems("spec.pod.annotations", {"note": "free text: anything", "Example.com/x": "y"},
                          kind="annotation") == []


@pytest.mark.parametrize("size", [256 * 1024, 256 * 1024 + 1])
@pytest.mark.parametrize("character", ["x", "é"])
def test_annotations_are_refused_for_their_size_exactly_when_the_apiserver_refuses_them(cluster, namespace, size,
                                                                                        character):
    # Keys and values together, counted in bytes: 'é' is two in UTF-8 (an odd size ends in an 'x').
    width = len(character.encode())
    annotations = {"note": character * ((size - 4) // width) + "x" * ((size - 4) % width)}
    assert sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) == size
    problem = annotations_size_problem("spec.pod.annotations", annotations)
    assert (problem is not None) == _apiserver_refuses(cluster, namespace, {"annotations": annotations}) == \
        (size > 256 * 1024)
    assert problem is None or problem.startswith(f"spec.pod.annotations: the keys and values come to {size} bytes")


def test_an_annotation_value_that_is_no_string_is_refused_by_the_schema(cluster, namespace):
    # The CRD types spec.pod.annotations as strings: a number or a list never reaches the webhook or the pods.
    from .conftest import FIS_PATH

    for value in (1, True, ["a"], {"a": "b"}):
        body = {"apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService",
                "metadata": {"name": "typed"}, "spec": {"model": {"source": "pvc://m"}, "pod": {"annotations": {
                    "note": value}}}}
        with pytest.raises(KubeError) as refused:
            cluster.kube.request("POST", f"{FIS_PATH}/namespaces/{namespace}/inferenceservices", body,
                                 {"dryRun": "All"})
        assert refused.value.status == 422 and "spec.pod.annotations.note" in refused.value.message, value
