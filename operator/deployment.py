"""The Deployment of engine pods for an InferenceService (a pure builder)."""

from __future__ import annotations

import math
from typing import Any

from flotilla.flags import flag
from flotilla.operator import names
from flotilla.operator.engine_args import ENGINE_COMMAND, engine_args, shutdown_timeout
from flotilla.operator.fit import gguf_file_bytes, rtn_scheme, weight_bytes
from flotilla.operator.gpus import node_label_value
from flotilla.operator.lora_volumes import adapter_volumes
from flotilla.operator.model_volume import model_volume, tokenizer_volume
from flotilla.operator.sandbox import container_security_context, pod_sandbox
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
GIB = 1 << 30
DEFAULT_LOADING_BYTES = 8 * GIB
DEFAULT_DOWNLOAD_SIZE = "500Gi"
# Environment variables the operator sets on the engine: refused in spec.pod.env (admission.py).
OPERATOR_ENV = ("HOME", "XDG_CACHE_HOME", "HF_HUB_OFFLINE", str(flag("--api-key").env))


def termination_grace_seconds(spec: InferenceServiceSpec) -> int:
    """Grace period covering the preStop delay plus the engine's drain (--shutdown-timeout) and slack."""
    return PRESTOP_DELAY_S + math.ceil(shutdown_timeout(spec)) + 15


def _probe(path: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": names.HTTP_PORT_NAME}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": timeout}


def _weights(spec: InferenceServiceSpec) -> int | None:
    """Bytes of the checkpoint's weights (what is downloaded and read through the page cache): model.config's
    numbers, which an --hf-overrides layer count does not change on disk, stored as its quantization_config says."""
    arch = spec.model.config
    return None if arch is None else weight_bytes(arch, spec.weight_quantization, spec.dtype, rtn_scheme(spec),
                                                  quantization_config=spec.quantization_config_override)


def default_requests(spec: InferenceServiceSpec) -> dict[str, str]:
    """CPU and memory requests when the spec sets none, so the pod is never BestEffort.

    CPU: 2 cores for the front end and scheduler plus 2 per GPU (tokenizing, detokenizing and the
    launch loop of each worker). Memory: 4 GiB per GPU (CUDA context, pinned buffers, tokenizer) plus a
    quarter of the weights for loading (safetensors shards are read through the page cache one at a
    time), or 8 GiB more when the weights are unknown. Estimates; set resources.cpu/memory to override.
    """
    gpus = spec.gpus_per_replica
    weights = _weights(spec)
    loading = DEFAULT_LOADING_BYTES if weights is None else weights // 4
    return {"cpu": str(2 + 2 * gpus), "memory": f"{math.ceil((gpus * 4 * GIB + loading) / GIB)}Gi"}


def _resources(spec: InferenceServiceSpec) -> dict[str, Any]:
    limits: dict[str, Any] = {GPU_RESOURCE: str(spec.gpus_per_replica)}
    requests: dict[str, Any] = default_requests(spec)
    for key, value in (("cpu", spec.resources.cpu), ("memory", spec.resources.memory)):
        if value is not None:
            # Request = limit: guaranteed QoS keeps a serving pod from being evicted under pressure.
            limits[key] = requests[key] = str(value)
    return {"limits": limits, "requests": requests}


def download_cache_size(spec: InferenceServiceSpec) -> str:
    """sizeLimit of the emptyDir an hf:// checkpoint downloads into (see ModelCacheSpec.size): 1.2 x the weights,
    as a GGUF file holds them for a .gguf source (fit.gguf_file_bytes)."""
    if spec.model.cache and spec.model.cache.size:
        return spec.model.cache.size
    arch = spec.model.config
    weights = gguf_file_bytes(arch) if arch is not None and spec.model.gguf_file else _weights(spec)
    return DEFAULT_DOWNLOAD_SIZE if weights is None else f"{math.ceil(weights * 1.2 / GIB) + 1}Gi"


def container_env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The engine container's env: the operator's variables, then spec.pod.env in order (exec_size.py sizes it)."""
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
    return env + [e.model_dump(by_alias=True, exclude_none=True) for e in spec.pod.env]


def container_args(spec: InferenceServiceSpec, name: str) -> list[str]:
    """The engine container's args: engine_args with every '$' doubled. The kubelet rewrites `$(NAME)` in args to the
    variable's value and `$$` to `$` before the engine starts; doubled, the engine gets exactly the arguments the
    review checked (a chat template's `$$` or `$(x)` included), never a value it did not see."""
    return [arg.replace("$", "$$") for arg in engine_args(spec, name)]


def _pod_extras(spec: InferenceServiceSpec) -> dict[str, Any]:
    pod = spec.pod
    out: dict[str, Any] = {
        "imagePullSecrets": [{"name": n} for n in pod.image_pull_secrets],
        "affinity": pod.affinity,
        "topologySpreadConstraints": pod.topology_spread_constraints,
        "priorityClassName": pod.priority_class_name,
        "serviceAccountName": pod.service_account_name,
    }
    return {k: v for k, v in out.items() if v}


def _scheduling(spec: InferenceServiceSpec) -> dict[str, Any]:
    node_selector = dict(spec.resources.node_selector)
    if spec.resources.gpu_product:
        node_selector[GPU_PRODUCT_LABEL] = node_label_value(spec.resources.gpu_product)
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += [t.model_dump(by_alias=True, exclude_none=True) for t in spec.resources.tolerations]
    out: dict[str, Any] = {"tolerations": tolerations}
    if node_selector:
        out["nodeSelector"] = node_selector
    return out


def _pod_metadata(spec: InferenceServiceSpec, name: str) -> dict[str, Any]:
    # The operator's own labels win; admission refuses pod labels that would override them.
    meta: dict[str, Any] = {"labels": {**spec.pod.labels, **names.common_labels(name)}}
    if spec.pod.annotations:
        meta["annotations"] = dict(spec.pod.annotations)
    return meta


def _engine_container(spec: InferenceServiceSpec, name: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine container: `flotilla serve` with its flags, port, probes, resources and a locked-down
    security context; `mounts` are the model's, /dev/shm's, /tmp's and any tokenizer or adapter volume's."""
    return {
        "name": names.ENGINE_CONTAINER,
        "image": spec.image,
        "command": ENGINE_COMMAND,
        "args": container_args(spec, name),
        "ports": [{"name": names.HTTP_PORT_NAME, "containerPort": names.HTTP_PORT, "protocol": "TCP"}],
        "env": container_env(spec),
        **({"envFrom": [e.model_dump(by_alias=True, exclude_none=True) for e in spec.pod.env_from]}
           if spec.pod.env_from else {}),
        "resources": _resources(spec),
        "volumeMounts": mounts,
        "startupProbe": _probe("/health", STARTUP_PERIOD_S, STARTUP_FAILURES),
        "readinessProbe": _probe("/health", 5, 3),
        "livenessProbe": _probe("/health", 10, 6),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_DELAY_S)]}}},
        # A crash's last log lines (a traceback, runc's "argument list too long") become the termination message,
        # which the Ready condition quotes (pod_problems.py).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
    }


def build_deployment(spec: InferenceServiceSpec, name: str, namespace: str) -> dict[str, Any]:
    """The engine Deployment: `flotilla serve /model <flags>` with GPUs, probes and a graceful drain.

    `replicas` is left out while an autoscaler owns it (`spec.autoscaled`), so re-applying the Deployment does
    not fight the HPA; spec.replicas 0 is applied even with autoscaling set (scaled to zero, autoscaler suspended).
    """
    volume, mount, init_containers = model_volume(spec, download_cache_size(spec))
    tokenizer_volumes, tokenizer_mounts, tokenizer_inits = tokenizer_volume(spec)
    lora_volumes, lora_mounts, lora_inits = adapter_volumes(spec)
    extra_volumes, extra_mounts = tokenizer_volumes + lora_volumes, tokenizer_mounts + lora_mounts
    init_containers = init_containers + tokenizer_inits + lora_inits
    container = _engine_container(spec, name, [mount, {"name": "dshm", "mountPath": "/dev/shm"},
                                               {"name": "tmp", "mountPath": "/tmp"}, *extra_mounts])
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            volume,
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
            {"name": "tmp", "emptyDir": {"sizeLimit": spec.resources.tmp_size}},
            *extra_volumes,
        ],
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        **pod_sandbox(),
        "enableServiceLinks": False,
        # The engine never calls the Kubernetes API: no token in the pod.
        "automountServiceAccountToken": False,
        **_scheduling(spec),
        **_pod_extras(spec),
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": names.selector_labels(name)},
        # By default a new pod must be ready before an old one goes, so serving capacity never drops;
        # on a full GPU pool (no spare GPUs) spec.rollout takes one down first instead.
        # Past it the Deployment controller marks the rollout ProgressDeadlineExceeded, which status reports.
        "progressDeadlineSeconds": spec.rollout.progress_deadline_seconds,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": spec.rollout.max_unavailable,
                                                                "maxSurge": spec.rollout.max_surge}},
        "template": {"metadata": _pod_metadata(spec, name), "spec": pod_spec},
    }
    if not spec.autoscaled:
        deployment_spec = {"replicas": spec.replicas, **deployment_spec}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": names.metadata(name, namespace),
            "spec": deployment_spec}
