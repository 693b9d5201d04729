"""The Deployment of engine pods for an InferenceService (a pure builder)."""

from __future__ import annotations

from typing import Any

from flotilla.flags import flag
from flotilla.operator import names
from flotilla.operator.engine_args import ENGINE_COMMAND, engine_args
from flotilla.operator.model_volume import model_volume
from flotilla.operator.spec import InferenceServiceSpec

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# Seconds the preStop hook waits before the engine sees SIGTERM, so Service endpoints and load
# balancers stop sending new requests first.
PRESTOP_DELAY_S = 10
# Loading a large checkpoint (and capturing CUDA graphs) takes minutes: the startup probe allows
# up to STARTUP_PERIOD_S x STARTUP_FAILURES = 60 minutes before the pod is restarted.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 360
RUN_AS_USER = 1000


def termination_grace_seconds() -> int:
    """Grace period covering the preStop delay plus the engine's drain (--shutdown-timeout) and slack."""
    return PRESTOP_DELAY_S + int(flag("--shutdown-timeout").default) + 15


def _probe(path: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": names.HTTP_PORT_NAME}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": timeout}


def _resources(spec: InferenceServiceSpec) -> dict[str, Any]:
    limits: dict[str, Any] = {GPU_RESOURCE: str(spec.gpus_per_replica)}
    requests: dict[str, Any] = {}
    for key, value in (("cpu", spec.resources.cpu), ("memory", spec.resources.memory)):
        if value is not None:
            # Request = limit: guaranteed QoS keeps a serving pod from being evicted under pressure.
            limits[key] = requests[key] = str(value)
    return {"limits": limits, "requests": requests} if requests else {"limits": limits}


def _env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    # The root filesystem is read-only: every cache (HF, torch, Triton) goes to the /tmp emptyDir.
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    ref = spec.api_key_secret_ref
    if ref is not None:
        env.append({"name": str(flag("--api-key").env),
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def _scheduling(spec: InferenceServiceSpec) -> dict[str, Any]:
    node_selector = dict(spec.resources.node_selector)
    if spec.resources.gpu_product:
        node_selector[GPU_PRODUCT_LABEL] = spec.resources.gpu_product
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += [t.model_dump(by_alias=True, exclude_none=True) for t in spec.resources.tolerations]
    out: dict[str, Any] = {"tolerations": tolerations}
    if node_selector:
        out["nodeSelector"] = node_selector
    return out


def build_deployment(spec: InferenceServiceSpec, name: str, namespace: str) -> dict[str, Any]:
    """The engine Deployment: `flotilla serve /model <flags>` with GPUs, probes and a graceful drain.

    `replicas` is left out while autoscaling is set, so the autoscaler owns it and re-applying the
    Deployment does not fight the HPA.
    """
    volume, mount, init_containers = model_volume(spec)
    container: dict[str, Any] = {
        "name": names.ENGINE_CONTAINER,
        "image": spec.image,
        "command": ENGINE_COMMAND,
        "args": engine_args(spec, name),
        "ports": [{"name": names.HTTP_PORT_NAME, "containerPort": names.HTTP_PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec),
        "volumeMounts": [mount, {"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "tmp", "mountPath": "/tmp"}],
        "startupProbe": _probe("/health", STARTUP_PERIOD_S, STARTUP_FAILURES),
        "readinessProbe": _probe("/health", 5, 3),
        "livenessProbe": _probe("/health", 10, 6),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_DELAY_S)]}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            volume,
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
            {"name": "tmp", "emptyDir": {}},
        ],
        "terminationGracePeriodSeconds": termination_grace_seconds(),
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER, "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "enableServiceLinks": False,
        **_scheduling(spec),
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": names.selector_labels(name)},
        # A new pod must be ready before an old one goes: serving capacity never drops in a rollout.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {"metadata": {"labels": names.common_labels(name)}, "spec": pod_spec},
    }
    if spec.autoscaling is None:
        deployment_spec = {"replicas": spec.replicas, **deployment_spec}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": names.metadata(name, namespace),
            "spec": deployment_spec}
