"""Names, labels and well-known paths shared by every child object of an InferenceService.

Kept in one place so the Deployment's selector, the Service's selector, the ServiceMonitor's
`targetLabels` and the autoscalers' queries can never drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from flotilla.operator.spec import GROUP

# Pods and the Service carry it; the ServiceMonitor copies it onto every series (DESIGN.md §1).
INFERENCESERVICE_LABEL = f"{GROUP}/inferenceservice"
# The same label once Prometheus has sanitised it into a series label.
INFERENCESERVICE_SERIES_LABEL = "serving_flotilla_dev_inferenceservice"

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "flotilla-operator"

# Child objects carry the InferenceService's own name, which is also a Service name (a DNS-1035
# label) and a label value: both at most 63 characters. Suffixes appended to it for other objects
# are listed here, so the name limit leaves room for the longest.
NAME_SUFFIXES: tuple[str, ...] = ()
MAX_NAME_LENGTH = 63 - max((len(s) for s in NAME_SUFFIXES), default=0)
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# Kubernetes' rules on label and annotation keys ([prefix/]name, a "qualified name") and label values.
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_CHARACTERS = "letters, digits, '-', '_' and '.', starting and ending with a letter or digit"

ENGINE_CONTAINER = "engine"
HTTP_PORT = 8000
HTTP_PORT_NAME = "http"
# The checkpoint is always mounted here; it is the engine's MODEL argument.
MODEL_PATH = "/model"
# spec.model.tokenizer is mounted here; it is the engine's --tokenizer.
TOKENIZER_PATH = "/tokenizer"


def selector_labels(name: str) -> dict[str, str]:
    """Labels that select an InferenceService's pods (immutable once a Deployment exists)."""
    return {INFERENCESERVICE_LABEL: name}


def common_labels(name: str) -> dict[str, str]:
    """Labels put on every child object and pod."""
    return {
        "app.kubernetes.io/name": "flotilla-engine",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "inference",
        MANAGED_BY_LABEL: MANAGED_BY,
        **selector_labels(name),
    }


def name_problem(name: str) -> str | None:
    """Why `name` cannot name an InferenceService (its Service and labels), or None when it can."""
    if len(name) > MAX_NAME_LENGTH:
        return (f"metadata.name {name!r} is {len(name)} characters long; the limit is {MAX_NAME_LENGTH} "
                "(it names the Service and is a label value)")
    if not _DNS_1035_LABEL.fullmatch(name):
        return (f"metadata.name {name!r} must be a DNS-1035 label, as a Service name: lower-case letters, "
                "digits and '-', starting with a letter and ending with a letter or digit")
    return None


def label_key_problem(key: str) -> str | None:
    """Why `key` is no label or annotation key by Kubernetes' rules (an optional DNS-subdomain prefix and '/', then
    a name of at most 63 characters), or None when it is one."""
    parts = key.split("/")
    if len(parts) > 2:
        return "a key has at most one '/' ([prefix/]name)"
    if len(parts) == 2 and not (len(parts[0]) <= 253 and _DNS_1123_SUBDOMAIN.fullmatch(parts[0])):
        return (f"its prefix {parts[0]!r} must be a DNS subdomain: at most 253 lower-case letters, digits, '-' and "
                "'.', starting and ending with a letter or digit")
    name = parts[-1]
    if len(name) > 63:
        return f"its name {name!r} is {len(name)} characters long; the limit is 63"
    if not _LABEL_NAME.fullmatch(name):
        return f"its name {name!r} must be 1 to 63 {_LABEL_CHARACTERS}"
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is no label value by Kubernetes' rules (empty, or at most 63 characters of a name), or None."""
    if len(value) > 63:
        return f"it is {len(value)} characters long; the limit is 63"
    if value and not _LABEL_NAME.fullmatch(value):
        return f"it must be empty or {_LABEL_CHARACTERS}"
    return None


def label_problems(field: str, labels: Mapping[str, str], kind: str = "label") -> list[str]:
    """What the apiserver would refuse in a map the spec passes on as labels (or, kind "annotation", annotations:
    their keys only), one message per key that names `field`."""
    errors = []
    for key, value in labels.items():
        # the apiserver checks an annotation's key lower-cased (a prefix may have capitals there, not on a label)
        if problem := label_key_problem(key.lower() if kind == "annotation" else key):
            errors.append(f"{field}: {key!r} is not a valid {kind} key: {problem}")
        elif kind == "label" and (problem := label_value_problem(value)):
            errors.append(f"{field}: the value of {key}, {value!r}, is not a valid label value: {problem}")
    return errors


# The apiserver's limit on one object's annotations: every key and value together, counted in bytes (UTF-8).
ANNOTATIONS_SIZE_LIMIT = 256 * 1024


def annotations_size_problem(field: str, annotations: Mapping[str, str]) -> str | None:
    """Why the apiserver would refuse `annotations` as an object's annotations for their size (keys and values
    together over 256 KiB), naming `field`; None when they fit."""
    size = sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())
    if size <= ANNOTATIONS_SIZE_LIMIT:
        return None
    return (f"{field}: the keys and values come to {size} bytes; Kubernetes allows at most {ANNOTATIONS_SIZE_LIMIT} "
            "(256 KiB) of annotations on an object")


def metadata(name: str, namespace: str) -> dict:
    """`metadata` for a child object: same name as the InferenceService, common labels."""
    return {"name": name, "namespace": namespace, "labels": common_labels(name)}


def service_url(name: str, namespace: str) -> str:
    """The in-cluster base URL clients use (OpenAI SDK `base_url` is this plus `/v1`)."""
    return f"http://{name}.{namespace}.svc.cluster.local:{HTTP_PORT}"
