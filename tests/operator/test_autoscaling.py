"""Autoscalers: HPA autoscaling/v2 (v2beta2 applied to a real 1.20 apiserver) and KEDA's ScaledObject."""

from __future__ import annotations

import pytest

from flotilla.operator.autoscaling import (
    REFUSED_SCALE_MANAGER,
    autoscaled_replicas,
    build_hpa,
    build_scaled_object,
    desired_replicas,
    keda_query,
    replicas_handover,
)
from flotilla.operator.spec import InferenceServiceSpec


def make(**autoscaling) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"source": "pvc://models/m"},
                                                "autoscaling": {"maxReplicas": 8, **autoscaling}})


def test_no_autoscaler_without_autoscaling():
    spec = InferenceServiceSpec.model_validate({"model": {"source": "pvc://m"}})
    assert build_hpa(spec, "llama", "ns") is None
    assert build_scaled_object(spec, "llama", "ns") is None


@pytest.mark.parametrize(("fields", "metric", "average"), [
    ({}, "vllm:num_requests_waiting", "10"),
    ({"metric": "num_requests_running", "target": 32}, "vllm:num_requests_running", "32"),
    ({"metric": "kv_cache_usage_perc", "target": 0.8}, "vllm:kv_cache_usage_perc", "800m"),
])
def test_hpa_follows_the_per_pod_average_of_the_engine_metric(fields, metric, average, validate_manifest):
    hpa = build_hpa(make(minReplicas=2, **fields), "llama", "serving")
    validate_manifest(hpa)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": metric}, "target": {"type": "AverageValue", "averageValue": average}}}]


def test_v2beta2_has_the_same_spec():
    v2 = build_hpa(make(), "llama", "ns")
    beta = build_hpa(make(), "llama", "ns", api_version="autoscaling/v2beta2")
    assert beta["apiVersion"] == "autoscaling/v2beta2" and beta["spec"] == v2["spec"]


def test_v2beta2_is_accepted_by_the_1_20_control_plane(kube_api, namespace):
    import kubernetes

    dyn = kubernetes.dynamic.DynamicClient(kube_api)
    hpa = build_hpa(make(metric="kv_cache_usage_perc", target=0.75), "llama", namespace,
                    api_version="autoscaling/v2beta2")
    stored = dyn.resources.get(api_version="autoscaling/v2beta2", kind="HorizontalPodAutoscaler").create(
        body=hpa, namespace=namespace)
    assert stored.spec.metrics[0].pods.target.averageValue == "750m"
    assert stored.spec.behavior.scaleDown.stabilizationWindowSeconds == 300


def test_keda_scaled_object_queries_prometheus_for_this_inferenceservice():
    so = build_scaled_object(make(minReplicas=1, target=5), "llama", "serving")
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    assert so["spec"]["scaleTargetRef"]["name"] == "llama"
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 8)
    trigger = so["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {
        "serverAddress": "http://prometheus-operated.monitoring.svc:9090",
        "query": 'sum(vllm:num_requests_waiting{namespace="serving",serving_flotilla_dev_inferenceservice="llama"})',
        "threshold": "5",
    }


def test_keda_query_uses_the_label_the_service_monitor_copies():
    assert "serving_flotilla_dev_inferenceservice=" in keda_query(make(), "x", "ns")


@pytest.mark.parametrize(("metric", "external"), [("ttft_p95_seconds", "flotilla_ttft_p95_seconds"),
                                                  ("inter_token_latency_p95_seconds",
                                                   "flotilla_inter_token_latency_p95_seconds")])
def test_hpa_on_a_latency_slo_reads_one_external_value_for_the_inferenceservice(metric, external,
                                                                                validate_manifest):
    hpa = build_hpa(make(metric=metric, target=0.5), "llama", "serving")
    validate_manifest(hpa)
    assert hpa["spec"]["metrics"] == [{"type": "External", "external": {
        "metric": {"name": external, "selector": {"matchLabels": {"serving_flotilla_dev_inferenceservice": "llama"}}},
        "target": {"type": "Value", "value": "500m"}}}]


def test_keda_on_a_latency_slo_takes_the_p95_of_the_histogram_buckets_as_a_value():
    so = build_scaled_object(make(metric="ttft_p95_seconds", target=0.5, window="2m"), "llama", "serving")
    trigger = so["spec"]["triggers"][0]
    assert trigger["metricType"] == "Value" and trigger["metadata"]["threshold"] == "0.5"
    assert trigger["metadata"]["query"] == (
        '(histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{namespace="serving",'
        'serving_flotilla_dev_inferenceservice="llama"}[2m]))) > 0) or vector(0)')
    itl = keda_query(make(metric="inter_token_latency_p95_seconds", target=0.05), "llama", "serving")
    assert "vllm:inter_token_latency_seconds_bucket" in itl and "[1m]" in itl


@pytest.mark.parametrize(("current", "value", "expected"), [
    (1, 2.0, 4),    # p95 four times the 0.5 s target: four times the replicas
    (2, 0.52, 2),   # within the HPA's 10 % tolerance: unchanged
    (3, 0.0, 1),    # no traffic reads 0: down to minReplicas
    (4, 50.0, 8),   # never above maxReplicas
])
def test_desired_replicas_is_the_hpa_value_rule(current, value, expected):
    assert desired_replicas(current, value, 0.5, 1, 8) == expected


@pytest.mark.parametrize("window", ["0m", "1h", "5", "1m; drop"])
def test_slo_window_is_a_plain_prometheus_duration(window):
    with pytest.raises(ValueError):
        make(metric="ttft_p95_seconds", target=0.5, window=window)


def _applied_by(manager: str, replicas: int) -> dict:
    return {"spec": {"replicas": replicas}, "metadata": {"managedFields": [
        {"manager": manager, "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]}}


@pytest.mark.parametrize(("live", "handed_over"), [(3, 3), (0, 2)])
def test_handover_keeps_the_live_replicas_but_resumes_a_deployment_at_zero_at_min_replicas(live, handed_over):
    """Autoscaling turned on keeps what serves; resumed after spec.replicas 0 it starts at minReplicas, since an HPA
    does not act on a target at 0 replicas."""
    applied = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "namespace": "ns"},
               "spec": {"template": {}}}
    handover = replicas_handover(applied, _applied_by("op", live), "op", min_replicas=2)
    assert handover is not None and handover["spec"] == {"replicas": handed_over}
    assert replicas_handover(applied, _applied_by("someone", live), "op", min_replicas=2) is None



def test_a_deployment_scaled_to_zero_while_its_spec_was_refused_is_handed_back_to_the_autoscaler():
    applied = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "namespace": "ns"},
               "spec": {"template": {}}}
    live = _applied_by(REFUSED_SCALE_MANAGER, 0)
    live["metadata"]["managedFields"][0]["operation"] = "Update"  # a merge patch, not an apply
    handover = replicas_handover(applied, live, "op", min_replicas=3)
    assert handover is not None and handover["spec"] == {"replicas": 3}


@pytest.mark.parametrize(("spec_replicas", "autoscaling", "live", "copied"), [
    (1, {"maxReplicas": 8}, 4, 4),      # the autoscaler's count goes into spec.replicas
    (4, {"maxReplicas": 8}, 4, None),   # already there: no write
    (1, {"maxReplicas": 8}, 0, None),   # KEDA's scale to zero: 0 in spec.replicas would suspend the autoscaler
    (0, {"maxReplicas": 8}, 3, None),   # suspended by spec.replicas 0: the operator's own count, nothing to copy
    (1, None, 4, None),                 # no autoscaler: spec.replicas decides
])
def test_the_autoscalers_count_is_copied_into_spec_replicas_while_it_owns_the_deployment(
        spec_replicas, autoscaling, live, copied):
    spec = InferenceServiceSpec.model_validate({"model": {"source": "pvc://m"}, "replicas": spec_replicas,
                                                "autoscaling": autoscaling})
    assert autoscaled_replicas(spec, {"spec": {"replicas": live}}) == copied
    assert autoscaled_replicas(spec, None) is None
