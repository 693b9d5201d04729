"""What the cluster admin allows InferenceServices to do beyond their namespace: the admission policy.

Whoever may create an InferenceService must not gain more than that. Anything that reaches the node
itself is off unless the operator is started with it turned on (`flotilla operator` flags, set by the
chart's values); the review (admission.py) reads this policy, so the webhook and the reconciler
decide alike.

Today the only such power is a `hostPath://` model source, which mounts a node directory into the
engine pod: off by default, and when an admin allows it, limited to the directory prefixes the admin
lists (`--host-path-prefix /models`). A path with `.`/`..` segments, repeated slashes or a trailing
slash is refused rather than normalised, so what is checked is exactly what the kubelet mounts.
The check is on the path's text: a symbolic link on the node under an allowed directory is followed by
the kubelet. The mounts are read-only, so no InferenceService can plant one; the admin keeps the allowed
directories free of links that leave them (docs/operator.md, "Security model").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionPolicy:
    """The admin's choices; the default allows nothing beyond the namespace."""

    host_path_prefixes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for prefix in self.host_path_prefixes:
            problem = _path_problem(prefix)
            if problem:
                raise ValueError(f"host path prefix {prefix!r}: {problem}")

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
