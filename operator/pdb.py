"""The PodDisruptionBudget of an InferenceService's engine pods (a pure builder)."""

from __future__ import annotations

from typing import Any, Literal

from flotilla.operator import names
from flotilla.operator.spec import InferenceServiceSpec

PDB_API_VERSIONS = ("policy/v1", "policy/v1beta1")


def build_pdb(spec: InferenceServiceSpec, name: str, namespace: str,
              api_version: Literal["policy/v1", "policy/v1beta1"] = "policy/v1") -> dict[str, Any] | None:
    """A PDB allowing one voluntary eviction at a time, or None for a single replica.

    With one replica a PDB would either block node drains forever (maxUnavailable 0) or protect
    nothing, so none is made. Use policy/v1beta1 only where the cluster lacks policy/v1 (< 1.21).
    """
    least = spec.autoscaling.min_replicas if spec.autoscaling and spec.autoscaled else spec.replicas
    if least <= 1:
        return None
    if api_version not in PDB_API_VERSIONS:
        raise ValueError(f"unsupported PodDisruptionBudget apiVersion {api_version}")
    return {
        "apiVersion": api_version,
        "kind": "PodDisruptionBudget",
        "metadata": names.metadata(name, namespace),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector_labels(name)}},
    }
