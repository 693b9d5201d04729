"""The InferenceService's status from what the reconciler saw (a pure function).

Conditions follow metav1.Condition: `lastTransitionTime` moves only when a condition's status
changes, so `kubectl describe` shows how long something has been true. The phase is a one-word
summary of the conditions, for `kubectl get`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flotilla.operator import names
from flotilla.operator.admission import Review
from flotilla.operator.children import Plan
from flotilla.operator.fit import FitReport
from flotilla.operator.message_limit import clip
from flotilla.operator.pod_problems import REASONS as POD_PROBLEMS
from flotilla.operator.pod_problems import PodProblem
from flotilla.operator.status import Condition, InferenceServiceStatus


@dataclass(frozen=True)
class Observation:
    """Everything the status is computed from, gathered by one reconcile."""

    name: str
    namespace: str
    generation: int
    review: Review
    plan: Plan | None  # None when the spec was refused and nothing was applied
    deployment: dict[str, Any] | None  # the live Deployment, if any
    now: str  # RFC 3339, for lastTransitionTime
    # (reason, message) when nothing could be applied: a child belongs to someone else
    # (OwnershipConflict) or the API server refused one (ApplyRefused).
    blocked: tuple[str, str] | None = None
    # Why an engine pod is not coming up (pod_problems.py), read while replicas are missing.
    pod_problem: PodProblem | None = None


def _condition(old: dict[str, dict[str, Any]], generation: int, now: str, type_: str, status: str,
               reason: str, message: str) -> Condition:
    previous = old.get(type_)
    moved = previous is None or previous.get("status") != status
    since = now if moved or previous is None else previous.get("lastTransitionTime", now)
    # Bounded whatever built it: a status write past the apiserver's limit would leave no condition at all.
    return Condition(type=type_, status=status, reason=reason, message=clip(message), last_transition_time=since,
                     observed_generation=generation)


def _replica_counts(deployment: dict[str, Any] | None) -> tuple[int, int, int, int, bool]:
    """(desired, existing, ready, updated, rollout observed) from a Deployment."""
    if deployment is None:
        return 0, 0, 0, 0, False
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    observed = status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
    return (spec.get("replicas", 1), status.get("replicas", 0), status.get("readyReplicas", 0),
            status.get("updatedReplicas", 0), observed)


def _pods_refused(deployment: dict[str, Any] | None) -> str | None:
    """Why the Deployment's ReplicaSet can create no pod (the apiserver refused it: a ResourceQuota, a LimitRange, a
    missing PriorityClass or ServiceAccount, a pod security policy), or None. The deployment controller copies the
    ReplicaSet's ReplicaFailure condition here; nothing else tells the InferenceService's user."""
    for c in ((deployment or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return str(c.get("message") or c.get("reason") or "pod creation failed")
    return None


def _stuck(deployment: dict[str, Any] | None) -> str | None:
    """Why the rollout has stopped progressing, or None: the Deployment controller's ProgressDeadlineExceeded
    (no pod created, scheduled or getting ready for spec.rollout.progressDeadlineSeconds), once the controller
    has seen the Deployment's current generation (a spec change starts a new deadline)."""
    if deployment is None:
        return None
    status = deployment.get("status") or {}
    if status.get("observedGeneration", 0) < deployment["metadata"].get("generation", 0):
        return None
    for c in status.get("conditions") or []:
        if (c.get("type"), c.get("status"), c.get("reason")) == ("Progressing", "False", "ProgressDeadlineExceeded"):
            deadline = (deployment.get("spec") or {}).get("progressDeadlineSeconds")
            return f"no progress for {deadline}s (spec.rollout.progressDeadlineSeconds)"
    return None


def _phase(conditions: list[Condition], seen: Observation) -> str:
    """The one-word summary of the conditions: Failed, Degraded, Ready, ScaledToZero, Pending or Progressing."""
    status_of = {c.type: c.status for c in conditions}
    reason_of = {c.type: c.reason for c in conditions}
    if status_of["Valid"] == "False" or seen.blocked is not None:
        return "Failed"
    if status_of["Degraded"] == "True":
        return "Degraded"
    if status_of["Ready"] == "True":
        return "Ready"
    if reason_of["Progressing"] == "ScaledToZero":
        # spec.replicas 0 by hand (kubectl scale), or the autoscaler's zero: nothing to roll out or wait for.
        return "ScaledToZero"
    if seen.deployment is None:
        return "Pending"
    return "Progressing"


def build_status(old: dict[str, Any], seen: Observation) -> dict[str, Any]:
    """The new status, given the old one (for transition times and the Degraded memory)."""
    old_conditions = _by_type(old)
    rollout = _Rollout.of(seen.deployment)
    verdicts = {
        "Valid": _valid(seen.review),
        "FitChecked": _fit_checked(seen.review.fit),
        "Progressing": _progressing(seen, rollout),
        "Ready": _ready(seen, rollout),
        "Degraded": _degraded(old, seen, rollout),
    }
    conditions = [_condition(old_conditions, seen.generation, seen.now, type_, *verdict)
                  for type_, verdict in verdicts.items()]
    spec, fit = seen.review.spec, seen.review.fit
    status = InferenceServiceStatus(
        phase=_phase(conditions, seen),
        observed_generation=seen.generation,
        replicas=rollout.existing,
        ready_replicas=rollout.ready,
        selector=",".join(f"{k}={v}" for k, v in names.selector_labels(seen.name).items()),
        url=names.service_url(seen.name, seen.namespace),
        conditions=conditions,
        gpus=None if spec is None else
        spec.gpus_per_replica * (rollout.desired if seen.deployment is not None else spec.replicas),
        fit=None if fit is None else fit.to_status(),
        autoscaler=None if seen.plan is None else seen.plan.autoscaler,
        monitoring=None if seen.plan is None else seen.plan.monitoring,
    )
    out = status.model_dump(by_alias=True, exclude_none=True)
    if old.get("serving") is not None:
        out["serving"] = old["serving"]  # the serving reader's block (serving_reader.py): not ours to drop
    return out


def _by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A status's conditions by their type."""
    return {c["type"]: c for c in status.get("conditions", []) if "type" in c}


# One condition's (status, reason, message).
_Verdict = tuple[str, str, str]


@dataclass(frozen=True)
class _Rollout:
    """The live Deployment as the conditions read it (all zero and None without one)."""

    desired: int
    existing: int
    ready: int
    updated: int
    # The controller has seen the current generation, and every desired replica is updated and ready.
    rolled_out: bool
    refused: str | None  # why the API server refuses the pods (`_pods_refused`)
    stuck: str | None  # why the rollout stopped progressing (`_stuck`); None once rolled out

    @classmethod
    def of(cls, deployment: dict[str, Any] | None) -> _Rollout:
        """The rollout of `deployment`."""
        desired, existing, ready, updated, observed = _replica_counts(deployment)
        rolled_out = observed and updated >= desired and ready >= desired
        stuck = None if rolled_out else _stuck(deployment)
        return cls(desired, existing, ready, updated, rolled_out, _pods_refused(deployment), stuck)


def _valid(review: Review) -> _Verdict:
    """Valid: the admission review's verdict on the spec."""
    if review.errors:
        return "False", "InvalidSpec", review.message
    return "True", "SpecAccepted", "; ".join(review.warnings) or "all cross-field and engine-flag rules pass"


def _fit_checked(fit: FitReport | None) -> _Verdict:
    """FitChecked: whether the model fits the GPUs asked for."""
    if fit is None:
        return "Unknown", "SpecUnparsable", "the spec did not parse"
    return fit.condition_status, fit.reason, fit.message


def _kept(seen: Observation) -> str:
    """What a refused spec leaves running, for its messages."""
    if seen.deployment is None:
        return ""
    if seen.deployment.get("spec", {}).get("replicas", 1) == 0:
        spec = seen.review.spec
        if spec is not None and spec.replicas != 0:  # scaling up waits for a valid spec; only 0 is applied
            return " (the last valid configuration is kept, at 0 replicas until the spec is valid)"
        return " (the last valid configuration is kept, scaled to zero as spec.replicas asks)"
    return " (the last valid configuration keeps running)"


def _zero(seen: Observation) -> str:
    """Why the Deployment is at 0, for the ScaledToZero messages. The reason stays ScaledToZero whoever scaled it
    (a condition's reason is a stable category that the phase, the REASON column and tooling match on); the message
    tells spec.replicas 0 apart from a Deployment scaled to 0 under a spec.replicas that is not (KEDA, or by hand)."""
    spec = seen.review.spec
    if spec is None:
        return "the Deployment is at 0 replicas"
    if spec.replicas == 0:
        suspended = "; autoscaling is suspended until it is 1 or more" if spec.autoscaling else ""
        return f"no replicas requested (spec.replicas is 0){suspended}"
    if spec.autoscaling:
        return (f"the Deployment was scaled to 0 by its autoscaler (or by hand) while autoscaling is set; "
                f"spec.replicas is {spec.replicas}")
    return f"the Deployment is at 0 replicas, not the {spec.replicas} spec.replicas asks for"


def _progressing(seen: Observation, r: _Rollout) -> _Verdict:
    """Progressing: whether a rollout is under way, and if not, why (nothing applied, refused, stuck, done)."""
    if seen.review.errors:
        return "False", "SpecRejected", f"nothing applied: the spec is invalid{_kept(seen)}"
    if seen.blocked is not None:
        return "False", seen.blocked[0], f"nothing applied: {seen.blocked[1]}"
    if seen.deployment is None:
        return "True", "Creating", "creating the Deployment"
    if r.refused is not None:
        return "False", "PodsRefused", f"the API server refuses the pods: {r.refused}"
    if r.stuck is not None:
        return ("False", "ProgressDeadlineExceeded",
                f"the rollout is stuck: {r.updated} of {r.desired} replicas updated, {r.ready} ready, {r.stuck}")
    if r.rolled_out and r.desired == 0 and r.existing == 0:
        return "False", "ScaledToZero", _zero(seen)
    if r.rolled_out and r.desired == 0:
        return "True", "RollingOut", f"scaling to zero: {r.existing} replicas left"
    if not r.rolled_out:
        return "True", "RollingOut", f"{r.updated} of {r.desired} replicas updated, {r.ready} ready"
    return "False", "RolloutComplete", f"{r.desired} replicas updated and ready"


def _ready(seen: Observation, r: _Rollout) -> _Verdict:
    """Ready: whether every desired replica serves."""
    if r.desired == 0 and seen.deployment is not None:
        return "False", "ScaledToZero", _zero(seen)
    if seen.deployment is not None and r.ready >= r.desired:
        return "True", "AllReplicasReady", f"{r.ready} of {r.desired} replicas ready"
    if seen.pod_problem is not None:
        return "False", seen.pod_problem.reason, f"{r.ready} of {r.desired} replicas ready; {seen.pod_problem.message}"
    return "False", "ReplicasNotReady", f"{r.ready} of {r.desired} replicas ready"


def _degraded(old: dict[str, Any], seen: Observation, r: _Rollout) -> _Verdict:
    """Degraded: something that worked is no longer working. Readiness lost with no new rollout under way is
    remembered until the replicas are back, so it does not flicker between reconciles."""
    old_conditions = _by_type(old)
    was_serving = (old_conditions.get("Ready", {}).get("status") == "True"
                   or old_conditions.get("Degraded", {}).get("reason") == "ReplicasUnavailable")
    same_generation = old.get("observedGeneration") == seen.generation
    if seen.review.errors:
        return "True", "InvalidSpec", f"{seen.review.message}{_kept(seen)}"
    if seen.blocked is not None:
        return "True", seen.blocked[0], f"{seen.blocked[1]}{_kept(seen)}"
    if r.refused is not None:
        return "True", "PodsRefused", f"the API server refuses the pods: {r.refused}"
    if r.stuck is not None:
        return ("True", "ProgressDeadlineExceeded",
                f"the rollout is stuck: {r.ready} of {r.desired} replicas ready, {r.stuck}; pods Pending for lack of "
                "GPUs or a matching node, or still loading the model (then raise the deadline)")
    if seen.deployment is not None and r.ready < r.desired and was_serving and same_generation:
        return "True", "ReplicasUnavailable", f"{r.desired - r.ready} of {r.desired} replicas are not ready"
    return "False", "AsExpected", "no known problem"


# Conditions whose False is bad news (Degraded is bad news when True).
_WARN_WHEN_FALSE = {"Valid", "FitChecked", "Ready"}
# Decisions announced even on first sight.
_ALWAYS_ANNOUNCED = {"Valid", "FitChecked"}


@dataclass(frozen=True)
class ConditionEvent:
    """A Kubernetes Event to post about a condition that changed."""

    type: str  # Normal or Warning
    reason: str
    message: str


def condition_events(old: dict[str, Any], new: dict[str, Any]) -> list[ConditionEvent]:
    """The Events announcing the condition changes from status `old` to `new` (a pure function).

    A condition whose status and reason are unchanged is no news. Bad news (Valid, FitChecked or
    Ready turning False, but for ScaledToZero, Degraded turning True, a low-concurrency fit) is a Warning, and so
    is a pod problem (Ready=False with the pods' reason, pod_problems.py): one Event per distinct reason, and a
    Normal one once the pods are past it. On first sight, only the admission decisions (Valid, FitChecked) and bad
    news are announced, and a first Ready=False (replicas still starting) is expected, not a warning.
    """
    before = {c.get("type"): c for c in old.get("conditions", [])}
    events = []
    for c in new.get("conditions", []):
        prior = before.get(c["type"], {})
        if (prior.get("status"), prior.get("reason")) == (c["status"], c["reason"]):
            continue
        # Ready=False because the user asked for zero replicas is their decision, not bad news.
        recovered = c["type"] == "Ready" and prior.get("reason") in POD_PROBLEMS and c["reason"] not in POD_PROBLEMS
        bad = ((c["type"] in _WARN_WHEN_FALSE and c["status"] == "False" and (prior or c["type"] != "Ready")
                and c["reason"] != "ScaledToZero" and not recovered)
               or (c["type"] == "Degraded" and c["status"] == "True") or c["reason"] == "LowConcurrency"
               or (c["type"] == "Ready" and c["reason"] in POD_PROBLEMS))
        if not prior and not bad and c["type"] not in _ALWAYS_ANNOUNCED:
            continue
        events.append(ConditionEvent("Warning" if bad else "Normal", c["reason"],
                                     f"{c['type']}={c['status']}: {c['message']}"))
    return events


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON merge patch (RFC 7386) taking `old` to `new`, or None when they are equal."""
    if old == new:
        return None
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            inner = merge_patch(old[key], value)
            if inner is not None:
                patch[key] = inner
        elif old.get(key) != value or key not in old:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None  # a key that no longer applies (e.g. fit after a parse error)
    return patch
