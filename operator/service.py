"""The Service in front of an InferenceService's engine pods (a pure builder)."""

from __future__ import annotations

from typing import Any

from flotilla.operator import names


def build_service(name: str, namespace: str) -> dict[str, Any]:
    """ClusterIP Service, port 8000 named `http` (the OpenAI API and /metrics), selecting the pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.metadata(name, namespace),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector_labels(name),
            "ports": [{"name": names.HTTP_PORT_NAME, "port": names.HTTP_PORT,
                       "targetPort": names.HTTP_PORT_NAME, "protocol": "TCP"}],
        },
    }
