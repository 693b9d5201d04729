"""The Prometheus Operator ServiceMonitor that scrapes the engine's /metrics (a pure builder).

Created only when the `monitoring.coreos.com/v1` CRD exists in the cluster (the handler decides).
"""

from __future__ import annotations

from typing import Any

from flotilla.operator import names
from flotilla.operator.spec import InferenceServiceSpec


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
                           "interval": spec.monitoring.interval, "scheme": "http"}],
        },
    }
