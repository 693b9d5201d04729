"""A small synchronous JSON client for the Kubernetes API: get, server-side apply, delete, status patch.

The generated `kubernetes` client has one method per kind and version; the operator's children span
kinds whose versions are chosen at run time (HPA v2 or v2beta2, PDB v1 or v1beta1) and custom
resources (ServiceMonitor, ScaledObject), so it speaks to paths instead. Authentication, TLS and
connection pooling still come from `kubernetes.client.ApiClient` (kubeconfig or in-cluster).
"""

from __future__ import annotations

import json
import os
from typing import Any

FIELD_MANAGER = "flotilla-operator"
# (connect, read) seconds: an apiserver that is restarting must not hang a handler thread.
REQUEST_TIMEOUT = (5, 30)


class KubeError(Exception):
    """A failed API call: the HTTP status (0 when the apiserver could not be reached) and its message."""

    def __init__(self, status: int, message: str, path: str = ""):
        super().__init__(f"{status} {message} ({path})" if path else f"{status} {message}")
        self.status = status
        self.message = message


PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "ServiceMonitor": "servicemonitors",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "ScaledObject": "scaledobjects",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "InferenceService": "inferenceservices",
}


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    """The REST path of a namespaced object (`/apis/apps/v1/namespaces/ns/deployments/name`)."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{PLURALS[kind]}/{name}"


def path_of(obj: dict[str, Any]) -> str:
    """The REST path of a manifest."""
    meta = obj["metadata"]
    return object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])


class Kube:
    """JSON requests over a configured `kubernetes.client.ApiClient`."""

    def __init__(self, api_client: Any):
        self.api = api_client

    @classmethod
    def from_environment(cls, pool_size: int | None = None) -> Kube:
        """In-cluster credentials inside a pod, else the kubeconfig ($KUBECONFIG or ~/.kube/config); `pool_size`:
        the apiserver connections kept for reuse, as many as threads may call at once (default: the client's, 5 per
        CPU).

        A thread that finds every kept connection in use opens another, and when it is done urllib3 discards it with
        a warning ("Connection pool is full") if the pool is full: a connection (and a TLS handshake) per request
        beyond the pool's size, and a warning for each."""
        import kubernetes

        configuration = kubernetes.client.Configuration()
        if pool_size is not None:
            configuration.connection_pool_maxsize = pool_size
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            return cls(kubernetes.client.ApiClient(configuration))
        # $KUBECONFIG read now (the client reads it once, at import), as it is passed to kubectl.
        api_client = kubernetes.config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"),
                                                              client_configuration=configuration)
        if not api_client.configuration.verify_ssl:
            # The kubeconfig asks for no TLS verification (local test clusters): warn once, not per call.
            import warnings

            import urllib3

            warnings.warn("the kubeconfig disables TLS verification of the apiserver", stacklevel=2)
            warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
        return cls(api_client)

    def request(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
                content_type: str | None = None) -> dict[str, Any]:
        """One API call; raises KubeError on a non-2xx answer or when the apiserver is unreachable."""
        import urllib3

        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        serialized = self.api.param_serialize(method, path, query_params=list((query or {}).items()),
                                              header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            response = self.api.call_api(*serialized, _request_timeout=REQUEST_TIMEOUT)
            response.read()
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeError(0, f"apiserver unreachable: {e}", path) from e
        if not 200 <= response.status < 300:
            try:
                message = json.loads(response.data).get("message", response.reason)
            except ValueError:
                message = response.reason
            raise KubeError(response.status, message, path)
        return json.loads(response.data) if response.data else {}

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def apply(self, obj: dict[str, Any], dry_run: bool = False, manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply as the operator's field manager (or `manager`), forcing conflicts (`dry_run`: validate
        only).

        Forcing takes back every field the operator sets from whoever edited it by hand, which is
        what "converged back" means; fields the operator does not set stay as others left them.
        Callers apply only objects they own (reconciler.py checks the owner references first).
        """
        query = {"fieldManager": manager, "force": "true", **({"dryRun": "All"} if dry_run else {})}
        return self.request("PATCH", path_of(obj), obj, query, "application/apply-patch+yaml")

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create `obj` (POST) as the operator's field manager: only create, so a name someone else took since it was
        read answers 409 (AlreadyExists) instead of being written over, as an apply would."""
        return self.request("POST", path_of(obj).rsplit("/", 1)[0], obj, {"fieldManager": FIELD_MANAGER})

    def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """The items of a collection (`/api/v1/namespaces/ns/pods`), optionally by label selector."""
        query = {"labelSelector": label_selector} if label_selector else None
        return self.request("GET", path, query=query).get("items", [])

    def delete(self, path: str, uid: str | None = None, resource_version: str | None = None) -> None:
        """Delete with background propagation (the garbage collector removes what the object owns); with `uid`,
        only that very object (a precondition: one recreated under the same name since it was read stays), with
        `resource_version` only as it was read (409 otherwise)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        preconditions = {key: value for key, value in (("uid", uid), ("resourceVersion", resource_version))
                         if value is not None}
        if preconditions:
            body["preconditions"] = preconditions
        try:
            self.request("DELETE", path, body)
        except KubeError as e:
            if e.status != 404:
                raise

    def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the status subresource."""
        return self.request("PATCH", f"{path}/status", {"status": status}, content_type="application/merge-patch+json")
