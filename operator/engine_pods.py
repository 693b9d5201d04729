"""Which pods are an InferenceService's engine pods: those its Deployment made (a pure function).

The InferenceService label alone is not enough: anyone who may create pods in a watched namespace can label one.
Two readers trust what they find in such a pod, so both go by this rule: the serving reader scrapes its
status.podIP (serving_reader.py), and the Ready condition names its problem (pod_problems.py, through the reader's
listing and the reconciler's).
"""

from __future__ import annotations

from typing import Any

# The label the Deployment controller gives a ReplicaSet's pods, whose value ends the ReplicaSet's name.
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"


def made_by_the_deployment(pod: dict[str, Any], owner: str) -> bool:
    """Whether `pod` is one of InferenceService `owner`'s engine pods: controlled by a ReplicaSet of its Deployment
    (named `owner`), which the Deployment controller names `<deployment>-<pod-template-hash>`, and not on the node's
    network (the operator never sets hostNetwork, and puts it back when a hand edit does).

    A labelled pod of anyone else's would otherwise point the operator's scrape anywhere (its status.podIP and
    ports; a hostNetwork pod's address is its node's), and put its own reason into the Ready condition."""
    meta = pod["metadata"]
    template_hash = meta.get("labels", {}).get(POD_TEMPLATE_HASH_LABEL)
    controllers = [ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")]
    if not template_hash or len(controllers) != 1 or pod.get("spec", {}).get("hostNetwork"):
        return False
    ref = controllers[0]
    return (ref.get("apiVersion"), ref.get("kind"), ref.get("name")) == (
        "apps/v1", "ReplicaSet", f"{owner}-{template_hash}")

