"""Hostile InferenceServices on a real control plane: each is refused by the webhook (or the apiserver's
schema) or marked in status, nothing is created or modified, and no pre-existing object changes.

The corpus is what a platform security reviewer tries (issue 18) and the variants they would try
next. The operator runs with one allowed hostPath directory (conftest.HOST_PATH_PREFIX), so escapes
from it are tried too; hostPath being off by default is tested without a cluster (test_policy.py).
"""

from __future__ import annotations

import contextlib
import copy
import http.server
import random
import threading
from typing import Any

import pytest

from flotilla.operator.kube import KubeError
from flotilla.operator.message_limit import MESSAGE_LIMIT
from flotilla.operator.names import HTTP_PORT, common_labels
from flotilla.operator.spec import DEFAULT_IMAGE

from .conftest import ENGINE_IMAGE, FIS_PATH, WEBHOOK_CONFIGURATION, wait_for
from .test_operator_reconcile import (
    KINDS,
    ZERO_HEAD_MODEL,
    child_path,
    collection,
    condition,
    first_change,
    fis,
    fis_path,
    revision,
    wait_children,
)

WEBHOOK = 'admission webhook "validate.flotilla.serving.flotilla.dev" denied the request'
SCHEMA = "is invalid: "  # the apiserver's own schema validation

# name -> (InferenceService name, spec changes, who refuses, a fragment of the message)
CORPUS: dict[str, tuple[str, dict[str, Any], str, str]] = {
    # 18.1: the node's files
    "hostpath-root": ("bad", {"model": {"source": "hostPath:///"}}, WEBHOOK,
                      "/ is outside the host directories this cluster allows (/models)"),
    "hostpath-etc": ("bad", {"model": {"source": "hostPath:///etc"}}, WEBHOOK, "/etc is outside the host"),
    "hostpath-proc": ("bad", {"model": {"source": "hostPath:///proc/1/root"}}, WEBHOOK, "outside the host"),
    "hostpath-docker-sock": ("bad", {"model": {"source": "hostPath:///var/run/docker.sock"}}, WEBHOOK,
                             "outside the host"),
    "hostpath-dotdot": ("bad", {"model": {"source": "hostPath:///models/../etc"}}, WEBHOOK,
                        "/models/../etc has a '.' or '..' segment"),
    "hostpath-trailing-dotdot": ("bad", {"model": {"source": "hostPath:///models/.."}}, WEBHOOK,
                                 "has a '.' or '..' segment"),
    "hostpath-prefix-lookalike": ("bad", {"model": {"source": "hostPath:///models-evil"}}, WEBHOOK,
                                  "/models-evil is outside the host"),
    "hostpath-double-slash": ("bad", {"model": {"source": "hostPath:////etc"}}, WEBHOOK, "not in normal form"),
    "hostpath-lora-adapter": ("bad", {"lora": {"adapters": [{"name": "a", "source": "hostPath:///etc"}]}}, WEBHOOK,
                              "spec.lora.adapters[0].source: /etc is outside the host"),
    # The pods' sandbox: annotations the apiserver and kubelet read as seccomp/AppArmor settings (on 1.20 a
    # container's seccomp annotation becomes its securityContext.seccompProfile, overriding the pod's RuntimeDefault)
    "seccomp-container-annotation": ("bad", {"pod": {"annotations": {
        "container.seccomp.security.alpha.kubernetes.io/engine": "unconfined"}}}, WEBHOOK,
        "spec.pod.annotations: container.seccomp.security.alpha.kubernetes.io/engine would change the pods' "
        "seccomp or AppArmor profile, which the operator sets"),
    "seccomp-pod-annotation": ("bad", {"pod": {"annotations": {
        "seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}}, WEBHOOK,
        "spec.pod.annotations: seccomp.security.alpha.kubernetes.io/pod would change"),
    "apparmor-annotation": ("bad", {"pod": {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/engine": "unconfined"}}}, WEBHOOK,
        "spec.pod.annotations: container.apparmor.security.beta.kubernetes.io/engine would change"),
    "apparmor-annotation-of-an-init-container": ("bad", {"pod": {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/download-model": "unconfined"}}}, WEBHOOK,
        "would change the pods' seccomp or AppArmor profile"),
    # Annotations that a mesh's sidecar injector, a node's container runtime or a cloud identity agent reads as
    # instructions: a hostPath volume in the injected sidecar, a runtime's device or user-namespace setting, a
    # cloud role. Which tools read which keys is the cluster's, so only the admin's list (and the user's own
    # unprefixed, dot-free keys) passes.
    "istio-sidecar-host-volume": ("bad", {"pod": {"annotations": {
        "sidecar.istio.io/userVolume": '[{"name": "host", "hostPath": {"path": "/"}}]'}}}, WEBHOOK,
        "spec.pod.annotations: sidecar.istio.io/userVolume is not a pod annotation this cluster allows"),
    "crio-runtime-annotation": ("bad", {"pod": {"annotations": {"io.kubernetes.cri-o.Devices": "/dev/mem"}}},
                                WEBHOOK, "spec.pod.annotations: io.kubernetes.cri-o.Devices is not a pod annotation"),
    "kata-hypervisor-annotation": ("bad", {"pod": {"annotations": {
        "io.katacontainers.config.hypervisor.kernel_params": "init=/bin/sh"}}}, WEBHOOK,
        "io.katacontainers.config.hypervisor.kernel_params is not a pod annotation this cluster allows"),
    "kube2iam-role-annotation": ("bad", {"pod": {"annotations": {"iam.amazonaws.com/role": "admin"}}}, WEBHOOK,
                                 "iam.amazonaws.com/role is not a pod annotation this cluster allows"),
    # Pod labels that tools read as instructions, as the annotations above: a mutating webhook that mounts a cloud
    # token into the pod (Azure Workload Identity reads this label; the operator promises no token in the pods), a
    # mesh's sidecar injector (the label form of sidecar.istio.io/inject wins over the namespace's choice), a
    # prefixed label that NetworkPolicies or a policy engine select by. Plain keys stay the user's.
    "workload-identity-label": ("bad", {"pod": {"labels": {"azure.workload.identity/use": "true"}}}, WEBHOOK,
                                "spec.pod.labels: azure.workload.identity/use is not a pod label this cluster allows"),
    "istio-inject-label": ("bad", {"pod": {"labels": {"sidecar.istio.io/inject": "true"}}}, WEBHOOK,
                           "spec.pod.labels: sidecar.istio.io/inject is not a pod label this cluster allows"),
    "kubernetes-io-label": ("bad", {"pod": {"labels": {"node-restriction.kubernetes.io/x": "y"}}}, WEBHOOK,
                            "spec.pod.labels: node-restriction.kubernetes.io/x is not a pod label"),
    # The two built-in critical classes (priority 2e9: above every user class) preempt any other team's pods on the
    # GPU nodes; since 1.17 the apiserver no longer keeps them to kube-system unless the admin configures a quota.
    "system-priority-class": ("bad", {"pod": {"priorityClassName": "system-node-critical"}}, WEBHOOK,
                              "spec.pod.priorityClassName: system-node-critical is not a priority class this cluster "
                              "allows InferenceServices"),
    "system-cluster-priority-class": ("bad", {"pod": {"priorityClassName": "system-cluster-critical"}}, WEBHOOK,
                                      "system-cluster-critical is not a priority class this cluster allows"),
    # The ServiceMonitor's interval is the shared Prometheus's work: 1ms had it scrape each engine pod 1000 times a
    # second (Prometheus caps the timeout at the interval, so nothing refuses it there).
    "scrape-interval-1ms": ("bad", {"monitoring": {"interval": "1ms"}}, WEBHOOK,
                            "spec.monitoring.interval: 1ms is shorter than 5s"),
    "scrape-interval-0s": ("bad", {"monitoring": {"interval": "0s"}}, WEBHOOK,
                           "spec.monitoring.interval: 0s is shorter than 5s"),
    # KEDA runs the SLO query over this window every polling interval on the shared Prometheus: years of histogram
    # buckets per poll (or a duration Prometheus cannot parse, so the autoscaler never gets a value).
    "autoscaling-window-years": ("bad", {"autoscaling": {"maxReplicas": 2, "metric": "ttft_p95_seconds", "target": 1,
                                                         "window": "99999999m"}}, WEBHOOK,
                                 "spec.autoscaling.window: 99999999m is longer than 1h"),
    # 18.4: flags the operator owns, and values outside the contract
    "engine-port": ("bad", {"engineArgs": ["--port", "9000"]}, WEBHOOK, "--port is set by the operator"),
    "engine-port-inline": ("bad", {"engineArgs": ["--port=9000"]}, WEBHOOK, "--port is set by the operator"),
    "engine-port-abbreviated": ("bad", {"engineArgs": ["--por", "9000"]}, WEBHOOK, "--por is not an engine flag"),
    "engine-host": ("bad", {"engineArgs": ["--host", "0.0.0.0"]}, WEBHOOK, "--host is set by the operator"),
    "engine-dummy-weights": ("bad", {"engineArgs": ["--load-format", "dummy"]}, WEBHOOK,
                             "--load-format dummy is the operator's to refuse"),
    "engine-cpu": ("bad", {"engineArgs": ["--device", "cpu"]}, WEBHOOK, "--device is set by the operator"),
    "engine-block-override": ("bad", {"engineArgs": ["--num-gpu-blocks-override", "100000"]}, WEBHOOK,
                              "--num-gpu-blocks-override is set by the operator"),
    "engine-tokenizer": ("bad", {"engineArgs": ["--tokenizer", "/etc"]}, WEBHOOK,
                         "--tokenizer is set by spec.model.tokenizer"),
    "engine-api-key": ("bad", {"engineArgs": ["--api-key", "k"]}, WEBHOOK, "--api-key is set by spec.apiKeySecretRef"),
    "engine-served-name": ("bad", {"engineArgs": ["--served-model-name", "gpt-4"]}, WEBHOOK,
                           "--served-model-name is set by spec.model.servedName"),
    "engine-shutdown-negative": ("bad", {"engineArgs": ["--shutdown-timeout", "-5"]}, WEBHOOK,
                                 "--shutdown-timeout=-5.0 is out of range (>= 0 and <= 3600)"),
    "engine-shutdown-inf": ("bad", {"engineArgs": ["--shutdown-timeout", "inf"]}, WEBHOOK,
                            "--shutdown-timeout: 'inf' is not a valid float"),
    "engine-shutdown-huge": ("bad", {"engineArgs": ["--shutdown-timeout", "1e18"]}, WEBHOOK, "is out of range"),
    "engine-seed-text": ("bad", {"engineArgs": ["--seed", "abc"]}, WEBHOOK, "--seed: 'abc' is not a valid int"),
    "engine-stray-value": ("bad", {"engineArgs": ["--enforce-eager", "yes"]}, WEBHOOK, "'yes' is not a flag"),
    "engine-separator": ("bad", {"engineArgs": ["--", "--port", "1"]}, WEBHOOK, "-- is not an engine flag"),
    "engine-help": ("bad", {"engineArgs": ["--help"]}, WEBHOOK, "--help is not an engine flag"),
    # Admitted, then refused by the engine at start-up (a crash loop): the engine's own rules for these values.
    "engine-structured-outputs-unknown-key": ("bad", {"engineArgs": ["--structured-outputs-config", '{"bogus": 1}']},
                                              WEBHOOK, "--structured-outputs-config: bogus: not a key it takes "
                                                       "(backend, disable_any_whitespace, compile_timeout_s, warm_up, "
                                                       "reasoning_parser, enable_in_reasoning)"),
    "engine-structured-outputs-backend": ("bad", {"engineArgs": ["--structured-outputs-config=" '{"backend": "x"}']},
                                          WEBHOOK, '--structured-outputs-config: backend must be "auto" or '
                                                   '"xgrammar", not "x"'),
    "engine-auto-tool-choice-without-parser": ("bad", {"engineArgs": ["--enable-auto-tool-choice"]}, WEBHOOK,
                                               "--enable-auto-tool-choice needs --tool-call-parser (hermes, "
                                               "llama3_json, mistral or qwen3_coder)"),
    "engine-structured-outputs-not-an-object": ("bad", {"engineArgs": ["--structured-outputs-config", "[1]"]},
                                                WEBHOOK, "--structured-outputs-config must be a JSON object"),
    # 18.6: names that make invalid Service names or label values
    "name-leading-digit": ("1llama", {}, WEBHOOK, "metadata.name '1llama' must be a DNS-1035 label"),
    "name-dot": ("llama.3", {}, WEBHOOK, "metadata.name 'llama.3' must be a DNS-1035 label"),
    "name-64": ("a" * 64, {}, WEBHOOK, "is 64 characters long; the limit is 63"),
    "name-200": ("a" * 200, {}, WEBHOOK, "is 200 characters long; the limit is 63"),
    # Labels and annotations the apiserver would refuse in the children (it did, after admission: ApplyRefused)
    "node-selector-key": ("bad", {"resources": {"nodeSelector": {"bad key!": "x"}}}, WEBHOOK,
                          "spec.resources.nodeSelector: 'bad key!' is not a valid label key"),
    "pod-label-value": ("bad", {"pod": {"labels": {"team": "ml/x"}}}, WEBHOOK,
                        "spec.pod.labels: the value of team, 'ml/x', is not a valid label value"),
    "service-monitor-label-value": ("bad", {"monitoring": {"labels": {"release": "kube prometheus"}}}, WEBHOOK,
                                    "spec.monitoring.labels: the value of release, 'kube prometheus', is not a valid"),
    "pod-annotation-key": ("bad", {"pod": {"annotations": {"bad key": "x"}}}, WEBHOOK,
                           "spec.pod.annotations: 'bad key' is not a valid annotation key"),
    # Annotations past the apiserver's 256 KiB (keys and values, in bytes: 'é' is two), and the scheduling objects
    # passed through to the pods as the apiserver checks them: each was admitted, then refused as ApplyRefused.
    "pod-annotations-too-large": ("bad", {"pod": {"annotations": {"notes": "é" * 131_067, "more": "xx"}}}, WEBHOOK,
                                  "spec.pod.annotations: the keys and values come to 262145 bytes"),
    "affinity-no-node-term": ("bad", {"pod": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}}, WEBHOOK,
        "spec.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: must "
        "have at least one node selector term"),
    "affinity-weight": ("bad", {"pod": {"affinity": {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1000, "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname"}}]}}}}, WEBHOOK,
        "preferredDuringSchedulingIgnoredDuringExecution[0].weight: 1000 is not in the range 1-100"),
    "affinity-no-topology-key": ("bad", {"pod": {"affinity": {"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "x"}}}]}}}},
        WEBHOOK, "spec.pod.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: must "
                 "be given"),
    "affinity-wrong-type": ("bad", {"pod": {"affinity": {"nodeAffinity": "gpu-nodes"}}}, WEBHOOK,
                            "spec.pod.affinity.nodeAffinity: must be an object"),
    "spread-skew-zero": ("bad", {"pod": {"topologySpreadConstraints": [{
        "maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}}, WEBHOOK,
        "spec.pod.topologySpreadConstraints[0].maxSkew: 0 must be at least 1"),
    "spread-action": ("bad", {"pod": {"topologySpreadConstraints": [{
        "maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Never"}]}}, WEBHOOK,
        "spec.pod.topologySpreadConstraints[0].whenUnsatisfiable: 'Never' is not one of DoNotSchedule"),
    "toleration-empty-key-equal": ("bad", {"resources": {"tolerations": [{"operator": "Equal", "value": "gpu"}]}},
                                   WEBHOOK, "spec.resources.tolerations[0].operator: must be Exists when key is "
                                            "empty"),
    "toleration-seconds-no-execute": ("bad", {"resources": {"tolerations": [{
        "key": "pool", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 60}]}}, WEBHOOK,
        "spec.resources.tolerations[0].effect: must be NoExecute when tolerationSeconds is set"),
    # The NVIDIA container toolkit reads NVIDIA_VISIBLE_DEVICES from the container's environment, and the kubelet puts
    # the pod's variables after the device plugin's (the last wins): all would expose every GPU of the node.
    "gpu-runtime-env": ("bad", {"pod": {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}}, WEBHOOK,
                        "spec.pod.env: NVIDIA_VISIBLE_DEVICES cannot be set: the NVIDIA container toolkit reads"),
    "gpu-runtime-env-from-secret": ("bad", {"pod": {"env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}}}]}}, WEBHOOK, "spec.pod.env: NVIDIA_DRIVER_CAPABILITIES cannot be"),
    "gpu-runtime-env-from-configmap": ("bad", {"pod": {"envFrom": [{"configMapRef": {"name": "gpus"}}]}}, WEBHOOK,
                                       "spec.pod.envFrom[0]: without a prefix, a key of the Secret or ConfigMap could "
                                       "name an NVIDIA_* variable"),
    "gpu-runtime-env-prefix": ("bad", {"pod": {"envFrom": [{"configMapRef": {"name": "gpus"}, "prefix": "NVIDIA"}]}},
                               WEBHOOK, "spec.pod.envFrom[0]: with the prefix 'NVIDIA', a key"),
    # The engine's own environment switches (operator/engine_env.py): what engineArgs governs, set around it.
    "runtime-lora-env": ("bad", {"pod": {"env": [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"}]}},
                         WEBHOOK, "spec.pod.env: VLLM_ALLOW_RUNTIME_LORA_UPDATING would turn on the engine's runtime "
                                  "adapter routes"),
    "engine-flag-env": ("bad", {"pod": {"env": [{"name": "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "value": "-1"}]}}, WEBHOOK,
                        "spec.pod.env: VLLM_HTTP_TIMEOUT_KEEP_ALIVE is the engine's --timeout-keep-alive: give "
                        "--timeout-keep-alive in spec.engineArgs instead"),
    "engine-env-prefix": ("bad", {"pod": {"envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "VLLM_"}]}},
                          WEBHOOK, "spec.pod.envFrom[0]: with the prefix 'VLLM_', a key of the Secret or ConfigMap "
                                   "could name VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
    # A pvc:// sub-path is the mount's subPath, where the apiserver refuses '..' (ApplyRefused after admission).
    "pvc-sub-path-dotdot": ("bad", {"model": {"source": "pvc://models/llama/../../x"}}, WEBHOOK,
                            "spec.model.source: the sub-path llama/../../x has a '..' segment"),
    # 18.7: a product that is no label value
    "gpu-product-space": ("bad", {"resources": {"gpuProduct": "NVIDIA H200"}}, SCHEMA, "spec.resources.gpuProduct"),
    # 18.8: engine rules across fields, decided as the engine decides them
    "budget-below-length": ("bad", {"scheduling": {"maxModelLen": 8192, "maxNumBatchedTokens": 4096}}, WEBHOOK,
                            "spec.scheduling.maxNumBatchedTokens (4096) is smaller than spec.scheduling.maxModelLen "
                            "(8192): without spec.scheduling.chunkedPrefill a whole prompt must fit one step"),
    "budget-below-model-limit": ("bad", {"scheduling": {"maxNumBatchedTokens": 8192}}, WEBHOOK,
                                 "spec.scheduling.maxNumBatchedTokens (8192) is smaller than "
                                 "spec.scheduling.maxModelLen (131072)"),
    "length-over-model-limit": ("bad", {"scheduling": {"maxModelLen": 200000, "chunkedPrefill": True}}, WEBHOOK,
                                "spec.scheduling.maxModelLen=200000 exceeds the model's limit of 131072 tokens"),
    "served-name-help": ("bad", {"model": {"source": "pvc://m", "servedName": "--help"}}, WEBHOOK,
                         "spec.model.servedName '--help' must be a non-empty name without spaces"),
    "served-name-dash": ("bad", {"model": {"source": "pvc://m", "servedName": "-h"}}, WEBHOOK,
                         "spec.model.servedName '-h'"),
    "served-name-space": ("bad", {"model": {"source": "pvc://m", "servedName": "a b"}}, WEBHOOK,
                          "spec.model.servedName 'a b'"),
    "autoscaling-tiny-target": ("bad", {"autoscaling": {"maxReplicas": 2, "target": 0.0001}}, SCHEMA,
                                "spec.autoscaling.target"),
    "autoscaling-sub-milli": ("bad", {"autoscaling": {"maxReplicas": 2, "target": 1.0005}}, WEBHOOK,
                              "autoscaling.target (1.0005) must be a multiple of 0.001"),
    "autoscaling-kv-over-one": ("bad", {"autoscaling": {"maxReplicas": 2, "metric": "kv_cache_usage_perc",
                                                        "target": 80}}, WEBHOOK,
                                "autoscaling.target (80) must be at most 1 for kv_cache_usage_perc"),
    "tensor-text": ("bad", {"parallelism": {"tensor": "abc"}}, SCHEMA, "spec.parallelism.tensor"),
    # Adapter names are DNS labels of up to 63 characters, but their volume (lora-<name>) and download init
    # container (download-lora-<name>) names are cut to 63: two long names sharing a beginning named one volume
    # twice, and the Deployment was refused after admission.
    "lora-names-that-collide-when-cut": ("bad", {"lora": {"adapters": [
        {"name": "a" * 60 + "x", "source": "pvc://adapters/x"}, {"name": "a" * 60 + "y", "source": "pvc://adapters/y"}]},
        "model": {"source": "pvc://models/m"}}, WEBHOOK,
        f"spec.lora.adapters: {'a' * 60}x and {'a' * 60}y would both name the pod's volume lora-{'a' * 58} (names "
        "are cut to 63 characters); shorten one"),
    "lora-name-cut-at-a-dash": ("bad", {"lora": {"adapters": [
        {"name": "a" * 48 + "-b", "source": "hf://org/adapter"}]}, "model": {"source": "pvc://models/m"}}, WEBHOOK,
        f"spec.lora.adapters: {'a' * 48}-b would name the pod's init container download-lora-{'a' * 48}-, which ends "
        "in '-' once cut to 63 characters; shorten the name"),
    # Model numbers whose head size rounds to 0: the fit check divided by the KV bytes per token (500, "division
    # by zero", from the webhook; an exception on every reconcile).
    "zero-head-size": ("bad", {"model": ZERO_HEAD_MODEL}, WEBHOOK,
                       "spec.model.config: hiddenSize (7) is smaller than numAttentionHeads (32): the head size "
                       "hiddenSize / numAttentionHeads would be 0; set headDim"),
    "prometheus-file-url": ("bad", {"autoscaling": {"maxReplicas": 2, "prometheusAddress": "file:///etc/passwd"}},
                            SCHEMA, "spec.autoscaling.prometheusAddress"),
    "prometheus-credentials": ("bad", {"autoscaling": {"maxReplicas": 2,
                                                       "prometheusAddress": "http://user:pw@evil.example:9090"}},
                               SCHEMA, "spec.autoscaling.prometheusAddress"),
    "prometheus-query": ("bad", {"autoscaling": {"maxReplicas": 2, "prometheusAddress": "http://p:9090/?x=1"}},
                         SCHEMA, "spec.autoscaling.prometheusAddress"),
    # KEDA runs the query with its own network position and puts the answer's body in its errors: an address of
    # the author's choosing made it fetch from anywhere (cloud metadata, a cluster-internal admin endpoint).
    "prometheus-elsewhere": ("bad", {"autoscaling": {"maxReplicas": 2,
                                                     "prometheusAddress": "http://169.254.169.254/latest/meta-data"}},
                             WEBHOOK, "spec.autoscaling.prometheusAddress: http://169.254.169.254/latest/meta-data is "
                                      "not a Prometheus this cluster allows (http://prometheus-operated.monitoring.svc"
                                      ":9090); leave the field out for the cluster's own"),
}


def _bystanders(cluster, namespace: str) -> dict[str, Any]:
    """Objects that exist before the corpus, by path: what anyone but their controllers could change."""
    objs = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad", "namespace": namespace},
         "spec": {"selector": {"app": "someone-else"}, "ports": [{"port": 80, "protocol": "TCP"}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama", "namespace": namespace},
         "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {
             "metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}},
    ]
    for o in objs:
        cluster.apply(o)
    return {path: _observable(cluster.kube.get(path)) for path in
            (child_path(o["kind"], namespace, o["metadata"]["name"]) for o in objs)}


def _observable(obj: dict[str, Any]) -> dict[str, Any]:
    # The Deployment controller writes status (and bumps resourceVersion) on its own: compare the rest.
    meta = obj["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if not k.startswith("deployment.kubernetes.io/")}
    return {"spec": obj["spec"], "labels": meta.get("labels"), "annotations": annotations,
            "ownerReferences": meta.get("ownerReferences"), "uid": meta["uid"],
            "managers": sorted({f["manager"] for f in meta.get("managedFields", []) if f.get("operation") == "Apply"
                                or f.get("manager") == "flotilla-operator"})}


def _no_children(cluster, namespace: str, name: str) -> None:
    for kind in ("Deployment", "PodDisruptionBudget", "HorizontalPodAutoscaler"):
        assert cluster.kube.get(child_path(kind, namespace, name)) is None, f"{kind} {name} was created"


def _unchanged(cluster, before: dict[str, Any]) -> None:
    for path, seen in before.items():
        assert _observable(cluster.kube.get(path)) == seen, f"{path} was modified"
        assert "flotilla-operator" not in seen["managers"]


@pytest.mark.parametrize("case", CORPUS, ids=list(CORPUS))
def test_hostile_spec_is_refused_and_nothing_changes(operator_process, cluster, namespace, case):
    name, change, refuser, fragment = CORPUS[case]
    before = _bystanders(cluster, namespace)
    doc = fis(name, namespace, **{"autoscaling": None, **copy.deepcopy(change)})
    with pytest.raises(KubeError) as refused:
        cluster.kube.request("POST", f"{FIS_PATH}/namespaces/{namespace}/inferenceservices", doc)
    assert refused.value.status == 422, refused.value.message
    assert refuser in refused.value.message and fragment in refused.value.message, refused.value.message
    assert "Traceback" not in refused.value.message and "Error(" not in refused.value.message
    assert cluster.kube.get(fis_path(namespace, name)) is None
    _no_children(cluster, namespace, name)
    _unchanged(cluster, before)


def _blocked(cluster, namespace: str, name: str, reason: str) -> dict[str, Any]:
    def seen():
        body = cluster.kube.get(fis_path(namespace, name))
        return body if condition(body, "Progressing").get("reason") == reason else None

    body = wait_for(seen, 60, f"Progressing reason {reason} on {name}")
    assert body["status"]["phase"] == "Failed"
    assert condition(body, "Degraded")["status"] == "True"
    # Events are posted through kopf's queue, a moment after the status.
    warnings = wait_for(lambda: [e for e in cluster.kube.list(f"/api/v1/namespaces/{namespace}/events")
                                 if e["involvedObject"]["name"] == name and e["reason"] == reason], 30,
                        f"a {reason} Event")
    assert warnings[0]["type"] == "Warning"
    assert warnings[0]["message"] == f"Degraded=True: {condition(body, 'Degraded')['message']}"
    return body


@pytest.mark.parametrize("kind", ["Service", "Deployment"])
def test_a_name_taken_by_someone_elses_object_is_a_conflict_and_nothing_is_applied(operator_process, cluster,
                                                                                    namespace, kind):
    before = _bystanders(cluster, namespace)
    name = "bad" if kind == "Service" else "llama"
    cluster.apply(fis(name, namespace, autoscaling=None))
    body = _blocked(cluster, namespace, name, "OwnershipConflict")
    assert condition(body, "Progressing")["message"] == (
        f"nothing applied: {kind} {name} already exists and is not owned by any object, not by this "
        "InferenceService; the operator leaves it untouched and applies nothing: rename the InferenceService, "
        "or delete that object if it is no longer needed")
    _unchanged(cluster, before)
    if kind == "Service":
        _no_children(cluster, namespace, name)  # all or nothing: not even the Deployment
    assert cluster.kube.get(child_path("Service" if kind == "Deployment" else "Deployment", namespace, name)) is None


def test_a_deployment_labelled_for_another_inferenceservice_is_not_adopted(operator_process, cluster, namespace):
    """Only an ownerless object with this InferenceService's own labels is adopted: one whose labels name another
    InferenceService (or none) stays someone else's, so creating an InferenceService never takes over a Deployment
    (and the Service's traffic) that its author could not edit."""
    labels = {"app.kubernetes.io/managed-by": "flotilla-operator", "serving.flotilla.dev/inferenceservice": "other"}
    theirs = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "taken", "namespace": namespace,
                                                                         "labels": labels},
              "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {
                  "metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
    cluster.apply(theirs)
    path = child_path("Deployment", namespace, "taken")
    seen = _observable(cluster.kube.get(path))
    cluster.apply(fis("taken", namespace, autoscaling=None))
    body = _blocked(cluster, namespace, "taken", "OwnershipConflict")
    assert "Deployment taken already exists and is not owned by any object" in condition(body, "Degraded")["message"]
    assert _observable(cluster.kube.get(path)) == seen
    assert cluster.kube.get(child_path("Service", namespace, "taken")) is None


def test_an_object_owned_by_another_owner_is_named_in_the_conflict(operator_process, cluster, namespace):
    owner = cluster.kube.request("POST", f"/api/v1/namespaces/{namespace}/configmaps",
                                 {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}})
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "owned", "namespace": namespace, "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "app", "uid": owner["metadata"]["uid"]}]},
        "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}
    version = cluster.apply(svc)["metadata"]["resourceVersion"]  # a Service has no controller writing it
    cluster.apply(fis("owned", namespace, autoscaling=None))
    body = _blocked(cluster, namespace, "owned", "OwnershipConflict")
    assert "Service owned already exists and is owned by ConfigMap app" in condition(body, "Degraded")["message"]
    assert cluster.kube.get(child_path("Service", namespace, "owned"))["metadata"]["resourceVersion"] == version


def test_a_child_the_apiserver_refuses_reaches_status_with_its_message_and_nothing_is_half_built(
        operator_process, cluster, namespace):
    # Admitted (an affinity is the core/v1 object, free-form so that a newer Kubernetes's fields pass; the review
    # checks the fields it knows), but one this 1.20 apiserver refuses: a node selector term with a field of
    # Kubernetes 1.2x. Server-side apply refuses the Deployment.
    doc = fis("picky", namespace, autoscaling=None)
    doc["spec"]["pod"] = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}],
                               "matchNewer": True}]}}}}
    cluster.apply(doc)
    body = _blocked(cluster, namespace, "picky", "ApplyRefused")
    message = condition(body, "Progressing")["message"]
    assert message.startswith("nothing applied: the API server refused Deployment picky: ")
    assert "matchNewer" in message
    for kind in KINDS:
        if kind in ("ServiceMonitor", "ScaledObject"):
            continue
        assert cluster.kube.get(child_path(kind, namespace, "picky")) is None, kind
    # Fixing the spec converges: the backoff retries, and the update triggers a reconcile at once.
    doc["spec"]["pod"] = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}}}
    cluster.apply(doc)
    wait_for(lambda: cluster.kube.get(child_path("Deployment", namespace, "picky")), 60, "the Deployment")
    wait_for(lambda: condition(cluster.kube.get(fis_path(namespace, "picky")), "Degraded").get("status") == "False",
             20, "Degraded=False")


def _refused_while_down(operator_process, cluster, namespace: str, doc: dict,
                        valid_timeout: float) -> tuple[dict, list[dict]]:
    """Store `doc` while the operator (and so its webhook, failure policy Ignore) is down, then start it again: the
    InferenceService once its reconcile has set Valid=False (within `valid_timeout` s), and its InvalidSpec Events."""
    name = doc["metadata"]["name"]
    operator_process.kill()
    try:
        cluster.apply(doc)
    finally:
        operator_process.start()
    body = wait_for(lambda: condition(b := cluster.kube.get(fis_path(namespace, name)), "Valid").get("status")
                    == "False" and b, valid_timeout, "Valid=False")
    events = wait_for(lambda: [e for e in cluster.kube.list(f"/api/v1/namespaces/{namespace}/events")
                               if e["involvedObject"]["name"] == name and e["reason"] == "InvalidSpec"], 30,
                      "an InvalidSpec Event")
    return body, events


def test_a_spec_stored_while_the_webhook_was_down_gets_its_refusal_in_status(operator_process, cluster, namespace):
    # Failure policy Ignore admits anything while the operator is away; the reconciler must then refuse it in
    # status (Valid=False and an Event), as the webhook would have, not fail on it at every retry.
    body, events = _refused_while_down(operator_process, cluster, namespace,
                                       fis("zero", namespace, autoscaling=None, model=ZERO_HEAD_MODEL), 20)
    assert condition(body, "Valid")["message"] == CORPUS["zero-head-size"][3]
    assert events[0]["type"] == "Warning"
    _no_children(cluster, namespace, "zero")


# Specs whose pod never starts (execve: E2BIG), as the reconciler finds them when failure policy Ignore let them in:
# (name, spec fields, the webhook's message)
PAST_LINUXS_LIMIT = [
    # an engine argument of 128 KiB or more
    ("long", {"engineArgs": ["--chat-template", "{{ m }}" + "a" * (131_072 - 7)]},
     "spec.engineArgs[1] is 131073 bytes long with its closing NUL; Linux starts a program only with arguments of at "
     "most 131072 bytes each (128 KiB, MAX_ARG_STRLEN), so the engine would never start: shorten it"),
    # B=$(A)$(A) is 12 bytes in the spec and 200 kB in the pod (the kubelet expands it before the engine starts)
    ("expands", {"pod": {"env": [{"name": "A", "value": "a" * 100_000}, {"name": "B", "value": "$(A)$(A)"}]}},
     "spec.pod.env[1] (B=...) is 200003 bytes long with its closing NUL once the kubelet replaces its $(...) "
     "references; Linux starts a program only with environment strings of at most 131072 bytes each (128 KiB, "
     "MAX_ARG_STRLEN), so the engine would never start: shorten it"),
]


@pytest.mark.parametrize(("name", "fields", "message"), PAST_LINUXS_LIMIT, ids=[c[0] for c in PAST_LINUXS_LIMIT])
def test_a_spec_past_linuxs_limit_stored_while_the_webhook_was_down_is_refused_in_status(
        operator_process, cluster, namespace, name, fields, message):
    # The reconciler refuses it with the webhook's message and makes no Deployment of it.
    body, events = _refused_while_down(operator_process, cluster, namespace,
                                       fis(name, namespace, autoscaling=None, **fields), 20)
    assert condition(body, "Valid")["message"] == message
    assert events[0]["type"] == "Warning" and message in events[0]["message"]
    _no_children(cluster, namespace, name)


def test_a_refused_spec_can_still_be_scaled_to_zero_and_back_once_fixed(operator_process, cluster, namespace):
    """A spec the rules refuse (stored while the webhook was down, or refused by an upgrade's stricter rules) keeps
    its last valid Deployment running, and nothing of it is applied. `kubectl scale fis --replicas 0` must still free
    the GPUs: the Deployment goes to 0 and its autoscaler is deleted (nothing else changes); fixed, the spec brings
    the autoscaler back and the Deployment restarts at minReplicas."""
    autoscaling = {"minReplicas": 2, "maxReplicas": 4, "target": 4}
    cluster.set_optional_crds(False)
    cluster.apply(fis("frozen", namespace, replicas=1, autoscaling=autoscaling))
    deployment_path = child_path("Deployment", namespace, "frozen")
    before = wait_children(cluster, namespace, "frozen", ["Deployment", "HorizontalPodAutoscaler"])["Deployment"]
    operator_process.kill()
    try:
        cluster.apply(fis("frozen", namespace, replicas=1, autoscaling=autoscaling, model=ZERO_HEAD_MODEL))
    finally:
        operator_process.start()
    wait_for(lambda: condition(cluster.kube.get(fis_path(namespace, "frozen")), "Valid").get("status") == "False",
             20, "Valid=False")
    since = {kind: cluster.kube.request("GET", collection(kind, namespace))["metadata"]["resourceVersion"]
             for kind in ("Deployment", "HorizontalPodAutoscaler")}
    cluster.kube.request("PATCH", f"{fis_path(namespace, 'frozen')}/scale", {"spec": {"replicas": 0}}, None,
                         "application/merge-patch+json")
    wait_for(lambda: cluster.kube.get(deployment_path)["spec"]["replicas"] == 0, 20, "the Deployment at 0")
    wait_for(lambda: cluster.kube.get(child_path("HorizontalPodAutoscaler", namespace, "frozen")) is None, 20,
             "the HPA deleted")
    # The autoscaler goes first (KEDA would scale a Deployment at 0 back up while it exists).
    deleted = first_change(cluster, "HorizontalPodAutoscaler", namespace, since["HorizontalPodAutoscaler"],
                           lambda e: e["type"] == "DELETED")
    at_zero = first_change(cluster, "Deployment", namespace, since["Deployment"],
                           lambda e: e["object"]["spec"]["replicas"] == 0)
    assert revision(deleted) < revision(at_zero)
    deployment = cluster.kube.get(deployment_path)
    assert deployment["spec"]["template"] == before["spec"]["template"]  # the last valid configuration, kept
    body = wait_for(lambda: "scaled to zero" in condition(b := cluster.kube.get(fis_path(namespace, "frozen")),
                                                          "Progressing").get("message", "") and b, 20,
                    "status saying the kept configuration is scaled to zero")
    assert condition(body, "Valid")["status"] == "False"

    cluster.apply(fis("frozen", namespace, replicas=1, autoscaling=autoscaling))  # fixed
    wait_children(cluster, namespace, "frozen", ["HorizontalPodAutoscaler"])
    wait_for(lambda: cluster.kube.get(deployment_path)["spec"]["replicas"] == 2, 20, "the Deployment at minReplicas")


def test_a_spec_stored_while_the_webhook_was_down_runs_the_admins_engine_image(operator_process, cluster, namespace):
    # The admin's engine image (--engine-image: a mirror, a vetted build) stands in for the stock one through the
    # mutating webhook. Admitted while the operator was away (failure policy Ignore), the spec kept the stock image
    # and the reconciler rolled it out: pods pulling from a registry the admin replaced.
    operator_process.kill()
    try:
        cluster.apply(fis("stock", namespace, autoscaling=None))
    finally:
        operator_process.start()
    assert cluster.kube.get(fis_path(namespace, "stock"))["spec"]["image"] == DEFAULT_IMAGE
    deployment = wait_children(cluster, namespace, "stock", ["Deployment"])["Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == ENGINE_IMAGE


def test_engine_image_with_no_webhook_runs_the_admins_engine_image(operator_process, cluster, namespace):
    # --engine-image with --no-webhook was refused at start-up ("works through the mutating webhook"); the review
    # both paths share now settles the image, so an operator without webhooks runs the admin's image too (the
    # spec keeps showing the stock value, which nothing rewrites).
    operator_process.stop()  # SIGTERM: kopf empties its webhook configurations
    try:
        operator_process.start(webhook=False)
        mutating = cluster.kube.get(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                                    f"{WEBHOOK_CONFIGURATION}")
        assert not (mutating or {}).get("webhooks"), "no webhook may mutate the spec here"
        cluster.apply(fis("nohook", namespace, autoscaling=None))
        deployment = wait_children(cluster, namespace, "nohook", ["Deployment"])["Deployment"]
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == ENGINE_IMAGE
        assert cluster.kube.get(fis_path(namespace, "nohook"))["spec"]["image"] == DEFAULT_IMAGE
        # An image the spec names is kept.
        cluster.apply(fis("named", namespace, autoscaling=None, image="registry.local/custom:1"))
        named = wait_children(cluster, namespace, "named", ["Deployment"])["Deployment"]
        assert named["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/custom:1"
    finally:
        operator_process.stop()
        operator_process.start()


# model.config at the largest numbers the schema allows (far beyond any checkpoint), and one past them.
LARGEST_MODEL = {"source": "pvc://models/m", "config": {
    "hiddenSize": 262_144, "numHiddenLayers": 4096, "numAttentionHeads": 4096, "numKeyValueHeads": 4096,
    "headDim": 4096, "intermediateSize": 1_048_576, "vocabSize": 4_194_304, "maxPositionEmbeddings": 1 << 30}}
PAST_LARGEST_MODEL = {"source": "pvc://models/m", "config": {
    "hiddenSize": 10**7, "numHiddenLayers": 10**5, "numAttentionHeads": 32, "intermediateSize": 10**8,
    "vocabSize": 10**9}}


@pytest.mark.parametrize("pod", [
    {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
    {"imagePullSecrets": ["regcred", "regcred"]},
], ids=["env", "image-pull-secrets"])
def test_a_deployment_that_server_side_apply_cannot_merge_reaches_status(operator_process, cluster, namespace, pod):
    # Admitted (the CRD and the webhook allow repeated names), but server-side apply answers 500 "failed to create
    # typed patch object ... duplicate entries for key": a refusal of the object, not an outage, so it must reach
    # status like any other refusal rather than be retried forever with no condition.
    cluster.apply(fis("twice", namespace, autoscaling=None, pod=pod))
    body = _blocked(cluster, namespace, "twice", "ApplyRefused")
    assert "duplicate entries for key" in condition(body, "Progressing")["message"]
    _no_children(cluster, namespace, "twice")


def test_model_numbers_past_the_schema_bounds_are_refused_even_while_the_webhook_is_down(operator_process, cluster,
                                                                                          namespace):
    # Past int64 the fit check's figures (status.fit.weightBytes, ...) cannot be written: status was refused
    # (422) on every reconcile, so such an InferenceService never got a condition. The apiserver's own schema
    # bounds the numbers; within them every figure fits.
    operator_process.kill()
    try:
        with pytest.raises(KubeError) as refused:
            cluster.apply(fis("huge", namespace, autoscaling=None, model=PAST_LARGEST_MODEL))
        assert refused.value.status == 422 and SCHEMA in refused.value.message
        assert "spec.model.config.hiddenSize" in refused.value.message, refused.value.message
        cluster.apply(fis("largest", namespace, autoscaling=None, model=LARGEST_MODEL))
    finally:
        operator_process.start()
    body = wait_for(lambda: condition(b := cluster.kube.get(fis_path(namespace, "largest")), "Valid").get("status")
                    == "False" and b, 20, "Valid=False")
    assert body["status"]["fit"]["verdict"] == "DoesNotFit" and body["status"]["fit"]["weightBytes"] > 1 << 50
    _no_children(cluster, namespace, "largest")


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A tiny HTTP server's handler: `answer(path)` -> (status, headers, body); every path asked is recorded."""

    def do_GET(self) -> None:
        self.server.asked.append(self.path)  # type: ignore[attr-defined]
        status, headers, body = self.server.answer(self.path)  # type: ignore[attr-defined]
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@contextlib.contextmanager
def _http_server(answer, port: int = 0):
    """A recording HTTP server on 127.0.0.1 (`port` 0: a free one), or, with a `port`, on a loopback address of its
    own (127.x.y.z: the engine pods' port is the operator's 8000, which several pods on one machine cannot share)."""
    for _ in range(20):
        host = "127.{}.{}.{}".format(*(random.randint(1, 254) for _ in range(3))) if port else "127.0.0.1"
        try:
            server = http.server.ThreadingHTTPServer((host, port), _Recorder)
            break
        except OSError:  # that address's port is taken (another test of this machine): another address
            continue
    else:
        raise AssertionError(f"no loopback address with port {port} free")
    server.asked, server.answer = [], answer  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _running(cluster, namespace: str, pod: str, ip: str) -> None:
    """Report `pod` Running at `ip`, as a kubelet would (pods never run on the test control plane)."""
    cluster.kube.patch_status(f"/api/v1/namespaces/{namespace}/pods/{pod}",
                              {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]})


def _engine_pod(cluster, namespace: str, name: str, ip: str) -> str:
    """One of InferenceService `name`'s engine pods, made by its Deployment's ReplicaSet (the real controllers),
    reported Running at `ip`; its name."""
    wait_for(lambda: cluster.kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"), 30,
             "the default ServiceAccount")
    pods = wait_for(lambda: cluster.kube.list(f"/api/v1/namespaces/{namespace}/pods",
                                              f"serving.flotilla.dev/inferenceservice={name}"), 60,
                    f"the ReplicaSet's pods of {name}")
    pod = sorted(p["metadata"]["name"] for p in pods)[0]
    _running(cluster, namespace, pod, ip)
    return pod


def test_the_operator_reads_an_engine_pods_metrics_and_follows_no_redirect(operator_process, cluster, namespace):
    # The engine image is the InferenceService author's choice, so its /metrics may answer with a redirect to what
    # only the operator reaches (another namespace's engine behind a NetworkPolicy, an internal service): the
    # operator must read the pod it listed, nothing else.
    figures = b"vllm:num_requests_running 7\nvllm:num_requests_waiting 3\n"
    with _http_server(lambda path: (200, {}, figures)) as elsewhere, _http_server(
            lambda path: (302, {"Location": f"http://127.0.0.1:{elsewhere.server_port}/secret"}, b""),
            port=HTTP_PORT) as engine:
        cluster.apply(fis("redirect", namespace, autoscaling=None))
        _engine_pod(cluster, namespace, "redirect", engine.server_address[0])
        serving = wait_for(lambda: (cluster.kube.get(fis_path(namespace, "redirect")).get("status") or {}).get(
            "serving"), 30, "status.serving")
        # (A scrape that ran past the reader's timeout on a loaded machine is written as unreachable too, maybe before
        # the server's thread recorded the request: a wait.)
        assert wait_for(lambda: list(engine.asked), 30, "the engine's /metrics to be asked")[0] == "/metrics"
        assert elsewhere.asked == [], "the operator followed the engine's redirect"
        assert serving["scraped"] == 0 and serving["unreachable"] == 1, serving


def test_the_operator_reads_only_the_pods_its_deployment_made_on_the_engines_port(operator_process, cluster,
                                                                                  namespace):
    """Anyone who may create pods in a watched namespace can give one the InferenceService label, and choose its
    ports and (with hostNetwork) its address. The operator scraped such a pod at the port its spec named; now it
    reads only pods of the InferenceService's own ReplicaSet, on the engine's port (8000), whatever a pod says."""
    figures = b"vllm:num_requests_running 7\nvllm:num_requests_waiting 3\n"
    with _http_server(lambda path: (200, {}, figures), port=HTTP_PORT) as engine, _http_server(
            lambda path: (200, {}, figures)) as lure:
        cluster.apply(fis("owned", namespace, autoscaling=None))
        real = _engine_pod(cluster, namespace, "owned", engine.server_address[0])
        # A forged pod: the label alone, on the lure's port. (A pod with the ReplicaSet's selector labels is adopted
        # by its controller, Kubernetes' own rule, and deleted as one too many; other owners and hostNetwork:
        # test_serving_metrics.py.)
        cluster.kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "label-only", "labels": {"serving.flotilla.dev/inferenceservice": "owned"}},
            "spec": {"automountServiceAccountToken": False, "containers": [{
                "name": "engine", "image": "x:latest",
                "ports": [{"name": "http", "containerPort": lure.server_port, "protocol": "TCP"}]}]}})
        _running(cluster, namespace, "label-only", "127.0.0.1")
        asked = len(engine.asked)
        wait_for(lambda: len(engine.asked) >= asked + 3, 30, "three more scrapes of the real engine pod")
        serving = cluster.kube.get(fis_path(namespace, "owned"))["status"]["serving"]
        assert [r["pod"] for r in serving["replicas"]] == [real] and serving["unreachable"] == 0, serving
        assert lure.asked == [], "the operator scraped a pod its Deployment did not make, at the port it named"


def _serving_of(cluster, namespace: str, name: str) -> dict[str, Any] | None:
    return (cluster.kube.get(fis_path(namespace, name)).get("status") or {}).get("serving")


@pytest.mark.parametrize("hostile", [
    b"vllm:num_requests_running 1\nvllm:num_requests_waiting NaN\n",
    b"vllm:num_requests_running 1\nvllm:num_requests_waiting +Inf\n",
    b"vllm:num_requests_running 1e308\nvllm:num_requests_running{model_name=\"b\"} 1e308\n"
    b"vllm:num_requests_waiting 0\n",
    # 60 000 TTFT buckets (3.5 MB, within the 4 MiB read): parsing them took 2 s of CPU on the operator's event loop,
    # which answers the admission webhooks too, every period; no engine has more than MAX_WANTED_LINES such lines.
    b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
    + b"".join(b'vllm:time_to_first_token_seconds_bucket{le="%d"} %d\n' % (i, i) for i in range(60_000)),
], ids=["nan", "inf", "overflowing-sum", "too-many-samples"])
def test_one_engines_hostile_metrics_keep_no_other_inferenceservice_from_its_serving_status(
        operator_process, cluster, namespace, hostile):
    # The engine image is its author's: its /metrics may say anything. A value no figure can be made of must cost
    # that InferenceService its figures (the pod counted unreachable), never every other team's status.serving.
    good = b"vllm:num_requests_running 7\nvllm:num_requests_waiting 3\n"
    with _http_server(lambda path: (200, {}, good), port=HTTP_PORT) as fine, _http_server(
            lambda path: (200, {}, hostile), port=HTTP_PORT) as bad:
        for name in ("fine", "hostile"):
            cluster.apply(fis(name, namespace, autoscaling=None))
        _engine_pod(cluster, namespace, "hostile", bad.server_address[0])
        _engine_pod(cluster, namespace, "fine", fine.server_address[0])
        # Its figures, not its first status.serving: a period whose scrape of this loaded machine's tiny server ran
        # past the reader's timeout writes the pod as unreachable, and the next one reads it.
        serving = wait_for(lambda: (s := _serving_of(cluster, namespace, "fine")) and s["scraped"] and s, 60,
                           "the other InferenceService's status.serving with its figures")
        assert (serving["scraped"], serving["running"], serving["waiting"]) == (1, 7, 3), serving
        hostile_serving = wait_for(lambda: _serving_of(cluster, namespace, "hostile"), 60,
                                   "the hostile InferenceService's status.serving")
        assert (hostile_serving["scraped"], hostile_serving["unreachable"]) == (0, 1), hostile_serving


def test_a_stored_spec_that_the_rules_refuse_can_still_be_labelled_and_deleted_in_the_foreground(
        operator_process, cluster, namespace):
    # A spec today's rules refuse can be stored: admitted while the operator was down (failure policy Ignore), or
    # valid under an older operator or a wider hostPath policy. An update that leaves the spec alone (a label, kopf's
    # own annotations, the garbage collector removing its foregroundDeletion finalizer) must go through, or such an
    # InferenceService could never be deleted in the foreground; a change to its spec is still reviewed.
    operator_process.kill()
    try:
        cluster.apply(fis("stale", namespace, autoscaling={"minReplicas": 4, "maxReplicas": 2}))
    finally:
        operator_process.start()
    path = fis_path(namespace, "stale")
    wait_for(lambda: condition(cluster.kube.get(path), "Valid").get("status") == "False", 60, "Valid=False")
    cluster.kube.request("PATCH", path, {"metadata": {"labels": {"team": "a"}}},
                         content_type="application/merge-patch+json")
    with pytest.raises(KubeError) as refused:
        cluster.kube.request("PATCH", path, {"spec": {"autoscaling": {"maxReplicas": 3}}},
                             content_type="application/merge-patch+json")
    assert WEBHOOK in refused.value.message and "minReplicas (4) must not exceed" in refused.value.message
    cluster.kube.request("DELETE", path, {"propagationPolicy": "Foreground"})
    wait_for(lambda: cluster.kube.get(path) is None, 30, "the foreground deletion to finish")


# 20000 pod annotation keys with a dot (200 kB of keys and values, within the apiserver's 256 KiB of annotations),
# each refused with a 300-character explanation: 6 MB of refusal from a 300 kB spec, past what one status write may
# carry (the apiserver closes the connection).
MANY_REFUSALS = {"annotations": {f"a.b{i:06d}": "x" for i in range(20_000)}}


def _bounded_refusal(message: str) -> None:
    assert len(message.encode()) <= MESSAGE_LIMIT, len(message)
    assert message.startswith("spec.pod.annotations: a.b000000 is not a pod annotation this cluster allows"), message
    assert message.endswith(" more (20000 errors in all, the first shown)"), message[-300:]


def test_a_spec_refused_many_times_over_is_refused_with_a_bounded_message(operator_process, cluster, namespace):
    doc = fis("many", namespace, autoscaling=None, pod=MANY_REFUSALS)
    with pytest.raises(KubeError) as refused:
        cluster.kube.request("POST", f"{FIS_PATH}/namespaces/{namespace}/inferenceservices", doc)
    assert refused.value.status == 422 and WEBHOOK in refused.value.message, refused.value.message[:300]
    _bounded_refusal(refused.value.message.split(" is invalid: ", 1)[1])
    assert cluster.kube.get(fis_path(namespace, "many")) is None


def test_a_spec_refused_many_times_over_stored_while_the_webhook_was_down_gets_its_refusal_in_status(
        operator_process, cluster, namespace):
    # The whole refusal did not fit one status write (the apiserver refused the patch), so such an InferenceService
    # got no condition and no Event, and was retried for ever, each time building and sending megabytes.
    body, events = _refused_while_down(operator_process, cluster, namespace,
                                       fis("many", namespace, autoscaling=None, pod=MANY_REFUSALS), 30)
    _bounded_refusal(condition(body, "Valid")["message"])
    assert events[0]["type"] == "Warning"
    _no_children(cluster, namespace, "many")


def test_the_inferenceservices_own_labels_reach_none_of_its_children(operator_process, cluster, namespace):
    # An InferenceService's metadata.labels are its author's to set freely, and kopf.adopt copied them onto every child
    # (Deployment, Service, PodDisruptionBudget, autoscaler, ServiceMonitor): a Service or Deployment then carried
    # labels that tools select by (another team's ServiceMonitor picking Services by a label, an image updater picking
    # Deployments), which its author could not have given them, nor spec.pod.labels' policy allows on the pods.
    doc = fis("labelled", namespace, autoscaling=None, replicas=2)
    doc["metadata"]["labels"] = {"team": "a", "example.com/scrape": "true", "keel.sh/policy": "force"}
    cluster.apply(doc)
    children = wait_children(cluster, namespace, "labelled", ["Deployment", "Service", "PodDisruptionBudget"])
    for kind, child in children.items():
        assert child["metadata"]["labels"] == common_labels("labelled"), kind


@pytest.mark.parametrize("records", [
    {"last-handled-configuration": "{not json", "reconcile": "[1"},
    {"last-handled-configuration": "5", "reconcile": '{"retries": "many", "delayed": "tomorrow"}'},
    # a time datetime.fromisoformat reads but kopf compares with its own aware ones (TypeError on every event)
    {"reconcile": '{"started": "2026-12-07T01:05:01", "delayed": "2026-12-07T01:05:01"}'},
], ids=["not-json", "not-kopfs-shape", "time-without-offset"])
def test_kopfs_records_written_by_the_author_are_read_as_absent_and_replaced(operator_process, cluster, namespace,
                                                                             records):
    # kopf keeps the last handled spec and each handler's progress in annotations of the InferenceService, which its
    # author can write too; kopf decoded them unchecked, so on every event it raised, throttled the object for ever
    # (an error and an Event each time) and never ran the reconcile or wrote its own record there.
    doc = fis("records", namespace, autoscaling=None)
    doc["metadata"]["annotations"] = {f"serving.flotilla.dev/{key}": value for key, value in records.items()}
    cluster.apply(doc)

    def replaced():
        annotations = cluster.kube.get(fis_path(namespace, "records"))["metadata"].get("annotations") or {}
        base = annotations.get("serving.flotilla.dev/last-handled-configuration", "")
        return base.startswith('{"sha256":') and "serving.flotilla.dev/reconcile" not in annotations
    wait_for(replaced, 60, "kopf's own records in place of the author's")
    assert "unexpected error" not in operator_process.log_path.read_text(errors="replace")
