"""The operator on a real control plane: children, owner references, status, drift, garbage collection.

The operator runs as a subprocess (`python -m flotilla.cli operator`, conftest.py). Pods never run
here (no scheduler, no kubelet): readiness is simulated by patching the engine pods' status
subresource (Ready condition), from which the real ReplicaSet and Deployment controllers compute
`readyReplicas`, as they would for pods a kubelet reports ready. (Patching the Deployment's own
status would be overwritten by the Deployment controller within milliseconds.)
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from flotilla.operator.autoscaling import AUTOSCALED_REPLICAS_MANAGER
from flotilla.operator.deployment import build_deployment
from flotilla.operator.kube import FIELD_MANAGER, Kube, KubeError, object_path
from flotilla.operator.reconciler import ADOPTION_ATTEMPTS, ChildrenBlocked, Reconciler
from flotilla.operator.spec import InferenceServiceSpec

from .conftest import ENGINE_IMAGE, FIS_PATH, wait_for

REPO = Path(__file__).resolve().parents[2]
LLAMA = yaml.safe_load((REPO / "crds" / "samples" / "llama-3.1-8b-h200.yaml").read_text())
KINDS = {  # on this 1.20 apiserver: HPA v2beta2 and PDB v1beta1
    "Deployment": "apps/v1", "Service": "v1", "HorizontalPodAutoscaler": "autoscaling/v2beta2",
    "PodDisruptionBudget": "policy/v1beta1", "ServiceMonitor": "monitoring.coreos.com/v1",
    "ScaledObject": "keda.sh/v1alpha1",
}


def fis(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """The Llama sample under another name, with spec fields replaced."""
    doc = copy.deepcopy(LLAMA)
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"].update(spec)
    doc["spec"] = {k: v for k, v in doc["spec"].items() if v is not None}
    return doc


def fixed(name: str, namespace: str, replicas: int = 2) -> dict[str, Any]:
    """A non-autoscaled InferenceService with `replicas` replicas."""
    return fis(name, namespace, autoscaling=None, replicas=replicas)


def child_path(kind: str, namespace: str, name: str) -> str:
    return object_path(KINDS[kind], kind, namespace, name)


def fis_path(namespace: str, name: str) -> str:
    return f"{FIS_PATH}/namespaces/{namespace}/inferenceservices/{name}"


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def wait_children(cluster, namespace: str, name: str, kinds: list[str], timeout: float = 60) -> dict[str, Any]:
    def present():
        objs = {kind: cluster.kube.get(child_path(kind, namespace, name)) for kind in kinds}
        return objs if all(objs.values()) else None

    return wait_for(present, timeout, f"{kinds} of {namespace}/{name}")


def set_pods_ready(cluster, namespace: str, name: str, ready: bool, count: int) -> None:
    """Mark the engine pods Ready (or not) through the pods' status subresource."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    selector = {"labelSelector": f"serving.flotilla.dev/inferenceservice={name}"}
    pods = wait_for(lambda: (items := cluster.kube.request("GET", path, query=selector)["items"])
                    and len(items) >= count and items, 30, f"{count} pods of {name}")
    value = "True" if ready else "False"
    for pod in pods:
        status = {"phase": "Running", "conditions": [
            {"type": t, "status": value, "lastTransitionTime": "2026-01-01T00:00:00Z"}
            for t in ("Initialized", "ContainersReady", "Ready", "PodScheduled")]}
        cluster.kube.patch_status(f"{path}/{pod['metadata']['name']}", status)


@pytest.fixture
def op(operator_process, cluster):
    return cluster


def test_children_and_owner_references_without_prometheus_operator_or_keda(op, namespace):
    op.set_optional_crds(False)
    op.apply(fis("llama", namespace))
    objs = wait_children(op, namespace, "llama", ["Deployment", "Service", "HorizontalPodAutoscaler",
                                                  "PodDisruptionBudget"])
    owner = op.kube.get(fis_path(namespace, "llama"))
    for kind, obj in objs.items():
        assert obj["metadata"]["ownerReferences"] == [{
            "apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService", "name": "llama",
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}], kind
        assert obj["metadata"]["labels"]["serving.flotilla.dev/inferenceservice"] == "llama"
    built = build_deployment(InferenceServiceSpec.model_validate(owner["spec"]), "llama", namespace)
    live = objs["Deployment"]["spec"]
    container = built["spec"]["template"]["spec"]["containers"][0]
    assert live["template"]["spec"]["containers"][0]["args"] == container["args"]
    assert live["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"}, "requests": {"cpu": "8", "memory": "64Gi"}}
    assert "replicas" not in built["spec"]  # the HPA owns the replica count
    assert objs["Service"]["spec"]["ports"][0]["port"] == 8000
    hpa = objs["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 8)
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "vllm:num_requests_waiting"
    assert objs["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    status = wait_for(lambda: (op.kube.get(fis_path(namespace, "llama")).get("status") or {}).get("autoscaler")
                      and op.kube.get(fis_path(namespace, "llama"))["status"], 30, "status")
    assert status["autoscaler"] == "HPA (autoscaling/v2beta2)"
    assert status["monitoring"] == "no ServiceMonitor: monitoring.coreos.com/v1 is not installed"


def test_servicemonitor_and_keda_scaledobject_when_their_crds_exist(op, namespace):
    op.set_optional_crds(True)
    op.apply(fis("llama", namespace))
    objs = wait_children(op, namespace, "llama", ["Deployment", "Service", "ServiceMonitor", "ScaledObject",
                                                  "PodDisruptionBudget"])
    assert objs["ServiceMonitor"]["spec"]["targetLabels"] == ["serving.flotilla.dev/inferenceservice"]
    assert objs["ServiceMonitor"]["metadata"]["labels"]["release"] == "prometheus"
    assert objs["ScaledObject"]["spec"]["triggers"][0]["metadata"]["query"] == \
        f'sum(vllm:num_requests_waiting{{namespace="{namespace}",serving_flotilla_dev_inferenceservice="llama"}})'
    assert all(o["metadata"]["ownerReferences"][0]["name"] == "llama" for o in objs.values())
    status = wait_for(lambda: (op.kube.get(fis_path(namespace, "llama")).get("status") or {}).get("autoscaler"),
                      30, "status")
    assert status == "KEDA ScaledObject (keda.sh/v1alpha1)"
    # KEDA makes its own HPA from the ScaledObject: the operator makes none.
    assert op.kube.get(child_path("HorizontalPodAutoscaler", namespace, "llama")) is None
    assert op.kube.get(fis_path(namespace, "llama"))["status"]["monitoring"] == "ServiceMonitor"


def test_status_conditions_and_printer_columns(op, namespace):
    op.apply(fixed("llama", namespace))
    wait_children(op, namespace, "llama", ["Deployment", "Service", "PodDisruptionBudget"])
    body = wait_for(lambda: (b := op.kube.get(fis_path(namespace, "llama"))).get("status", {}).get("replicas") == 2
                    and b, 20, "status.replicas 2")
    status = body["status"]
    assert status["phase"] == "Progressing"
    assert status["observedGeneration"] == body["metadata"]["generation"]
    assert status["url"] == f"http://llama.{namespace}.svc.cluster.local:8000"
    assert status["selector"] == "serving.flotilla.dev/inferenceservice=llama"
    assert status["fit"]["verdict"] == "Fits" and status["fit"]["weightBytes"] > 15e9
    assert {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]} == {
        "Valid": ("True", "SpecAccepted"), "FitChecked": ("True", "Fits"), "Progressing": ("True", "RollingOut"),
        "Ready": ("False", "ReplicasNotReady"), "Degraded": ("False", "AsExpected")}
    assert all(c["observedGeneration"] == body["metadata"]["generation"] for c in status["conditions"])
    table = op.kube.request("GET", fis_path(namespace, "llama"), None, None)  # plain JSON first
    assert table["kind"] == "InferenceService"
    table = op.kube.api.call_api(*op.kube.api.param_serialize(
        "GET", fis_path(namespace, "llama"), header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"]))
    table.read()
    import json

    doc = json.loads(table.data)
    columns = [c["name"] for c in doc["columnDefinitions"]]
    assert columns == ["Name", "Ready", "Reason", "Replicas", "Model", "GPUs", "Queue", "KV %", "Tok/s", "TTFT-P95",
                       "URL", "Age"]
    # No engine pod runs here, so there are no serving figures yet: those cells are empty.
    assert doc["rows"][0]["cells"][:11] == ["llama", "False", "ReplicasNotReady", 0, "llama-8b", 2, None, None, None,
                                            None, f"http://llama.{namespace}.svc.cluster.local:8000"]
    # Events are posted through kopf's queue, a moment after the writes they tell of.
    wait_for(lambda: {"Created", "SpecAccepted", "Fits"} <= {
        e["reason"] for e in op.kube.list(f"/api/v1/namespaces/{namespace}/events")
        if e["involvedObject"]["name"] == "llama"}, 30, "the Created, SpecAccepted and Fits Events")


def test_simulated_readiness_turns_ready_true_and_back(op, namespace):
    op.apply(fixed("llama", namespace))
    wait_children(op, namespace, "llama", ["Deployment"])

    def fis_status():
        return op.kube.get(fis_path(namespace, "llama")).get("status") or {}

    set_pods_ready(op, namespace, "llama", True, 2)
    wait_for(lambda: condition({"status": fis_status()}, "Ready").get("status") == "True", 60, "Ready=True")
    status = fis_status()
    assert (status["phase"], status["readyReplicas"]) == ("Ready", 2)
    assert condition({"status": status}, "Progressing")["reason"] == "RolloutComplete"

    set_pods_ready(op, namespace, "llama", False, 2)
    wait_for(lambda: condition({"status": fis_status()}, "Ready").get("status") == "False", 60, "Ready=False")
    wait_for(lambda: fis_status()["phase"] == "Degraded", 60, "phase Degraded")
    assert condition({"status": fis_status()}, "Degraded")["reason"] == "ReplicasUnavailable"


def test_scaled_to_zero_by_hand_reads_scaled_to_zero_not_progressing(op, namespace):
    """`kubectl scale fis --replicas 0` (the scale subresource): once no pod is left, phase ScaledToZero, Ready and
    Progressing False for that reason, and a Normal Event (the user's decision, not bad news). It read Progressing
    for ever."""
    op.apply(fixed("llama", namespace, replicas=1))
    wait_children(op, namespace, "llama", ["Deployment"])
    set_pods_ready(op, namespace, "llama", True, 1)

    def fis_status():
        return op.kube.get(fis_path(namespace, "llama")).get("status") or {}

    wait_for(lambda: fis_status().get("phase") == "Ready", 60, "phase Ready")
    op.kube.request("PATCH", f"{fis_path(namespace, 'llama')}/scale", {"spec": {"replicas": 0}}, None,
                    "application/merge-patch+json")
    status = wait_for(lambda: (s := fis_status()).get("phase") == "ScaledToZero" and s, 30, "phase ScaledToZero")
    assert (status["replicas"], status["readyReplicas"]) == (0, 0)
    seen = {t: (condition({"status": status}, t)["status"], condition({"status": status}, t)["reason"])
            for t in ("Progressing", "Ready", "Degraded")}
    assert seen == {"Progressing": ("False", "ScaledToZero"), "Ready": ("False", "ScaledToZero"),
                    "Degraded": ("False", "AsExpected")}
    events = wait_for(lambda: [e for e in op.kube.list(f"/api/v1/namespaces/{namespace}/events")
                               if e["involvedObject"]["name"] == "llama" and e["reason"] == "ScaledToZero"],
                      30, "the ScaledToZero Event")
    assert {e["type"] for e in events} == {"Normal"}

    op.kube.request("PATCH", f"{fis_path(namespace, 'llama')}/scale", {"spec": {"replicas": 1}}, None,
                    "application/merge-patch+json")
    wait_for(lambda: fis_status().get("phase") == "Progressing", 60, "phase Progressing on the way back")
    set_pods_ready(op, namespace, "llama", True, 1)
    wait_for(lambda: fis_status().get("phase") == "Ready", 60, "phase Ready again")


def _scale(op, namespace: str, name: str, replicas: int) -> None:
    """`kubectl scale fis NAME --replicas N`: the CRD's scale subresource."""
    op.kube.request("PATCH", f"{fis_path(namespace, name)}/scale", {"spec": {"replicas": replicas}}, None,
                    "application/merge-patch+json")


def collection(kind: str, namespace: str) -> str:
    return child_path(kind, namespace, "x").rsplit("/", 1)[0]


def changes_since(op, kind: str, namespace: str, resource_version: str) -> list[dict[str, Any]]:
    """The watch events of `kind` in `namespace` after `resource_version`, replayed by a watch that starts there and
    ends a second later (each event's object carries the resourceVersion of that write; a DELETED one, the
    deletion's)."""
    query = {"watch": "1", "resourceVersion": resource_version, "timeoutSeconds": "1"}
    serialized = op.kube.api.param_serialize("GET", collection(kind, namespace), query_params=list(query.items()),
                                             header_params={"Accept": "application/json"},
                                             auth_settings=["BearerToken"])
    response = op.kube.api.call_api(*serialized, _request_timeout=30)
    response.read()
    return [json.loads(line) for line in response.data.decode().splitlines() if line.strip()]


def first_change(op, kind: str, namespace: str, resource_version: str, match: Any) -> dict[str, Any]:
    """The first object of the watch events of `kind` after `resource_version` that `match(event)` accepts, watched
    again until one is there: the apiserver serves such a watch from its watch cache, which may lag the write that the
    caller has already read back (etcd) by more than the one-second watch on a loaded machine."""
    return wait_for(lambda: next((e["object"] for e in changes_since(op, kind, namespace, resource_version)
                                  if match(e)), None), 30, f"the {kind} change in its watch")


def revision(obj: dict[str, Any]) -> int:
    # A resourceVersion is opaque to clients, but on this etcd-backed apiserver it is the etcd revision of the
    # write, one counter for every kind: the order of writes across kinds.
    return int(obj["metadata"]["resourceVersion"])


@pytest.mark.parametrize(("keda", "autoscaler", "status_autoscaler"), [
    (False, "HorizontalPodAutoscaler", "HPA (autoscaling/v2beta2)"),
    (True, "ScaledObject", "KEDA ScaledObject (keda.sh/v1alpha1)"),
])
def test_scaling_an_autoscaled_inferenceservice_to_zero_suspends_the_autoscaler_until_scaled_up(
        op, namespace, keda, autoscaler, status_autoscaler):
    """`kubectl scale fis --replicas 0` with autoscaling set did nothing visible (the autoscaler owned the replicas
    and spec.replicas was ignored). Now the HPA or KEDA ScaledObject is removed (KEDA would scale back to
    minReplicas), the Deployment goes to 0, status says the autoscaler is suspended; scaling to 1 or more brings the
    autoscaler back and restarts the Deployment at minReplicas (an HPA does not act on a target at 0). A replica
    count past maxReplicas is a warning in Valid."""
    op.set_optional_crds(keda)
    op.apply(fis("auto", namespace, replicas=1, autoscaling={"minReplicas": 2, "maxReplicas": 4, "target": 4}))
    deployment_path = child_path("Deployment", namespace, "auto")
    created = wait_children(op, namespace, "auto", ["Deployment", autoscaler])["Deployment"]
    # Created at minReplicas, not the apiserver's default of 1 until the HPA's first sync; the next reconcile (the
    # resync, every 5 s here) hands the field over and it stays at 2.
    assert created["spec"]["replicas"] == 2

    def replicas_managers() -> set[str]:
        return {f["manager"] for f in op.kube.get(deployment_path)["metadata"]["managedFields"]
                if "f:replicas" in (f.get("fieldsV1") or {}).get("f:spec", {})}

    wait_for(lambda: "flotilla-operator" not in replicas_managers(), 20, "the replicas handed over")
    assert op.kube.get(deployment_path)["spec"]["replicas"] == 2
    # Handing the field over changes no spec: no "Updated" Event (kopf posts Events a moment after the write).
    time.sleep(2)
    assert not [e for e in op.kube.list(f"/api/v1/namespaces/{namespace}/events")
                if e["involvedObject"]["name"] == "auto" and e["reason"] == "Updated"]

    def fis_status():
        return op.kube.get(fis_path(namespace, "auto")).get("status") or {}

    since = {kind: op.kube.request("GET", collection(kind, namespace))["metadata"]["resourceVersion"]
             for kind in ("Deployment", autoscaler)}
    _scale(op, namespace, "auto", 0)
    wait_for(lambda: op.kube.get(child_path(autoscaler, namespace, "auto")) is None, 20, f"the {autoscaler} removed")
    wait_for(lambda: op.kube.get(deployment_path)["spec"]["replicas"] == 0, 20, "the Deployment at 0")
    # The autoscaler goes first: while it exists, KEDA (minReplicaCount >= 1) would scale a Deployment at 0 back up.
    deleted = first_change(op, autoscaler, namespace, since[autoscaler],
                           lambda e: e["type"] == "DELETED" and e["object"]["metadata"]["name"] == "auto")
    at_zero = first_change(op, "Deployment", namespace, since["Deployment"],
                           lambda e: e["object"]["metadata"]["name"] == "auto" and e["object"]["spec"]["replicas"] == 0)
    assert revision(deleted) < revision(at_zero), "the Deployment went to 0 while its autoscaler existed"
    status = wait_for(lambda: (s := fis_status()).get("phase") == "ScaledToZero" and s, 30, "phase ScaledToZero")
    assert status["autoscaler"].startswith("suspended: spec.replicas is 0")
    assert condition({"status": status}, "Ready")["message"].endswith("autoscaling is suspended until it is 1 or more")
    wait_for(lambda: [e for e in op.kube.list(f"/api/v1/namespaces/{namespace}/events")
                      if e["involvedObject"]["name"] == "auto" and e["reason"] == "Deleted"
                      and autoscaler in e["message"]], 30, "the Event of the autoscaler's removal")

    _scale(op, namespace, "auto", 1)
    wait_children(op, namespace, "auto", [autoscaler])
    wait_for(lambda: op.kube.get(deployment_path)["spec"]["replicas"] == 2, 20, "the Deployment back at minReplicas")
    wait_for(lambda: fis_status()["autoscaler"] == status_autoscaler, 20, "status.autoscaler back")
    # The autoscaler owns the replicas again: the operator applies none.
    assert "flotilla-operator" not in replicas_managers()

    # A count set by hand changes nothing (the webhook warns: test_admission.py); the autoscaler's is copied over it.
    _scale(op, namespace, "auto", 9)
    wait_for(lambda: op.kube.get(fis_path(namespace, "auto"))["spec"]["replicas"] == 2, 20,
             "the autoscaler's count copied over the hand-set 9")
    assert op.kube.get(deployment_path)["spec"]["replicas"] == 2


def test_spec_update_rolls_the_deployment_under_the_same_name(op, namespace):
    op.apply(fixed("llama", namespace))
    before = wait_children(op, namespace, "llama", ["Deployment"])["Deployment"]
    assert "--max-num-seqs" in (args := before["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args[args.index("--max-num-seqs") + 1] == "64"
    changed = fixed("llama", namespace)
    changed["spec"]["scheduling"] = {**changed["spec"]["scheduling"], "maxNumSeqs": 32}
    op.apply(changed)

    def rolled():
        d = op.kube.get(child_path("Deployment", namespace, "llama"))
        a = d["spec"]["template"]["spec"]["containers"][0]["args"]
        return d if a[a.index("--max-num-seqs") + 1] == "32" else None

    after = wait_for(rolled, 60, "the new args")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    body = op.kube.get(fis_path(namespace, "llama"))
    wait_for(lambda: op.kube.get(fis_path(namespace, "llama"))["status"]["observedGeneration"]
             == body["metadata"]["generation"], 30, "observedGeneration")
    # The Deployment controller starts a new ReplicaSet for the new pod template (a rollout).
    wait_for(lambda: len(op.kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/replicasets")["items"]) == 2,
             20, "a second ReplicaSet")


def test_children_no_longer_wanted_are_removed(op, namespace):
    op.apply(fixed("llama", namespace, replicas=2))
    wait_children(op, namespace, "llama", ["PodDisruptionBudget"])
    op.apply(fixed("llama", namespace, replicas=1))  # one replica: a PDB would block drains
    wait_for(lambda: op.kube.get(child_path("PodDisruptionBudget", namespace, "llama")) is None, 60, "PDB removed")


def test_hand_deleted_and_hand_edited_children_are_put_back(op, namespace):
    op.apply(fixed("llama", namespace))
    objs = wait_children(op, namespace, "llama", ["Deployment", "Service", "PodDisruptionBudget"])
    for kind in ("Service", "PodDisruptionBudget", "Deployment"):
        op.kube.delete(child_path(kind, namespace, "llama"))
        back = wait_for(lambda k=kind: (o := op.kube.get(child_path(k, namespace, "llama")))
                        and o["metadata"]["uid"] != objs[k]["metadata"]["uid"] and o, 30, f"{kind} back")
        assert back["metadata"]["ownerReferences"][0]["name"] == "llama"
    # Hand edits, as `kubectl edit`/`kubectl scale` would make them.
    path = child_path("Deployment", namespace, "llama")
    op.kube.request("PATCH", path, {"spec": {"replicas": 5, "template": {"spec": {"containers": [
        {"name": "engine", "image": "evil:latest"}]}}}}, content_type="application/strategic-merge-patch+json")
    wait_for(lambda: (d := op.kube.get(path))["spec"]["replicas"] == 2
             and d["spec"]["template"]["spec"]["containers"][0]["image"] == LLAMA["spec"].get(
                 "image", ENGINE_IMAGE), 30, "the Deployment restored")
    # Server-side apply takes back every field the operator sets; fields it does not set (an extra
    # port added by hand under another key) are left to whoever added them.
    svc = child_path("Service", namespace, "llama")
    op.kube.request("PATCH", svc, {"spec": {"selector": {"serving.flotilla.dev/inferenceservice": "other"}}},
                    content_type="application/merge-patch+json")
    wait_for(lambda: op.kube.get(svc)["spec"]["selector"] == {"serving.flotilla.dev/inferenceservice": "llama"},
             30, "the Service restored")


def test_hand_edits_that_loosen_the_pods_sandbox_are_put_back(op, namespace):
    """The pod fields that keep an engine pod off the node's namespaces and out of root are the operator's: a hand
    edit (someone with Deployment rights, a careless `kubectl edit`) is reverted like any other field it sets,
    even where the field's value is the API's default, which server-side apply would not otherwise own."""
    op.apply(fis("sandboxed", namespace, autoscaling=None, model={"source": "hf://org/name"}))
    path = child_path("Deployment", namespace, "sandboxed")
    live = wait_children(op, namespace, "sandboxed", ["Deployment"])["Deployment"]["spec"]["template"]["spec"]
    # The download runs the InferenceService author's image without a GPU request: the NVIDIA container toolkit is told
    # no GPUs, or it would follow the image's NVIDIA_VISIBLE_DEVICES (all, on a CUDA base image).
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in live["initContainers"][0]["env"]
    # (privileged: true is refused by this apiserver's --allow-privileged=false, and beside allowPrivilegeEscalation
    # false, which the operator sets: it cannot be tried here.)
    loose = {"runAsNonRoot": False, "runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}
    op.kube.request("PATCH", path, {"spec": {"template": {"spec": {
        "hostNetwork": True, "hostPID": True, "hostIPC": True,
        "containers": [{"name": "engine", "securityContext": loose}],
        "initContainers": [{"name": "download-model", "securityContext": loose}]}}}},
        content_type="application/strategic-merge-patch+json")

    def sandboxed() -> bool:
        pod = op.kube.get(path)["spec"]["template"]["spec"]
        if any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
            return False
        return all(not c["securityContext"].get("privileged") and c["securityContext"].get("runAsNonRoot") is not False
                   and c["securityContext"].get("seccompProfile", {}).get("type") != "Unconfined"
                   for c in pod["containers"] + pod["initContainers"])

    wait_for(sandboxed, 60, "the pod's sandbox restored")
    # And the repair is no churn: a resync (every 5 s here) that finds nothing to change writes nothing.
    def operators_write() -> list[Any]:  # the controller manager writes the status on its own: not compared
        return [f for f in op.kube.get(path)["metadata"]["managedFields"] if f["manager"] == "flotilla-operator"]

    written = operators_write()
    time.sleep(6)
    assert operators_write() == written


@pytest.mark.parametrize(("obstacle", "change", "fragment"), [
    # A namespace's LimitRange below the engine's memory request: every pod the ReplicaSet makes is refused.
    ({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "small"},
      "spec": {"limits": [{"type": "Container", "max": {"memory": "1Gi"}}]}},
     {}, "maximum memory usage per Container is 1Gi"),
    # A priority class that does not exist (a typo): the Priority admission plugin refuses every pod.
    (None, {"pod": {"priorityClassName": "no-such-class"}}, "no PriorityClass with name no-such-class was found"),
], ids=["limit-range", "missing-priority-class"])
def test_pods_the_apiserver_refuses_reach_status_and_an_event(op, namespace, obstacle, change, fragment):
    """The Deployment is admitted but its ReplicaSet can make no pod (a quota, a LimitRange, a missing priority
    class or ServiceAccount): the reason is on the ReplicaSet alone, so status must carry it, or the user sees
    "0 of 1 ready" forever and never learns why."""
    if obstacle is not None:
        op.kube.request("POST", f"/api/v1/namespaces/{namespace}/limitranges", obstacle)
    op.apply(fis("refused", namespace, autoscaling=None, replicas=1, **change))
    body = wait_for(lambda: (b := op.kube.get(fis_path(namespace, "refused"))) and
                    fragment in condition(b, "Degraded").get("message", "") and b, 30, "the refusal in status")
    assert condition(body, "Degraded")["reason"] == "PodsRefused" and body["status"]["phase"] == "Degraded"
    assert condition(body, "Progressing")["status"] == "False"
    wait_for(lambda: [e for e in op.kube.list(f"/api/v1/namespaces/{namespace}/events")
                      if e["involvedObject"]["name"] == "refused" and e["reason"] == "PodsRefused"
                      and e["type"] == "Warning" and fragment in e["message"]], 30, "a PodsRefused Event")


def test_a_rollout_past_its_progress_deadline_reaches_status_and_an_event(op, namespace):
    """Pods that stay Pending (no GPU free, no node matching) or never get ready: the Deployment controller marks the
    rollout ProgressDeadlineExceeded once spec.rollout.progressDeadlineSeconds pass without progress (here no
    scheduler runs, so the pods stay Pending). Status said "RollingOut" forever; KServe users expect a condition
    saying the rollout is stuck."""
    op.apply(fis("stuck", namespace, autoscaling=None, replicas=1, rollout={"progressDeadlineSeconds": 1}))
    deployment = wait_children(op, namespace, "stuck", ["Deployment"])["Deployment"]
    assert deployment["spec"]["progressDeadlineSeconds"] == 1
    body = wait_for(lambda: (b := op.kube.get(fis_path(namespace, "stuck"))) and
                    condition(b, "Progressing").get("reason") == "ProgressDeadlineExceeded" and b, 30,
                    "ProgressDeadlineExceeded in status")
    assert condition(body, "Progressing")["status"] == "False"
    degraded = condition(body, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ProgressDeadlineExceeded"
    assert "0 of 1 replicas ready" in degraded["message"] and "1s" in degraded["message"], degraded["message"]
    assert body["status"]["phase"] == "Degraded"
    wait_for(lambda: [e for e in op.kube.list(f"/api/v1/namespaces/{namespace}/events")
                      if e["involvedObject"]["name"] == "stuck" and e["reason"] == "ProgressDeadlineExceeded"
                      and e["type"] == "Warning"], 30, "a ProgressDeadlineExceeded Event")


def test_turning_autoscaling_on_keeps_the_replicas_that_serve(op, namespace):
    """spec.replicas 3, then autoscaling (minReplicas 3): the Deployment is applied without `replicas`, so that the
    autoscaler owns it. Server-side apply removes a field its only manager stops applying, and the apiserver
    defaulted it to 1: two of three serving replicas were deleted until the HPA scaled back up. (An HPA or a KEDA
    ScaledObject, whichever optional CRDs an earlier test left installed: the Deployment is applied alike.)"""
    op.apply(fis("grows", namespace, autoscaling=None, replicas=3))
    path = child_path("Deployment", namespace, "grows")
    wait_for(lambda: (d := op.kube.get(path)) and d["spec"]["replicas"] == 3, 60, "3 replicas")
    op.apply(fis("grows", namespace, replicas=3, autoscaling={"minReplicas": 3, "maxReplicas": 5, "target": 4}))
    generation = op.kube.get(fis_path(namespace, "grows"))["metadata"]["generation"]
    wait_for(lambda: (op.kube.get(fis_path(namespace, "grows")).get("status") or {}).get("observedGeneration")
             == generation,
             20, "the autoscaled spec reconciled")
    deployment = op.kube.get(path)
    assert deployment["spec"]["replicas"] == 3
    # The Deployment controller makes and scales the ReplicaSet on its own time: read it once that controller has
    # acted on the Deployment as it is now.
    wait_for(lambda: (op.kube.get(path).get("status") or {}).get("observedGeneration", 0)
             >= deployment["metadata"]["generation"], 30, "the Deployment controller to catch up")
    replica_sets = op.kube.list(f"/apis/apps/v1/namespaces/{namespace}/replicasets")
    assert [rs["spec"]["replicas"] for rs in replica_sets if rs["metadata"]["name"].startswith("grows-")] == [3]


def _deployment_scaled_by_the_autoscaler(op, namespace: str, name: str, replicas: int) -> dict[str, Any]:
    """Once the operator has handed the Deployment's replicas over (only then is the count the autoscaler's: a
    reconcile still under way could otherwise hand over the count it read before), scale it to `replicas` through its
    scale subresource, as the HPA controller does (this control plane runs none); returns the Deployment."""
    path = child_path("Deployment", namespace, name)

    def operator_applies_replicas() -> bool:
        return any(e["manager"] == "flotilla-operator" and "f:replicas" in (e.get("fieldsV1") or {}).get("f:spec", {})
                   for e in op.kube.get(path)["metadata"]["managedFields"])

    wait_for(lambda: not operator_applies_replicas(), 30, "replicas handed over to the autoscaler")
    scaled = op.kube.request("PATCH", f"{path}/scale", {"spec": {"replicas": replicas}}, None,
                             "application/merge-patch+json")
    assert scaled["spec"].get("replicas", 0) == replicas  # a Scale's 0 is left out of the JSON (omitempty)
    return op.kube.get(path)


def test_removing_autoscaling_keeps_the_autoscalers_count_which_spec_replicas_holds(op, namespace):
    """While autoscaling is on, the operator copies the autoscaler's count into spec.replicas (through the scale
    subresource, as an HPA aimed at the InferenceService would), so removing autoscaling keeps it: the Deployment stays
    at that count (as deleting an HPA leaves its Deployment alone), with a ReplicasKept Event. Before, spec.replicas
    kept its default of 1 and the Deployment dropped to 1 at once. Scaled afterwards, spec.replicas decides."""
    # An HPA, which this control plane's controller leaves alone with no metrics API.
    op.set_optional_crds(False)
    autoscaling = {"minReplicas": 2, "maxReplicas": 6, "target": 4}
    op.apply(fis("kept", namespace, replicas=None, autoscaling=autoscaling))  # spec.replicas left out, as advised
    wait_children(op, namespace, "kept", ["Deployment", "HorizontalPodAutoscaler"])
    path = child_path("Deployment", namespace, "kept")
    generation = _deployment_scaled_by_the_autoscaler(op, namespace, "kept", 4)["metadata"]["generation"]
    wait_for(lambda: op.kube.get(fis_path(namespace, "kept"))["spec"]["replicas"] == 4, 30,
             "the autoscaler's count copied into spec.replicas")
    op.apply(fis("kept", namespace, replicas=None, autoscaling=None))
    observed = op.kube.get(fis_path(namespace, "kept"))["metadata"]["generation"]
    wait_for(lambda: (op.kube.get(fis_path(namespace, "kept")).get("status") or {}).get("observedGeneration")
             == observed and op.kube.get(child_path("HorizontalPodAutoscaler", namespace, "kept")) is None,
             30, "autoscaling removed")
    deployment = op.kube.get(path)
    assert deployment["spec"]["replicas"] == 4, deployment["metadata"]["managedFields"]
    # Not even for a moment at 1: the Deployment's spec never changed (a drop and a return would count 2 generations).
    assert deployment["metadata"]["generation"] == generation
    events = wait_for(lambda: [e for e in op.kube.list(f"/api/v1/namespaces/{namespace}/events")
                               if e["involvedObject"]["name"] == "kept" and e["reason"] == "ReplicasKept"], 30,
                      "a ReplicasKept Event")
    assert "keeps its 4 replicas" in events[0]["message"] and events[0]["type"] == "Normal"
    assert op.kube.get(child_path("PodDisruptionBudget", namespace, "kept")) is not None  # 4 replicas: one kept
    _scale(op, namespace, "kept", 2)
    wait_for(lambda: op.kube.get(path)["spec"]["replicas"] == 2, 30, "spec.replicas 2 applied")


class _WrittenBeforeScaleCopies(Kube):
    """The real API server, where someone else writes the InferenceService right before each of the reconciler's
    copies of the autoscaled count through /scale (one write from `before` per copy, while any are left)."""

    def __init__(self, api: Any, before: list[Any]):
        super().__init__(api)
        self.before = before

    def request(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
                content_type: str | None = None) -> dict[str, Any]:
        if method == "PATCH" and path.endswith("/scale") and (query or {}).get("fieldManager") == \
                AUTOSCALED_REPLICAS_MANAGER and self.before:
            self.before.pop(0)()
        return super().request(method, path, body, query, content_type)


def test_a_status_write_before_the_autoscaled_count_is_copied_is_retried_in_the_same_reconcile(
        operator_process, op, namespace):
    """The serving reader patches status.serving every few seconds. One that lands between a reconcile's status patch
    and its copy of the autoscaler's count through /scale failed the copy's resourceVersion precondition (409), and the
    count waited a whole reconcile. The copy is now retried once on a fresh read, with its resourceVersion as the
    precondition again: a second write in between still defers it, and a spec changed meanwhile (the generation moved:
    `kubectl scale`) is still not written over."""
    operator_process.stop()  # this test's reconcilers are the only writers (the next test's fixture starts it again)
    op.set_optional_crds(False)  # an HPA, which this control plane's controller leaves alone with no metrics API
    op.apply(fis("busy", namespace, replicas=None, autoscaling={"minReplicas": 2, "maxReplicas": 6, "target": 4}))
    path = fis_path(namespace, "busy")
    events: list[tuple[str, str]] = []
    for _ in range(2):  # created at minReplicas, then the Deployment's replicas handed over to the autoscaler
        _quiet_reconciler(Kube(op.kube.api), events).reconcile(namespace, "busy")
    assert op.kube.get(path)["spec"]["replicas"] == 2  # minReplicas, copied

    def serving_written(running: int) -> Any:
        block = {"running": running, "waiting": 0, "windowSeconds": 60, "observedAt": "2026-12-05T20:00:00Z",
                 "scraped": 1}
        return lambda: op.kube.patch_status(path, {"serving": block})

    def reconcile_with(*before: Any) -> list[Any]:
        left = list(before)
        _quiet_reconciler(_WrittenBeforeScaleCopies(op.kube.api, left), events).reconcile(namespace, "busy")
        return left

    # One status write in between: copied within the same reconcile, the reader's status.serving kept.
    _deployment_scaled_by_the_autoscaler(op, namespace, "busy", 4)
    assert reconcile_with(serving_written(1)) == []
    body = op.kube.get(path)
    assert body["spec"]["replicas"] == 4
    assert body["status"]["serving"]["running"] == 1
    # One before each try: retried once only, left to the next reconcile, which copies it.
    _deployment_scaled_by_the_autoscaler(op, namespace, "busy", 5)
    assert reconcile_with(serving_written(2), serving_written(3)) == []
    assert op.kube.get(path)["spec"]["replicas"] == 4
    _quiet_reconciler(Kube(op.kube.api), events).reconcile(namespace, "busy")
    assert op.kube.get(path)["spec"]["replicas"] == 5
    # `kubectl scale fis busy --replicas 3` in between: the retry reads the new generation and writes nothing.
    _deployment_scaled_by_the_autoscaler(op, namespace, "busy", 6)
    assert reconcile_with(lambda: _scale(op, namespace, "busy", 3)) == []
    assert op.kube.get(path)["spec"]["replicas"] == 3


def _get_scale(op, namespace: str, name: str) -> dict[str, Any]:
    """`kubectl get fis NAME --subresource scale` (an autoscaling/v1 Scale)."""
    return op.kube.request("GET", f"{fis_path(namespace, name)}/scale")


def test_the_scale_subresource_answers_whether_or_not_the_manifest_sets_replicas(op, namespace):
    """GET of the scale subresource answered 500 when spec.replicas was absent (the apiserver has no count to read):
    `kubectl scale --current-replicas`, `kubectl get --subresource scale` and any HPA or KEDA aimed at the
    InferenceService failed. Now spec.replicas is always there: a default for a manifest without it, the autoscaler's
    count while one runs."""
    op.set_optional_crds(False)
    op.apply(fis("plain", namespace, autoscaling=None, replicas=None))
    op.apply(fis("fixed", namespace, autoscaling=None, replicas=2))
    op.apply(fis("auto", namespace, replicas=None, autoscaling={"minReplicas": 2, "maxReplicas": 6, "target": 4}))
    assert _get_scale(op, namespace, "plain")["spec"]["replicas"] == 1
    assert _get_scale(op, namespace, "fixed")["spec"]["replicas"] == 2

    # status.replicas and status.selector: what an HPA reads next to spec.replicas (the pods it averages over).
    for name, count in (("plain", 1), ("fixed", 2)):
        scale = wait_for(lambda n=name, c=count: (s := _get_scale(op, namespace, n))["status"]["replicas"] == c
                         and s, 30, f"status.replicas of {name}")
        assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
        pods = op.kube.list(f"/api/v1/namespaces/{namespace}/pods", scale["status"]["selector"])
        assert len(pods) == count and {p["metadata"]["labels"]["serving.flotilla.dev/inferenceservice"]
                                       for p in pods} == {name}

    # `kubectl scale --current-replicas 1 --replicas 3`: a PUT of the Scale read, its resourceVersion a precondition.
    # The operator's own status writes move the resourceVersion too, so a PUT may meet a 409 as kubectl's would:
    # read again and retry, as a user would (CI saw one such race).
    def put_three() -> dict | None:
        read = _get_scale(op, namespace, "plain")
        read["spec"]["replicas"] = 3
        try:
            op.kube.request("PUT", f"{fis_path(namespace, 'plain')}/scale", read)
        except KubeError as e:
            if e.status != 409:
                raise
            return None
        return read

    scale = wait_for(put_three, 30, "a PUT of the Scale not overtaken by a status write")
    assert _get_scale(op, namespace, "plain")["spec"]["replicas"] == 3
    wait_for(lambda: op.kube.get(child_path("Deployment", namespace, "plain"))["spec"]["replicas"] == 3, 30,
             "3 replicas applied")
    with pytest.raises(KubeError) as stale:  # the same PUT again: the InferenceService changed since it was read
        op.kube.request("PUT", f"{fis_path(namespace, 'plain')}/scale", scale)
    assert stale.value.status == 409

    # Autoscaled: the Deployment starts at minReplicas and the scale subresource says so, then follows the autoscaler.
    wait_children(op, namespace, "auto", ["Deployment", "HorizontalPodAutoscaler"])
    wait_for(lambda: _get_scale(op, namespace, "auto")["spec"]["replicas"] == 2, 30, "minReplicas in the Scale")
    _deployment_scaled_by_the_autoscaler(op, namespace, "auto", 5)
    wait_for(lambda: _get_scale(op, namespace, "auto")["spec"]["replicas"] == 5, 30, "the autoscaler's 5 in the Scale")
    # KEDA's scale to zero (minReplicaCount 0) is not copied: spec.replicas 0 would suspend the autoscaler.
    op.kube.request("PATCH", f"{child_path('Deployment', namespace, 'auto')}/scale", {"spec": {"replicas": 0}}, None,
                    "application/merge-patch+json")
    wait_for(lambda: (op.kube.get(fis_path(namespace, "auto")).get("status") or {}).get("phase") == "ScaledToZero",
             30, "the Deployment at 0 reconciled")
    assert _get_scale(op, namespace, "auto")["spec"]["replicas"] == 5
    assert op.kube.get(child_path("HorizontalPodAutoscaler", namespace, "auto")) is not None


def test_a_deployment_the_autoscaler_scaled_to_zero_reads_scaled_to_zero_saying_so(op, namespace):
    """KEDA scaling the Deployment to 0 under spec.autoscaling (spec.replicas still 2) read "no replicas requested
    (spec.replicas is 0)". The reason stays ScaledToZero; the message says the autoscaler (or a hand) scaled it."""
    op.set_optional_crds(True)
    op.apply(fis("keda", namespace, replicas=None, autoscaling={"minReplicas": 2, "maxReplicas": 6, "target": 4}))
    wait_children(op, namespace, "keda", ["Deployment", "ScaledObject"])
    _deployment_scaled_by_the_autoscaler(op, namespace, "keda", 0)

    def fis_status():
        return op.kube.get(fis_path(namespace, "keda")).get("status") or {}

    status = wait_for(lambda: (s := fis_status()).get("phase") == "ScaledToZero" and s, 30, "phase ScaledToZero")
    expected = ("the Deployment was scaled to 0 by its autoscaler (or by hand) while autoscaling is set; "
                "spec.replicas is 2")
    for type_ in ("Ready", "Progressing"):
        c = condition({"status": status}, type_)
        assert (c["status"], c["reason"], c["message"]) == ("False", "ScaledToZero", expected)
    assert op.kube.get(fis_path(namespace, "keda"))["spec"]["replicas"] == 2
    assert op.kube.get(child_path("ScaledObject", namespace, "keda")) is not None  # not suspended


# Model numbers whose head size (hiddenSize / numAttentionHeads) rounds to 0: the webhook refuses them, but one
# stored while the operator was down is met by every later reconcile.
ZERO_HEAD_MODEL = {"source": "pvc://models/m", "config": {"hiddenSize": 7, "numHiddenLayers": 1,
                                                          "numAttentionHeads": 32, "intermediateSize": 128,
                                                          "vocabSize": 3}}


def test_the_resync_reaches_every_inferenceservice_past_one_it_cannot_reconcile(operator_process, op, namespace):
    # A ServiceMonitor CRD installed after an InferenceService is noticed by the periodic resync alone (no event
    # names the InferenceService). The resync lists InferenceServices by name, so a-zero comes before b-good.
    op.set_optional_crds(False)
    op.apply(fixed("b-good", namespace))
    wait_children(op, namespace, "b-good", ["Deployment"])
    operator_process.kill()
    try:
        op.apply(fis("a-zero", namespace, autoscaling=None, model=ZERO_HEAD_MODEL))
    finally:
        operator_process.start()
    op.set_optional_crds(True)
    wait_children(op, namespace, "b-good", ["ServiceMonitor"], timeout=60)


def test_the_reconciler_posts_events_outside_kopfs_handlers_as_the_resync_calls_it(cluster, namespace):
    # The periodic resync (handlers._resync_forever) runs reconcile in a thread of a task started by a startup
    # handler: kopf's event queue (set per object by kopf's processing) is not there, and kopf.event raised
    # LookupError, aborting that reconcile before its status (seen in the operator's log after a restart).
    from flotilla.operator.kube import Kube
    from flotilla.operator.reconciler import Reconciler

    cluster.apply(fis("announced", namespace, autoscaling=None))
    body = cluster.kube.get(fis_path(namespace, "announced"))
    Reconciler(Kube(cluster.kube.api)).post_event(body, "Normal", "Created", "created Deployment announced")
    events = wait_for(lambda: [e for e in cluster.kube.list(f"/api/v1/namespaces/{namespace}/events")
                               if e["involvedObject"]["name"] == "announced" and e["reason"] == "Created"], 10,
                      "the Event")
    assert events[0]["involvedObject"]["uid"] == body["metadata"]["uid"] and events[0]["type"] == "Normal"
    assert events[0]["message"] == "created Deployment announced"


def test_what_the_resync_changes_is_announced_and_reaches_status(op, namespace):
    # The ServiceMonitor CRD installed after the InferenceService: no event names it, so the periodic resync alone
    # makes the ServiceMonitor, and must post its Event and write status.monitoring as a handler-driven reconcile
    # does (the resync runs outside kopf's per-object tasks, whose event queue kopf.event needs).
    op.set_optional_crds(False)
    op.apply(fixed("late", namespace, replicas=1))
    wait_for(lambda: (op.kube.get(fis_path(namespace, "late")).get("status") or {}).get("monitoring", "").startswith(
        "no ServiceMonitor"), 20, "status.monitoring without a ServiceMonitor")
    op.set_optional_crds(True)
    wait_children(op, namespace, "late", ["ServiceMonitor"], timeout=60)
    wait_for(lambda: [e for e in op.kube.list(f"/api/v1/namespaces/{namespace}/events")
                      if e["involvedObject"]["name"] == "late" and e["reason"] == "Created"
                      and e["message"] == "created ServiceMonitor late"], 30, "the resync's Created Event")
    wait_for(lambda: op.kube.get(fis_path(namespace, "late"))["status"].get("monitoring") == "ServiceMonitor", 60,
             "status.monitoring written by the resync")


def test_deleting_the_inferenceservice_garbage_collects_every_child(op, namespace):
    op.set_optional_crds(True)
    op.apply(fis("llama", namespace))
    kinds = ["Deployment", "Service", "ServiceMonitor", "ScaledObject", "PodDisruptionBudget"]
    wait_children(op, namespace, "llama", kinds)
    op.kube.delete(fis_path(namespace, "llama"))
    # The controller manager's garbage collector follows the owner references (it discovers new
    # CRD kinds every 30 s, hence the generous timeout: 34 s seen under a load average of 20).
    wait_for(lambda: all(op.kube.get(child_path(k, namespace, "llama")) is None for k in kinds), 180,
             "every child to be garbage-collected", interval=0.5)
    pods = op.kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    wait_for(lambda: not [p for p in op.kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
                          if not p["metadata"].get("deletionTimestamp")], 60, "pods gone", interval=0.5)
    del pods


def _delete_orphaning(op, operator_process, namespace: str, name: str, kinds: list[str]) -> None:
    """What `kubectl delete fis NAME --cascade=orphan` leaves: the InferenceService gone, its children without owner
    references. Done by hand as the garbage collector does it, with the operator stopped (a reconcile under way would
    put the references back): the collector of a control plane started seconds ago may not have the children in its
    graph yet and then deletes them as dangling instead (seen here), which is its race, not the operator's."""
    operator_process.stop()
    for kind in kinds:
        op.kube.request("PATCH", child_path(kind, namespace, name), {"metadata": {"ownerReferences": None}}, None,
                        "application/merge-patch+json")
    op.kube.delete(fis_path(namespace, name))
    wait_for(lambda: op.kube.get(fis_path(namespace, name)) is None, 30, f"{name} gone")
    operator_process.start()
    for kind in kinds:
        orphan = op.kube.get(child_path(kind, namespace, name))
        assert orphan is not None and not orphan["metadata"].get("ownerReferences"), (kind, orphan)


def test_children_orphaned_by_a_cascade_orphan_delete_are_adopted_by_the_next_inferenceservice(operator_process, op,
                                                                                                namespace):
    """`kubectl delete fis NAME --cascade=orphan` keeps the children (the garbage collector strips their owner
    references) and is how an object is recreated without taking its pods down. The next InferenceService of that
    name adopts the orphans that carry its labels (same objects, same pods, its owner reference, an Adopted Event)
    instead of reading OwnershipConflict for ever; an orphaned HPA the new spec does not ask for is deleted, or it
    would keep scaling the adopted Deployment."""
    op.set_optional_crds(False)
    op.apply(fis("moved", namespace, autoscaling={"minReplicas": 2, "maxReplicas": 3, "target": 4}))
    kinds = ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]
    before = wait_children(op, namespace, "moved", kinds)
    _delete_orphaning(op, operator_process, namespace, "moved", kinds)

    op.apply(fis("moved", namespace, autoscaling=None, replicas=3))
    uid = op.kube.get(fis_path(namespace, "moved"))["metadata"]["uid"]

    def adopted(kind: str) -> dict[str, Any] | None:
        obj = op.kube.get(child_path(kind, namespace, "moved"))
        return obj if obj and [r["uid"] for r in obj["metadata"].get("ownerReferences", [])] == [uid] else None

    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        obj = wait_for(lambda k=kind: adopted(k), 30, f"the {kind} adopted")
        assert obj["metadata"]["uid"] == before[kind]["metadata"]["uid"], f"{kind} was recreated, not adopted"
    wait_for(lambda: op.kube.get(child_path("Deployment", namespace, "moved"))["spec"]["replicas"] == 3, 20,
             "the adopted Deployment converged on the new spec")
    wait_for(lambda: op.kube.get(child_path("HorizontalPodAutoscaler", namespace, "moved")) is None, 20,
             "the orphaned HPA deleted")
    body = wait_for(lambda: (b := op.kube.get(fis_path(namespace, "moved"))) and condition(b, "Progressing") and b, 20,
                    "the adopting InferenceService's status")
    assert condition(body, "Progressing")["reason"] != "OwnershipConflict"
    assert body["status"]["phase"] != "Failed"
    # The Events go through kopf's asynchronous queue: wait for all three, not the first.
    adopted_events = {"adopted Deployment moved", "adopted Service moved", "adopted PodDisruptionBudget moved"}
    events = wait_for(lambda: (found := [e for e in op.kube.list(f"/api/v1/namespaces/{namespace}/events")
                                         if e["involvedObject"].get("uid") == uid and e["reason"] == "Adopted"])
                      and {e["message"].split(":")[0] for e in found} >= adopted_events and found, 30,
                      "the three Adopted Events")
    assert {e["message"].split(":")[0] for e in events} == adopted_events
    assert {e["type"] for e in events} == {"Normal"}


class _ClaimedAfterRead(Kube):
    """The real API server, where another controller claims one object right after the reconciler first reads it:
    between its adoption check and the adoption's write."""

    def __init__(self, api: Any, path: str, claim: Any):
        super().__init__(api)
        self.path, self.claim = path, claim

    def get(self, path: str) -> dict[str, Any] | None:
        found = super().get(path)
        if path == self.path and self.claim is not None:
            claim, self.claim = self.claim, None
            claim()
        return found


def _quiet_reconciler(kube: Kube, events: list[tuple[str, str]]) -> Reconciler:
    """A reconciler in this process whose Events land in `events` (reason, message)."""
    return Reconciler(kube, post_event=lambda _body, _type, reason, message: events.append((reason, message)))


@pytest.mark.parametrize("controller", [True, False], ids=["controller-reference", "owner-reference"])
def test_an_orphan_claimed_while_being_adopted_is_left_to_its_new_owner(operator_process, op, namespace, controller):
    """An orphan carrying this InferenceService's labels is adopted, but only as it was read: another controller that
    claims it between the check and the write (an owner reference, controlling or not) keeps it. The forced apply
    took it over regardless (an owner reference beside the other's), or was refused as two controllers (ApplyRefused,
    which misnames the obstacle); the write's resourceVersion precondition fails instead and the reconcile starts
    over, which now reads OwnershipConflict."""
    operator_process.stop()  # this test's reconciler is the only one (the next test's fixture starts it again)
    op.apply(fixed("claimed", namespace, replicas=1))
    spec = InferenceServiceSpec.model_validate(op.kube.get(fis_path(namespace, "claimed"))["spec"])
    op.apply(build_deployment(spec, "claimed", namespace))  # an orphan with the operator's labels, made by hand
    other = op.kube.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "other"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": other["metadata"]["uid"],
           **({"controller": True} if controller else {})}
    path = child_path("Deployment", namespace, "claimed")

    def claim() -> None:
        op.kube.request("PATCH", path, {"metadata": {"ownerReferences": [ref]}}, None, "application/merge-patch+json")

    events: list[tuple[str, str]] = []
    with pytest.raises(ChildrenBlocked) as blocked:
        _quiet_reconciler(_ClaimedAfterRead(op.kube.api, path, claim), events).reconcile(namespace, "claimed")
    assert blocked.value.reason == "OwnershipConflict", blocked.value.message
    assert op.kube.get(path)["metadata"]["ownerReferences"] == [ref]
    assert "owned by ConfigMap other" in blocked.value.message
    assert not [e for e in events if e[0] == "Adopted"], events
    assert condition(op.kube.get(fis_path(namespace, "claimed")), "Progressing")["reason"] == "OwnershipConflict"


def _settled(op, path: str) -> dict[str, Any]:
    """The Deployment at `path` once the Deployment controller is done with it: its status describes this generation
    and its ReplicaSet's replicas. Until then each of the controller's writes (the revision annotation, the status
    once the ReplicaSet exists, again once it has its pods) changes the resourceVersion an adoption expects, so every
    attempt of a reconcile may fail its precondition (on a loaded machine those writes come late and spread out)."""
    def settled() -> dict[str, Any] | None:
        found = op.kube.get(path)
        status = (found or {}).get("status") or {}
        if found is None or status.get("observedGeneration") != found["metadata"]["generation"]:
            return None
        replicas = found["spec"]["replicas"]
        done = status.get("replicas", 0) == status.get("updatedReplicas", 0) == replicas
        return found if done and {c["type"] for c in status.get("conditions", [])} >= {"Available", "Progressing"} \
            else None

    return wait_for(settled, 60, f"the Deployment controller to settle {path}")


def test_an_orphan_left_unchanged_is_still_adopted_with_the_precondition(operator_process, op, namespace):
    """The precondition holds when nothing changed: the orphan is adopted (same object, this owner reference)."""
    operator_process.stop()
    op.apply(fixed("kept", namespace, replicas=1))
    body = op.kube.get(fis_path(namespace, "kept"))
    orphan = op.apply(build_deployment(InferenceServiceSpec.model_validate(body["spec"]), "kept", namespace))
    _settled(op, child_path("Deployment", namespace, "kept"))
    events: list[tuple[str, str]] = []
    _quiet_reconciler(Kube(op.kube.api), events).reconcile(namespace, "kept")
    adopted = op.kube.get(child_path("Deployment", namespace, "kept"))
    assert adopted["metadata"]["uid"] == orphan["metadata"]["uid"]
    assert [r["uid"] for r in adopted["metadata"]["ownerReferences"]] == [body["metadata"]["uid"]]
    assert ("Adopted", "adopted Deployment kept: it had no owner and carries this InferenceService's labels; updated "
            "it to match the spec") in events


class _BusyOrphan(Kube):
    """The real API server, where another controller writes one object (an annotation of its own, leaving it an orphan)
    right before each of the reconciler's first `writes` writes of it, dry runs included: as the
    kube-controller-manager keeps writing a Deployment whose pods churn (status, revision annotation), each write
    moving the resourceVersion that the adoption's precondition expects."""

    def __init__(self, api: Any, path: str, writes: int):
        super().__init__(api)
        self.path, self.writes = path, writes

    def apply(self, obj: dict[str, Any], dry_run: bool = False, manager: str = FIELD_MANAGER) -> dict[str, Any]:
        meta = obj["metadata"]
        if object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]) == self.path and self.writes:
            self.writes -= 1
            Kube(self.api).request("PATCH", self.path, {"metadata": {"annotations": {
                "tests.flotilla.dev/busy": str(self.writes)}}}, None, "application/merge-patch+json")
        return super().apply(obj, dry_run, manager)


def test_a_busy_orphan_is_adopted_within_one_reconcile(operator_process, op, namespace):
    """Each write of someone else's between the adoption's read and its write failed the precondition and started the
    reconcile over; as many as it has attempts (ADOPTION_ATTEMPTS) failed it, and the adoption waited kopf's backoff.
    A failed precondition is now tried once more on a fresh read that is still an orphan to adopt, as the /scale copy
    of the autoscaler's count is: the same writes leave it adopted by the one reconcile."""
    operator_process.stop()  # this test's reconciler is the only one (the next test's fixture starts it again)
    op.apply(fixed("busy", namespace, replicas=1))
    body = op.kube.get(fis_path(namespace, "busy"))
    orphan = op.apply(build_deployment(InferenceServiceSpec.model_validate(body["spec"]), "busy", namespace))
    path = child_path("Deployment", namespace, "busy")
    _settled(op, path)  # the real controller's writes done: the racer's are the only ones
    events: list[tuple[str, str]] = []
    _quiet_reconciler(_BusyOrphan(op.kube.api, path, ADOPTION_ATTEMPTS), events).reconcile(namespace, "busy")
    adopted = op.kube.get(path)
    assert adopted["metadata"]["uid"] == orphan["metadata"]["uid"]
    assert [r["uid"] for r in adopted["metadata"]["ownerReferences"]] == [body["metadata"]["uid"]]
    assert adopted["metadata"]["annotations"]["tests.flotilla.dev/busy"] == "0"  # every write of the other's came
    assert [e for e in events if e[0] == "Adopted"] == [
        ("Adopted", "adopted Deployment busy: it had no owner and carries this InferenceService's labels; updated it "
         "to match the spec")]


def _someones_deployment(namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A minimal Deployment made by hand (no owner)."""
    pod = {"metadata": {"labels": {"app": "someone"}},
           "spec": {"containers": [{"name": "c", "image": "registry.local/someone:1"}]}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "someone"}}, "template": pod}}


class _CreatedAfterDryRun(Kube):
    """The real API server, where someone else creates an object right after the reconciler's dry run of it: between
    the dry run and the write."""

    def __init__(self, api: Any, path: str, create: Any):
        super().__init__(api)
        self.path, self.create_theirs = path, create

    def apply(self, obj: dict[str, Any], dry_run: bool = False, manager: str = FIELD_MANAGER) -> dict[str, Any]:
        answer = super().apply(obj, dry_run, manager)
        if dry_run and object_path(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"],
                                   obj["metadata"]["name"]) == self.path and self.create_theirs is not None:
            create, self.create_theirs = self.create_theirs, None
            create()
        return answer


@pytest.mark.parametrize("window", [_ClaimedAfterRead, _CreatedAfterDryRun], ids=["before-dry-run", "before-write"])
def test_a_child_created_by_someone_else_after_the_check_is_not_taken_over(operator_process, op, namespace, window):
    """A child found absent is only created: one that someone else created between the check and the write (here
    with no labels, so not an orphan to adopt) makes the create answer AlreadyExists (or the dry run find their
    object and fail on it) and the reconcile start over, which reads OwnershipConflict. A forced apply took it over
    instead (its owner reference added, its spec replaced), or was refused as ApplyRefused (their selector is
    immutable), which misnames the obstacle."""
    operator_process.stop()  # this test's reconciler is the only one
    op.apply(fixed("raced", namespace, replicas=1))
    path = child_path("Deployment", namespace, "raced")
    theirs = _someones_deployment(namespace, "raced", {"team": "someone"})

    def create() -> None:
        op.kube.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", theirs)

    events: list[tuple[str, str]] = []
    with pytest.raises(ChildrenBlocked) as blocked:
        _quiet_reconciler(window(op.kube.api, path, create), events).reconcile(namespace, "raced")
    assert blocked.value.reason == "OwnershipConflict", blocked.value.message
    live = op.kube.get(path)
    assert not live["metadata"].get("ownerReferences")
    assert live["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/someone:1"
    assert not [e for e in events if e[0] in ("Created", "Adopted")], events
    assert condition(op.kube.get(fis_path(namespace, "raced")), "Progressing")["reason"] == "OwnershipConflict"


def test_an_orphan_created_after_the_check_is_adopted_on_the_next_attempt(operator_process, op, namespace):
    """When what appeared between the check and the create is an orphan with this InferenceService's labels, the
    attempt that starts over adopts it (same object, an Adopted Event), rather than blocking."""
    operator_process.stop()
    op.apply(fixed("late", namespace, replicas=1))
    spec = InferenceServiceSpec.model_validate(op.kube.get(fis_path(namespace, "late"))["spec"])
    path = child_path("Deployment", namespace, "late")
    made: list[dict[str, Any]] = []

    def create() -> None:
        made.append(op.kube.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments",
                                    build_deployment(spec, "late", namespace)))
        _settled(op, path)  # the next attempt then reads the orphan as it stays

    events: list[tuple[str, str]] = []
    _quiet_reconciler(_CreatedAfterDryRun(op.kube.api, path, create), events).reconcile(namespace, "late")
    live = op.kube.get(path)
    assert live["metadata"]["uid"] == made[0]["metadata"]["uid"]
    assert [r["name"] for r in live["metadata"]["ownerReferences"]] == ["late"]
    assert [reason for reason, message in events if "Deployment late" in message] == ["Adopted"], events


class _Recording(Kube):
    """The real API server, with every request kept (method, path, query) and the answers to every write (each one's
    watch echo carries its resourceVersion)."""

    def __init__(self, api: Any):
        super().__init__(api)
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.writes: list[dict[str, Any]] = []

    def request(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
                content_type: str | None = None) -> dict[str, Any]:
        self.requests.append((method, path, dict(query or {})))
        answer = super().request(method, path, body, query, content_type)
        if method == "PATCH" and not path.endswith("/status") and "dryRun" not in (query or {}):
            self.writes.append(answer)
        return answer


def _writes(kube: _Recording, path: str) -> list[str]:
    """The methods of the requests `kube` made that wrote the object at `path` (a POST to its collection included; dry
    runs not)."""
    return [method for method, at, query in kube.requests if method != "GET" and "dryRun" not in query
            and (at == path or at.startswith(f"{path}/") or (method == "POST" and at == path.rsplit("/", 1)[0]))]


def test_a_created_child_is_owned_by_the_apply_alone(operator_process, op, namespace):
    """A child is created (POST), then applied: only the apply's entry of the operator is left in managedFields, so a
    field the spec drops later is removed from the child (here a pod label), as on a child only ever applied."""
    operator_process.stop()
    op.set_optional_crds(False)
    doc = fixed("owned", namespace, replicas=1)
    doc["spec"]["pod"] = {"labels": {"team": "ml"}}
    op.apply(doc)
    kube = _Recording(op.kube.api)
    reconciler = _quiet_reconciler(kube, [])
    reconciler.reconcile(namespace, "owned")
    path = child_path("Deployment", namespace, "owned")
    # The create, the apply of that object, the removal of the create's entry (reconciler._write_child says why three).
    assert _writes(kube, path) == ["POST", "PATCH", "PATCH"], kube.requests
    entries = [(e["manager"], e["operation"]) for e in op.kube.get(path)["metadata"]["managedFields"]]
    assert ("flotilla-operator", "Apply") in entries and ("flotilla-operator", "Update") not in entries, entries
    assert all(reconciler.is_own_write(w) for w in kube.writes if w["kind"] == "Deployment")
    del doc["spec"]["pod"]
    op.apply(doc)
    reconciler.reconcile(namespace, "owned")
    assert "team" not in op.kube.get(path)["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("autoscaling", [None, {"minReplicas": 2, "maxReplicas": 5, "target": 4}],
                         ids=["fixed", "autoscaled"])
def test_a_reconcile_reads_the_deployment_once(operator_process, op, namespace, autoscaling):
    """With spec.replicas left out, a reconcile read the live Deployment twice (once to keep its count, once for the
    ownership check); one read serves the whole reconcile, at creation and after."""
    operator_process.stop()
    op.set_optional_crds(False)
    op.apply(fis("once", namespace, replicas=None, autoscaling=autoscaling))
    kube = _Recording(op.kube.api)
    reconciler = _quiet_reconciler(kube, [])
    path = child_path("Deployment", namespace, "once")
    for _ in range(3):  # the creation, then reconciles of what exists (a handover of the replicas, with autoscaling)
        kube.requests.clear()
        reconciler.reconcile(namespace, "once")
        assert [method for method, at, _ in kube.requests if at == path].count("GET") == 1, kube.requests


def test_one_reconcile_copies_the_autoscalers_count_though_it_writes_the_status_too(operator_process, op, namespace):
    """The copy into spec.replicas carries the InferenceService's resourceVersion as a precondition; the status patch
    of the same reconcile changes that resourceVersion (not the spec), so the copy must expect the new one, or it is
    refused each time the status changes too (a new count mostly comes with new replica figures) and waits for a
    reconcile that changes no status."""
    operator_process.stop()
    op.set_optional_crds(False)
    op.apply(fis("copied", namespace, replicas=None, autoscaling={"minReplicas": 2, "maxReplicas": 5, "target": 4}))
    reconciler = _quiet_reconciler(op.kube, [])
    reconciler.reconcile(namespace, "copied")  # creates the Deployment at minReplicas and writes the first status
    assert op.kube.get(fis_path(namespace, "copied"))["spec"]["replicas"] == 2
    reconciler.reconcile(namespace, "copied")  # hands the replicas over to the HPA
    op.kube.request("PATCH", f"{child_path('Deployment', namespace, 'copied')}/scale", {"spec": {"replicas": 4}},
                    None, "application/merge-patch+json")
    reconciler.reconcile(namespace, "copied")
    assert op.kube.get(fis_path(namespace, "copied"))["spec"]["replicas"] == 4


def test_every_write_of_a_replicas_handover_is_known_as_the_operators_own(operator_process, op, namespace):
    """Turning autoscaling on hands `replicas` over (one apply by the handover manager, then the operator's apply):
    the watch echoes both writes, and both must read as the operator's own, or the first costs a reconcile that
    changes nothing."""
    operator_process.stop()
    op.set_optional_crds(False)
    op.apply(fis("handed", namespace, autoscaling=None, replicas=3))
    kube = _Recording(op.kube.api)
    reconciler = _quiet_reconciler(kube, [])
    reconciler.reconcile(namespace, "handed")
    op.apply(fis("handed", namespace, replicas=3, autoscaling={"minReplicas": 2, "maxReplicas": 5, "target": 4}))
    kube.writes.clear()
    reconciler.reconcile(namespace, "handed")
    deployments = [w for w in kube.writes if w["kind"] == "Deployment"]
    assert len(deployments) == 2, [w["metadata"].get("managedFields") for w in deployments]  # handover, apply
    assert deployments[-1]["spec"]["replicas"] == 3
    assert all(reconciler.is_own_write(w) for w in deployments)


def test_pod_extras_reach_the_live_deployment(op, namespace):
    doc = fixed("extras", namespace, replicas=1)
    doc["spec"]["pod"] = {
        "labels": {"team": "ml"}, "annotations": {"owner": "ml"},
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        "envFrom": [{"configMapRef": {"name": "engine-env"}, "prefix": "ENGINE_"}], "imagePullSecrets": ["regcred"],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                             "labelSelector": {"matchLabels": {"team": "ml"}}}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": {"team": "ml"}}}],
        "priorityClassName": "inference", "serviceAccountName": "default"}
    doc["spec"]["rollout"] = {"maxSurge": 0, "maxUnavailable": 1}
    op.apply(doc)
    live = wait_children(op, namespace, "extras", ["Deployment"])["Deployment"]
    built = build_deployment(InferenceServiceSpec.model_validate(op.kube.get(fis_path(namespace, "extras"))["spec"]),
                             "extras", namespace)
    template = live["spec"]["template"]
    for key in ("imagePullSecrets", "affinity", "topologySpreadConstraints", "priorityClassName",
                "serviceAccountName", "automountServiceAccountToken"):
        assert template["spec"][key] == built["spec"]["template"]["spec"][key], key
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["annotations"] == {"owner": "ml"}
    engine = template["spec"]["containers"][0]
    assert engine["env"][-1]["name"] == "HF_TOKEN"
    assert engine["envFrom"] == [{"configMapRef": {"name": "engine-env"}, "prefix": "ENGINE_"}]
    assert engine["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}  # the sample sets them
    assert live["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_a_gguf_file_is_mounted_alone_and_served_as_the_model(op, namespace):
    """A .gguf source (quantization left at none: implied) reaches the live Deployment as the built one: the file
    mounted by itself at /model/<name>, the engine started on it with --quantization gguf; status.fit counts the
    GPU's bytes (codes beside the dequantized weights)."""
    gguf = yaml.safe_load((REPO / "crds" / "samples" / "llama-3.1-8b-gguf.yaml").read_text())
    doc = fixed("gguf", namespace, replicas=1)
    doc["spec"]["model"] = gguf["spec"]["model"]
    op.apply(doc)
    live = wait_children(op, namespace, "gguf", ["Deployment"])["Deployment"]
    built = build_deployment(InferenceServiceSpec.model_validate(op.kube.get(fis_path(namespace, "gguf"))["spec"]),
                             "gguf", namespace)
    engine = live["spec"]["template"]["spec"]["containers"][0]
    assert engine["args"] == built["spec"]["template"]["spec"]["containers"][0]["args"]
    assert engine["args"][0] == "/model/Llama-3.1-8B-Instruct-Q4_1.gguf"
    assert engine["args"][engine["args"].index("--quantization") + 1] == "gguf"
    assert engine["volumeMounts"][0] == {"name": "model", "mountPath": "/model/Llama-3.1-8B-Instruct-Q4_1.gguf",
                                         "readOnly": True, "subPath": "gguf/Llama-3.1-8B-Instruct-Q4_1.gguf"}
    fit = wait_for(lambda: (op.kube.get(fis_path(namespace, "gguf")).get("status") or {}).get("fit"), 60, "status.fit")
    assert fit["weightBytes"] == 21_294_481_408


def _service_monitor_crd(follow_redirects: bool) -> dict[str, Any]:
    """A structural ServiceMonitor CRD: the Prometheus Operator's from v0.55 (its endpoints take followRedirects),
    or an older one's (they do not, and server-side apply refuses a field its schema lacks)."""
    endpoint = {"type": "object", "properties": {
        "port": {"type": "string"}, "path": {"type": "string"}, "interval": {"type": "string"},
        "scheme": {"type": "string"}, **({"followRedirects": {"type": "boolean"}} if follow_redirects else {})}}
    spec = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"endpoints": {"type": "array", "items": endpoint}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor",
                               "listKind": "ServiceMonitorList"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "properties": {"spec": spec}}}}]}}


@pytest.mark.parametrize("follow_redirects_in_schema", [True, False])
def test_the_servicemonitor_tells_prometheus_not_to_follow_redirects_where_its_schema_can(op, namespace,
                                                                                          follow_redirects_in_schema):
    # The engine image is the InferenceService author's: a 3xx from its /metrics sent Prometheus (which
    # follows redirects by default) to any address the author chose, from Prometheus' network position. Prometheus
    # Operator v0.55+ takes endpoints[].followRedirects; an older CRD lacks it, and server-side apply refuses a
    # field its schema lacks ("field not declared in schema"), so there the ServiceMonitor goes without it.
    op.set_optional_crds(False)
    op.apply_crd(_service_monitor_crd(follow_redirects_in_schema))
    try:
        op.apply(fis("llama", namespace))
        monitor = wait_children(op, namespace, "llama", ["ServiceMonitor"])["ServiceMonitor"]
        endpoint = monitor["spec"]["endpoints"][0]
        assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
        if follow_redirects_in_schema:
            assert endpoint["followRedirects"] is False
        else:
            assert "followRedirects" not in endpoint
        status = wait_for(lambda: (op.kube.get(fis_path(namespace, "llama")).get("status") or {}).get("monitoring"),
                          20, "status.monitoring")
        assert status == "ServiceMonitor"
    finally:
        op.set_optional_crds(False)
