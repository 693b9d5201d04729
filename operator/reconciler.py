"""One reconcile of an InferenceService: read, review, apply the children, write the status.

Everything that decides is pure (admission.review, children.plan_children, the builders,
status_writer.build_status); this module only reads, applies and writes. It is called by every
trigger alike (create, update, resume, a child's change, the periodic resync), so they all
converge on the same state; calls for one InferenceService are serialized by a lock.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import kopf

from flotilla.operator import kube as k
from flotilla.operator import names
from flotilla.operator.admission import Review, review
from flotilla.operator.autoscaling import (
    AUTOSCALED_REPLICAS_MANAGER,
    REFUSED_SCALE_MANAGER,
    REPLICAS_HANDOVER_MANAGER,
    autoscaled_replicas,
    replicas_handover,
)
from flotilla.operator.capabilities import UNKNOWN_VERSION, discover
from flotilla.operator.children import Plan, plan_children
from flotilla.operator.engine_pods import engine_pods
from flotilla.operator.message_limit import clip
from flotilla.operator.ownership import adoptable, conflict_message, owned_by
from flotilla.operator.pod_problems import REASONS, PodProblem, pod_problem
from flotilla.operator.policy import DEFAULT_POLICY, AdmissionPolicy
from flotilla.operator.preconditions import on_fresh_read, unless_conflict
from flotilla.operator.sandbox import host_namespaces_reset
from flotilla.operator.servicemonitor import drop_fields_an_older_crd_lacks
from flotilla.operator.spec import GROUP, KIND, VERSION
from flotilla.operator.status_writer import Observation, build_status, condition_events, merge_patch

# (body, type, reason, message) -> posts a Kubernetes Event about the InferenceService.
EventPoster = Callable[[dict[str, Any], str, str, str], None]
# Answers to an apply that say the object itself is refused (invalid, forbidden), as opposed to the
# API server being away or busy: retrying unchanged will not help, so status must say it.
REFUSALS = {400, 403, 404, 422}
# Server-side apply answers 500 when it cannot build the object's typed form (a list keyed by name, such as a
# container's env or the pod's imagePullSecrets, holding one name twice): that too is the object's fault.
TYPED_PATCH_REFUSAL = "failed to create typed patch object"
# The autoscalers the operator makes; when one goes, the Deployment keeps spec.replicas (the count it last set).
AUTOSCALER_KINDS = ("HorizontalPodAutoscaler", "ScaledObject")
# Reconciles started over at once when a child changed between the ownership check and the write (an orphan claimed
# while being adopted, an absent child created by someone else); past them the reconcile fails as an API error would
# (the caller retries with backoff).
ADOPTION_ATTEMPTS = 3

log = logging.getLogger(__name__)


def kopf_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """Post through kopf's event queue (works from any handler, sync or async)."""
    # kopf reads only the body's apiVersion, kind and metadata, which a plain dict from the API carries.
    kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message[:1024])


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def inferenceservice_path(namespace: str, name: str) -> str:
    """The REST path of an InferenceService."""
    return k.object_path(f"{GROUP}/{VERSION}", KIND, namespace, name)


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def _kept_replicas(plan: Plan, live: dict[str, dict[str, Any] | None]) -> int | None:
    """With autoscaling removed, the count the live Deployment keeps: spec.replicas when the Deployment has it already
    (the autoscaler's last count, copied there while it ran); None otherwise (the spec asks for another count, or
    autoscaling is on or suspended)."""
    if plan.autoscaler != "none":
        return None
    deployment = next(child for child in plan.apply if child["kind"] == "Deployment")
    found = live[k.path_of(deployment)]
    replicas = deployment["spec"].get("replicas")
    return replicas if found is not None and (found.get("spec") or {}).get("replicas", 1) == replicas else None


def _visible(obj: dict[str, Any]) -> tuple[Any, Any]:
    """What an Updated Event is about: the spec and labels (not managedFields, which a handover of `replicas` between
    field managers changes alone)."""
    return obj.get("spec"), obj["metadata"].get("labels")


class ChildrenBlocked(Exception):
    """Nothing was applied: a child exists but belongs to someone else, or the API server refused one.

    The status already says so (Progressing=False and Degraded=True with this reason, and an Event);
    the caller retries with backoff, since the obstacle may go away.
    """

    def __init__(self, reason: str, message: str):
        message = clip(message)  # the apiserver's refusal lists every field it refuses, and the spec sets how many
        super().__init__(message)
        self.reason = reason
        self.message = message


class AdoptionRaced(Exception):
    """A child changed between its ownership check and the write: an orphan being adopted (the write's resourceVersion
    precondition failed), or a child found absent that someone else created meanwhile (the create answered
    AlreadyExists). It may be someone else's now, so the reconcile starts over and checks again."""


@contextlib.contextmanager
def _adoption_guard(child: dict[str, Any]) -> Iterator[None]:
    """Turn the 409 of a write with a precondition on `child` (the uid of the object just created) into AdoptionRaced.
    Writes are forced applies, so a 409 can only be that precondition."""
    try:
        yield
    except k.KubeError as e:
        if e.status == 409 and "uid" in child["metadata"]:
            what = f"{child['kind']} {child['metadata']['name']}"
            raise AdoptionRaced(f"{what} was replaced since it was created: {e.message}") from e
        raise


T = TypeVar("T")


class Reconciler:
    """Converges InferenceServices; remembers the resourceVersions it wrote so its own writes,
    echoed back by the child watches, do not trigger another reconcile."""

    def __init__(self, kube: k.Kube, post_event: EventPoster | None = None, now: Callable[[], str] = _now,
                 policy: AdmissionPolicy = DEFAULT_POLICY, server_version: tuple[int, int] = UNKNOWN_VERSION):
        self.kube = kube
        self.policy = policy
        # The apiserver's (major, minor), read once at start-up (capabilities.server_version): which fields it keeps.
        self.server_version = server_version
        self.post_event = post_event or self._post_event
        self.now = now
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        # Per child, the resourceVersions of its last write (one write may take several requests: a handover of
        # `replicas`, the apply, a reset), each echoed by the watch.
        self._written: dict[tuple[str, str, str], frozenset[str]] = {}
        # Per InferenceService, the reason its Ready condition gives as last read or written here.
        self._ready_reasons: dict[tuple[str, str], str | None] = {}
        # Per InferenceService, the uid of its own Deployment as last read or applied here.
        self._deployments: dict[tuple[str, str], str] = {}

    def _post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post through kopf's queue inside its handlers; elsewhere (the periodic resync, in a task kopf's startup
        handler started, where kopf has no event queue and raises LookupError) post the Event itself. An Event is
        best effort: failing to post one never stops a reconcile."""
        try:
            kopf_event(body, type_, reason, message)
            return
        except LookupError:
            pass
        meta = body["metadata"]
        now = self.now()
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": body["apiVersion"], "kind": body["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": "flotilla-operator"}, "reportingComponent": "flotilla-operator",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self.kube.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", event)
        except k.KubeError as e:
            log.warning(f"posting the Event {reason} on {meta['namespace']}/{meta['name']} failed: {e}")

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def is_own_write(self, child: dict[str, Any]) -> bool:
        """Whether a child, as seen by a watch, is exactly what this operator last wrote."""
        return child["metadata"].get("resourceVersion") in self._written.get(_key(child), frozenset())

    def _remember(self, *written: dict[str, Any]) -> None:
        """Record one write of a child (its requests' answers, in order) as this operator's."""
        self._written[_key(written[-1])] = frozenset(obj["metadata"]["resourceVersion"] for obj in written)

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is remembered about a deleted InferenceService."""
        with self._guard:
            self._locks.pop((namespace, name), None)
            self._ready_reasons.pop((namespace, name), None)
            self._deployments.pop((namespace, name), None)
            for key in [key for key in self._written if key[1:] == (namespace, name)]:
                del self._written[key]

    def shown_pod_problems(self) -> dict[tuple[str, str], str]:
        """The pod problem each InferenceService's Ready condition names (pod_problems.REASONS), where it names one,
        by (namespace, name): as this reconciler last read or wrote it. The operator alone writes that condition, so
        this is the status without listing it (the serving reader compares it with the pods each period)."""
        with self._guard:
            return {key: reason for key, reason in self._ready_reasons.items() if reason in REASONS}

    def own_deployments(self) -> dict[tuple[str, str], str]:
        """The uid of each InferenceService's own Deployment, by (namespace, name), as this reconciler last read or
        applied it (the serving reader reads only the pods it made)."""
        with self._guard:
            return dict(self._deployments)

    def _note_deployment(self, namespace: str, name: str, deployment: dict[str, Any] | None) -> None:
        with self._guard:
            if deployment is None:
                self._deployments.pop((namespace, name), None)
            else:
                self._deployments[(namespace, name)] = deployment["metadata"]["uid"]

    def _note_ready(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
        with self._guard:
            self._ready_reasons[(namespace, name)] = ready.get("reason")

    def reconcile(self, namespace: str, name: str) -> Review | None:
        """Converge one InferenceService; returns its review, or None when it is gone.

        Raises KubeError when the apiserver fails, and ChildrenBlocked (after writing the status) when
        a child belongs to someone else or is refused; the caller retries with backoff. An orphan that changes while
        it is being adopted (AdoptionRaced) starts the reconcile over, so the adoption is checked again on what it
        has become.
        """
        with self._lock(namespace, name):
            for _ in range(ADOPTION_ATTEMPTS - 1):
                try:
                    return self._reconcile(namespace, name)
                except AdoptionRaced as e:
                    log.info(f"reconciling {namespace}/{name} again: {e}")
            try:
                return self._reconcile(namespace, name)
            except AdoptionRaced as e:
                raise k.KubeError(409, str(e)) from e

    def _reconcile(self, namespace: str, name: str) -> Review | None:
        """One attempt of `reconcile` (the caller holds the lock)."""
        body = self.kube.get(inferenceservice_path(namespace, name))
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        result = review(body.get("spec") or {}, name, self.policy)
        plan, deployment, blocked = None, None, None
        if result.errors:
            # Keep the children as they are: rolling out a spec the engine refuses would take
            # serving replicas down. Status says so. Scaling to zero still works (freeing the GPUs must not
            # wait for the spec to be fixed, e.g. after an upgrade whose stricter rules refuse it).
            deployment = self._own_deployment(body)
            if deployment is not None and (body.get("spec") or {}).get("replicas") == 0:
                deployment = self._scale_refused_to_zero(body, deployment)
        else:
            assert result.spec is not None
            plan = plan_children(result.spec, name, namespace, discover(self.kube, self.server_version))
            try:
                deployment = self._apply(body, plan)
            except ChildrenBlocked as e:
                blocked, deployment = e, self._own_deployment(body)
        written = self._write_status(body, result, plan, deployment, blocked)
        if blocked is not None:
            raise blocked
        if plan is not None and result.spec is not None:
            self._copy_autoscaled_replicas(body, written or body, autoscaled_replicas(result.spec, deployment))
        return result

    def _copy_autoscaled_replicas(self, owner: dict[str, Any], now: dict[str, Any], count: int | None) -> None:
        """Write the autoscaler's `count` (autoscaling.autoscaled_replicas) into `owner`'s spec.replicas through its
        scale subresource, as an HPA aimed at the InferenceService would. Only on the spec this reconcile read: with
        the resourceVersion of `now` (`owner` as this reconcile's status patch left it, which changes that and not the
        generation) as a precondition, and not at all when the generation moved on, so a spec changed since
        (kubectl scale, an edit) is not written over; its own reconcile follows.

        A 409 is tried once more on a fresh read, again with its resourceVersion as the precondition (preconditions.py):
        a status write of someone else's between this reconcile's status patch and the copy (the serving reader's
        status.serving, every few seconds) changes the resourceVersion alone, and would otherwise hold the copy back a
        whole reconcile."""
        if count is None:
            return
        meta = owner["metadata"]
        path = inferenceservice_path(meta["namespace"], meta["name"])
        if on_fresh_read(lambda read: self._copy_settled(owner, read, count), now, lambda: self.kube.get(path)) is None:
            log.info(f"not copying {count} replicas into {meta['namespace']}/{meta['name']} now: it changed since")

    def _copy_settled(self, owner: dict[str, Any], now: dict[str, Any], count: int) -> bool | None:
        """One try of `_copy_autoscaled_replicas` on `now`, as read: True when settled (written, or not to be written:
        the spec moved on from the generation this reconcile read, or the object is being deleted or is another one
        of the same name), None when the write's resourceVersion precondition failed (a 409)."""
        meta, read = now["metadata"], owner["metadata"]
        if (meta.get("generation"), meta.get("uid")) != (read.get("generation"), read.get("uid")) \
                or meta.get("deletionTimestamp"):
            return True
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": {"replicas": count}}
        written = unless_conflict(lambda: self.kube.request(
            "PATCH", f"{inferenceservice_path(meta['namespace'], meta['name'])}/scale", patch,
            {"fieldManager": AUTOSCALED_REPLICAS_MANAGER}, "application/merge-patch+json"))
        return True if written is not None else None

    def _own_deployment(self, owner: dict[str, Any]) -> dict[str, Any] | None:
        meta = owner["metadata"]
        found = self.kube.get(k.object_path("apps/v1", "Deployment", meta["namespace"], meta["name"]))
        return found if found is not None and owned_by(found, meta["uid"]) else None

    def _scale_refused_to_zero(self, owner: dict[str, Any], deployment: dict[str, Any]) -> dict[str, Any]:
        """spec.replicas 0 on a refused spec: the owned autoscaler deleted, then the owned Deployment (the last valid
        configuration) scaled to 0 by a merge patch of `replicas` alone; returns the Deployment. Nothing else of the
        refused spec is applied."""
        self._delete_own_autoscalers(owner)
        meta = owner["metadata"]
        if deployment["spec"].get("replicas") != 0:
            deployment = self.kube.request("PATCH", k.path_of(deployment), {"spec": {"replicas": 0}},
                                           {"fieldManager": REFUSED_SCALE_MANAGER}, "application/merge-patch+json")
            self._remember(deployment)
            self.post_event(owner, "Normal", "ScaledToZero",
                            f"scaled Deployment {meta['name']} to 0 replicas as spec.replicas asks; the rest of the "
                            "spec is refused and not applied")
        return deployment

    def _delete_own_autoscalers(self, owner: dict[str, Any]) -> None:
        """Delete `owner`'s HPA and KEDA ScaledObject, before its Deployment goes to 0: while one exists, KEDA with
        minReplicaCount >= 1 would scale the Deployment back up."""
        meta = owner["metadata"]
        caps = discover(self.kube, self.server_version)
        autoscalers = [(caps.hpa_version, "HorizontalPodAutoscaler"), ("keda.sh/v1alpha1" if caps.keda else None,
                                                                       "ScaledObject")]
        for api_version, kind in autoscalers:
            if api_version is None:
                continue
            path = k.object_path(api_version, kind, meta["namespace"], meta["name"])
            found = self.kube.get(path)
            if found is not None and owned_by(found, meta["uid"]):
                self.kube.delete(path, uid=found["metadata"]["uid"])
                self.post_event(owner, "Normal", "Deleted", f"deleted {kind} {meta['name']}: spec.replicas is 0, "
                                "which suspends autoscaling")

    def _apply(self, owner: dict[str, Any], plan: Plan) -> dict[str, Any] | None:
        """Apply every planned child (owned by `owner`), remove unwanted ones; returns the Deployment.

        All or nothing: every child is first checked to be absent or owned by this InferenceService,
        then applied as a dry run, and only when all of them pass is anything written. Raises
        ChildrenBlocked otherwise, with nothing created or modified. The unwanted children go before the
        rest is written: an autoscaler the spec drops (spec.replicas 0 suspends it, or autoscaling is turned
        off) must not scale the Deployment between its new replica count and its deletion (KEDA scales a
        Deployment at 0 back up to minReplicaCount).
        """
        live = self._live_children(owner, plan)
        for child in plan.apply:
            self._dry_run(child, live[k.path_of(child)])
        self._remove_unwanted(owner, plan, _kept_replicas(plan, live))
        deployment = None
        for child in plan.apply:
            applied = self._write_child(owner, child, live[k.path_of(child)], plan.min_replicas)
            if child["kind"] == "Deployment":
                deployment = applied
        return deployment

    def _live_children(self, owner: dict[str, Any], plan: Plan) -> dict[str, dict[str, Any] | None]:
        """The planned children as they are now, by path (None: absent), each given `owner`'s owner reference;
        ChildrenBlocked (OwnershipConflict) when one exists, is not `owner`'s and is no orphan it may adopt
        (ownership.py). An orphan to adopt is written only as it was read: its child carries the resourceVersion read
        as a precondition (`_adopting`)."""
        meta = owner["metadata"]
        live: dict[str, dict[str, Any] | None] = {}
        for child in plan.apply:
            # The owner reference alone: kopf.adopt would also copy the InferenceService's own labels onto the child,
            # and those are its author's to set freely, while tools select Services and Deployments by label.
            kopf.append_owner_reference(child, owner=cast(kopf.Body, owner))  # kopf reads only the owner's identity
            path = k.path_of(child)
            live[path] = self.kube.get(path)
            found = live[path]
            if found is not None and not owned_by(found, meta["uid"]) and not adoptable(found, meta["name"]):
                raise ChildrenBlocked("OwnershipConflict", conflict_message(child, found))
            if found is not None and not owned_by(found, meta["uid"]):
                child["metadata"]["resourceVersion"] = found["metadata"]["resourceVersion"]
        return live

    def _dry_run(self, child: dict[str, Any], found: dict[str, Any] | None) -> None:
        """Apply `child` (live as `found`) as a dry run (once more without the fields an older CRD lacks, if that is
        the trouble); ChildrenBlocked (ApplyRefused) when the API server refuses it. A child found absent that exists
        by the time of a refusal was made by someone else meanwhile (the refusal is about their object): AdoptionRaced,
        so the reconcile checks again whose it is."""
        absent = found is None

        def dry_run(obj: dict[str, Any]) -> dict[str, Any]:
            return self.kube.apply(obj, dry_run=True)

        try:
            try:
                self._precondition_write(child, found, dry_run)
            except k.KubeError as e:
                if not (e.status == 500 and drop_fields_an_older_crd_lacks(child, e.message)):
                    raise
                self._precondition_write(child, found, dry_run)  # once more, without them
        except k.KubeError as e:
            if e.status not in REFUSALS and not (e.status == 500 and TYPED_PATCH_REFUSAL in e.message):
                raise
            what = f"{child['kind']} {child['metadata']['name']}"
            if absent and self.kube.get(k.path_of(child)) is not None:
                raise AdoptionRaced(f"{what} was created by someone else since it was found absent") from e
            raise ChildrenBlocked("ApplyRefused", f"the API server refused {what}: {e.message}") from e

    def _write_child(self, owner: dict[str, Any], child: dict[str, Any],
                     before: dict[str, Any] | None, min_replicas: int) -> dict[str, Any]:
        """Apply `child` (live as `before`), remember the write as ours, post Created or Updated when it
        changed something; returns the child as applied."""
        deployment = child["kind"] == "Deployment"
        if deployment and before is None and "replicas" not in child["spec"]:
            # A new autoscaled Deployment starts at minReplicas, not at the apiserver's default of 1 until the
            # autoscaler's first sync (a second wave of GPU pods minutes behind the first); the next apply, without
            # `replicas`, hands the field to the autoscaler (replicas_handover).
            child = {**child, "spec": {"replicas": min_replicas, **child["spec"]}}
        handover = replicas_handover(child, before, k.FIELD_MANAGER, min_replicas) if deployment else None
        written = []
        if before is None:  # absent at the check: only created, never written over (someone may have made it since)
            # Three writes (create, apply, _drop_create_entry), once per child. Fewer lose something:
            # - an apply alone cannot say "create only": carrying a resourceVersion no object has, it creates a missing
            #   Deployment, PDB or HPA and fails on an existing one (409), but a 1.20 apiserver answers 500 for a
            #   Service (its storage creates through a path that refuses any resourceVersion); a uid precondition
            #   refuses a missing object.
            # - an apply cannot carry managedFields, and a create records every field as an Update of its manager
            #   whatever managedFields it carries, so that entry goes in a write of its own.
            # - turning that entry into an Apply (one JSON patch instead of the apply and the removal) would record the
            #   fields the apiserver defaulted as applied by the operator: the next apply prunes them (the apiserver
            #   defaults them again) and so writes, giving the saved write back, and until then managedFields misstates
            #   who set what.
            written.append(self._create(child))
            # The apply that follows is of this very object (its uid a precondition) and owns the child's fields as
            # on any applied child; the create's own record of them goes after it (_drop_create_entry).
            child = {**child, "metadata": {**child["metadata"], "uid": written[-1]["metadata"]["uid"]}}
        current = before  # the child as the next write expects it, where it is an orphan being adopted
        if handover is not None:  # autoscaling turned on or resumed: the autoscaler takes the replicas over from here
            adopting = "resourceVersion" in child["metadata"]
            if adopting:  # the same precondition; the apply then expects what the handover left
                handover["metadata"]["resourceVersion"] = child["metadata"]["resourceVersion"]
            written.append(self._precondition_write(
                handover, before, lambda obj: self.kube.apply(obj, manager=REPLICAS_HANDOVER_MANAGER)))
            current = written[-1]
            if adopting:
                child = {**child, "metadata": {**child["metadata"],
                                               "resourceVersion": current["metadata"]["resourceVersion"]}}
        applied = self._precondition_write(child, current, self.kube.apply)
        written.append(applied)
        if before is None:
            applied = self._drop_create_entry(applied)
            written.append(applied)
        reset = host_namespaces_reset(applied) if deployment else None
        if reset is not None:  # fields the apply cannot own (sandbox.py): a hand edit turned them on
            applied = self.kube.request("PATCH", k.path_of(child), reset,
                                        content_type="application/merge-patch+json")
            written.append(applied)
        self._remember(*written)
        what = f"{child['kind']} {child['metadata']['name']}"
        if before is None:
            self.post_event(owner, "Normal", "Created", f"created {what}")
        elif not owned_by(before, owner["metadata"]["uid"]):
            self.post_event(owner, "Normal", "Adopted",
                            f"adopted {what}: it had no owner and carries this InferenceService's labels; "
                            "updated it to match the spec")
        elif _visible(before) != _visible(applied):
            self.post_event(owner, "Normal", "Updated", f"updated {what} to match the spec")
        return applied

    def _precondition_write(self, child: dict[str, Any], found: dict[str, Any] | None,
                            write: Callable[[dict[str, Any]], T]) -> T:
        """`write(child)`, where `child` may carry a precondition: the resourceVersion of an orphan being adopted,
        found as `found` (`_adopting`), or the uid of the object just created (its 409 is AdoptionRaced)."""
        if "resourceVersion" in child["metadata"]:
            assert found is not None  # only an orphan found by the check carries one
            return self._adopting(child, found, write)
        with _adoption_guard(child):
            return write(child)

    def _adopting(self, child: dict[str, Any], found: dict[str, Any], write: Callable[[dict[str, Any]], T]) -> T:
        """`write(child)` of an orphan being adopted, found as `found`: only on the orphan as read (its resourceVersion
        the precondition), so another controller claiming it meanwhile fails the write instead of being overridden by
        the forced apply. A failed precondition is tried once more on a fresh read that is still an orphan this
        InferenceService (whose name its children bear) may adopt: the kube-controller-manager writes a busy orphan
        Deployment's status and revision annotation again and again, and starting the reconcile over for each write
        left its adoption to kopf's backoff. AdoptionRaced otherwise: the reconcile starts over and checks again."""
        name = child["metadata"]["name"]
        what = f"{child['kind']} {name}"

        def attempt(current: dict[str, Any]) -> T | None:
            if current is not found and not adoptable(current, name):
                raise AdoptionRaced(f"{what} was claimed, relabelled or deleted while being adopted")
            at = {**child, "metadata": {**child["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
            return unless_conflict(lambda: write(at))

        written = on_fresh_read(attempt, found, lambda: self.kube.get(k.path_of(child)))
        if written is None:
            raise AdoptionRaced(f"{what} changed while being adopted, and again since")
        return written

    def _create(self, child: dict[str, Any]) -> dict[str, Any]:
        """Create `child`, found absent by the check; AdoptionRaced when its name was taken since (AlreadyExists), so
        the reconcile checks again whose it is instead of taking it over."""
        try:
            return self.kube.create(child)
        except k.KubeError as e:
            if e.status == 409:
                what = f"{child['kind']} {child['metadata']['name']}"
                raise AdoptionRaced(f"{what} was created by someone else since it was found absent: {e.message}") from e
            raise

    def _drop_create_entry(self, applied: dict[str, Any]) -> dict[str, Any]:
        """Remove the managedFields entry the create left (the operator's, operation Update), now that the apply owns
        the same fields: left there, it would keep every field the spec drops later. Returns the child as written;
        as it was when someone else changed the entries meanwhile (the patch's test fails), which costs only that."""
        entries = applied["metadata"].get("managedFields") or []
        index = next((i for i, entry in enumerate(entries)
                      if entry.get("manager") == k.FIELD_MANAGER and entry.get("operation") == "Update"), None)
        if index is None:
            return applied
        entry = f"/metadata/managedFields/{index}"
        patch = [{"op": "test", "path": f"{entry}/manager", "value": k.FIELD_MANAGER},
                 {"op": "test", "path": f"{entry}/operation", "value": "Update"}, {"op": "remove", "path": entry}]
        try:
            return self.kube.request("PATCH", k.path_of(applied), patch, {"fieldManager": k.FIELD_MANAGER},
                                     "application/json-patch+json")
        except k.KubeError as e:
            if e.status not in (409, 422):
                raise
            log.warning(f"dropping the create's field ownership of {applied['kind']} "
                        f"{applied['metadata']['name']} failed: {e}")
            return applied

    def _remove_unwanted(self, owner: dict[str, Any], plan: Plan, kept: int | None) -> None:
        """Delete the children the spec no longer asks for: `owner`'s own, and orphans it would adopt (an orphaned
        HPA left by a deleted autoscaled InferenceService would otherwise keep scaling the adopted Deployment). When
        `owner`'s autoscaler goes and the Deployment keeps its `kept` replicas, an Event says so."""
        meta = owner["metadata"]
        for api_version, kind in plan.remove:
            path = k.object_path(api_version, kind, meta["namespace"], meta["name"])
            found = self.kube.get(path)
            if found is None:
                continue
            orphan = not owned_by(found, meta["uid"])
            if not orphan:
                why = "the spec no longer asks for it"
                self.kube.delete(path, uid=found["metadata"]["uid"])
            elif adoptable(found, meta["name"]):
                why = "an orphan with this InferenceService's labels that the spec does not ask for"
                # Deleted only as it was read: one claimed meanwhile is someone else's (AdoptionRaced: check again).
                self._adopting(found, found, functools.partial(self._delete_as_read, path))
            else:
                continue
            self.post_event(owner, "Normal", "Deleted", f"deleted {kind} {meta['name']}: {why}")
            if kept is not None and kind in AUTOSCALER_KINDS and not orphan:
                self.post_event(owner, "Normal", "ReplicasKept",
                                f"autoscaling removed: Deployment {meta['name']} keeps its {kept} replicas, the "
                                "autoscaler's last count, which spec.replicas holds; set spec.replicas to change it")

    def _delete_as_read(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Delete the object at `path` only as `obj` was read (its uid and resourceVersion); returns `obj`."""
        self.kube.delete(path, uid=obj["metadata"]["uid"], resource_version=obj["metadata"]["resourceVersion"])
        return obj

    def _pod_problem(self, namespace: str, name: str, deployment: dict[str, Any] | None) -> PodProblem | None:
        """Why the engine pods (those the Deployment made) are not coming up, read only while replicas are missing
        (one list of one InferenceService's pods); the serving reader and the resync reconcile when the kubelet
        reports more."""
        if deployment is None:
            return None
        desired = (deployment.get("spec") or {}).get("replicas", 1)
        if desired == 0 or (deployment.get("status") or {}).get("readyReplicas", 0) >= desired:
            return None
        selector = ",".join(f"{k}={v}" for k, v in names.selector_labels(name).items())
        try:
            pods = self.kube.list(f"/api/v1/namespaces/{namespace}/pods", selector)
            replicasets = self.kube.list(f"/apis/apps/v1/namespaces/{namespace}/replicasets", selector)
            # Only its Deployment's pods: a pod anyone labelled must not put its reason into the Ready condition.
            return pod_problem(engine_pods(pods, replicasets, {(namespace, name): deployment["metadata"]["uid"]}))
        except k.KubeError as e:
            # 403: the chart grants pods and replicasets list only with the serving reader on; then the progress
            # deadline tells.
            # Either way a status without the pods' reason beats no status.
            (log.debug if e.status == 403 else log.warning)(f"listing the pods of {namespace}/{name} failed: {e}")
            return None

    def _write_status(self, body: dict[str, Any], result: Review, plan: Plan | None,
                      deployment: dict[str, Any] | None, blocked: ChildrenBlocked | None) -> dict[str, Any] | None:
        """Patch the status when it changed; returns the InferenceService as the patch left it (None: unchanged)."""
        meta = body["metadata"]
        self._note_deployment(meta["namespace"], meta["name"], deployment)
        old = body.get("status") or {}
        seen = Observation(name=meta["name"], namespace=meta["namespace"], generation=meta.get("generation", 1),
                           review=result, plan=plan, deployment=deployment, now=self.now(),
                           blocked=(blocked.reason, blocked.message) if blocked else None,
                           pod_problem=self._pod_problem(meta["namespace"], meta["name"], deployment))
        new = build_status(old, seen)
        patch = merge_patch(old, new)
        self._note_ready(meta["namespace"], meta["name"], old)
        if patch is None:
            return None
        written = self.kube.patch_status(inferenceservice_path(meta["namespace"], meta["name"]), patch)
        self._note_ready(meta["namespace"], meta["name"], new)
        for event in condition_events(old, new):
            self.post_event(body, event.type, event.reason, event.message)
        return written
