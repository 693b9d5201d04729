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


HOST_NAMESPACE_FIELDS = ("hostNetwork", "hostPID", "hostIPC")


def host_namespaces_reset(deployment: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON merge patch that turns off the host namespaces a hand edit turned on in `deployment`, or None."""
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    on = [key for key in HOST_NAMESPACE_FIELDS if pod.get(key)]
    return {"spec": {"template": {"spec": dict.fromkeys(on)}}} if on else None
