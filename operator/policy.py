"""What the cluster admin allows InferenceServices to do beyond their namespace: the admission policy.

Whoever may create an InferenceService must not gain more than that. Anything that reaches the node
itself is off unless the operator is started with it turned on (`flotilla operator` flags, set by the
chart's values); the review (admission.py) reads this policy, so the webhook and the reconciler
decide alike.

The first such power is a `hostPath://` model source, which mounts a node directory into the
engine pod: off by default, and when an admin allows it, limited to the directory prefixes the admin
lists (`--host-path-prefix /models`). A path with `.`/`..` segments, repeated slashes or a trailing
slash is refused rather than normalised, so what is checked is exactly what the kubelet mounts.
The check is on the path's text: a symbolic link on the node under an allowed directory is followed by
the kubelet. The mounts are read-only, so no InferenceService can plant one; the admin keeps the allowed
directories free of links that leave them (docs/operator.md, "Security model").

The second is where KEDA sends its queries: KEDA runs them from its own pod, with its network position, and
puts a failed answer's body in its errors, so an address of the InferenceService author's choosing would make
it fetch from anywhere (a cloud metadata endpoint, an internal admin API). The admin lists the Prometheus
addresses allowed (`--prometheus-address`); spec.autoscaling.prometheusAddress must be one of them, and its
schema default stands for the first (so a spec that leaves it out follows the cluster's Prometheus).

The third is which pod annotations spec.pod.annotations may set. Annotations are instructions to whatever
reads them: a mesh's sidecar injector (`sidecar.istio.io/userVolume` mounts a node directory into the injected
sidecar), the node's container runtime (`io.kubernetes.cri-o.Devices`, `io.katacontainers.config.*`: keys with
dots and no slash), a cloud identity agent (`iam.amazonaws.com/role`). Which tools a cluster runs is the
admin's to know, so the rule is an allow-list: a plain key of the user's own (no `/`, no `.`) always passes,
any other only when the admin lists it (`--pod-annotation KEY`, or `--pod-annotation PREFIX/` for every key
under that prefix).

Pod labels are read as instructions too: a label key with a prefix (`/`) is a tool's (a mutating webhook that
mounts a cloud token into the pod, as Azure Workload Identity does for `azure.workload.identity/use`, while the
operator promises the pods no token; the label form of `sidecar.istio.io/inject`, which wins over the
namespace's choice; a prefixed label that NetworkPolicies or a policy engine select by). So spec.pod.labels
follows the same rule: a key without a prefix is the user's, a prefixed one only when the admin lists it
(`--pod-label KEY` or `--pod-label PREFIX/`). A dot without a prefix is a plain label name (runtimes read
annotations, not labels).

The fourth is the pods' priority class. The built-in `system-node-critical` and `system-cluster-critical`
(priority 2e9, above any class a user can make) let the engine pods preempt every other team's pods on the GPU
nodes, and since Kubernetes 1.17 the apiserver no longer keeps them to kube-system unless the admin configures
a quota for them. So `system-*` classes are refused unless the admin lists them, and when the admin lists
classes (`--priority-class`), only those are allowed.

The fifth is the pods' ServiceAccount. The pods never mount its token, but a cloud's workload identity (EKS IRSA,
GKE Workload Identity, Azure Workload Identity) keys on the ServiceAccount alone, so the engine gets the cloud role
of whichever account spec.pod.serviceAccountName names. By default any ServiceAccount of the namespace may be named,
as a Pod (or a KServe InferenceService) may name one: the namespace's accounts are its owner's to police. An admin
who binds cloud roles to accounts in tenant namespaces lists the accounts engine pods may use (`--service-account`);
then only those may be named (leaving the field out, the namespace's `default`, always may).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flotilla.operator.spec import DEFAULT_IMAGE, DEFAULT_PROMETHEUS_ADDRESS, PROMETHEUS_URL_PATTERN

# Kubernetes reserves the prefix for its built-in critical classes (no user may create a PriorityClass named so).
SYSTEM_PRIORITY_PREFIX = "system-"


@dataclass(frozen=True)
class AdmissionPolicy:
    """The admin's choices; the default allows nothing beyond the namespace."""

    host_path_prefixes: tuple[str, ...] = ()
    prometheus_addresses: tuple[str, ...] = (DEFAULT_PROMETHEUS_ADDRESS,)
    pod_annotations: tuple[str, ...] = ()
    pod_labels: tuple[str, ...] = ()
    priority_classes: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = ()
    # What spec.image's schema default stands for (--engine-image: a mirror, a vetted build). The mutating webhook
    # writes it into the spec; the review settles it too, for a spec admitted while the webhook was away.
    engine_image: str = DEFAULT_IMAGE

    def __post_init__(self) -> None:
        for prefix in self.host_path_prefixes:
            problem = _path_problem(prefix)
            if problem:
                raise ValueError(f"host path prefix {prefix!r}: {problem}")
        if any(not allowed for allowed in self.pod_annotations):
            raise ValueError("an allowed pod annotation must be a key or a prefix ending in '/', not empty")
        if any(not allowed for allowed in self.pod_labels):
            raise ValueError("an allowed pod label must be a key or a prefix ending in '/', not empty")
        if not self.prometheus_addresses:
            raise ValueError("at least one Prometheus address is needed (KEDA's default)")
        for address in self.prometheus_addresses:
            if not re.match(PROMETHEUS_URL_PATTERN, address):
                raise ValueError(f"Prometheus address {address!r} is not a plain http(s)://host[:port][/path] URL")

    def pod_annotation_problem(self, key: str) -> str | None:
        """Why spec.pod.annotations may not set `key`, or None when it is the user's own or the admin allows it."""
        if not ("/" in key or "." in key):
            return None
        if _listed(key, self.pod_annotations):
            return None
        allowed = f" ({', '.join(self.pod_annotations)})" if self.pod_annotations else ""
        return (f"{key} is not a pod annotation this cluster allows{allowed}: a key with a prefix or a dot is read by "
                "a tool (a sidecar injector, the container runtime); keys without '/' or '.' are yours, others the "
                "cluster admin may allow (operator flag --pod-annotation, chart value "
                "operator.engineAnnotations.allowed)")

    def pod_label_problem(self, key: str) -> str | None:
        """Why spec.pod.labels may not set `key`, or None when it is the user's (no prefix) or listed by the admin."""
        if "/" not in key or _listed(key, self.pod_labels):
            return None
        allowed = f" ({', '.join(self.pod_labels)})" if self.pod_labels else ""
        return (f"{key} is not a pod label this cluster allows{allowed}: a key with a prefix is read by a tool (a "
                "webhook that injects a sidecar or a cloud token, a policy that selects pods); keys without '/' are "
                "yours, others the cluster admin may allow (operator flag --pod-label, chart value "
                "operator.engineLabels.allowed)")

    def priority_class_problem(self, name: str) -> str | None:
        """Why the engine pods may not run at priority class `name`, or None when the policy allows it."""
        if name in self.priority_classes or not (self.priority_classes or name.startswith(SYSTEM_PRIORITY_PREFIX)):
            return None
        allowed = ", ".join(self.priority_classes) or f"any but {SYSTEM_PRIORITY_PREFIX}*"
        return (f"{name} is not a priority class this cluster allows InferenceServices ({allowed}; operator flag "
                "--priority-class, chart value operator.priorityClasses.allowed)")

    def service_account_problem(self, name: str) -> str | None:
        """Why the engine pods may not run as ServiceAccount `name`, or None when the policy allows it (any, unless
        the admin lists some)."""
        if not self.service_accounts or name in self.service_accounts:
            return None
        return (f"{name} is not a ServiceAccount this cluster allows InferenceServices "
                f"({', '.join(self.service_accounts)}): a cloud's workload identity gives the pods the account's "
                "role; leave the field out for the namespace's default, or ask the cluster admin to allow it "
                "(operator flag --service-account, chart value operator.serviceAccounts.allowed)")

    def prometheus_address_problem(self, address: str) -> str | None:
        """Why KEDA may not query `address`, or None when the policy allows it (the schema's default always)."""
        if address == DEFAULT_PROMETHEUS_ADDRESS or address in self.prometheus_addresses:
            return None
        return (f"{address} is not a Prometheus this cluster allows ({', '.join(self.prometheus_addresses)}); leave "
                "the field out for the cluster's own")

    def prometheus_address(self, address: str) -> str:
        """The address KEDA is given for an allowed spec `address`: the schema's default means the admin's first."""
        return self.prometheus_addresses[0] if address == DEFAULT_PROMETHEUS_ADDRESS else address

    def host_path_problem(self, path: str) -> str | None:
        """Why the node directory `path` may not be mounted, or None when the policy allows it."""
        if not self.host_path_prefixes:
            return ("hostPath model sources are turned off on this cluster; use pvc:// or hf://, or ask the "
                    "cluster admin to allow a directory (operator flag --host-path-prefix, chart value "
                    "operator.hostPath.allowedPrefixes)")
        problem = _path_problem(path)
        if problem:
            return problem
        if not any(_within(path, prefix) for prefix in self.host_path_prefixes):
            allowed = ", ".join(self.host_path_prefixes)
            return f"{path} is outside the host directories this cluster allows ({allowed})"
        return None


def _listed(key: str, allowed: tuple[str, ...]) -> bool:
    """Whether `key` is one of the admin's keys, or under one of the admin's prefixes (those ending in '/')."""
    return any(key == entry or (entry.endswith("/") and key.startswith(entry)) for entry in allowed)


def _path_problem(path: str) -> str | None:
    if not path.startswith("/"):
        return f"{path!r} is not an absolute path"
    if path == "/":
        return None
    parts = path[1:].split("/")
    if ".." in parts or "." in parts:
        return f"{path} has a '.' or '..' segment"
    if "" in parts:
        return f"{path} is not in normal form (no repeated or trailing slashes)"
    return None


def _within(path: str, prefix: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


# Nothing beyond the namespace: what a cluster gets unless its admin turns something on.
DEFAULT_POLICY = AdmissionPolicy()
