"""The engine Deployment: every spec field's effect, validated against Kubernetes schemas."""

from __future__ import annotations

import pytest

from flotilla.flags import flag
from flotilla.operator.deployment import build_deployment, termination_grace_seconds
from flotilla.operator.names import INFERENCESERVICE_LABEL
from flotilla.operator.spec import InferenceServiceSpec


def make(**spec) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"source": "pvc://models/llama-8b"}, **spec})


def build(**spec) -> dict:
    return build_deployment(make(**spec), "llama", "serving")


def pod(d: dict) -> dict:
    return d["spec"]["template"]["spec"]


def engine(d: dict) -> dict:
    return pod(d)["containers"][0]


# (spec fields, a function of the Deployment, what it must return)
CASES = [
    ({}, lambda d: d["spec"]["replicas"], 1),
    ({"replicas": 3}, lambda d: d["spec"]["replicas"], 3),
    ({"autoscaling": {"maxReplicas": 4}}, lambda d: "replicas" in d["spec"], False),
    ({"image": "registry.local/engine:dev"}, lambda d: engine(d)["image"], "registry.local/engine:dev"),
    ({}, lambda d: engine(d)["resources"]["limits"]["nvidia.com/gpu"], "1"),
    ({"parallelism": {"tensor": 2, "pipeline": 2}}, lambda d: engine(d)["resources"]["limits"]["nvidia.com/gpu"], "4"),
    ({"resources": {"cpu": 8, "memory": "64Gi"}}, lambda d: engine(d)["resources"],
     {"limits": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"}, "requests": {"cpu": "8", "memory": "64Gi"}}),
    ({"resources": {"gpuProduct": "NVIDIA-H200"}}, lambda d: pod(d)["nodeSelector"],
     {"nvidia.com/gpu.product": "NVIDIA-H200"}),
    ({"resources": {"nodeSelector": {"pool": "gpu"}}}, lambda d: pod(d)["nodeSelector"], {"pool": "gpu"}),
    ({}, lambda d: "nodeSelector" in pod(d), False),
    ({"resources": {"tolerations": [{"key": "spot", "operator": "Exists"}]}}, lambda d: pod(d)["tolerations"],
     [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, {"key": "spot", "operator": "Exists"}]),
    ({"resources": {"shmSize": "16Gi"}}, lambda d: pod(d)["volumes"][1],
     {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}),
    ({"scheduling": {"maxModelLen": 4096}}, lambda d: engine(d)["args"][engine(d)["args"].index("--max-model-len") + 1],
     "4096"),
    ({"apiKeySecretRef": {"name": "llm-key"}}, lambda d: engine(d)["env"][-1],
     {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "llm-key", "key": "token"}}}),
    ({}, lambda d: [e["name"] for e in engine(d)["env"]], ["HOME", "XDG_CACHE_HOME", "HF_HUB_OFFLINE"]),
    ({"model": {"source": "pvc://models/llama-8b"}}, lambda d: (pod(d)["volumes"][0], engine(d)["volumeMounts"][0]),
     ({"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
      {"name": "model", "mountPath": "/model", "readOnly": True, "subPath": "llama-8b"})),
    ({"model": {"source": "pvc://whole-claim"}}, lambda d: engine(d)["volumeMounts"][0],
     {"name": "model", "mountPath": "/model", "readOnly": True}),
    ({"model": {"source": "hostPath:///mnt/models/llama"}}, lambda d: pod(d)["volumes"][0],
     {"name": "model", "hostPath": {"path": "/mnt/models/llama", "type": "Directory"}}),
    ({"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}},
     lambda d: (pod(d)["volumes"][0], pod(d)["initContainers"][0]["command"][-2:]),
     ({"name": "model", "emptyDir": {}}, ["meta-llama/Llama-3.1-8B-Instruct", "/model"])),
    ({}, lambda d: "initContainers" in pod(d), False),
]


@pytest.mark.parametrize(("fields", "get", "expected"), CASES, ids=[str(c[0]) for c in CASES])
def test_field_effect(fields, get, expected, validate_manifest):
    d = build(**fields)
    assert get(d) == expected
    validate_manifest(d)


def test_engine_runs_flotilla_serve_on_the_mounted_model():
    c = engine(build())
    assert c["command"] == ["flotilla", "serve"]
    assert c["args"][0] == "/model"
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in c["ports"]


def test_labels_select_the_pods_of_this_inferenceservice_only():
    d = build()
    assert d["spec"]["selector"]["matchLabels"] == {INFERENCESERVICE_LABEL: "llama"}
    assert d["spec"]["template"]["metadata"]["labels"][INFERENCESERVICE_LABEL] == "llama"
    assert d["metadata"] == {"name": "llama", "namespace": "serving", "labels": d["spec"]["template"]["metadata"]
                             ["labels"]}


def test_probes_allow_a_long_load_then_watch_health():
    c = engine(build())
    startup = c["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60  # big checkpoints load for minutes
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"


def test_grace_period_covers_prestop_and_engine_drain():
    d = build()
    prestop = int(engine(d)["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = pod(d)["terminationGracePeriodSeconds"]
    assert grace == termination_grace_seconds()
    assert grace > prestop + flag("--shutdown-timeout").default


def test_rollout_never_drops_serving_capacity():
    assert build()["spec"]["strategy"] == {"type": "RollingUpdate",
                                           "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def test_pod_runs_unprivileged_with_a_read_only_root():
    d = build()
    assert pod(d)["securityContext"]["runAsNonRoot"] is True
    sc = engine(d)["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    mounts = {m["mountPath"] for m in engine(d)["volumeMounts"]}
    assert {"/tmp", "/dev/shm", "/model"} <= mounts  # writable scratch despite the read-only root


def test_deployment_and_service_are_accepted_by_the_control_plane(kube_api, namespace):
    import kubernetes

    from flotilla.operator.service import build_service

    spec = make(replicas=2, resources={"gpuProduct": "NVIDIA-H200", "cpu": "4", "memory": "32Gi"},
                apiKeySecretRef={"name": "k"})
    apps, core = kubernetes.client.AppsV1Api(kube_api), kubernetes.client.CoreV1Api(kube_api)
    created = apps.create_namespaced_deployment(namespace, build_deployment(spec, "llama", namespace))
    assert created.spec.template.spec.containers[0].args[0] == "/model"
    core.create_namespaced_service(namespace, build_service("llama", namespace))
