"""Problems of the engine pods reach the InferenceService's Ready condition and Events on a real control plane.

No kubelet or scheduler runs here: the real ReplicaSet controller creates the engine pods, and this test writes
what a kubelet or the scheduler would write into their status subresource (a container's waiting state, its last
termination, the PodScheduled condition). The operator under test (a subprocess, resync every 5 s) reads them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from ..k8s_fixtures import service_account_token, token_kubeconfig
from .conftest import wait_for
from .test_operator_reconcile import child_path, condition, fis_path, fixed, set_pods_ready

IMAGE = "ghcr.io/flotilla-dev/engine:no-such-tag"


def engine_pod(cluster: Any, namespace: str, name: str) -> str:
    """The one engine pod's name (created by the real ReplicaSet controller)."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    pods = wait_for(lambda: cluster.kube.list(path, f"serving.flotilla.dev/inferenceservice={name}"), 30, "the pod")
    return pods[0]["metadata"]["name"]


def report(cluster: Any, namespace: str, pod: str, **status: Any) -> None:
    """Write pod status as the kubelet or scheduler would (merge patch: None removes a field)."""
    cluster.kube.patch_status(f"/api/v1/namespaces/{namespace}/pods/{pod}", {"phase": "Pending", **status})


def engine_status(state: dict[str, Any], restarts: int = 0, last: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [{"name": "engine", "image": IMAGE, "imageID": "", "ready": False, "restartCount": restarts,
             "state": state, "lastState": last or {}}]


@contextlib.contextmanager
def resync_off(operator_process: Any) -> Iterator[None]:
    """The operator under test restarted with its resync off for the block, then as it was."""
    operator_process.stop()
    try:
        operator_process.start(extra_args=("--resync-seconds", "0"))
        yield
    finally:
        operator_process.stop()
        operator_process.start()


def ready_condition(cluster: Any, namespace: str, name: str, reason: str, text: str) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        c = condition(cluster.kube.get(fis_path(namespace, name)), "Ready")
        return c if c.get("reason") == reason and text in c.get("message", "") else None

    return wait_for(seen, 30, f"Ready reason {reason} with {text!r}")


def reason_column(cluster: Any, namespace: str, name: str) -> str:
    """The REASON cell of `kubectl get fis NAME` (the apiserver's table of the CRD's printer columns)."""
    response = cluster.kube.api.call_api(*cluster.kube.api.param_serialize(
        "GET", fis_path(namespace, name), header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"]))
    response.read()
    table = json.loads(response.data)
    column = [c["name"] for c in table["columnDefinitions"]].index("Reason")
    return table["rows"][0]["cells"][column]


def events(cluster: Any, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.kube.list(f"/api/v1/namespaces/{namespace}/events")
            if e["involvedObject"]["name"] == name and e["reason"] == reason]


def test_pod_problems_show_in_ready_with_one_warning_per_reason_and_clear_on_recovery(operator_process, cluster,
                                                                                     namespace):
    op = cluster
    op.apply(fixed("llama", namespace, replicas=1))
    pod = engine_pod(op, namespace, "llama")
    ready_condition(op, namespace, "llama", "ReplicasNotReady", "0 of 1 replicas ready")

    # The kubelet alternates ErrImagePull and ImagePullBackOff on every retry: one problem, one Warning.
    report(op, namespace, pod, containerStatuses=engine_status(
        {"waiting": {"reason": "ErrImagePull", "message": f"rpc error: pull {IMAGE}: not found"}}))
    c = ready_condition(op, namespace, "llama", "ImagePullBackOff", f"pod {pod} container engine: rpc error")
    assert c["status"] == "False"
    report(op, namespace, pod, containerStatuses=engine_status(
        {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'}}))
    ready_condition(op, namespace, "llama", "ImagePullBackOff", "Back-off pulling image")
    warned = wait_for(lambda: events(op, namespace, "llama", "ImagePullBackOff"), 30, "the ImagePullBackOff Event")
    assert [e["type"] for e in warned] == ["Warning"] and pod in warned[0]["message"]

    # A missing Secret: the kubelet's CreateContainerConfigError.
    report(op, namespace, pod, containerStatuses=engine_status(
        {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "llama-api-key" not found'}}))
    ready_condition(op, namespace, "llama", "CreateContainerConfigError", 'secret "llama-api-key" not found')

    # A crash loop, with the last termination; between back-offs the container runs (not ready): same reason.
    oom = {"terminated": {"reason": "OOMKilled", "exitCode": 137, "startedAt": "2026-01-01T00:00:00Z",
                          "finishedAt": "2026-01-01T00:01:00Z"}}
    report(op, namespace, pod, containerStatuses=engine_status(
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}, 3, oom))
    ready_condition(op, namespace, "llama", "CrashLoopBackOff", "last terminated: OOMKilled (exit code 137)")
    report(op, namespace, pod, containerStatuses=engine_status(
        {"running": {"startedAt": "2026-01-01T00:02:00Z"}}, 4, oom))
    ready_condition(op, namespace, "llama", "CrashLoopBackOff", "restarted 4 times")

    # Unschedulable: the scheduler's message.
    report(op, namespace, pod, containerStatuses=None, conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    ready_condition(op, namespace, "llama", "Unschedulable", "3 Insufficient nvidia.com/gpu")

    # Many resyncs later still one Warning per reason, not one per reconcile.
    for reason in ("CreateContainerConfigError", "CrashLoopBackOff", "Unschedulable"):
        wait_for(lambda r=reason: events(op, namespace, "llama", r), 30, f"the {reason} Event")
    time.sleep(12)  # past two resyncs (every 5 s), each of which reconciles with the same problem
    for reason in ("ImagePullBackOff", "CreateContainerConfigError", "CrashLoopBackOff", "Unschedulable"):
        assert [e["type"] for e in events(op, namespace, "llama", reason)] == ["Warning"], reason
        assert events(op, namespace, "llama", reason)[0].get("count", 1) == 1, reason

    # Recovery clears it: Ready=True, a Normal Event.
    set_pods_ready(op, namespace, "llama", True, 1)
    c = ready_condition(op, namespace, "llama", "AllReplicasReady", "1 of 1 replicas ready")
    assert c["status"] == "True"
    # The Event follows the status patch through kopf's asynchronous event queue: wait for it.
    recovered = wait_for(lambda: events(op, namespace, "llama", "AllReplicasReady"), 30, "the AllReplicasReady Event")
    assert {e["type"] for e in recovered} == {"Normal"}


def test_an_engine_linux_will_not_exec_is_explained_in_ready(operator_process, cluster, namespace):
    """Values from Secrets and ConfigMaps are not known at admission: a pod whose environment they push past execve's
    limits fails in runc ("exec ...: argument list too long" in its log, which FallbackToLogsOnError makes the
    termination message). Ready says what that means, not only "Error (exit code 1)"."""
    cluster.apply(fixed("big-env", namespace, replicas=1))
    deployment = wait_for(lambda: cluster.kube.get(child_path("Deployment", namespace, "big-env")), 30, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"  # stored as the operator wrote it
    pod = engine_pod(cluster, namespace, "big-env")
    e2big = {"terminated": {"reason": "Error", "exitCode": 1, "startedAt": "2026-01-01T00:00:00Z",
                            "finishedAt": "2026-01-01T00:00:01Z",
                            "message": "exec /opt/flotilla/bin/flotilla: argument list too long\n"}}
    report(cluster, namespace, pod, containerStatuses=engine_status(
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}}, 2, e2big))
    c = ready_condition(cluster, namespace, "big-env", "CrashLoopBackOff", "Linux refused to start the engine")
    assert c["message"].endswith("last terminated: Error (exit code 1): exec /opt/flotilla/bin/flotilla: argument "
                                 "list too long")


def test_a_labelled_pod_its_deployment_did_not_make_never_names_the_ready_reason(operator_process, cluster,
                                                                                 namespace):
    """A pod anyone made with the InferenceService's label (no owner: the ReplicaSet, whose selector also wants
    pod-template-hash, does not adopt it) reports ImagePullBackOff: neither the reconciler's listing (every resync)
    nor the serving reader's (every second) puts it into Ready. The real engine pod's problem still shows."""
    cluster.apply(fixed("owned", namespace, replicas=1))
    pod = engine_pod(cluster, namespace, "owned")
    ready_condition(cluster, namespace, "owned", "ReplicasNotReady", "0 of 1 replicas ready")
    cluster.kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": "stray", "labels": {"serving.flotilla.dev/inferenceservice": "owned"}},
        "spec": {"containers": [{"name": "engine", "image": IMAGE}]}})
    report(cluster, namespace, "stray", containerStatuses=engine_status(
        {"waiting": {"reason": "ImagePullBackOff", "message": "the stray pod's lure"}}))
    time.sleep(12)  # two resyncs (every 5 s) and a dozen periods of the serving reader
    assert condition(cluster.kube.get(fis_path(namespace, "owned")), "Ready")["reason"] == "ReplicasNotReady"
    assert cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods/stray") is not None  # still there, not adopted
    report(cluster, namespace, pod, containerStatuses=engine_status(
        {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "owned-key" not found'}}))
    ready_condition(cluster, namespace, "owned", "CreateContainerConfigError", f"pod {pod} container engine")


def test_a_replicaset_named_as_the_deployments_but_not_its_own_never_names_the_ready_reason(operator_process, cluster,
                                                                                             namespace):
    """Whoever may create ReplicaSets names one `<name>-<hash>`, as the Deployment controller would, with another
    controller (here a ConfigMap of theirs), so the Deployment does not adopt it: the real ReplicaSet controller makes
    its pod, labelled and owned as an engine pod by name. The operator checks owner uids (pod -> ReplicaSet -> the
    Deployment it owns), so that pod's ImagePullBackOff never reaches Ready."""
    cluster.apply(fixed("named", namespace, replicas=1))
    pod = engine_pod(cluster, namespace, "named")
    ready_condition(cluster, namespace, "named", "ReplicasNotReady", "0 of 1 replicas ready")
    theirs = cluster.kube.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "mine"}})
    labels = {"serving.flotilla.dev/inferenceservice": "named", "pod-template-hash": "f0f0f0"}
    cluster.kube.request("POST", f"/apis/apps/v1/namespaces/{namespace}/replicasets", {
        "metadata": {"name": "named-f0f0f0", "labels": labels, "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "mine", "uid": theirs["metadata"]["uid"],
             "controller": True}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "engine",
                                                                                       "image": IMAGE}]}}}})
    path = f"/api/v1/namespaces/{namespace}/pods"
    forged = wait_for(lambda: cluster.kube.list(path, "pod-template-hash=f0f0f0"), 30, "the forged ReplicaSet's pod")
    assert forged[0]["metadata"]["ownerReferences"][0]["name"] == "named-f0f0f0"
    report(cluster, namespace, forged[0]["metadata"]["name"], containerStatuses=engine_status(
        {"waiting": {"reason": "ImagePullBackOff", "message": "the forged pod's lure"}}))
    time.sleep(12)  # two resyncs (every 5 s) and a dozen periods of the serving reader
    assert condition(cluster.kube.get(fis_path(namespace, "named")), "Ready")["reason"] == "ReplicasNotReady"
    report(cluster, namespace, pod, containerStatuses=engine_status(
        {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "named-key" not found'}}))
    ready_condition(cluster, namespace, "named", "CreateContainerConfigError", f"pod {pod} container engine")


def test_without_a_resync_the_serving_readers_pod_listing_brings_the_problem(operator_process, cluster, namespace):
    # No pod is watched, and a container's waiting state changes nothing on the ReplicaSet or the Deployment: with
    # the resync off, only the serving reader's periodic listing (every second here) can bring the problem in.
    with resync_off(operator_process):
        cluster.apply(fixed("quiet", namespace, replicas=1))
        pod = engine_pod(cluster, namespace, "quiet")
        ready_condition(cluster, namespace, "quiet", "ReplicasNotReady", "0 of 1 replicas ready")
        time.sleep(3)  # the Deployment's and ReplicaSet's own status changes (which reconcile) are over
        report(cluster, namespace, pod, containerStatuses=engine_status(
            {"waiting": {"reason": "InvalidImageName", "message": 'invalid reference format: "UPPER:case"'}}))
        ready_condition(cluster, namespace, "quiet", "InvalidImageName", f"pod {pod} container engine: invalid")
        assert reason_column(cluster, namespace, "quiet") == "InvalidImageName"
        time.sleep(3)  # three periods of the serving reader: it has seen the problem
        report(cluster, namespace, pod, containerStatuses=engine_status({"waiting": {"reason": "ContainerCreating"}}))
        ready_condition(cluster, namespace, "quiet", "ReplicasNotReady", "0 of 1 replicas ready")
        # The Event is posted after the status patch (through kopf's queue, or by the reader's thread): wait for it.
        notready = wait_for(lambda: events(cluster, namespace, "quiet", "ReplicasNotReady"), 30,
                            "the ReplicasNotReady Event")
        assert [e["type"] for e in notready] == ["Normal"]


def test_a_problem_another_triggers_reconcile_wrote_is_cleared_by_the_serving_reader(operator_process, cluster,
                                                                                     namespace):
    # A reconcile of another trigger (here a hand edit of the Deployment) may write a problem that the serving reader's
    # listings never showed (it came and went between two of them), so they never change, yet Ready names it. The
    # reader compares the pods with what Ready names as the reconciler last wrote it (no listing of the
    # InferenceServices): with the resync off, it alone clears the problem once the pods no longer have it.
    with resync_off(operator_process):
        cluster.apply(fixed("stale", namespace, replicas=1))
        pod = engine_pod(cluster, namespace, "stale")
        ready_condition(cluster, namespace, "stale", "ReplicasNotReady", "0 of 1 replicas ready")
        time.sleep(3)  # the Deployment's and ReplicaSet's own status changes (which reconcile) are over
        report(cluster, namespace, pod, containerStatuses=engine_status(
            {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}, 3))
        cluster.kube.request("PATCH", child_path("Deployment", namespace, "stale"),
                             {"metadata": {"annotations": {"example.com/touched": "by hand"}}}, None,
                             "application/merge-patch+json")
        ready_condition(cluster, namespace, "stale", "CrashLoopBackOff", "restarted 3 times")
        report(cluster, namespace, pod, containerStatuses=engine_status({"waiting": {"reason": "ContainerCreating"}}))
        ready_condition(cluster, namespace, "stale", "ReplicasNotReady", "0 of 1 replicas ready")


RBAC = "/apis/rbac.authorization.k8s.io/v1"
READER = "serving-reader"
# The operator's reach, under a ServiceAccount so that the apiserver's audit log records its requests.
EVERYTHING = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
# The serving reader's listing of the engine pods (the label's existence; a reconcile lists one InferenceService's).
READER_PODS = "/pods?labelSelector=serving.flotilla.dev/inferenceservice"


def _audited(control_plane: Any, user: str) -> list[str]:
    """The `verb requestURI` of each request `user` made, in order."""
    return [f"{e['verb']} {e['requestURI']}" for e in control_plane.audit_events() if e["user"]["username"] == user]


def test_the_serving_reader_lists_no_inferenceservices(operator_process, cluster, control_plane, namespace, tmp_path):
    # What Ready names comes from the reconciler, which wrote it: the reader's periods list the engine pods alone
    # (one call per watched namespace), where they also listed every InferenceService to read it back.
    cluster.kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": READER}})
    name = f"{READER}-{namespace}"
    cluster.kube.request("POST", f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": EVERYTHING})
    cluster.kube.request("POST", f"{RBAC}/clusterrolebindings", {
        "metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": namespace}]})
    token = wait_for(lambda: service_account_token(cluster.kube, namespace, READER), 30, f"{READER}'s token")
    user = f"system:serviceaccount:{namespace}:{READER}"
    operator_process.stop()
    try:
        operator_process.start(webhook=False, kubeconfig=token_kubeconfig(
            control_plane.kubeconfig, token, tmp_path / "reader.kubeconfig"), extra_args=(
                "-n", namespace, "--resync-seconds", "0"))
        cluster.apply(fixed("listed", namespace, replicas=1))
        engine_pod(cluster, namespace, "listed")

        def periods() -> int:
            return sum(r.startswith("list ") and r.endswith(READER_PODS) for r in _audited(control_plane, user))

        def inferenceservice_lists() -> int:
            return sum("/inferenceservices" in r for r in _audited(control_plane, user) if r.startswith("list "))

        wait_for(lambda: periods() >= 2, 30, f"two serving periods (log: {operator_process.log_path})")
        before, started = inferenceservice_lists(), periods()
        wait_for(lambda: periods() >= started + 3, 30, "three more serving periods")
        assert inferenceservice_lists() == before, [r for r in _audited(control_plane, user)
                                                    if r.startswith("list ") and "/inferenceservices" in r]
    finally:
        operator_process.stop()
        cluster.kube.delete(f"{RBAC}/clusterrolebindings/{name}")
        cluster.kube.delete(f"{RBAC}/clusterroles/{name}")
        operator_process.start()
