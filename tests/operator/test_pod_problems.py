"""pod_problems: the reason and message a pod's status gives for not coming up (no cluster)."""

from __future__ import annotations

from typing import Any

from flotilla.operator.pod_problems import MAX_MESSAGE, pod_problem


def _pod(name: str, containers: list[dict[str, Any]] = (), init: list[dict[str, Any]] = (),
         conditions: list[dict[str, Any]] = (), deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"containerStatuses": list(containers), "initContainerStatuses": list(init),
                                         "conditions": list(conditions)}}


def _waiting(reason: str, message: str = "", name: str = "engine", **more: Any) -> dict[str, Any]:
    return {"name": name, "ready": False, "restartCount": 0, "state": {"waiting": {"reason": reason,
                                                                                    "message": message}}, **more}


def test_healthy_or_starting_pods_have_no_problem():
    assert pod_problem([]) is None
    ready = {"name": "engine", "ready": True, "restartCount": 0, "state": {}}
    assert pod_problem([_pod("a", [_waiting("ContainerCreating")]), _pod("b", [ready])]) is None


def test_image_pull_retries_are_one_reason_naming_pod_and_container():
    for reason in ("ErrImagePull", "ImagePullBackOff"):
        found = pod_problem([_pod("p", [_waiting(reason, "not found")])])
        assert found is not None and found.reason == "ImagePullBackOff"
        assert found.message == "pod p container engine: not found"
    assert pod_problem([_pod("p", [_waiting("InvalidImageName", "bad ref")])]).reason == "InvalidImageName"


def test_an_init_container_problem_is_found_and_deleted_pods_are_ignored():
    found = pod_problem([_pod("p", init=[_waiting("CreateContainerConfigError", 'secret "hf" not found',
                                                  name="download")])])
    assert (found.reason, found.message) == ("CreateContainerConfigError",
                                             'pod p container download: secret "hf" not found')
    assert pod_problem([_pod("old", [_waiting("CrashLoopBackOff")], deleting=True)]) is None


def test_a_crash_loop_names_the_last_termination_and_does_not_flicker_between_back_offs():
    oom = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    waiting = pod_problem([_pod("p", [_waiting("CrashLoopBackOff", "back-off 40s", restartCount=3, lastState=oom)])])
    assert waiting.reason == "CrashLoopBackOff"
    assert waiting.message == ("pod p container engine: back-off 40s; restarted 3 times; "
                               "last terminated: OOMKilled (exit code 137)")
    running = {"name": "engine", "ready": False, "restartCount": 4, "state": {"running": {}}, "lastState": oom}
    assert pod_problem([_pod("p", [running])]).reason == "CrashLoopBackOff"
    assert pod_problem([_pod("p", [{**running, "ready": True}])]) is None


def test_unschedulable_comes_with_the_schedulers_message_truncated():
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. " * 20
    found = pod_problem([_pod("b"), _pod("a", conditions=[{"type": "PodScheduled", "status": "False",
                                                           "reason": "Unschedulable", "message": message}])])
    assert found.reason == "Unschedulable" and found.message.startswith("pod a: 0/3 nodes are available")
    assert len(found.message) == MAX_MESSAGE and found.message.endswith("...")


def test_a_labelled_pod_its_deployment_did_not_make_has_no_problem_for_ready():
    """Ready's reason comes from the pods the serving reader would scrape, never from a pod anyone labelled."""
    from flotilla.operator.engine_pods import engine_pods

    def pod(reason: str, replicaset: str | None) -> dict[str, Any]:
        p = _pod("p", [_waiting(reason)])
        refs = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x-h", "uid": replicaset, "controller": True}]
        p["metadata"].update(namespace="a", labels={"serving.flotilla.dev/inferenceservice": "x"},
                             ownerReferences=refs if replicaset else [])
        return p

    replicasets = [{"metadata": {"name": "x-h", "namespace": "a", "uid": uid, "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": deployment, "controller": True}]}}
        for uid, deployment in (("rs-x", "deploy-x"), ("rs-forged", "deploy-forged"))]
    stray = pod("ImagePullBackOff", None)  # no owner
    forged = pod("CrashLoopBackOff", "rs-forged")  # a ReplicaSet named alike, another Deployment's
    engine = pod("InvalidImageName", "rs-x")  # the Deployment's own
    assert pod_problem(engine_pods([stray, forged], replicasets, {("a", "x"): "deploy-x"})) is None
    found = pod_problem(engine_pods([stray, forged, engine], replicasets, {("a", "x"): "deploy-x"}))
    assert found is not None and found.reason == "InvalidImageName"


def test_the_serving_reader_reconciles_an_inferenceservice_whose_ready_names_another_problem_once():
    from flotilla.operator.serving_reader import ServingReader

    def pod(namespace: str, reason: str) -> dict[str, Any]:
        p = _pod("p", [_waiting(reason)])
        p["metadata"].update(namespace=namespace, labels={"serving.flotilla.dev/inferenceservice": "x"})
        return p

    # What Ready names (the reconciler's record, Reconciler.shown_pod_problems): nothing, or a pod problem.
    calls: list[tuple[str, str]] = []
    reader = ServingReader(kube=None, namespaces=["team-*"], on_pod_problem=lambda ns, name: calls.append((ns, name)))
    reader.announce_problems([pod("team-a", "ErrImagePull"), pod("other", "ErrImagePull")], {})
    assert calls == [("team-a", "x")]  # an unwatched namespace's pods are not its business
    # The same disagreement (the reconciler does not read the pods of a Deployment with every replica ready, say):
    # reconciled once, not every period.
    reader.announce_problems([pod("team-a", "ImagePullBackOff")], {})
    assert calls == [("team-a", "x")]
    reader.announce_problems([pod("team-a", "ImagePullBackOff")], {("team-a", "x"): "ImagePullBackOff"})  # agreed
    assert calls == [("team-a", "x")]
    # Past it: reconcile to clear Ready's reason.
    reader.announce_problems([pod("team-a", "ContainerCreating")], {("team-a", "x"): "ImagePullBackOff"})
    assert calls == [("team-a", "x")] * 2
    # A problem this reader never saw (it came and went between two listings, written by another trigger's
    # reconcile) is still named by Ready: reconcile, as its own listings never changed.
    reader = ServingReader(kube=None, namespaces=[], on_pod_problem=lambda ns, name: calls.append((ns, name)))
    reader.announce_problems([pod("team-a", "ContainerCreating")], {})
    assert calls == [("team-a", "x")] * 2
    reader.announce_problems([pod("team-a", "ContainerCreating")], {("team-a", "x"): "CrashLoopBackOff"})
    assert calls == [("team-a", "x")] * 3
    # Ready in an unwatched namespace is not its business either.
    reader = ServingReader(kube=None, namespaces=["team-*"], on_pod_problem=lambda ns, name: calls.append((ns, name)))
    reader.announce_problems([], {("other", "x"): "CrashLoopBackOff"})
    assert calls == [("team-a", "x")] * 3


def test_a_crash_quotes_the_last_line_of_its_termination_message():
    # The engine container's terminationMessagePolicy is FallbackToLogsOnError: the message is its log's tail.
    crash = {"terminated": {"reason": "Error", "exitCode": 1,
                            "message": "Traceback (most recent call last):\n  ...\nValueError: bad config\n\n"}}
    found = pod_problem([_pod("p", [_waiting("CrashLoopBackOff", "back-off 10s", restartCount=1, lastState=crash)])])
    assert found.message == ("pod p container engine: back-off 10s; restarted 1 times; "
                             "last terminated: Error (exit code 1): ValueError: bad config")


def test_linuxs_argument_list_too_long_is_explained_first():
    # runc's execve failure (E2BIG), in the log tail or a runtime's waiting message: values from Secrets and
    # ConfigMaps are not known at admission, so the pod is where it shows.
    e2big = {"terminated": {"reason": "Error", "exitCode": 1,
                            "message": "exec /opt/flotilla/bin/flotilla: argument list too long\n"}}
    for found in (
        pod_problem([_pod("p", [_waiting("CrashLoopBackOff", "back-off 20s", restartCount=2, lastState=e2big)])]),
        pod_problem([_pod("p", [{"name": "engine", "ready": False, "restartCount": 2, "state": {"running": {}},
                                 "lastState": e2big}])]),
        pod_problem([_pod("p", [_waiting("RunContainerError", "runc create failed: unable to start container "
                                         "process: exec: argument list too long")])]),
    ):
        assert found.message.startswith(
            "pod p container engine: Linux refused to start the engine: its arguments and environment, Secret and "
            "ConfigMap values included, pass execve's limits (128 KiB a string, 2 MiB in all); "), found.message
        assert "argument list too long" in found.message and len(found.message) <= MAX_MESSAGE
