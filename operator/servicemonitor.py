"""The Prometheus Operator ServiceMonitor that scrapes the engine's /metrics (a pure builder).

Created only when the `monitoring.coreos.com/v1` CRD exists in the cluster (the handler decides).
Prometheus follows redirects by default, and the engine image is the InferenceService author's: its /metrics
could redirect Prometheus' scrapes anywhere Prometheus reaches, so the endpoint says `followRedirects: false`.
The Prometheus Operator's CRD has that field from v0.55 (2022); server-side apply refuses a field an older CRD's
schema lacks, so the reconciler drops it there (`drop_fields_an_older_crd_lacks`).
"""

from __future__ import annotations

from typing import Any

from flotilla.operator import names
from flotilla.operator.spec import InferenceServiceSpec

FOLLOW_REDIRECTS = "followRedirects"


def build_service_monitor(spec: InferenceServiceSpec, name: str, namespace: str) -> dict[str, Any] | None:
    """The ServiceMonitor, or None when spec.monitoring.serviceMonitor is false.

    `targetLabels` copies the InferenceService label from the Service onto every scraped series,
    so dashboards and the KEDA query can select one InferenceService.
    """
    if not spec.monitoring.service_monitor:
        return None
    metadata = names.metadata(name, namespace)
    metadata["labels"] = {**spec.monitoring.labels, **metadata["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": names.selector_labels(name)},
            "namespaceSelector": {"matchNames": [namespace]},
            "targetLabels": [names.INFERENCESERVICE_LABEL],
            "endpoints": [{"port": names.HTTP_PORT_NAME, "path": "/metrics",
                           "interval": spec.monitoring.interval, "scheme": "http", FOLLOW_REDIRECTS: False}],
        },
    }


def drop_fields_an_older_crd_lacks(child: dict[str, Any], refusal: str) -> bool:
    """Remove `followRedirects` from a ServiceMonitor that server-side apply refused for it (a Prometheus Operator
    CRD older than v0.55: "field not declared in schema"); True when it did, so the caller applies it again."""
    if child.get("kind") != "ServiceMonitor" or f".{FOLLOW_REDIRECTS}: field not declared in schema" not in refusal:
        return False
    for endpoint in child["spec"]["endpoints"]:
        endpoint.pop(FOLLOW_REDIRECTS, None)
    return True
