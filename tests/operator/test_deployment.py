"""The engine Deployment: every spec field's effect, validated against Kubernetes schemas."""

from __future__ import annotations

import pytest

from flotilla.flags import flag
from flotilla.operator.deployment import build_deployment, termination_grace_seconds
from flotilla.operator.names import INFERENCESERVICE_LABEL
from flotilla.operator.spec import InferenceServiceSpec

LLAMA_8B = {"hiddenSize": 4096, "numHiddenLayers": 32, "numAttentionHeads": 32, "numKeyValueHeads": 8,
            "headDim": 128, "intermediateSize": 14336, "vocabSize": 128256}


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
    # spec.replicas 0 (kubectl scale) scales to zero whatever autoscaling says: the autoscaler is suspended.
    ({"replicas": 0, "autoscaling": {"maxReplicas": 4}}, lambda d: d["spec"]["replicas"], 0),
    ({"image": "registry.local/engine:dev"}, lambda d: engine(d)["image"], "registry.local/engine:dev"),
    ({}, lambda d: engine(d)["resources"]["limits"]["nvidia.com/gpu"], "1"),
    ({"parallelism": {"tensor": 2, "pipeline": 2}}, lambda d: engine(d)["resources"]["limits"]["nvidia.com/gpu"], "4"),
    ({"resources": {"cpu": 8, "memory": "64Gi"}}, lambda d: engine(d)["resources"],
     {"limits": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"}, "requests": {"cpu": "8", "memory": "64Gi"}}),
    # Never BestEffort: requests sized from the GPUs and (when known) the weights.
    ({}, lambda d: engine(d)["resources"], {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "4",
                                                                                           "memory": "12Gi"}}),
    ({"parallelism": {"tensor": 2}, "model": {"source": "pvc://m", "config": LLAMA_8B}},
     lambda d: engine(d)["resources"]["requests"], {"cpu": "6", "memory": "12Gi"}),
    # the checkpoint's bytes as its --hf-overrides quantization_config stores them: 8-bit GPTQ in groups of 128,
    # 9.24 GB (4 GiB + 2.15 GiB; counted at 4 bits, 5.75 GB, it was 6Gi) ...
    ({"model": {"source": "pvc://m", "config": LLAMA_8B}, "engineArgs": [
        "--hf-overrides", '{"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 128}}']},
     lambda d: engine(d)["resources"]["requests"], {"cpu": "4", "memory": "7Gi"}),
    # ... and all the layers the files hold, whatever number of them the engine is told to build (16.06 GB)
    ({"model": {"source": "pvc://m", "config": LLAMA_8B}, "engineArgs": [
        "--hf-overrides", '{"num_hidden_layers": 16}']},
     lambda d: engine(d)["resources"]["requests"], {"cpu": "4", "memory": "8Gi"}),
    ({}, lambda d: pod(d)["automountServiceAccountToken"], False),
    ({}, lambda d: pod(d)["volumes"][2], {"name": "tmp", "emptyDir": {"sizeLimit": "20Gi"}}),
    ({"resources": {"tmpSize": "50Gi"}}, lambda d: pod(d)["volumes"][2]["emptyDir"]["sizeLimit"], "50Gi"),
    ({"pod": {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                      {"name": "LOG", "value": "1"}]}}, lambda d: engine(d)["env"][-2:],
     [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
      {"name": "LOG", "value": "1"}]),
    ({"pod": {"envFrom": [{"secretRef": {"name": "creds"}, "prefix": "S3_"}]}}, lambda d: engine(d)["envFrom"],
     [{"prefix": "S3_", "secretRef": {"name": "creds"}}]),
    ({}, lambda d: "envFrom" in engine(d), False),
    ({"pod": {"imagePullSecrets": ["regcred"]}}, lambda d: pod(d)["imagePullSecrets"], [{"name": "regcred"}]),
    ({"pod": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}},
     lambda d: pod(d)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
         "nodeSelectorTerms"][0]["matchExpressions"][0]["key"], "zone"),
    ({"pod": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                                             "labelSelector": {"matchLabels": {"a": "b"}}}]}},
     lambda d: pod(d)["topologySpreadConstraints"][0]["topologyKey"], "zone"),
    ({"pod": {"priorityClassName": "inference-high"}}, lambda d: pod(d)["priorityClassName"], "inference-high"),
    ({"pod": {"serviceAccountName": "model-reader"}}, lambda d: pod(d)["serviceAccountName"], "model-reader"),
    ({}, lambda d: [k for k in ("imagePullSecrets", "affinity", "topologySpreadConstraints", "priorityClassName",
                                "serviceAccountName") if k in pod(d)], []),
    ({"pod": {"labels": {"team": "ml"}, "annotations": {"a": "b"}}},
     lambda d: (d["spec"]["template"]["metadata"]["labels"]["team"], d["spec"]["template"]["metadata"]["annotations"]),
     ("ml", {"a": "b"})),
    ({"rollout": {"maxSurge": 0, "maxUnavailable": 1}}, lambda d: d["spec"]["strategy"]["rollingUpdate"],
     {"maxUnavailable": 1, "maxSurge": 0}),
    ({"model": {"source": "hf://org/model", "cache": {"claimName": "hf-cache"}}},
     lambda d: (pod(d)["volumes"][0], engine(d)["volumeMounts"][0], pod(d)["initContainers"][0]["command"][-1],
                pod(d)["initContainers"][0]["volumeMounts"][0]),
     ({"name": "model", "persistentVolumeClaim": {"claimName": "hf-cache"}},
      {"name": "model", "mountPath": "/model", "readOnly": True, "subPath": "hf/org/model"},
      "/cache/hf/org/model", {"name": "model", "mountPath": "/cache"})),
    ({"model": {"source": "hf://org/model", "config": LLAMA_8B}}, lambda d: pod(d)["volumes"][0]["emptyDir"],
     {"sizeLimit": "19Gi"}),
    ({"model": {"source": "hf://org/model", "cache": {"size": "40Gi"}}},
     lambda d: pod(d)["volumes"][0]["emptyDir"], {"sizeLimit": "40Gi"}),
    ({"resources": {"gpuProduct": "NVIDIA-H200"}}, lambda d: pod(d)["nodeSelector"],
     {"nvidia.com/gpu.product": "NVIDIA-H200"}),
    # A short name passes the fit check through its alias; nodes carry GPU feature discovery's name.
    ({"resources": {"gpuProduct": "H200"}}, lambda d: pod(d)["nodeSelector"],
     {"nvidia.com/gpu.product": "NVIDIA-H200"}),
    ({"resources": {"gpuProduct": "h100-sxm"}}, lambda d: pod(d)["nodeSelector"],
     {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
    ({"resources": {"gpuProduct": "A100-SHARED"}}, lambda d: pod(d)["nodeSelector"],
     {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED"}),
    ({"resources": {"gpuProduct": "Acme-X1"}}, lambda d: pod(d)["nodeSelector"],
     {"nvidia.com/gpu.product": "Acme-X1"}),
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
     ({"name": "model", "emptyDir": {"sizeLimit": "500Gi"}}, ["meta-llama/Llama-3.1-8B-Instruct", "/model"])),
    ({}, lambda d: "initContainers" in pod(d), False),
    # A GGUF file on a claim or a node is mounted alone, by its name, and is the engine's MODEL argument.
    ({"model": {"source": "pvc://models/gguf/llama-8b.Q4_1.gguf"}},
     lambda d: (pod(d)["volumes"][0], engine(d)["volumeMounts"][0], engine(d)["args"][0]),
     ({"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
      {"name": "model", "mountPath": "/model/llama-8b.Q4_1.gguf", "readOnly": True,
       "subPath": "gguf/llama-8b.Q4_1.gguf"},
      "/model/llama-8b.Q4_1.gguf")),
    ({"model": {"source": "hostPath:///mnt/models/llama-8b.Q4_0.gguf"}},
     lambda d: (pod(d)["volumes"][0], engine(d)["volumeMounts"][0]["mountPath"], engine(d)["args"][0]),
     ({"name": "model", "hostPath": {"path": "/mnt/models/llama-8b.Q4_0.gguf", "type": "File"}},
      "/model/llama-8b.Q4_0.gguf", "/model/llama-8b.Q4_0.gguf")),
    # One file of a repository: only it is downloaded, kept at its path; the emptyDir is sized by the file's bytes
    # (8B: 5.48 GB at Q4_1 linears and a Q8_0 embedding/LM head, x 1.2, + 1 GiB).
    ({"model": {"source": "hf://org/llama-gguf/q4/llama-8b.Q4_1.gguf", "config": LLAMA_8B}},
     lambda d: (pod(d)["volumes"][0], engine(d)["volumeMounts"][0], pod(d)["initContainers"][0]["command"][-3:],
                engine(d)["args"][0]),
     ({"name": "model", "emptyDir": {"sizeLimit": "8Gi"}}, {"name": "model", "mountPath": "/model", "readOnly": True},
      ["org/llama-gguf", "/model", "q4/llama-8b.Q4_1.gguf"], "/model/q4/llama-8b.Q4_1.gguf")),
    ({"model": {"source": "hf://org/llama-gguf/llama-8b.Q4_1.gguf", "cache": {"claimName": "hf-cache"}}},
     lambda d: (engine(d)["volumeMounts"][0], pod(d)["initContainers"][0]["command"][-3:], engine(d)["args"][0]),
     ({"name": "model", "mountPath": "/model", "readOnly": True, "subPath": "hf/org/llama-gguf"},
      ["org/llama-gguf", "/cache/hf/org/llama-gguf", "llama-8b.Q4_1.gguf"], "/model/llama-8b.Q4_1.gguf")),
    ({"model": {"source": "pvc://models/gguf/llama-8b.Q4_1.gguf"}},
     lambda d: engine(d)["args"][engine(d)["args"].index("--quantization") + 1], "gguf"),
    # A tokenizer directory beside the model (a GGUF's base model's, say): read-only at /tokenizer; of an hf://
    # repository only the tokenizer's files are downloaded, never its weights.
    ({"model": {"source": "pvc://models/gguf/llama-8b.Q4_1.gguf", "tokenizer": "pvc://models/llama-8b"}},
     lambda d: (pod(d)["volumes"][3], engine(d)["volumeMounts"][3], "initContainers" in pod(d)),
     ({"name": "tokenizer", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
      {"name": "tokenizer", "mountPath": "/tokenizer", "readOnly": True, "subPath": "llama-8b"}, False)),
    ({"model": {"source": "pvc://models/llama-8b", "tokenizer": "hostPath:///mnt/tokenizers/llama"}},
     lambda d: pod(d)["volumes"][3], {"name": "tokenizer", "hostPath": {"path": "/mnt/tokenizers/llama",
                                                                       "type": "Directory"}}),
    ({"model": {"source": "hf://org/llama-gguf/llama-8b.Q4_1.gguf", "tokenizer": "hf://meta-llama/Llama-3.1-8B"}},
     lambda d: (pod(d)["volumes"][3], [c["command"][3:] for c in pod(d)["initContainers"]]),
     ({"name": "tokenizer", "emptyDir": {"sizeLimit": "1Gi"}},
      [["org/llama-gguf", "/model", "llama-8b.Q4_1.gguf"],
       ["meta-llama/Llama-3.1-8B", "/tokenizer", "*.json", "*.model", "*.txt", "*.jinja", "*.tiktoken"]])),
    ({}, lambda d: [v["name"] for v in pod(d)["volumes"]], ["model", "dshm", "tmp"]),
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


# An init container requests no GPU, so the device plugin sets no NVIDIA_VISIBLE_DEVICES there, and the NVIDIA container
# toolkit would follow the image's own (a CUDA base image says all): every GPU of the node for the author's image.
NO_GPUS = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


HF_ENV = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
          {"name": "HF_ENDPOINT", "value": "https://hub.mirror.local"},
          {"name": "HUGGING_FACE_HUB_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-old", "key": "t"}}}]
OTHER_ENV = [{"name": "S3_SECRET", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}},
             {"name": "LOG", "value": "1"}, {"name": "HF_HUB_CACHE", "value": "/elsewhere"}]


def test_hf_downloads_get_the_hub_token_and_endpoint_of_pod_env_and_nothing_else(validate_manifest):
    """A gated repository: each hf:// download (model, tokenizer, adapters) gets HOME and, of spec.pod.env, exactly
    HF_TOKEN, HF_ENDPOINT and HUGGING_FACE_HUB_TOKEN as written there (Secret references included), in their
    order there; other variables and spec.pod.envFrom stay with the engine."""
    env = [OTHER_ENV[0], HF_ENV[0], OTHER_ENV[1], HF_ENV[1], OTHER_ENV[2], HF_ENV[2]]
    d = build(model={"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "tokenizer": "hf://meta-llama/Llama-3.1-8B"},
              lora={"adapters": [{"name": "sql", "source": "hf://org/sql-lora"},
                                 {"name": "chat", "source": "pvc://adapters/chat"}]},
              pod={"env": env, "envFrom": [{"secretRef": {"name": "creds"}}]})
    inits = pod(d)["initContainers"]
    assert [c["name"] for c in inits] == ["download-model", "download-tokenizer", "download-lora-sql"]
    for c in inits:
        assert c["env"] == [{"name": "HOME", "value": "/tmp"}, NO_GPUS, *HF_ENV], c["name"]
        assert "envFrom" not in c
    assert engine(d)["env"][-6:] == env and engine(d)["envFrom"] == [{"secretRef": {"name": "creds"}}]
    validate_manifest(d)


def test_hf_downloads_without_hub_variables_get_only_home():
    d = build(model={"source": "hf://org/public-model"}, lora={"adapters": [{"name": "a", "source": "hf://org/a"}]},
              pod={"env": OTHER_ENV})
    assert [c["env"] for c in pod(d)["initContainers"]] == [[{"name": "HOME", "value": "/tmp"}, NO_GPUS]] * 2


def test_the_download_containers_get_no_gpus_and_the_engine_only_the_device_plugins():
    d = build(model={"source": "hf://org/public-model"}, pod={"env": OTHER_ENV})
    assert all(NO_GPUS in c["env"] for c in pod(d)["initContainers"])
    assert not [e for e in engine(d)["env"] if e["name"].startswith("NVIDIA_")]


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
    assert grace == termination_grace_seconds(make())
    assert grace > prestop + flag("--shutdown-timeout").default


def test_rollout_never_drops_serving_capacity():
    assert build()["spec"]["strategy"] == {"type": "RollingUpdate",
                                           "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def test_pod_runs_unprivileged_with_a_read_only_root():
    d = build()
    assert pod(d)["securityContext"]["runAsNonRoot"] is True
    sc = engine(d)["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
                  "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    # Not applied (false is dropped by the API, and applying it churned managedFields): reset by a merge patch.
    assert not {"hostNetwork", "hostPID", "hostIPC"} & pod(d).keys()
    mounts = {m["mountPath"] for m in engine(d)["volumeMounts"]}
    assert {"/tmp", "/dev/shm", "/model"} <= mounts  # writable scratch despite the read-only root


# Volume types the Pod Security Standards' restricted profile allows (kubernetes.io/docs/concepts/security/
# pod-security-standards, "Volume Types").
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


@pytest.mark.parametrize("fields", [
    {},
    {"model": {"source": "hf://org/model"}, "lora": {"adapters": [{"name": "a", "source": "hf://org/adapter"}]}},
    {"model": {"source": "pvc://models/m.Q4_1.gguf", "tokenizer": "hf://org/tok"}},
    {"apiKeySecretRef": {"name": "key"}, "pod": {"env": [{"name": "HF_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "hf", "key": "token"}}}]}},
])
def test_every_container_meets_the_restricted_pod_security_standard(fields):
    """A namespace enforcing `pod-security.kubernetes.io/enforce: restricted` admits the engine pods, download init
    containers included: non-root (never uid 0), no privilege escalation, every capability dropped, RuntimeDefault
    seccomp, no host namespaces or ports, restricted volume types (a hostPath source, the admin's opt-in, is the one
    exception: even the baseline profile refuses it)."""
    p = pod(build(**fields))
    assert p["securityContext"]["runAsNonRoot"] is True and p["securityContext"]["runAsUser"] != 0
    assert p["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostNetwork", "hostPID", "hostIPC", "hostUsers"} & p.keys()
    containers = p["containers"] + p.get("initContainers", [])
    for c in containers:
        sc = c["securityContext"]
        assert (sc["allowPrivilegeEscalation"], sc["privileged"], sc["runAsNonRoot"]) == (False, False, True), c["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not {"runAsUser", "procMount", "seLinuxOptions", "windowsOptions"} & sc.keys()
        assert not any("hostPort" in port for port in c.get("ports", []))
    for volume in p["volumes"]:
        assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, volume
    if fields.get("model", {}).get("source", "").startswith("hf://"):
        assert p.get("initContainers"), "the hf:// case must cover the download init containers"


def test_deployment_and_service_are_accepted_by_the_control_plane(kube_api, namespace):
    import kubernetes

    from flotilla.operator.service import build_service

    spec = make(replicas=2, resources={"gpuProduct": "NVIDIA-H200", "cpu": "4", "memory": "32Gi"},
                apiKeySecretRef={"name": "k"})
    apps, core = kubernetes.client.AppsV1Api(kube_api), kubernetes.client.CoreV1Api(kube_api)
    created = apps.create_namespaced_deployment(namespace, build_deployment(spec, "llama", namespace))
    assert created.spec.template.spec.containers[0].args[0] == "/model"
    core.create_namespaced_service(namespace, build_service("llama", namespace))


def test_every_host_path_is_mounted_read_only_by_every_container():
    # The hostPath policy checks path text and the kubelet follows node symlinks (docs/operator.md, "Security
    # model"): a pod that could write under an allowed directory could plant a link out of it for the next one.
    spec = InferenceServiceSpec.model_validate({
        "model": {"source": "hostPath:///models/llama", "tokenizer": "hostPath:///models/tok"},
        "lora": {"adapters": [{"name": "a", "source": "hostPath:///models/a"}, {"name": "b", "source": "hf://o/b"}]}})
    pod_spec = build_deployment(spec, "x", "ns")["spec"]["template"]["spec"]
    host_volumes = {v["name"] for v in pod_spec["volumes"] if "hostPath" in v}
    assert len(host_volumes) == 3
    for container in pod_spec["containers"] + pod_spec.get("initContainers", []):
        for mount in container.get("volumeMounts", []):
            if mount["name"] in host_volumes:
                assert mount.get("readOnly") is True, (container["name"], mount)
