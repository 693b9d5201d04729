"""Which pods are an InferenceService's engine pods: those its own Deployment made (pure functions).

The InferenceService label alone is not enough: anyone who may create pods in a watched namespace can label one.
Two readers trust what they find in such a pod, so both go by this rule: the serving reader scrapes its
status.podIP (serving_reader.py), and the Ready condition names its problem (pod_problems.py, through the reader's
listing and the reconciler's).

The chain is checked by uid, link by link: the pod's controller is a ReplicaSet whose controller is the Deployment
the operator owns (its uid, as the reconciler read it). A name is not enough at either link: whoever may create
ReplicaSets could name one `<name>-<x>` and give it another controller, so the Deployment never adopts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flotilla.operator.names import INFERENCESERVICE_LABEL

# (namespace, InferenceService) of each ReplicaSet that the InferenceService's own Deployment controls, by uid.
EngineReplicaSets = Mapping[str, tuple[str, str]]


def _controller(obj: dict[str, Any], kind: str) -> str | None:
    """The uid of `obj`'s one controller when it is an `apps/v1` `kind`; None otherwise."""
    controllers = [ref for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("controller")]
    if len(controllers) != 1 or (controllers[0].get("apiVersion"), controllers[0].get("kind")) != ("apps/v1", kind):
        return None
    return controllers[0].get("uid")


def engine_replicasets(replicasets: list[dict[str, Any]], deployments: Mapping[tuple[str, str], str],
                       ) -> dict[str, tuple[str, str]]:
    """The ReplicaSets among `replicasets` controlled by an InferenceService's own Deployment (`deployments`: its
    uid by (namespace, InferenceService)), by their uid."""
    owners = {uid: key for key, uid in deployments.items()}
    out = {}
    for rs in replicasets:
        owner = owners.get(_controller(rs, "Deployment") or "")
        if owner is not None and owner[0] == rs["metadata"].get("namespace"):
            out[rs["metadata"]["uid"]] = owner
    return out


def made_by_the_deployment(pod: dict[str, Any], owner: str, replicasets: EngineReplicaSets) -> bool:
    """Whether `pod` is one of InferenceService `owner`'s engine pods: controlled by one of `replicasets`
    (engine_replicasets) that its Deployment controls, and not on the node's network (the operator never sets
    hostNetwork, and puts it back when a hand edit does).

    A labelled pod of anyone else's would otherwise point the operator's scrape anywhere (its status.podIP and
    ports; a hostNetwork pod's address is its node's), and put its own reason into the Ready condition."""
    if pod.get("spec", {}).get("hostNetwork"):
        return False
    made_by = replicasets.get(_controller(pod, "ReplicaSet") or "")
    return made_by == (pod["metadata"].get("namespace"), owner)


def engine_pods(pods: list[dict[str, Any]], replicasets: list[dict[str, Any]],
                deployments: Mapping[tuple[str, str], str]) -> list[dict[str, Any]]:
    """The `pods` that their InferenceService's (label) own Deployment made, through one of `replicasets`;
    `deployments` holds each InferenceService's own Deployment's uid by (namespace, InferenceService)."""
    made_by = engine_replicasets(replicasets, deployments)
    return [pod for pod in pods
            if made_by_the_deployment(pod, (pod["metadata"].get("labels") or {}).get(INFERENCESERVICE_LABEL, ""),
                                      made_by)]
