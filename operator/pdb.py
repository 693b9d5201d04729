"""The PodDisruptionBudget of an InferenceService's engine pods (a pure builder)."""

from __future__ import annotations

from typing import Any, Literal

from flotilla.operator import names
from flotilla.operator.spec import InferenceServiceSpec

PDB_API_VERSIONS = ("policy/v1", "policy/v1beta1")


def build_pdb(spec: InferenceServiceSpec, name: str, namespace: str,
              api_version: Literal["policy/v1", "policy/v1beta1"] = "policy/v1",
              unhealthy_pod_eviction_policy: bool = False) -> dict[str, Any] | None:
    """A PDB allowing one voluntary eviction at a time, or None for a single replica.

    With one replica a PDB would either block node drains forever (maxUnavailable 0) or protect
    nothing, so none is made. Use policy/v1beta1 only where the cluster lacks policy/v1 (< 1.21).
    With `unhealthy_pod_eviction_policy` (an apiserver of 1.27 or later; policy/v1 only) it says
    `unhealthyPodEvictionPolicy: AlwaysAllow`: an engine pod that is not Ready (crash-looping, stuck
    loading) serves nothing, and without it such pods count against the budget, so a drain would wait
    for ever once too few are Ready.
    """
    least = spec.autoscaling.min_replicas if spec.autoscaling and spec.autoscaled else spec.replicas
    if least <= 1:
        return None
    if api_version not in PDB_API_VERSIONS:
        raise ValueError(f"unsupported PodDisruptionBudget apiVersion {api_version}")
    pdb_spec: dict[str, Any] = {"maxUnavailable": 1, "selector": {"matchLabels": names.selector_labels(name)}}
    if unhealthy_pod_eviction_policy and api_version == "policy/v1":
        # An apiserver before 1.26 does not know the field (1.20 refuses the apply: "field not declared in schema").
        pdb_spec["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    return {
        "apiVersion": api_version,
        "kind": "PodDisruptionBudget",
        "metadata": names.metadata(name, namespace),
        "spec": pdb_spec,
    }
