"""Autoscalers on the engine's metrics (pure builders): an HPA, or a KEDA ScaledObject.

Two kinds of metric:
- an engine gauge per pod (num_requests_waiting, ...): the HPA reads `vllm:<metric>` as a Pods
  metric through the custom metrics API, which the Prometheus Adapter serves with a rule such as
  `{seriesQuery: 'vllm:num_requests_waiting{namespace!="",pod!=""}', name: {as: "vllm:num_requests_waiting"},
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'}`; KEDA sums it over the pods
  and divides by the replicas (AverageValue).
- a latency SLO (ttft_p95_seconds, inter_token_latency_p95_seconds): the p95 over all replicas from
  vLLM's histogram buckets, compared with the target as a Value, so the HPA wants
  ceil(replicas x p95 / target) replicas (`desired_replicas`). KEDA runs the PromQL itself
  (`keda_query`); the HPA reads the External metric `flotilla_<metric>`, which the chart's adapter
  rules serve from its recording rules (`inferenceservice:vllm_..._seconds:p95_1m`). With no
  traffic the p95 reads 0, so replicas fall back to minReplicas.
KEDA, when installed, queries Prometheus itself, so no adapter is needed.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from flotilla.operator import names
from flotilla.operator.spec import SLO_METRICS, InferenceServiceSpec

HPA_API_VERSIONS = ("autoscaling/v2", "autoscaling/v2beta2")
# Wait before scaling in: a replica takes minutes to load, so don't give one up on a short lull.
SCALE_DOWN_STABILIZATION_S = 300


# SLO metric -> vLLM histogram whose buckets give its p95.
SLO_HISTOGRAMS = {"ttft_p95_seconds": "vllm:time_to_first_token_seconds",
                  "inter_token_latency_p95_seconds": "vllm:inter_token_latency_seconds"}


def is_slo(spec: InferenceServiceSpec) -> bool:
    """Whether the autoscaler follows a latency SLO (a Value over all replicas), not a per-pod gauge."""
    return spec.autoscaling is not None and spec.autoscaling.metric in SLO_METRICS


def metric_name(spec: InferenceServiceSpec) -> str:
    """The metric the HPA asks for: the engine gauge with vLLM's name (`vllm:num_requests_waiting`), or
    the External SLO metric the chart's adapter rules serve (`flotilla_ttft_p95_seconds`)."""
    assert spec.autoscaling is not None
    return f"flotilla_{spec.autoscaling.metric}" if is_slo(spec) else f"vllm:{spec.autoscaling.metric}"


def desired_replicas(current: int, value: float, target: float, min_replicas: int, max_replicas: int) -> int:
    """What the HPA controller (and so KEDA) asks for with a Value target: ceil(current x value / target),
    within [min, max]; it leaves replicas alone within its 10% tolerance."""
    ratio = value / target
    wanted = current if abs(ratio - 1) <= 0.1 else math.ceil(current * ratio)
    return max(min_replicas, min(max_replicas, wanted))


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
    if is_slo(spec):
        metric = {"type": "External", "external": {
            "metric": {"name": metric_name(spec),
                       "selector": {"matchLabels": {names.INFERENCESERVICE_SERIES_LABEL: name}}},
            "target": {"type": "Value", "value": _quantity(a.target)}}}
    else:
        metric = {"type": "Pods", "pods": {
            "metric": {"name": metric_name(spec)},
            "target": {"type": "AverageValue", "averageValue": _quantity(a.target)}}}
    return {
        "apiVersion": api_version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": names.metadata(name, namespace),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [metric],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_STABILIZATION_S}},
        },
    }


# Who holds the Deployment's replicas between the operator's last apply with them and the autoscaler's first write.
REPLICAS_HANDOVER_MANAGER = "flotilla-operator-handover"
# Who scales the Deployment to zero while the spec is refused (reconciler.py): the rest of it is not applied then.
REFUSED_SCALE_MANAGER = "flotilla-operator-scale"


def replicas_handover(applied: dict[str, Any], live: dict[str, Any] | None, manager: str,
                      min_replicas: int = 1) -> dict[str, Any] | None:
    """The apply (as REPLICAS_HANDOVER_MANAGER) that keeps the live Deployment's replicas when autoscaling turns on
    (or resumes), or None when nothing needs handing over.

    With autoscaling the Deployment is applied without `replicas` (the autoscaler owns it). Server-side apply
    removes a field that its only manager stops applying, and the apiserver defaults a missing `replicas` to 1: turning
    autoscaling on for a Deployment of 3 would delete 2 serving replicas until the autoscaler scales back up.
    Kubernetes' answer (server-side apply, "Transferring ownership") is another manager applying the same value
    first, so the field stays when `manager` lets go of it. A Deployment at 0 replicas (autoscaling was suspended by
    spec.replicas 0) is handed over at `min_replicas` instead: an HPA does not act on a target scaled to 0.
    """
    if live is None or "replicas" in applied["spec"] or not (
            _applies_replicas(live, manager) or _applies_replicas(live, REFUSED_SCALE_MANAGER, "Update")):
        return None
    meta = applied["metadata"]
    return {"apiVersion": applied["apiVersion"], "kind": applied["kind"],
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "spec": {"replicas": live["spec"].get("replicas", 1) or min_replicas}}


# Who copies the autoscaler's count into the InferenceService's spec.replicas (through its scale subresource).
AUTOSCALED_REPLICAS_MANAGER = "flotilla-operator-autoscaled"


def autoscaled_replicas(spec: InferenceServiceSpec, deployment: dict[str, Any] | None) -> int | None:
    """The count to copy into spec.replicas: the Deployment's, while an autoscaler owns it and it differs; None
    otherwise.

    So spec.replicas always holds the count serving now, as the scale subresource of an HPA's Deployment does: `kubectl
    scale --current-replicas`, `kubectl get --subresource=scale` and an HPA or KEDA aimed at the InferenceService read
    it (the apiserver cannot answer that subresource when spec.replicas is absent), and removing spec.autoscaling
    keeps it instead of going back to whatever spec.replicas held before. 0 (KEDA's scale to zero) is not copied:
    spec.replicas 0 means "suspend autoscaling"."""
    if deployment is None or not spec.autoscaled:
        return None
    live = (deployment.get("spec") or {}).get("replicas", 1)
    return live if live and live != spec.replicas else None


def _applies_replicas(obj: dict[str, Any], manager: str, operation: str = "Apply") -> bool:
    return any(entry.get("manager") == manager and entry.get("operation") == operation
               and "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
               for entry in obj["metadata"].get("managedFields") or [])


def keda_query(spec: InferenceServiceSpec, name: str, namespace: str) -> str:
    """PromQL over this InferenceService's pods (label copied by the ServiceMonitor): the gauge summed,
    or the SLO's p95 from the histogram buckets over `autoscaling.window` (0 with no traffic)."""
    assert spec.autoscaling is not None
    selector = f'{{namespace="{namespace}",{names.INFERENCESERVICE_SERIES_LABEL}="{name}"}}'
    if is_slo(spec):
        histogram = SLO_HISTOGRAMS[spec.autoscaling.metric]
        # No request in the window gives NaN (0/0): `> 0` drops it and `or vector(0)` reads it as 0.
        return (f"(histogram_quantile(0.95, sum by (le) (rate({histogram}_bucket{selector}"
                f"[{spec.autoscaling.window}]))) > 0) or vector(0)")
    return f"sum({metric_name(spec)}{selector})"


def build_scaled_object(spec: InferenceServiceSpec, name: str, namespace: str) -> dict[str, Any] | None:
    """KEDA ScaledObject with a Prometheus trigger, or None when autoscaling is not set.

    KEDA divides the summed query by the replica count (metricType AverageValue), so `target` keeps
    the same per-pod meaning as with the HPA; an SLO's p95 is compared as it is (metricType Value).
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
                "metricType": "Value" if is_slo(spec) else "AverageValue",
                "metadata": {"serverAddress": a.prometheus_address,
                             "query": keda_query(spec, name, namespace),
                             "threshold": f"{a.target:g}"},
            }],
        },
    }
