"""What the cluster serves, which decides the children's kinds, versions and fields.

The group list (`GET /apis`) is read on every reconcile: one cheap call, and a Prometheus Operator
or KEDA installed after the operator started is picked up without a restart. The apiserver's
version (`GET /version`) is read once at start-up (main.py): it decides fields of built-in kinds
that older apiservers refuse or drop, and it changes only with an upgrade of the control plane.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from flotilla.operator.kube import Kube

SERVICE_MONITOR_GROUP_VERSION = "monitoring.coreos.com/v1"
KEDA_GROUP_VERSION = "keda.sh/v1alpha1"
# PodDisruptionBudget.spec.unhealthyPodEvictionPolicy: beta and on by default from 1.27 (alpha, off, in 1.26; GA 1.31).
UNHEALTHY_POD_EVICTION_POLICY_SINCE = (1, 27)
UNKNOWN_VERSION = (0, 0)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capabilities:
    """API versions the children use, and which optional CRDs are installed."""

    hpa_version: str | None  # autoscaling/v2, autoscaling/v2beta2, or None when neither is served
    pdb_version: str | None  # policy/v1, policy/v1beta1, or None
    service_monitor: bool  # the Prometheus Operator's ServiceMonitor CRD is installed
    keda: bool  # KEDA's ScaledObject CRD is installed
    # The apiserver keeps a PDB's unhealthyPodEvictionPolicy (1.27+); from the version read at start-up.
    pdb_unhealthy_pod_eviction_policy: bool = False


def from_group_list(groups: dict[str, Any], version: tuple[int, int] = UNKNOWN_VERSION) -> Capabilities:
    """Capabilities from an APIGroupList (the body of `GET /apis`) and the apiserver's (major, minor); a pure
    function."""
    served = {v["groupVersion"] for g in groups.get("groups", []) for v in g.get("versions", [])}

    def first(*candidates: str) -> str | None:
        return next((c for c in candidates if c in served), None)

    pdb_version = first("policy/v1", "policy/v1beta1")
    return Capabilities(
        hpa_version=first("autoscaling/v2", "autoscaling/v2beta2"),
        pdb_version=pdb_version,
        service_monitor=SERVICE_MONITOR_GROUP_VERSION in served,
        keda=KEDA_GROUP_VERSION in served,
        pdb_unhealthy_pod_eviction_policy=pdb_version == "policy/v1" and version >= UNHEALTHY_POD_EVICTION_POLICY_SINCE,
    )


def parse_server_version(info: dict[str, Any]) -> tuple[int, int]:
    """(major, minor) from the body of `GET /version`; UNKNOWN_VERSION when it has none; a pure function.

    gitVersion first ("v1.27.3-eks-4f4795d"): managed clusters write minor as "27+"."""
    for text in (str(info.get("gitVersion", "")), f"{info.get('major', '')}.{info.get('minor', '')}"):
        found = re.match(r"v?(\d+)\.(\d+)", text)
        if found:
            return int(found[1]), int(found[2])
    return UNKNOWN_VERSION


def server_version(kube: Kube) -> tuple[int, int]:
    """The apiserver's (major, minor); raises KubeError when it does not answer."""
    info = kube.request("GET", "/version")
    version = parse_server_version(info)
    if version == UNKNOWN_VERSION:
        log.warning(f"the apiserver's version {info!r} is not major.minor: no field of a newer Kubernetes is used")
    return version


def discover(kube: Kube, version: tuple[int, int] = UNKNOWN_VERSION) -> Capabilities:
    """Ask the apiserver what it serves now; `version` is its version as read at start-up."""
    return from_group_list(kube.request("GET", "/apis"), version)
