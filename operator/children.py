"""Which child objects an InferenceService should have on this cluster (a pure function).

The builders say what each object looks like; this module says which of them to apply, at which
API version, and which kinds must not exist (so a child is removed when the spec stops asking for
it: autoscaling dropped or suspended by spec.replicas 0, replicas down to one, ServiceMonitor switched off).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flotilla.operator.autoscaling import build_hpa, build_scaled_object
from flotilla.operator.capabilities import SERVICE_MONITOR_GROUP_VERSION, Capabilities
from flotilla.operator.deployment import build_deployment
from flotilla.operator.pdb import build_pdb
from flotilla.operator.service import build_service
from flotilla.operator.servicemonitor import build_service_monitor
from flotilla.operator.spec import InferenceServiceSpec


@dataclass
class Plan:
    """The children to apply, the (apiVersion, kind) pairs to remove, and what status should say."""

    apply: list[dict[str, Any]] = field(default_factory=list)
    remove: list[tuple[str, str]] = field(default_factory=list)
    autoscaler: str = "none"
    monitoring: str = ""
    # What a Deployment scaled to zero restarts with when an autoscaler takes its replicas over again (an HPA does
    # not act on a target at 0 replicas).
    min_replicas: int = 1


def plan_children(spec: InferenceServiceSpec, name: str, namespace: str, caps: Capabilities) -> Plan:
    """Decide the children for a valid spec on a cluster with `caps`."""
    plan = Plan(apply=[build_deployment(spec, name, namespace), build_service(name, namespace)],
                min_replicas=spec.autoscaling.min_replicas if spec.autoscaling else 1)

    def want(obj: dict[str, Any] | None, api_version: str | None, kind: str) -> None:
        if api_version is None:
            return  # the cluster does not serve the kind: nothing to apply and nothing to remove
        if obj is None:
            plan.remove.append((api_version, kind))
        else:
            plan.apply.append(obj)

    # KEDA, when installed, makes its own HPA from the ScaledObject; two autoscalers would fight.
    # spec.replicas 0 suspends autoscaling: neither exists, so none scales the Deployment back up.
    scaled_object = build_scaled_object(spec, name, namespace) if caps.keda and spec.autoscaled else None
    hpa = None
    if not caps.keda and caps.hpa_version and spec.autoscaled:
        # Ignored below: caps.hpa_version is a str that from_group_list picked from HPA_API_VERSIONS.
        hpa = build_hpa(spec, name, namespace, api_version=caps.hpa_version)  # type: ignore[arg-type]  # see above
    want(scaled_object, "keda.sh/v1alpha1" if caps.keda else None, "ScaledObject")
    want(hpa, caps.hpa_version, "HorizontalPodAutoscaler")
    if spec.autoscaling is None:
        plan.autoscaler = "none"
    elif not spec.autoscaled:
        plan.autoscaler = ("suspended: spec.replicas is 0, so the engine is scaled to zero; set it to 1 or more "
                           "(kubectl scale) to resume autoscaling")
    elif scaled_object:
        plan.autoscaler = "KEDA ScaledObject (keda.sh/v1alpha1)"
    elif hpa:
        plan.autoscaler = f"HPA ({caps.hpa_version})"
    else:
        plan.autoscaler = "none: the cluster serves no autoscaling/v2 or v2beta2"

    monitor = build_service_monitor(spec, name, namespace) if caps.service_monitor else None
    want(monitor, SERVICE_MONITOR_GROUP_VERSION if caps.service_monitor else None, "ServiceMonitor")
    if not spec.monitoring.service_monitor:
        plan.monitoring = "ServiceMonitor disabled by spec.monitoring.serviceMonitor"
    elif caps.service_monitor:
        plan.monitoring = "ServiceMonitor"
    else:
        plan.monitoring = f"no ServiceMonitor: {SERVICE_MONITOR_GROUP_VERSION} is not installed"

    if caps.pdb_version:
        # Ignored below: caps.pdb_version is a str that from_group_list picked from policy/v1, v1beta1.
        want(build_pdb(spec, name, namespace, api_version=caps.pdb_version,  # type: ignore[arg-type]  # see above
                       unhealthy_pod_eviction_policy=caps.pdb_unhealthy_pod_eviction_policy),
             caps.pdb_version, "PodDisruptionBudget")
    return plan
