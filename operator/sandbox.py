"""The engine pods' sandbox: the security fields the operator sets on every pod and container it renders.

Each is stated explicitly, the API's defaults included (`hostNetwork: false`, `privileged: false`): server-side
apply owns only the fields the applied object names, so a field left to its default would not be the
operator's, and a hand edit of it (`kubectl edit` by someone with Deployment rights) would survive every repair.
Stated, it is taken back like any other field the operator sets. Container-level `runAsNonRoot` and
`seccompProfile` are stated too, since a container's own value overrides the pod's.
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
    """The pod spec's own fields: user 1000, RuntimeDefault seccomp, none of the node's namespaces."""
    return {
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER, "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
    }
