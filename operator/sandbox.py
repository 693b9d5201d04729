"""The engine pods' sandbox: the security fields the operator sets on every pod and container it renders.

Each is stated explicitly, the API's defaults included (`privileged: false`): server-side apply owns only the
fields the applied object names, so a field left to its default would not be the operator's, and a hand edit of
it (`kubectl edit` by someone with Deployment rights) would survive every repair. Stated, it is taken back like
any other field the operator sets. Container-level `runAsNonRoot` and `seccompProfile` are stated too, since a
container's own value overrides the pod's.

The pod's host namespaces are the exception: `hostNetwork`/`hostPID`/`hostIPC` are plain booleans that the API
drops when false, so applying them as false changed the object's managedFields on every apply (a write and an
"updated" Event per resync). They are left out of the applied object and reset by a merge patch when a hand edit
turned one on (`host_namespaces_reset`).
"""

from __future__ import annotations

from typing import Any

RUN_AS_USER = 1000


def container_security_context() -> dict[str, Any]:
    """Every container's securityContext: non-root, no privilege, no capability, read-only root, RuntimeDefault."""
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_sandbox() -> dict[str, Any]:
    """The pod spec's own fields: user 1000, RuntimeDefault seccomp (the host namespaces: host_namespaces_reset)."""
    return {
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER, "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


# The NVIDIA container toolkit reads the container's NVIDIA_* environment as device requests: with the device plugin's
# default (envvar) strategy, NVIDIA_VISIBLE_DEVICES=all in the pod spec exposes every GPU of the node, since the kubelet
# puts the pod's variables after the device plugin's, and the last wins. So spec.pod.env may set none of them, and
# envFrom only under a prefix that cannot spell one (admission.py).
GPU_RUNTIME_ENV_PREFIX = "NVIDIA_"
# NVIDIA_* names the toolkit does not read: cuBLAS/cuDNN read NVIDIA_TF32_OVERRIDE in the process (a precision switch
# that requests no device), which users set on CUDA pods.
LIBRARY_ENV = frozenset({"NVIDIA_TF32_OVERRIDE"})
# An init container requests no GPU, so the device plugin sets nothing there, and an image built on a CUDA base image
# says NVIDIA_VISIBLE_DEVICES=all: the toolkit would hand it every GPU of the node. void: no GPU support at all.
NO_GPUS_ENV = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


GPU_RUNTIME_ENV_REASON = ("the NVIDIA container toolkit reads NVIDIA_* variables as device requests "
                          "(NVIDIA_VISIBLE_DEVICES=all would expose every GPU of the node)")


def is_gpu_runtime_name(name: str, prefix: bool = False) -> bool:
    """Whether the environment variable `name` (`prefix` True: some name that an envFrom prefix `name` makes) is one
    the NVIDIA container toolkit reads."""
    if prefix:
        return name.startswith(GPU_RUNTIME_ENV_PREFIX) or GPU_RUNTIME_ENV_PREFIX.startswith(name)
    return name.startswith(GPU_RUNTIME_ENV_PREFIX) and name not in LIBRARY_ENV


HOST_NAMESPACE_FIELDS = ("hostNetwork", "hostPID", "hostIPC")


def host_namespaces_reset(deployment: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON merge patch that turns off the host namespaces a hand edit turned on in `deployment`, or None."""
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    on = [key for key in HOST_NAMESPACE_FIELDS if pod.get(key)]
    return {"spec": {"template": {"spec": dict.fromkeys(on)}}} if on else None
