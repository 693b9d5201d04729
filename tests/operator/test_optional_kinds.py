"""The Prometheus Operator's or KEDA's CRD installed after the operator started: its kind gets watched; removed under
it: the operator keeps running, and watches the kind again once it is back.

kopf starts watching a kind when a CRD event finds it in the apiserver's discovery, but discovery can lag the
CRD's last event (ops15: seen on this apiserver), and kopf without the right to watch CRDs never looks again.
Either way a hand edit of a ServiceMonitor was undone only by the next resync (or by a reconcile some other child's
event happened to start). The operator here runs with every right but watching CRDs (kopf's own CRD observation
is then blind: a deterministic stand-in for losing that race), no resync and no status.serving reads, while the
session's operator is stopped. Its requests are in the apiserver's audit log (it runs under a ServiceAccount's
token): kopf lists a kind before it watches it, and the reconciler never lists ServiceMonitors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..k8s_fixtures import service_account_token, token_kubeconfig
from .conftest import wait_for
from .test_operator_reconcile import child_path, fis, wait_children

RBAC = "/apis/rbac.authorization.k8s.io/v1"
ACCOUNT = "no-crd-watch"
# Everything the operator may touch, and CRDs read but not watched.
RULES = [{"apiGroups": ["", "apps", "autoscaling", "policy", "events.k8s.io", "monitoring.coreos.com", "keda.sh",
                        "serving.flotilla.dev", "admissionregistration.k8s.io"], "resources": ["*"], "verbs": ["*"]},
         {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list"]}]


def _account_without_crd_watch(cluster: Any, control_plane: Any, namespace: str, workdir: Path) -> Path:
    name = f"{ACCOUNT}-{namespace}"
    cluster.kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": ACCOUNT}})
    cluster.kube.request("POST", f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": RULES})
    cluster.kube.request("POST", f"{RBAC}/clusterrolebindings", {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}]})
    token = wait_for(lambda: service_account_token(cluster.kube, namespace, ACCOUNT), 30, f"{ACCOUNT}'s token")
    return token_kubeconfig(control_plane.kubeconfig, token, workdir / "no-crd-watch.kubeconfig")


@contextmanager
def _operator_without_crd_watch(operator_process: Any, cluster: Any, control_plane: Any, namespace: str,
                                workdir: Path, **start: Any) -> Iterator[None]:
    """The operator under the ServiceAccount that may not watch CRDs (started with `start`) instead of the session's;
    afterwards the account gone, the optional CRDs removed and the session's operator back."""
    kubeconfig = _account_without_crd_watch(cluster, control_plane, namespace, workdir)
    operator_process.stop()
    try:
        operator_process.start(kubeconfig=kubeconfig, **start)
        yield
    finally:
        operator_process.stop()
        name = f"{ACCOUNT}-{namespace}"
        cluster.kube.delete(f"{RBAC}/clusterrolebindings/{name}")
        cluster.kube.delete(f"{RBAC}/clusterroles/{name}")
        cluster.set_optional_crds(False)
        operator_process.start()


def _requests(control_plane: Any, namespace: str, resource: str, verb: str, code: int | None = None) -> int:
    """How many `verb` requests of `resource` the ServiceAccount has made (answered with `code`, if given)."""
    user = f"system:serviceaccount:{namespace}:{ACCOUNT}"
    count = 0
    for event in control_plane.audit_events():
        if (event["user"]["username"] == user and event["verb"] == verb and event["stage"] == "ResponseComplete"
                and event.get("objectRef", {}).get("resource") == resource
                and code in (None, event.get("responseStatus", {}).get("code"))):
            count += 1
    return count


def _listed(control_plane: Any, namespace: str, resource: str) -> bool:
    """Whether the ServiceAccount has listed `resource` (kopf does so when it starts watching a kind)."""
    return _requests(control_plane, namespace, resource, "list", 200) > 0


def test_a_servicemonitor_crd_installed_after_start_up_is_watched(operator_process, cluster, control_plane,
                                                                  namespace, tmp_path):
    cluster.set_optional_crds(False)
    with _operator_without_crd_watch(operator_process, cluster, control_plane, namespace, tmp_path, webhook=False,
                                     extra_args=("-n", namespace, "--resync-seconds", "0", "--serving-period", "0")):
        cluster.apply(fis("llama", namespace, autoscaling=None))  # the sample asks for a ServiceMonitor
        wait_children(cluster, namespace, "llama", ["Deployment", "Service"])
        # Installed as a user would (no extra touch of the CRD, unlike the fixtures' apply_crd).
        cluster.set_optional_crds(True, touch=False)
        wait_for(lambda: _listed(control_plane, namespace, "servicemonitors"), 30,
                 f"the operator to watch ServiceMonitors (log: {operator_process.log_path})")
        # A spec change: its reconcile makes the ServiceMonitor, which the operator then has to keep as it is.
        cluster.apply(fis("llama", namespace, autoscaling=None, replicas=3))
        wait_children(cluster, namespace, "llama", ["ServiceMonitor"], timeout=30)
        path = child_path("ServiceMonitor", namespace, "llama")
        for attempt in ("/elsewhere", "/again"):
            cluster.kube.request("PATCH", path, {"spec": {"endpoints": [{"port": "http", "path": attempt}]}},
                                 content_type="application/merge-patch+json")
            wait_for(lambda: cluster.kube.get(path)["spec"]["endpoints"][0].get("path") == "/metrics", 30,
                     f"the hand-edited ServiceMonitor ({attempt}) put back (log: {operator_process.log_path})")


def test_this_kopf_release_has_the_internals_the_rescan_uses():
    # Without them the operator only warns at start-up (a late CRD waits for the resync): a kopf upgrade that
    # moves them should fail here, not silently.
    from flotilla.operator import optional_kinds

    assert optional_kinds.available()
    insights = optional_kinds.INTERNALS[0]()
    assert optional_kinds.watched(insights) == frozenset()
    # The watch task the operator wraps (a removed CRD's 404): kopf's orchestrator calls it by this name.
    from kopf._core.reactor import orchestration

    assert orchestration.queueing is optional_kinds.INTERNALS[2]
    assert callable(optional_kinds.INTERNALS[2].watcher)



def _updated_events(cluster: Any, namespace: str, name: str) -> int:
    return sum(1 for e in cluster.kube.list(f"/api/v1/namespaces/{namespace}/events")
               if e["involvedObject"]["name"] == name and e["reason"] == "Updated")


def test_the_operator_keeps_running_while_the_servicemonitor_crd_goes_and_comes_back(
        operator_process, cluster, control_plane, namespace, tmp_path):
    """Uninstalling the Prometheus Operator removes its CRDs under a running operator. kopf's watch of the kind then
    reconnects and gets a 404, which kopf treats as fatal, unless a CRD event made kopf drop the kind first (session
    21, under load: kopf stopped in-process, Events of reconciles in flight were lost, no webhook for ~30 s). Without
    the right to watch CRDs kopf sees no such event, so here the 404 comes every time."""
    cluster.set_optional_crds(True)
    # Every namespace: the webhook probe of operator_process.start is made in "default".
    with _operator_without_crd_watch(operator_process, cluster, control_plane, namespace, tmp_path,
                                     extra_args=("--resync-seconds", "0", "--serving-period", "0")):
        cluster.apply(fis("llama", namespace, autoscaling=None))
        wait_children(cluster, namespace, "llama", ["Deployment", "ServiceMonitor"], timeout=30)
        wait_for(lambda: _listed(control_plane, namespace, "servicemonitors"), 30,
                 f"the operator to watch ServiceMonitors (log: {operator_process.log_path})")
        cluster.set_optional_crds(False)
        # The apiserver closes the kind's watch a moment after the CRD is gone; kopf's reconnect gets the 404.
        wait_for(lambda: _requests(control_plane, namespace, "servicemonitors", "watch", 404), 60,
                 f"kopf's watch of ServiceMonitors answered 404 (log: {operator_process.log_path})")
        for replicas in (3, 4):
            before = _updated_events(cluster, namespace, "llama")
            cluster.apply(fis("llama", namespace, autoscaling=None, replicas=replicas))
            wait_for(lambda r=replicas: cluster.kube.get(child_path("Deployment", namespace, "llama"))["spec"][
                "replicas"] == r, 30, f"the Deployment reconciled to {replicas} (log: {operator_process.log_path})")
            wait_for(lambda b=before: _updated_events(cluster, namespace, "llama") > b, 30,
                     f"an Updated Event for {replicas} replicas (log: {operator_process.log_path})")
            assert operator_process._serving(), f"the webhook does not answer (log: {operator_process.log_path})"
        lists = _requests(control_plane, namespace, "servicemonitors", "list", 200)
        cluster.set_optional_crds(True, touch=False)
        wait_children(cluster, namespace, "llama", ["ServiceMonitor"], timeout=30)
        # Watched again (kopf lists a kind before it watches it); a hand edit is put back.
        wait_for(lambda: _requests(control_plane, namespace, "servicemonitors", "list", 200) > lists, 30,
                 f"the operator to watch ServiceMonitors again (log: {operator_process.log_path})")
        path = child_path("ServiceMonitor", namespace, "llama")
        cluster.kube.request("PATCH", path, {"spec": {"endpoints": [{"port": "http", "path": "/elsewhere"}]}},
                             content_type="application/merge-patch+json")
        wait_for(lambda: cluster.kube.get(path)["spec"]["endpoints"][0].get("path") == "/metrics", 30,
                 f"the hand-edited ServiceMonitor put back (log: {operator_process.log_path})")
        log = operator_process.log_path.read_text(errors="replace")
        assert "has failed" not in log and "the operator stopped on an error" not in log, operator_process.tail(80)
