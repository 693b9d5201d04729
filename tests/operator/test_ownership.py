"""ownership: which existing objects an InferenceService may write (its own, orphans it may adopt), no cluster."""

from __future__ import annotations

import pytest

from flotilla.operator.names import common_labels
from flotilla.operator.ownership import adoptable, conflict_message, owned_by

OURS = common_labels("llama")
OWNER = {"apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService", "name": "llama", "uid": "u1",
         "controller": True}


def _obj(labels: dict | None = None, owners: list | None = None, deleting: bool = False) -> dict:
    meta: dict = {"name": "llama", "labels": labels or {}}
    if owners is not None:
        meta["ownerReferences"] = owners
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"kind": "Deployment", "metadata": meta}


@pytest.mark.parametrize(("obj", "adopted"), [
    (_obj(OURS), True),  # left by `kubectl delete fis llama --cascade=orphan`
    (_obj(OURS, owners=[]), True),
    (_obj({}), False),  # someone's own Deployment of that name
    (_obj({"app": "llama"}), False),
    (_obj({**OURS, "serving.flotilla.dev/inferenceservice": "other"}), False),  # another InferenceService's
    (_obj({k: v for k, v in OURS.items() if k != "app.kubernetes.io/managed-by"}), False),
    (_obj(OURS, owners=[{**OWNER, "uid": "u0"}]), False),  # a previous InferenceService's: the GC deletes it
    (_obj(OURS, owners=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "app", "uid": "c1"}]), False),
    (_obj(OURS, deleting=True), False),
])
def test_only_an_ownerless_object_with_this_inferenceservices_labels_is_adopted(obj, adopted):
    assert adoptable(obj, "llama") is adopted
    assert not owned_by(obj, "u1")


def test_owned_means_an_owner_reference_with_the_uid():
    assert owned_by(_obj(OURS, owners=[OWNER]), "u1")
    assert not owned_by(_obj(OURS, owners=[OWNER]), "u2")


def test_the_conflict_names_the_owners_and_a_deletion_under_way():
    child = {"kind": "Deployment", "metadata": {"name": "llama"}}
    assert "is not owned by any object and is being deleted, not by this InferenceService" in conflict_message(
        child, _obj({}, deleting=True))
    assert "is owned by ConfigMap app, not by" in conflict_message(
        child, _obj({}, owners=[{"kind": "ConfigMap", "name": "app", "uid": "c1"}]))


def test_a_child_of_an_earlier_inferenceservice_of_the_name_says_it_will_go():
    child = {"kind": "Deployment", "metadata": {"name": "llama"}}
    message = conflict_message(child, _obj(OURS, owners=[{**OWNER, "uid": "u0"}]))
    assert "is owned by InferenceService llama (an earlier InferenceService of this name, deleted: the garbage " \
           "collector removes it), not by this InferenceService" in message
