"""Names, labels and well-known paths shared by every child object of an InferenceService.

Kept in one place so the Deployment's selector, the Service's selector, the ServiceMonitor's
`targetLabels` and the autoscalers' queries can never drift apart.
"""

from __future__ import annotations

from flotilla.operator.spec import GROUP

# Pods and the Service carry it; the ServiceMonitor copies it onto every series (DESIGN.md §1).
INFERENCESERVICE_LABEL = f"{GROUP}/inferenceservice"
# The same label once Prometheus has sanitised it into a series label.
INFERENCESERVICE_SERIES_LABEL = "serving_flotilla_dev_inferenceservice"

ENGINE_CONTAINER = "engine"
HTTP_PORT = 8000
HTTP_PORT_NAME = "http"
# The checkpoint is always mounted here; it is the engine's MODEL argument.
MODEL_PATH = "/model"


def selector_labels(name: str) -> dict[str, str]:
    """Labels that select an InferenceService's pods (immutable once a Deployment exists)."""
    return {INFERENCESERVICE_LABEL: name}


def common_labels(name: str) -> dict[str, str]:
    """Labels put on every child object and pod."""
    return {
        "app.kubernetes.io/name": "flotilla-engine",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "inference",
        "app.kubernetes.io/managed-by": "flotilla-operator",
        **selector_labels(name),
    }


def metadata(name: str, namespace: str) -> dict:
    """`metadata` for a child object: same name as the InferenceService, common labels."""
    return {"name": name, "namespace": namespace, "labels": common_labels(name)}


def service_url(name: str, namespace: str) -> str:
    """The in-cluster base URL clients use (OpenAI SDK `base_url` is this plus `/v1`)."""
    return f"http://{name}.{namespace}.svc.cluster.local:{HTTP_PORT}"
