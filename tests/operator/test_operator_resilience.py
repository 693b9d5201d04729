"""The operator survives what production does to it: a SIGKILL mid-way, an apiserver restart."""

from __future__ import annotations

from .conftest import wait_for
from .test_operator_reconcile import child_path, condition, fis, fis_path, fixed, wait_children

CHILDREN = ["Deployment", "Service", "PodDisruptionBudget"]


def _count(cluster, namespace: str, plural: str, group_version: str) -> list[str]:
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    items = cluster.kube.request("GET", f"{prefix}/namespaces/{namespace}/{plural}")["items"]
    return sorted(i["metadata"]["name"] for i in items)


def test_sigkill_mid_way_then_restart_converges_without_duplicates(operator_process, cluster, namespace):
    names = [f"svc-{i}" for i in range(6)]
    for name in names[:3]:
        cluster.apply(fixed(name, namespace))
    operator_process.kill()  # mid-way: some of the three are being reconciled, maybe half done
    try:
        # While it is down, the webhook configurations it left behind fail open (policy Ignore):
        # changes go through, and an invalid spec is admitted...
        for name in names[3:]:
            cluster.apply(fixed(name, namespace))
        cluster.apply(fis("bad", namespace, autoscaling={"minReplicas": 4, "maxReplicas": 2}))
    finally:
        operator_process.start()
    for name in names:
        wait_children(cluster, namespace, name, CHILDREN, timeout=30)
    assert _count(cluster, namespace, "deployments", "apps/v1") == names  # one each, no duplicates
    assert _count(cluster, namespace, "services", "v1") == names
    assert _count(cluster, namespace, "poddisruptionbudgets", "policy/v1beta1") == names
    # ...but the reconciler refuses it: status says why and nothing is rolled out.
    bad = wait_for(lambda: condition(b := cluster.kube.get(fis_path(namespace, "bad")), "Valid").get("status")
                   == "False" and b, 20, "Valid=False on the invalid spec")
    assert condition(bad, "Valid")["message"] == \
        "autoscaling.minReplicas (4) must not exceed autoscaling.maxReplicas (2)"
    assert bad["status"]["phase"] == "Failed"
    assert cluster.kube.get(child_path("Deployment", namespace, "bad")) is None


def test_apiserver_restart_under_the_operator_then_it_converges(operator_process, cluster, control_plane,
                                                                 namespace):
    cluster.apply(fixed("before", namespace))
    wait_children(cluster, namespace, "before", CHILDREN)
    control_plane.restart_apiserver()
    assert operator_process.proc.poll() is None, "the operator exited when the apiserver went away"
    # The operator's watches reconnect: a new InferenceService, a deleted child and a spec change
    # made after the restart all converge.
    cluster.apply(fixed("after", namespace))
    cluster.kube.delete(child_path("Service", namespace, "before"))
    cluster.apply(fixed("before", namespace, replicas=3))
    try:
        wait_children(cluster, namespace, "after", CHILDREN, timeout=60)
        wait_for(lambda: cluster.kube.get(child_path("Service", namespace, "before")), 60, "the Service back")
        wait_for(lambda: cluster.kube.get(child_path("Deployment", namespace, "before"))["spec"]["replicas"] == 3,
                 60, "replicas 3")
    except AssertionError as e:  # the operator's own account is what tells why it did not converge
        raise AssertionError(f"{e}\noperator log:\n{operator_process.tail(80)}") from e
    assert operator_process.proc.poll() is None, "the operator exited after the apiserver came back"



def _operate_in_a_thread(registry, restart):
    """main.operate (kopf) with `registry` in a daemon thread; returns the thread and the list its outcome goes to (the
    exception, or None)."""
    import asyncio
    import threading

    import kopf

    from flotilla.operator import main

    settings = kopf.OperatorSettings()
    settings.process.ultimate_exiting_timeout = None  # a regression must fail the test, not SIGKILL pytest
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            asyncio.run(main.operate(restart, registry=registry, settings=settings, standalone=True, clusterwide=True))
        except BaseException as e:  # the outcome is what is asserted
            outcome.append(e)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _registry():
    import kopf

    from flotilla.operator import main

    registry = kopf.OperatorRegistry()
    kopf.on.login(id="login", registry=registry)(main.login)
    return registry


def test_kopf_stopped_by_an_error_returns_at_once_for_the_restart_in_process(control_plane, monkeypatch):
    """main.run_resiliently starts kopf again when it stops of an error, but only once kopf's run returns. With the
    certificate check's threading.Event as kopf's stop flag, kopf waited for it in a thread of the event loop's
    executor that nothing released on such a stop, and the loop's shutdown waited for that thread until kopf's
    exit timeout SIGKILLed the operator (a removed CRD's 404: 15 s without webhook, then exit -9). Here kopf fails
    at start-up; the run must end with its error."""
    import threading

    import kopf

    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    registry = _registry()

    @kopf.on.startup(id="fail", registry=registry)
    def fail(**_):
        raise kopf.PermanentError("a fatal error")

    restart = threading.Event()
    thread, outcome = _operate_in_a_thread(registry, restart)
    thread.join(60)
    hung = thread.is_alive()
    restart.set()  # releases what a regression leaves waiting on it (the interpreter's exit joins executor threads)
    assert not hung, "kopf's run did not return after its error"
    # The failed start-up, as kopf reports it (ActivityError: "One or more handlers failed.").
    assert len(outcome) == 1 and type(outcome[0]).__name__ == "ActivityError", outcome


def test_the_restart_flag_stops_kopf(control_plane, monkeypatch):
    """The certificate check sets the restart flag (main._restart_on_new_certificate): kopf stops, and its run returns
    without an error, for main to start it again on the new certificate."""
    import threading

    import kopf

    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    registry = _registry()
    started = threading.Event()

    @kopf.on.startup(id="started", registry=registry)
    def start(**_):
        started.set()

    restart = threading.Event()
    thread, outcome = _operate_in_a_thread(registry, restart)
    wait_for(started.is_set, 60, "kopf started")
    restart.set()
    thread.join(60)
    assert not thread.is_alive(), "kopf did not stop on the restart flag"
    assert outcome == [None]
