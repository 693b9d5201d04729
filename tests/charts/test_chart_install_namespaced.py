"""The chart with operator.watchNamespaces: the operator works under Roles in the watched namespace
alone, and has no rights on Deployments or Services anywhere else (its own control plane, as every
module here)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from flotilla.operator.kube import KubeError, path_of
from flotilla.operator.spec import DEFAULT_IMAGE

from ..k8s_fixtures import ControlPlane, wait_for
from .conftest import NAMESPACE, RELEASE
from .test_chart_install import DEMO, FIS, VALUES, Installed, apply, child, fis

pytestmark = pytest.mark.slow

SCOPED = copy.deepcopy(VALUES)
SCOPED["operator"]["watchNamespaces"] = [DEMO]
ELSEWHERE = "elsewhere"  # a namespace the release does not serve


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    chart = Installed(control_plane, tmp_path_factory.mktemp("chart-install-scoped"), SCOPED)
    chart.admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": DEMO}})  # the Role lives there
    chart.install()
    chart.start_operator()
    yield chart
    chart.stop()


def test_roles_in_the_watched_namespace_only(installed: Installed) -> None:
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = installed.admin.get(f"{rbac}/namespaces/{DEMO}/roles/{RELEASE}-operator")
    assert role is not None and any("deployments" in r["resources"] for r in role["rules"])
    cluster_role = installed.admin.get(f"{rbac}/clusterroles/{RELEASE}-operator")
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {"customresourcedefinitions",
                                                                                  "namespaces"}


def test_the_operator_reconciles_under_the_roles_with_nothing_refused(installed: Installed) -> None:
    admin = installed.admin
    apply(admin, fis("smollm2"))
    installed.wait(lambda: child(admin, "apps/v1", "deployments", "smollm2"), 30, "the engine Deployment")
    installed.wait(lambda: child(admin, "v1", "services", "smollm2"), 30, "the engine Service")

    def valid() -> dict[str, Any] | None:
        status = (admin.get(f"{FIS}/namespaces/{DEMO}/inferenceservices/smollm2") or {}).get("status", {})
        return status if any(c["type"] == "Valid" and c["status"] == "True"
                             for c in status.get("conditions", [])) else None

    installed.wait(valid, 30, "status Valid=True")
    refused = sorted({f"{a['verb']} {a['requestURI']}" for a in installed.audited()
                      if a.get("responseStatus", {}).get("code") == 403})
    assert refused == [], f"the Roles are missing permissions for: {refused}"


def test_the_service_account_cannot_write_deployments_elsewhere(installed: Installed) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "probe", "namespace": NAMESPACE},
                  "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                      "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    with pytest.raises(KubeError) as refused:
        installed.operator.request("PATCH", path_of(deployment), deployment,
                                   {"fieldManager": "flotilla-operator", "force": "true", "dryRun": "All"},
                                   "application/apply-patch+yaml")
    assert refused.value.status == 403


def test_the_webhooks_leave_inferenceservices_of_other_namespaces_alone(installed: Installed) -> None:
    # The chart's webhook configurations match InferenceServices in every namespace. A release that serves one
    # team's namespace must neither refuse another namespace's spec by its own admin policy (here: no hostPath
    # prefix allowed) nor write its engine image into it: that namespace is another release's (or nobody's).
    if installed.host_ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address for the webhook Service's Endpoints")
    admin = installed.admin
    bad = fis("bad", parallelism={"tensor": 2}, resources={"gpusPerReplica": 3})

    def refused() -> bool:  # first, the webhooks answer (in the namespace the release serves)
        try:
            admin.request("POST", f"{FIS}/namespaces/{DEMO}/inferenceservices", bad, {"dryRun": "All"})
        except KubeError as e:
            return "denied the request" in e.message
        return False

    wait_for(refused, 30, "the validating webhook to refuse in the watched namespace", interval=0.3)
    if admin.get(f"/api/v1/namespaces/{ELSEWHERE}") is None:
        admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ELSEWHERE}})
    for spec in ({"model": {"source": "hostPath:///models/smollm2"}}, {}):
        doc = fis("other", **spec)
        doc["metadata"]["namespace"] = ELSEWHERE
        created = admin.request("POST", f"{FIS}/namespaces/{ELSEWHERE}/inferenceservices", doc, {"dryRun": "All"})
        assert created["spec"]["image"] == DEFAULT_IMAGE, "this release's engine image written into another namespace"
