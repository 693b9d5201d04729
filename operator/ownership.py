"""Whose a child object is: this InferenceService's, an orphan it may adopt, or someone else's (pure functions).

A child is applied only when it is absent or owned by the InferenceService (its uid in an owner reference). An
object of the child's name that has no owner at all and carries the operator's labels for this InferenceService
(`app.kubernetes.io/managed-by=flotilla-operator`, `serving.flotilla.dev/inferenceservice=<name>`) is adopted: the
apply adds the owner reference. Such orphans are left by `kubectl delete fis NAME --cascade=orphan` (the garbage
collector strips the owner references and keeps the objects), the usual way to recreate an object without taking its
pods down, or made by hand to be handed over. Anything else (no labels, another InferenceService's labels, another
owner, being deleted) is someone else's: never written, reported as OwnershipConflict. That is what keeps creating
an InferenceService from taking over a Deployment or Service its author could not edit.
"""

from __future__ import annotations

from typing import Any

from flotilla.operator.names import INFERENCESERVICE_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from flotilla.operator.spec import KIND


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether `obj` has an owner reference to the object with `uid`."""
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def adoptable(obj: dict[str, Any], name: str) -> bool:
    """Whether the InferenceService `name` may adopt `obj`: no owner, not being deleted, and the operator's labels
    for that InferenceService."""
    meta = obj["metadata"]
    labels = meta.get("labels") or {}
    return (not meta.get("ownerReferences") and not meta.get("deletionTimestamp")
            and labels.get(MANAGED_BY_LABEL) == MANAGED_BY and labels.get(INFERENCESERVICE_LABEL) == name)


def conflict_message(child: dict[str, Any], found: dict[str, Any]) -> str:
    """Why `found`, the live object of `child`'s name, is left alone, and what to do."""
    meta = found["metadata"]
    owners = [f"{r.get('kind')} {r.get('name')}" for r in meta.get("ownerReferences") or []]
    whose = f"owned by {', '.join(owners)}" if owners else "not owned by any object"
    if meta.get("deletionTimestamp"):
        whose += " and is being deleted"
    name = child["metadata"]["name"]
    if any(r.get("kind") == KIND and r.get("name") == name for r in meta.get("ownerReferences") or []):
        # A deleted InferenceService's child the garbage collector has not removed yet (or one restored from a backup
        # with its old owner reference): it goes by itself, and the retries then create this one's.
        whose += " (an earlier InferenceService of this name, deleted: the garbage collector removes it)"
    return (f"{child['kind']} {child['metadata']['name']} already exists and is {whose}, not by this "
            "InferenceService; the operator leaves it untouched and applies nothing: rename the "
            "InferenceService, or delete that object if it is no longer needed")
