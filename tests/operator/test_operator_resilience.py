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
