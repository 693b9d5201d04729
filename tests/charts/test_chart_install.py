"""charts/flotilla installed into a real 1.20 control plane with helm-python-sdk, and the operator run
under exactly the chart's ServiceAccount token, with the arguments of the chart's Deployment.

Pods never run on the test control plane (no kubelet), so the operator runs as a local process, as
it would in its pod: the chart's webhook certificate is copied out of its Secret into the directory
the pod would mount, and the webhook Service's Endpoints are written by hand to point at the
process (the apiserver dials Services' Endpoints: aggregator routing, scripts/k8s-control-plane.sh).
Everything else is the chart's: CRD, ServiceAccount, ClusterRole and binding, webhook Service and
configurations with their caBundle.

Then InferenceServices exercise every child kind the operator can make and remove, and the
apiserver's audit log says which (group, resource, verb) the ServiceAccount used: the test requires
that none was refused (the role is sufficient) and that the role grants nothing else (no wider).
"""

from __future__ import annotations

import base64
import copy
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..k8s_fixtures import REPO, Cluster, ControlPlane, free_ports, service_account_token, token_kubeconfig, wait_for
from .conftest import CHART, NAMESPACE, RELEASE, find, render_chart

pytestmark = pytest.mark.slow

DEMO = "demo"
FIS = "/apis/serving.flotilla.dev/v1alpha1"
ENGINE_IMAGE = "registry.local/flotilla-engine:mirror"
VALUES = {"operator": {"resyncSeconds": 2},
          "engine": {"image": {"repository": "registry.local/flotilla-engine", "tag": "mirror"}}}
SAMPLE = yaml.safe_load((REPO / "crds" / "samples" / "minimal.yaml").read_text())
# Granted on purpose though no request shows it: the OwnerReferencesPermissionEnforcement admission
# plugin checks it (blockOwnerDeletion) without a request of its own; proven by its own test below.
CHECKED_BY_ADMISSION = {("serving.flotilla.dev", "inferenceservices/finalizers", "update")}


def _host_ip() -> str | None:
    """A non-loopback IPv4 address of this machine (Endpoints may not point at 127.0.0.0/8)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # no packet is sent; this picks the outgoing interface
        except OSError:
            return None
        ip = s.getsockname()[0]
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def _kube(kubeconfig: Path) -> Any:
    import kubernetes

    from flotilla.operator.kube import Kube

    return Kube(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))


class Installed:
    """The release on the control plane, and the operator process running as its ServiceAccount."""

    def __init__(self, control_plane: ControlPlane, workdir: Path, values: dict[str, Any] | None = None):
        self.control_plane, self.workdir = control_plane, workdir
        self.values = VALUES if values is None else values
        self.admin = _kube(control_plane.kubeconfig)
        self.objects, _ = render_chart(self.values)
        self.service_account = find(self.objects, "ServiceAccount")["metadata"]["name"]
        self.user = f"system:serviceaccount:{NAMESPACE}:{self.service_account}"
        self.release: dict[str, Any] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.host_ip = _host_ip()

    def install(self) -> None:
        import helm_python

        with helm_python.Config(kubeconfig_path=self.control_plane.kubeconfig, namespace=NAMESPACE) as helm:
            release = helm.install(str(CHART), RELEASE, self.values, namespace=NAMESPACE, create_namespace=True,
                                   timeout=120)
        self.release = release if isinstance(release, dict) else dict(release)

    def start_operator(self) -> None:
        token = wait_for(lambda: service_account_token(self.admin, NAMESPACE, self.service_account), 30,
                         "the token controller to make the ServiceAccount's token")
        kubeconfig = token_kubeconfig(self.control_plane.kubeconfig, token, self.workdir / "operator.kubeconfig")
        self.operator = _kube(kubeconfig)
        # The certificate the pod would mount from the chart's Secret.
        deployment = self.admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{RELEASE}-operator")
        assert deployment is not None
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        secret_name = pod["volumes"][0]["secret"]["secretName"]
        secret = self.admin.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{secret_name}")
        assert secret is not None
        certs = self.workdir / "webhook-tls"
        certs.mkdir()
        for key in ("tls.crt", "tls.key"):
            (certs / key).write_bytes(base64.b64decode(secret["data"][key]))
        # The Deployment's own command line; only ports and the mounted directory are local.
        self.webhook_port, self.liveness_port = free_ports(2)
        replace = {"--webhook-port": str(self.webhook_port), "--webhook-cert-dir": str(certs),
                   "--liveness": f"http://127.0.0.1:{self.liveness_port}/healthz"}
        args = [f"{a.split('=')[0]}={replace[a.split('=')[0]]}" if a.split("=")[0] in replace else a
                for a in container["args"]]
        self.command = [sys.executable, "-m", "flotilla.cli", *container["command"][1:], *args]
        if self.host_ip:
            self.admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/endpoints", {
                "metadata": {"name": f"{RELEASE}-operator-webhook"},
                "subsets": [{"addresses": [{"ip": self.host_ip}],
                             "ports": [{"name": "webhook", "port": self.webhook_port, "protocol": "TCP"}]}]})
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update(KUBECONFIG=str(kubeconfig), PYTHONWARNINGS="ignore")
        with (self.workdir / "operator.log").open("wb") as log:
            self.proc = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        wait_for(self._alive, 60, "the operator's liveness endpoint", interval=0.2)

    def _alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log()}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def wait(self, predicate: Any, timeout: float, what: str) -> Any:
        """wait_for, with the operator's log and its refused requests in the failure message."""
        try:
            return wait_for(predicate, timeout, what, interval=0.1)
        except AssertionError as e:
            refused = sorted({f"{a['verb']} {a['requestURI']}" for a in self.audited()
                              if a.get("responseStatus", {}).get("code") == 403})
            raise AssertionError(f"{e}\nrefused: {refused}\noperator log:\n{self.log()}") from None

    def log(self) -> str:
        return "\n".join((self.workdir / "operator.log").read_text(errors="replace").splitlines()[-40:])

    def audited(self) -> list[dict[str, Any]]:
        """The ServiceAccount's resource requests in the apiserver's audit log.

        On this apiserver a watch appears when it ends.
        """
        events = []
        for event in self.control_plane.audit_events():
            if event["user"]["username"] == self.user and "objectRef" in event:
                events.append(event)
        return events


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    chart = Installed(control_plane, tmp_path_factory.mktemp("chart-install"))
    chart.install()
    chart.start_operator()
    yield chart
    chart.stop()


def fis(name: str, **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(SAMPLE)
    body["metadata"] = {"name": name, "namespace": DEMO}
    body["spec"].update(spec)
    return body


def apply(kube: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply as the user would (`kubectl apply --server-side`), with the admin token."""
    from flotilla.operator.kube import path_of

    return kube.request("PATCH", path_of(obj), obj, {"fieldManager": "user", "force": "true"},
                        "application/apply-patch+yaml")


def child(kube: Any, api_version: str, plural: str, name: str) -> dict[str, Any] | None:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return kube.get(f"{prefix}/namespaces/{DEMO}/{plural}/{name}")


def test_helm_install_creates_the_release(installed: Installed) -> None:
    release = installed.release
    assert release["name"] == RELEASE and release["namespace"] == NAMESPACE
    assert release["status"] == "deployed" and release["revision"] == 1
    assert "kubectl get fis" in release["notes"]
    admin = installed.admin
    assert admin.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.serving.flotilla.dev")
    for obj in installed.objects:
        kind, meta = obj["kind"], obj["metadata"]
        paths = {"ServiceAccount": f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{meta['name']}",
                 "Secret": f"/api/v1/namespaces/{NAMESPACE}/secrets/{meta['name']}",
                 "ConfigMap": f"/api/v1/namespaces/{NAMESPACE}/configmaps/{meta['name']}",
                 "Service": f"/api/v1/namespaces/{NAMESPACE}/services/{meta['name']}",
                 "Deployment": f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{meta['name']}",
                 "ClusterRole": f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{meta['name']}",
                 "ClusterRoleBinding": f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{meta['name']}",
                 "ValidatingWebhookConfiguration":
                     f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{meta['name']}",
                 "MutatingWebhookConfiguration":
                     f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{meta['name']}"}
        assert admin.get(paths[kind]), f"{kind} {meta['name']} was not installed"


def test_helm_upgrade_keeps_the_webhook_certificate(installed: Installed) -> None:
    """The running operator serves the certificate it started with: an upgrade must not replace it."""
    import helm_python

    path = f"/api/v1/namespaces/{NAMESPACE}/secrets/{RELEASE}-operator-webhook-tls"
    before = installed.admin.get(path)
    with helm_python.Config(kubeconfig_path=installed.control_plane.kubeconfig, namespace=NAMESPACE) as helm:
        release = helm.upgrade(str(CHART), RELEASE, VALUES, namespace=NAMESPACE, timeout=120)
    assert release["revision"] == 2 and release["status"] == "deployed"
    after = installed.admin.get(path)
    assert before is not None and after is not None and after["data"] == before["data"]


def _webhooks_answering(admin: Any) -> str:
    """Once the operator's webhooks answer through the chart's Service (the operator serves them a moment after its
    liveness endpoint): the validating webhook's refusal of a bad spec (a dry run in DEMO, which must exist)."""
    from flotilla.operator.kube import KubeError

    bad = fis("bad", parallelism={"tensor": 2}, resources={"gpusPerReplica": 3})

    def refused() -> str | None:
        try:
            admin.request("POST", f"{FIS}/namespaces/{DEMO}/inferenceservices", bad, {"dryRun": "All"})
        except KubeError as e:
            return e.message if "denied the request" in e.message else None
        return None  # admitted: with failure policy Ignore, a webhook not answering yet lets it through

    return wait_for(refused, 30, "the validating webhook to refuse through the Service", interval=0.3)


def test_webhooks_answer_through_the_chart_service(installed: Installed) -> None:
    if installed.host_ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address for the webhook Service's Endpoints")
    installed.admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": DEMO}})
    assert "resources.gpusPerReplica (3) must equal" in _webhooks_answering(installed.admin)


def test_sample_is_reconciled_under_the_chart_service_account(installed: Installed) -> None:
    admin = installed.admin
    if admin.get(f"/api/v1/namespaces/{DEMO}") is None:
        admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": DEMO}})
    if installed.host_ip is not None:
        _webhooks_answering(admin)  # else, with failure policy Ignore, the apply goes through unmutated
    created = apply(admin, fis("smollm2"))
    if installed.host_ip is not None:
        # The mutating webhooks: servedName defaulted, and the chart's engine image in place of the stock one.
        assert created["spec"]["model"]["servedName"] == "smollm2"
        assert created["spec"]["image"] == ENGINE_IMAGE
        # An image named in the spec is kept.
        custom = fis("custom", image="registry.local/custom:1")
        kept = admin.request("POST", f"{FIS}/namespaces/{DEMO}/inferenceservices", custom, {"dryRun": "All"})
        assert kept["spec"]["image"] == "registry.local/custom:1"
    deployment = installed.wait(lambda: child(admin, "apps/v1", "deployments", "smollm2"), 30, "the engine Deployment")
    assert deployment["metadata"]["ownerReferences"][0]["name"] == "smollm2"
    assert deployment["metadata"]["managedFields"][0]["manager"] == "flotilla-operator"
    installed.wait(lambda: child(admin, "v1", "services", "smollm2"), 30, "the engine Service")
    if installed.host_ip is not None:
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == ENGINE_IMAGE

    def valid() -> dict[str, Any] | None:
        status = (admin.get(f"{FIS}/namespaces/{DEMO}/inferenceservices/smollm2") or {}).get("status", {})
        conditions = {c["type"]: c for c in status.get("conditions", [])}
        return status if conditions.get("Valid", {}).get("status") == "True" else None

    status = installed.wait(valid, 30, "status Valid=True")
    assert status["url"] == f"http://smollm2.{DEMO}.svc.cluster.local:8000"


def test_children_come_and_go_under_the_chart_service_account(installed: Installed) -> None:
    """Every child kind made and removed, so every verb of the role is exercised."""
    admin = installed.admin
    hpa, pdb = ("autoscaling/v2beta2", "horizontalpodautoscalers"), ("policy/v1beta1", "poddisruptionbudgets")
    monitor, scaled = ("monitoring.coreos.com/v1", "servicemonitors"), ("keda.sh/v1alpha1", "scaledobjects")
    scaling = {"autoscaling": {"minReplicas": 2, "maxReplicas": 4}}

    def present(kind: tuple[str, str]) -> bool:
        return child(admin, *kind, "scaler") is not None

    apply(admin, fis("scaler", **scaling, monitoring={"serviceMonitor": False}))
    installed.wait(lambda: present(hpa) and present(pdb), 30, "the HPA and the PDB")

    def copied() -> bool:  # the autoscaled count (minReplicas 2) written into spec.replicas through /scale
        return ((admin.get(f"{FIS}/namespaces/{DEMO}/inferenceservices/scaler") or {}).get("spec", {})
                .get("replicas") == 2)

    # Wait for it, so that the role's inferenceservices/scale patch is used in every run (a copy refused with a 409
    # waits for the next reconcile, which the next apply could otherwise pre-empt).
    installed.wait(copied, 30, "the autoscaler's count copied into spec.replicas")
    # spec.replicas 1 with autoscaling removed (left out, it holds the autoscaler's 2, copied in through the scale
    # subresource, and the Deployment would keep them, and its PDB).
    apply(admin, fis("scaler", replicas=1, monitoring={"serviceMonitor": False}))
    installed.wait(lambda: not present(hpa) and not present(pdb), 30, "the HPA and the PDB to be deleted")

    Cluster(admin).set_optional_crds(True)
    apply(admin, fis("scaler", **scaling, monitoring={"serviceMonitor": True}))
    installed.wait(lambda: present(scaled) and present(monitor) and present(pdb), 60,
             "the ScaledObject, ServiceMonitor and PDB")
    assert not present(hpa), "KEDA makes its own HPA"
    apply(admin, fis("scaler", replicas=1, monitoring={"serviceMonitor": False}))
    installed.wait(lambda: not present(scaled) and not present(monitor) and not present(pdb), 30,
             "the ScaledObject, ServiceMonitor and PDB to be deleted")


def _granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def _used(events: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    used = set()
    for event in events:
        ref = event["objectRef"]
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, event["verb"]))
        if event["verb"] == "patch" and event.get("responseStatus", {}).get("code") == 201:
            # A server-side apply that made the object: the apiserver authorized it as create too.
            used.add((ref.get("apiGroup", ""), resource, "create"))
    return used


def test_cluster_role_is_exactly_what_the_operator_uses(installed: Installed) -> None:
    """Sufficient: no request of the ServiceAccount was refused. No wider: every grant was used."""
    role = installed.admin.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{RELEASE}-operator")
    assert role is not None
    granted = _granted(role["rules"])
    # A watch is logged when it ends: stop the operator (SIGTERM) to end them all, then give the
    # apiserver a moment to write them.
    installed.stop()
    deadline = time.monotonic() + 60
    while not granted - CHECKED_BY_ADMISSION <= _used(installed.audited()) and time.monotonic() < deadline:
        time.sleep(0.2)
    events = installed.audited()
    refused = sorted({f"{e['verb']} {e['requestURI']}" for e in events
                      if e.get("responseStatus", {}).get("code") == 403})
    assert not refused, f"the chart's ClusterRole is missing permissions for: {refused}"
    used = _used(events)
    assert used - granted == set(), "used but not granted (should have been refused)"
    unused = granted - used - CHECKED_BY_ADMISSION
    assert unused == set(), f"the ClusterRole grants more than the operator uses: {sorted(unused)}"


def test_block_owner_deletion_needs_update_on_finalizers(installed: Installed) -> None:
    """The one grant no request shows: without it, owner references with blockOwnerDeletion are refused."""
    from flotilla.operator.kube import KubeError, path_of

    admin, workdir = installed.admin, installed.workdir
    owner = admin.get(f"{FIS}/namespaces/{DEMO}/inferenceservices/smollm2")
    assert owner is not None
    role = admin.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{RELEASE}-operator")
    assert role is not None
    narrower = [r for r in role["rules"] if r["resources"] != ["inferenceservices/finalizers"]]
    assert len(narrower) == len(role["rules"]) - 1
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": "narrower"}})
    admin.request("POST", f"{rbac}/clusterroles", {"metadata": {"name": "narrower"}, "rules": narrower})
    admin.request("POST", f"{rbac}/clusterrolebindings", {
        "metadata": {"name": "narrower"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "narrower"},
        "subjects": [{"kind": "ServiceAccount", "name": "narrower", "namespace": NAMESPACE}]})
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "owned-probe", "namespace": DEMO, "ownerReferences": [{
                   "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": "smollm2",
                   "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
               "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}
    query = {"fieldManager": "flotilla-operator", "force": "true", "dryRun": "All"}

    def as_account(name: str, file: str) -> Any:
        token = wait_for(lambda: service_account_token(admin, NAMESPACE, name), 30, f"{name}'s token")
        return _kube(token_kubeconfig(installed.control_plane.kubeconfig, token, workdir / file))

    chart_account = as_account(installed.service_account, "chart.kubeconfig")
    chart_account.request("PATCH", path_of(service), service, query, "application/apply-patch+yaml")
    narrow_account = as_account("narrower", "narrower.kubeconfig")
    deadline = time.monotonic() + 60
    refusal = ""
    while "blockOwnerDeletion" not in refusal:  # a new binding reaches the authorizer within moments
        assert time.monotonic() < deadline, f"not refused for blockOwnerDeletion (last answer: {refusal or 'ok'})"
        try:
            narrow_account.request("PATCH", path_of(service), service, query, "application/apply-patch+yaml")
            refusal = ""
        except KubeError as e:
            refusal = e.message
        time.sleep(0.2)


def test_helm_upgrade_renews_a_webhook_certificate_near_expiry(installed: Installed) -> None:
    """Last in this file: the running test operator keeps the old certificate, as a pod would until restarted."""
    import helm_python

    secret_path = f"/api/v1/namespaces/{NAMESPACE}/secrets/{RELEASE}-operator-webhook-tls"
    deployment_path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{RELEASE}-operator"
    before = installed.admin.get(secret_path)
    assert before["metadata"]["annotations"]["serving.flotilla.dev/not-after"] > time.strftime("%Y-%m-%d")
    # As if the certificate were near its expiry: a renewal window longer than its whole validity.
    values = copy.deepcopy(VALUES)
    values["webhook"] = {"tls": {"renewBeforeDays": 3651, "validityDays": 3000}}
    pod_before = installed.admin.get(deployment_path)["spec"]["template"]["metadata"]["annotations"]
    upgrading = time.time()
    with helm_python.Config(kubeconfig_path=installed.control_plane.kubeconfig, namespace=NAMESPACE) as helm:
        helm.upgrade(str(CHART), RELEASE, values, namespace=NAMESPACE, timeout=120)
    upgraded = time.time()
    after = installed.admin.get(secret_path)
    assert after["data"]["tls.crt"] != before["data"]["tls.crt"] and after["data"]["ca.crt"] != before["data"]["ca.crt"]
    not_after = after["metadata"]["annotations"]["serving.flotilla.dev/not-after"]
    # The chart dates it (Sprig's `date`, local time) somewhere in the upgrade: either day if midnight fell in it.
    assert not_after in {time.strftime("%Y-%m-%d", time.localtime(t + 3000 * 86400)) for t in (upgrading, upgraded)}
    pod = installed.admin.get(deployment_path)["spec"]["template"]["metadata"]
    # The pod template changes with the certificate, so the Deployment rolls the operator onto it.
    assert pod_before["serving.flotilla.dev/webhook-certificate"] == before["metadata"]["annotations"][
        "serving.flotilla.dev/not-after"]
    assert pod["annotations"]["serving.flotilla.dev/webhook-certificate"] == not_after
    bundles = {h["clientConfig"]["caBundle"] for h in installed.admin.get(
        f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{RELEASE}.serving.flotilla.dev")[
        "webhooks"]}
    assert bundles == {after["data"]["ca.crt"]}
