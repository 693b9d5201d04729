"""One reconcile of an InferenceService: read, review, apply the children, write the status.

Everything that decides is pure (admission.review, children.plan_children, the builders,
status_writer.build_status); this module only reads, applies and writes. It is called by every
trigger alike (create, update, resume, a child's change, the periodic resync), so they all
converge on the same state; calls for one InferenceService are serialized by a lock.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

import kopf

from flotilla.operator import kube as k
from flotilla.operator.admission import Review, review
from flotilla.operator.capabilities import discover
from flotilla.operator.children import Plan, plan_children
from flotilla.operator.spec import GROUP, KIND, VERSION
from flotilla.operator.status_writer import Observation, build_status, merge_patch

# (body, type, reason, message) -> posts a Kubernetes Event about the InferenceService.
EventPoster = Callable[[dict[str, Any], str, str, str], None]
# Conditions whose False is bad news (Degraded is bad news when True).
_WARN_WHEN_FALSE = {"Valid", "FitChecked", "Ready"}
# Decisions announced even on first sight.
_ALWAYS_ANNOUNCED = {"Valid", "FitChecked"}

log = logging.getLogger(__name__)


def kopf_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """Post through kopf's event queue (works from any handler, sync or async)."""
    kopf.event(body, type=type_, reason=reason, message=message[:1024])


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def inferenceservice_path(namespace: str, name: str) -> str:
    """The REST path of an InferenceService."""
    return k.object_path(f"{GROUP}/{VERSION}", KIND, namespace, name)


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences", []))


class Reconciler:
    """Converges InferenceServices; remembers the resourceVersions it wrote so its own writes,
    echoed back by the child watches, do not trigger another reconcile."""

    def __init__(self, kube: k.Kube, post_event: EventPoster = kopf_event, now: Callable[[], str] = _now):
        self.kube = kube
        self.post_event = post_event
        self.now = now
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._written: dict[tuple[str, str, str], str] = {}

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def is_own_write(self, child: dict[str, Any]) -> bool:
        """Whether a child, as seen by a watch, is exactly what this operator last wrote."""
        return self._written.get(_key(child)) == child["metadata"].get("resourceVersion")

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is remembered about a deleted InferenceService."""
        with self._guard:
            self._locks.pop((namespace, name), None)
            for key in [key for key in self._written if key[1:] == (namespace, name)]:
                del self._written[key]

    def reconcile(self, namespace: str, name: str) -> Review | None:
        """Converge one InferenceService; returns its review, or None when it is gone.

        Raises KubeError when the apiserver fails; the caller retries with backoff.
        """
        with self._lock(namespace, name):
            body = self.kube.get(inferenceservice_path(namespace, name))
            if body is None or body["metadata"].get("deletionTimestamp"):
                return None
            result = review(body.get("spec") or {}, name)
            plan, deployment = None, None
            if result.errors:
                # Keep the children as they are: rolling out a spec the engine refuses would take
                # serving replicas down. Status says so.
                deployment = self.kube.get(k.object_path("apps/v1", "Deployment", namespace, name))
            else:
                assert result.spec is not None
                plan = plan_children(result.spec, name, namespace, discover(self.kube))
                deployment = self._apply(body, plan)
            self._write_status(body, result, plan, deployment)
            return result

    def _apply(self, owner: dict[str, Any], plan: Plan) -> dict[str, Any] | None:
        """Apply every planned child (owned by `owner`), remove unwanted ones; returns the Deployment."""
        deployment = None
        for child in plan.apply:
            kopf.adopt(child, owner=owner)
            path = k.path_of(child)
            live = self.kube.get(path)
            applied = self.kube.apply(child)
            self._written[_key(applied)] = applied["metadata"]["resourceVersion"]
            what = f"{child['kind']} {child['metadata']['name']}"
            if live is None:
                self.post_event(owner, "Normal", "Created", f"created {what}")
            elif live["metadata"]["resourceVersion"] != applied["metadata"]["resourceVersion"]:
                self.post_event(owner, "Normal", "Updated", f"updated {what} to match the spec")
            if child["kind"] == "Deployment":
                deployment = applied
        meta = owner["metadata"]
        for api_version, kind in plan.remove:
            path = k.object_path(api_version, kind, meta["namespace"], meta["name"])
            live = self.kube.get(path)
            if live is not None and _owned_by(live, meta["uid"]):
                self.kube.delete(path)
                self.post_event(owner, "Normal", "Deleted",
                                f"deleted {kind} {meta['name']}: the spec no longer asks for it")
        return deployment

    def _write_status(self, body: dict[str, Any], result: Review, plan: Plan | None,
                      deployment: dict[str, Any] | None) -> None:
        meta = body["metadata"]
        old = body.get("status") or {}
        seen = Observation(name=meta["name"], namespace=meta["namespace"], generation=meta.get("generation", 1),
                           review=result, plan=plan, deployment=deployment, now=self.now())
        new = build_status(old, seen)
        patch = merge_patch(old, new)
        if patch is None:
            return
        self.kube.patch_status(inferenceservice_path(meta["namespace"], meta["name"]), patch)
        before = {c.get("type"): c for c in old.get("conditions", [])}
        for c in new["conditions"]:
            prior = before.get(c["type"], {})
            if (prior.get("status"), prior.get("reason")) == (c["status"], c["reason"]):
                continue
            # A first Ready=False (replicas still starting) is expected, not a warning.
            bad = (c["type"] in _WARN_WHEN_FALSE and c["status"] == "False" and (prior or c["type"] != "Ready")) or \
                  (c["type"] == "Degraded" and c["status"] == "True") or c["reason"] == "LowConcurrency"
            if not prior and not bad and c["type"] not in _ALWAYS_ANNOUNCED:
                continue  # a first "Progressing" or "not Degraded" is no news
            self.post_event(body, "Warning" if bad else "Normal", c["reason"],
                            f"{c['type']}={c['status']}: {c['message']}")
