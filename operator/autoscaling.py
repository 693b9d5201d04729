"""Autoscalers on the engine's per-pod metrics (pure builders): an HPA, or a KEDA ScaledObject.

The HPA reads `vllm:<metric>` as a Pods metric through the custom metrics API, which the
Prometheus Adapter serves with a rule such as
`{seriesQuery: 'vllm:num_requests_waiting{namespace!="",pod!=""}', name: {as: "vllm:num_requests_waiting"},
metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'}`.
KEDA, when installed, queries Prometheus itself, so no adapter is needed.
"""

from __future__ import annotations

from typing import Any, Literal

from flotilla.operator import names
from flotilla.operator.spec import InferenceServiceSpec

HPA_API_VERSIONS = ("autoscaling/v2", "autoscaling/v2beta2")
# Wait before scaling in: a replica takes minutes to load, so don't give one up on a short lull.
SCALE_DOWN_STABILIZATION_S = 300


def metric_name(spec: InferenceServiceSpec) -> str:
    """The engine gauge the autoscaler follows, with vLLM's name (`vllm:num_requests_waiting`)."""
    assert spec.autoscaling is not None
    return f"vllm:{spec.autoscaling.metric}"


def _quantity(value: float) -> str:
    # Kubernetes quantities: whole numbers as-is, fractions (kv_cache_usage_perc) in milli-units.
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def build_hpa(spec: InferenceServiceSpec, name: str, namespace: str,
              api_version: Literal["autoscaling/v2", "autoscaling/v2beta2"] = "autoscaling/v2",
              ) -> dict[str, Any] | None:
    """HPA on the per-pod average of the metric, or None when autoscaling is not set.

    autoscaling/v2beta2 has the same shape; use it only where v2 is absent (< 1.23).
    """
    if spec.autoscaling is None:
        return None
    if api_version not in HPA_API_VERSIONS:
        raise ValueError(f"unsupported HorizontalPodAutoscaler apiVersion {api_version}")
    a = spec.autoscaling
    return {
        "apiVersion": api_version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": names.metadata(name, namespace),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": metric_name(spec)},
                "target": {"type": "AverageValue", "averageValue": _quantity(a.target)},
            }}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_STABILIZATION_S}},
        },
    }


def keda_query(spec: InferenceServiceSpec, name: str, namespace: str) -> str:
    """PromQL summing the metric over this InferenceService's pods (label copied by the ServiceMonitor)."""
    return (f'sum({metric_name(spec)}{{namespace="{namespace}",'
            f'{names.INFERENCESERVICE_SERIES_LABEL}="{name}"}})')


def build_scaled_object(spec: InferenceServiceSpec, name: str, namespace: str) -> dict[str, Any] | None:
    """KEDA ScaledObject with a Prometheus trigger, or None when autoscaling is not set.

    KEDA divides the summed query by the replica count (metricType AverageValue), so `target` keeps
    the same per-pod meaning as with the HPA.
    """
    if spec.autoscaling is None:
        return None
    a = spec.autoscaling
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": names.metadata(name, namespace),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_STABILIZATION_S}}}},
            "triggers": [{
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {"serverAddress": a.prometheus_address,
                             "query": keda_query(spec, name, namespace),
                             "threshold": f"{a.target:g}"},
            }],
        },
    }
