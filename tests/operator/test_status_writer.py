"""status_writer: conditions, phase and transition times from an observation (no cluster)."""

from __future__ import annotations

import pytest

from flotilla.operator.admission import review
from flotilla.operator.capabilities import Capabilities
from flotilla.operator.children import plan_children
from flotilla.operator.pod_problems import PodProblem
from flotilla.operator.status_writer import Observation, build_status, condition_events, merge_patch

SPEC = {"model": {"source": "pvc://m"}, "replicas": 2}
CAPS = Capabilities(hpa_version="autoscaling/v2", pdb_version="policy/v1", service_monitor=False, keda=False)


def _deployment(ready: int, desired: int = 2, updated: int = 2) -> dict:
    return {"metadata": {"generation": 1}, "spec": {"replicas": desired},
            "status": {"observedGeneration": 1, "replicas": desired, "readyReplicas": ready,
                       "updatedReplicas": updated}}


def _status(old: dict, deployment: dict | None, spec: dict = SPEC, now: str = "t1", generation: int = 1) -> dict:
    r = review(spec, "x")
    plan = plan_children(r.spec, "x", "ns", CAPS) if r.spec and not r.errors else None
    return build_status(old, Observation("x", "ns", generation, r, plan, deployment, now))


def _conditions(status: dict) -> dict:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_ready_when_every_replica_is_ready():
    status = _status({}, _deployment(ready=2))
    assert status["phase"] == "Ready" and _conditions(status)["Ready"] == ("True", "AllReplicasReady")
    assert (status["replicas"], status["readyReplicas"], status["gpus"]) == (2, 2, 2)


def test_losing_readiness_is_degraded_until_it_comes_back():
    ready = _status({}, _deployment(ready=2))
    lost = _status(ready, _deployment(ready=1), now="t2")
    assert lost["phase"] == "Degraded" and _conditions(lost)["Degraded"] == ("True", "ReplicasUnavailable")
    still = _status(lost, _deployment(ready=1), now="t3")
    assert _conditions(still)["Degraded"] == ("True", "ReplicasUnavailable")  # no flicker
    back = _status(still, _deployment(ready=2), now="t4")
    assert back["phase"] == "Ready" and _conditions(back)["Degraded"][0] == "False"


def test_a_new_rollout_is_progressing_not_degraded():
    status = _status({}, _deployment(ready=0, updated=0))
    assert status["phase"] == "Progressing" and _conditions(status)["Progressing"] == ("True", "RollingOut")
    assert _conditions(status)["Degraded"] == ("False", "AsExpected")


def test_scaled_to_zero_once_no_pod_is_left():
    ready = _status({}, _deployment(ready=2), spec={**SPEC, "replicas": 2})
    going = {"metadata": {"generation": 2}, "spec": {"replicas": 0},
             "status": {"observedGeneration": 2, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}}
    leaving = _status(ready, going, spec={**SPEC, "replicas": 0}, now="t2", generation=2)
    assert leaving["phase"] == "Progressing" and _conditions(leaving)["Progressing"] == ("True", "RollingOut")
    gone = {**going, "status": {"observedGeneration": 2}}
    zero = _status(leaving, gone, spec={**SPEC, "replicas": 0}, now="t3", generation=2)
    assert zero["phase"] == "ScaledToZero"
    assert {t: _conditions(zero)[t] for t in ("Progressing", "Ready", "Degraded")} == {
        "Progressing": ("False", "ScaledToZero"), "Ready": ("False", "ScaledToZero"),
        "Degraded": ("False", "AsExpected")}
    # The user's decision: Normal Events, no Warning.
    assert {e.type for e in condition_events(ready, zero)} == {"Normal"}


def test_transition_time_moves_only_when_the_status_changes():
    first = _status({}, _deployment(ready=0), now="t1")
    same = _status(first, _deployment(ready=0), now="t2")
    assert {c["lastTransitionTime"] for c in same["conditions"]} == {"t1"}
    ready = _status(same, _deployment(ready=2), now="t3")
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times["Ready"] == "t3" and times["Valid"] == "t1"


def test_invalid_spec_fails_and_keeps_the_running_deployment():
    bad = {**SPEC, "autoscaling": {"minReplicas": 3, "maxReplicas": 1}}
    status = _status({}, _deployment(ready=2), spec=bad)
    assert status["phase"] == "Failed"
    assert _conditions(status)["Valid"] == ("False", "InvalidSpec")
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"].endswith("(the last valid configuration keeps running)")


def test_merge_patch_removes_keys_that_no_longer_apply():
    assert merge_patch({"a": 1, "fit": {"x": 1, "y": 2}}, {"a": 1, "fit": {"x": 1}}) == {"fit": {"y": None}}
    assert merge_patch({"a": 1}, {"a": 1}) is None
    assert merge_patch({"a": 1, "b": 2}, {"a": 2}) == {"a": 2, "b": None}


def test_blocked_apply_fails_the_phase_and_says_why_in_progressing_and_degraded():
    r = review(SPEC, "x")
    plan = plan_children(r.spec, "x", "ns", CAPS)
    status = build_status({}, Observation("x", "ns", 1, r, plan, None, "t1",
                                          blocked=("OwnershipConflict", "Service x already exists")))
    assert status["phase"] == "Failed"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Progressing"]["status"], conditions["Progressing"]["reason"]) == ("False", "OwnershipConflict")
    assert conditions["Progressing"]["message"] == "nothing applied: Service x already exists"
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["message"]) == ("True", "Service x already exists")
    assert conditions["Valid"]["status"] == "True"  # the spec itself is fine


def test_condition_events_announce_decisions_and_bad_news_once():
    first = _status({}, None)
    events = condition_events({}, first)
    # First sight: the admission decisions only; "still starting" and "not degraded" are no news.
    assert [(e.type, e.reason) for e in events] == [("Normal", "SpecAccepted"), ("Normal", "ArchitectureUnknown")]
    assert condition_events(first, first) == []  # nothing changed: no news
    ready = _status(first, _deployment(ready=2), now="t2")
    assert ("Normal", "AllReplicasReady") in [(e.type, e.reason) for e in condition_events(first, ready)]
    lost = _status(ready, _deployment(ready=1), now="t3")
    news = {(e.type, e.reason): e.message for e in condition_events(ready, lost)}
    assert news[("Warning", "ReplicasUnavailable")] == "Degraded=True: 1 of 2 replicas are not ready"
    assert ("Warning", "ReplicasNotReady") in news


def test_an_invalid_spec_is_a_warning_on_first_sight():
    refused = _status({}, None, spec={**SPEC, "replicas": -1})
    kinds = {(e.type, e.reason) for e in condition_events({}, refused)}
    assert ("Warning", "InvalidSpec") in kinds


def test_pooling_with_lora_slipped_past_the_webhook_is_refused_in_status_and_an_event():
    # The reconciler's own review (webhook failure policy Ignore: the operator may have been down).
    spec = {**SPEC, "runner": "pooling", "lora": {"adapters": [{"name": "sql", "source": "pvc://adapters/sql"}]}}
    refused = _status({}, None, spec=spec)
    valid = next(c for c in refused["conditions"] if c["type"] == "Valid")
    assert (refused["phase"], valid["status"], valid["reason"]) == ("Failed", "False", "InvalidSpec")
    assert valid["message"] == ("spec.runner pooling serves embeddings on one GPU, without LoRA adapters or "
                                "speculative decoding: remove spec.lora")
    events = {(e.type, e.reason): e.message for e in condition_events({}, refused)}
    assert events[("Warning", "InvalidSpec")].endswith(valid["message"])


def test_scaled_to_zero_with_autoscaling_says_the_autoscaler_is_suspended():
    spec = {"model": {"source": "pvc://m"}, "replicas": 0, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}
    gone = {"metadata": {"generation": 1}, "spec": {"replicas": 0}, "status": {"observedGeneration": 1}}
    status = _status({}, gone, spec=spec)
    assert status["phase"] == "ScaledToZero"
    assert status["autoscaler"].startswith("suspended: spec.replicas is 0")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == ("no replicas requested (spec.replicas is 0); autoscaling is suspended until it is 1 "
                                "or more")


AT_ZERO = {"metadata": {"generation": 1}, "spec": {"replicas": 0}, "status": {"observedGeneration": 1}}


@pytest.mark.parametrize(("spec", "message"), [
    ({"replicas": 0}, "no replicas requested (spec.replicas is 0)"),
    ({"replicas": 3, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}},
     "the Deployment was scaled to 0 by its autoscaler (or by hand) while autoscaling is set; spec.replicas is 3"),
    ({"replicas": 3}, "the Deployment is at 0 replicas, not the 3 spec.replicas asks for"),
])
def test_scaled_to_zero_says_who_scaled_it_under_one_stable_reason(spec, message):
    """A Deployment at 0 under a spec.replicas that is not 0 (KEDA scaling to zero, a hand `kubectl scale
    deployment`) read "no replicas requested (spec.replicas is 0)". The reason stays ScaledToZero (the phase, the
    REASON column and Normal Events go by it); the message says what happened."""
    status = _status({}, AT_ZERO, spec={"model": {"source": "pvc://m"}, **spec})
    assert status["phase"] == "ScaledToZero"
    by_type = {c["type"]: c for c in status["conditions"]}
    for type_ in ("Ready", "Progressing"):
        assert (by_type[type_]["status"], by_type[type_]["reason"], by_type[type_]["message"]) == (
            "False", "ScaledToZero", message)
    assert {e.type for e in condition_events({}, status)} <= {"Normal"}


def test_a_refused_spec_kept_at_zero_says_so_only_when_spec_replicas_asks_for_zero():
    # A refused spec applies nothing but spec.replicas 0: any other count waits for a valid spec.
    refused = {"model": {"source": "pvc://m"}, "dtype": "float32", "kvCache": {"dtype": "fp8"}}
    for replicas, kept in ((0, "scaled to zero as spec.replicas asks"), (3, "at 0 replicas until the spec is valid")):
        status = _status({}, AT_ZERO, spec={**refused, "replicas": replicas})
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["message"].endswith(f"(the last valid configuration is kept, {kept})")


def test_a_pod_problem_is_the_ready_reason_with_one_warning_and_a_normal_event_once_past_it():
    r = review(SPEC, "x")
    plan = plan_children(r.spec, "x", "ns", CAPS)

    def status(old: dict, problem: PodProblem | None, ready: int = 0) -> dict:
        return build_status(old, Observation("x", "ns", 1, r, plan, _deployment(ready=ready), "t", pod_problem=problem))

    starting = status({}, None)
    pulling = status(starting, PodProblem("ImagePullBackOff", "pod p container engine: not found"))
    ready = {c["type"]: c for c in pulling["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ImagePullBackOff")
    assert ready["message"] == "0 of 2 replicas ready; pod p container engine: not found"
    assert [(e.type, e.reason) for e in condition_events(starting, pulling)] == [("Warning", "ImagePullBackOff")]
    again = status(pulling, PodProblem("ImagePullBackOff", "pod p container engine: back-off"))
    assert condition_events(pulling, again) == []  # the same reason: no new Event on every reconcile
    past = status(again, None)
    assert [(e.type, e.reason) for e in condition_events(again, past)] == [("Normal", "ReplicasNotReady")]
    crashing = status(past, PodProblem("CrashLoopBackOff", "pod p container engine: OOMKilled"))
    fixed = status(crashing, None, ready=2)
    assert ("Normal", "AllReplicasReady") in [(e.type, e.reason) for e in condition_events(crashing, fixed)]
    assert not [e for e in condition_events(crashing, fixed) if e.type == "Warning"]
