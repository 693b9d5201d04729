"""What the cluster serves, which decides the children's kinds and versions.

Read from the apiserver's group list (`GET /apis`) on every reconcile: one cheap call, and a
Prometheus Operator or KEDA installed after the operator started is picked up without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flotilla.operator.kube import Kube

SERVICE_MONITOR_GROUP_VERSION = "monitoring.coreos.com/v1"
KEDA_GROUP_VERSION = "keda.sh/v1alpha1"


@dataclass(frozen=True)
class Capabilities:
    """API versions the children use, and which optional CRDs are installed."""

    hpa_version: str | None  # autoscaling/v2, autoscaling/v2beta2, or None when neither is served
    pdb_version: str | None  # policy/v1, policy/v1beta1, or None
    service_monitor: bool  # the Prometheus Operator's ServiceMonitor CRD is installed
    keda: bool  # KEDA's ScaledObject CRD is installed


def from_group_list(groups: dict[str, Any]) -> Capabilities:
    """Capabilities from an APIGroupList (the body of `GET /apis`); a pure function."""
    served = {v["groupVersion"] for g in groups.get("groups", []) for v in g.get("versions", [])}

    def first(*candidates: str) -> str | None:
        return next((c for c in candidates if c in served), None)

    return Capabilities(
        hpa_version=first("autoscaling/v2", "autoscaling/v2beta2"),
        pdb_version=first("policy/v1", "policy/v1beta1"),
        service_monitor=SERVICE_MONITOR_GROUP_VERSION in served,
        keda=KEDA_GROUP_VERSION in served,
    )


def discover(kube: Kube) -> Capabilities:
    """Ask the apiserver what it serves now."""
    return from_group_list(kube.request("GET", "/apis"))
