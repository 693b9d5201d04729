"""The admission webhooks on a real apiserver: invalid specs refused with the exact message, defaults
written, failure policy Ignore (the reconciler still refuses what slipped through: see
test_operator_resilience.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flotilla.operator.deployment import build_deployment
from flotilla.operator.kube import KubeError
from flotilla.operator.spec import InferenceServiceSpec

from .conftest import FIS_PATH, WEBHOOK_CONFIGURATION, wait_for
from .test_operator_reconcile import _deployment_scaled_by_the_autoscaler, fis, fis_path, fixed, wait_children

# llm-compressor's W4A16 quantization_config (int4 weights in groups of 128), as an --hf-overrides value.
W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}
DENIED = f'admission webhook "validate.{WEBHOOK_CONFIGURATION}" denied the request: InferenceService bad is invalid: '
INVALID = {
    "gpus-vs-parallelism": (
        {"resources": {"gpusPerReplica": 2, "gpuProduct": "NVIDIA-H200"}},
        "resources.gpusPerReplica (2) must equal parallelism.tensor x parallelism.pipeline (1 x 1 = 1)"),
    "autoscaling-min-over-max": (
        {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
        "autoscaling.minReplicas (5) must not exceed autoscaling.maxReplicas (2)"),
    "fp8-kv-cache-with-float32": (
        {"dtype": "float32", "kvCache": {"dtype": "fp8"}},
        "spec.kvCache.dtype: fp8 needs 16-bit activations; set spec.dtype to bfloat16, float16 or auto, or "
        "spec.kvCache.dtype to auto"),
    "unsupported-quantization": (
        {"quantization": "int8"},
        "spec.quantization: --quantization='int8' is not supported yet (supported: fp8, rtn, awq, gptq, "
        "compressed-tensors, gguf, bitsandbytes)"),
    "gguf-with-a-checkpoint-directory": (
        {"quantization": "gguf"},
        "spec.quantization: gguf serves one .gguf file as the model, but spec.model.source "
        "pvc://models/llama-3.1-8b-instruct names a checkpoint directory; point it at the file "
        "(pvc://claim/dir/model.gguf, hostPath:///dir/model.gguf or hf://org/name/model.gguf), or choose another "
        "quantization"),
    "gguf-file-with-fp8": (
        {"quantization": "fp8", "model": {"source": "pvc://models/gguf/llama-8b.Q4_1.gguf"}},
        "spec.quantization: fp8: a .gguf model (pvc://models/gguf/llama-8b.Q4_1.gguf) serves its own quantized "
        "weights; leave spec.quantization out or set it to gguf"),
    "parallelism-that-does-not-split-the-model": (
        {"parallelism": {"tensor": 3}, "resources": {"gpusPerReplica": 3, "gpuProduct": "NVIDIA-H200"}},
        "spec.parallelism: tensor parallel size 3 does not divide the model's 32 attention heads, 8 KV heads "
        "(nor replicated evenly), MLP width 14336"),
    "pooling-with-lora": (
        {"runner": "pooling", "lora": {"adapters": [{"name": "sql", "source": "pvc://adapters/sql"}]}},
        "spec.runner pooling serves embeddings on one GPU, without LoRA adapters or speculative decoding: "
        "remove spec.lora"),
    "pooling-with-speculative-decoding": (
        {"runner": "pooling", "speculative": {"method": "ngram", "numTokens": 4}},
        "spec.runner pooling serves embeddings on one GPU, without LoRA adapters or speculative decoding: "
        "remove spec.speculative"),
    "pooling-with-tensor-parallelism": (
        {"runner": "pooling", "parallelism": {"tensor": 2}, "resources": {"gpusPerReplica": 2,
                                                                          "gpuProduct": "NVIDIA-H200"}},
        "spec.runner pooling serves embeddings on one GPU, without LoRA adapters or speculative decoding: "
        "set spec.parallelism.tensor to 1"),
    "unknown-engine-arg": (
        {"engineArgs": ["--swap-space", "4"]},
        "spec.engineArgs: --swap-space is not an engine flag"),
    "flag-set-by-a-field": (
        {"engineArgs": ["--max-model-len=4096"]},
        "spec.engineArgs: --max-model-len is set by spec.scheduling.maxModelLen; set that field instead"),
    "engine-arg-past-linux-limit": (
        {"engineArgs": ["--chat-template", "{{ m }}" + "a" * (131_072 - 7)]},
        "spec.engineArgs[1] is 131073 bytes long with its closing NUL; Linux starts a program only with arguments of "
        "at most 131072 bytes each (128 KiB, MAX_ARG_STRLEN), so the engine would never start: shorten it"),
    "env-string-past-linux-limit": (
        {"pod": {"env": [{"name": "BULK", "value": "é" * 65_534}]}},
        "spec.pod.env[0] (BULK=...) is 131074 bytes long with its closing NUL; Linux starts a program only with "
        "environment strings of at most 131072 bytes each (128 KiB, MAX_ARG_STRLEN), so the engine would never "
        "start: shorten it"),
    # The kubelet expands $(A) before the engine starts: 12 bytes in the spec, 200 kB in the pod.
    "env-expanding-past-linux-limit": (
        {"pod": {"env": [{"name": "A", "value": "a" * 100_000}, {"name": "B", "value": "$(A)$(A)"}]}},
        "spec.pod.env[1] (B=...) is 200003 bytes long with its closing NUL once the kubelet replaces its $(...) "
        "references; Linux starts a program only with environment strings of at most 131072 bytes each (128 KiB, "
        "MAX_ARG_STRLEN), so the engine would never start: shorten it"),
    # Each string under 128 KiB, all of them past 2 MiB (ARG_MAX) once expanded, from 100 kB of spec.
    "exec-total-past-linux-limit": (
        {"pod": {"env": [{"name": "A", "value": "a" * 100_000}, *({"name": f"R{i}", "value": "$(A)"}
                                                                   for i in range(20))]}},
        "the engine's arguments (667 bytes) and environment (2100339 bytes), counted as Linux counts them (each "
        "string, its NUL and an 8-byte pointer) once the kubelet expands $(...), come to 2101006 bytes; Linux starts "
        "a program with at most 2097152 (a quarter of the default 8 MiB stack limit, ARG_MAX), and 65536 of them are "
        "left for the image's and the kubelet's variables, so the engine would never start: shorten spec.engineArgs "
        "or spec.pod.env"),
    # The apiserver refuses a negative request or limit in the Deployment (422 "must be greater than or equal to 0").
    "negative-cpu": ({"resources": {"cpu": -1}}, "resources.cpu (-1) must be at least 0"),
    "negative-memory": ({"resources": {"memory": -5}}, "resources.memory (-5) must be at least 0"),
    "does-not-fit": (
        {"scheduling": {"maxModelLen": 131072, "maxNumSeqs": 64, "maxNumBatchedTokens": 131072},
         "kvCache": {"blockSize": 16, "gpuMemoryUtilization": 0.2}},
        "fit check: one 131072-token sequence needs 16.0 GiB of KV cache but only 1.1 GiB is left after weights "
        "(15.0 GiB) and activations on 1 x NVIDIA-H200 at gpuMemoryUtilization 0.2 (28.1 GiB); lower "
        "scheduling.maxModelLen to 8944 or less, add GPUs, or quantize"),
    "quantization-config-override-against-spec-quantization": (
        {"quantization": "fp8", "engineArgs": ["--hf-overrides", json.dumps({"quantization_config": W4A16})]},
        "spec.engineArgs: --hf-overrides: quantization_config's quant_method 'compressed-tensors' does not match "
        "spec.quantization fp8; the engine refuses to start with both: leave spec.quantization out or make them "
        "agree"),
    "quantization-config-without-quant-method-against-spec-quantization": (
        {"quantization": "fp8", "engineArgs": ["--hf-overrides", json.dumps({"quantization_config": {"bits": 4}})]},
        "spec.engineArgs: --hf-overrides: quantization_config has no quant_method, which does not match "
        "spec.quantization fp8; the engine refuses to start with both: leave spec.quantization out or name the "
        "scheme in quant_method"),
    # the engine's own reader of the fields (flotilla/quantization_config.py) refuses it, and the webhook says its words
    "quantization-config-override-modelopt-nvfp4": (
        {"engineArgs": ["--hf-overrides", json.dumps({"quantization_config": {"quant_method": "modelopt",
                                                                             "quant_algo": "NVFP4"}})]},
        "spec.engineArgs: --hf-overrides: quantization_config: modelopt quant_algo 'NVFP4' is not supported; FP8 "
        "(per-tensor e4m3 weights, static input scales) and FP8_PER_CHANNEL_PER_TOKEN are"),
    "quantization-config-override-gptq-group-size-no-number": (
        {"engineArgs": ["--hf-overrides", json.dumps({"quantization_config": {"quant_method": "gptq",
                                                                             "group_size": "g128"}})]},
        "spec.engineArgs: --hf-overrides: quantization_config: gptq's group_size 'g128' is not a number of inputs"),
    "quantization-config-override-compressed-tensors-group-size-no-number": (
        {"engineArgs": ["--hf-overrides", json.dumps({"quantization_config": {
            "quant_method": "compressed-tensors", "config_groups": {"g": {
                "targets": ["Linear"], "format": "pack-quantized",
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": "64"}}}}})]},
        "spec.engineArgs: --hf-overrides: quantization_config: compressed-tensors: weights' group_size '64' is not a "
        "number of inputs (strategy group)"),
    # a layout the engine does not run (flotilla/quantization_config.py check_layout): refused here, not a crash loop
    "quantization-config-override-gptq-desc-act-over-tensor-ranks": (
        {"engineArgs": ["--hf-overrides", json.dumps({"quantization_config": {"quant_method": "gptq",
                                                                             "desc_act": True}})],
         "parallelism": {"tensor": 2}, "resources": {"gpusPerReplica": 2, "gpuProduct": "NVIDIA-H200"}},
        "spec.engineArgs: --hf-overrides: quantization_config: gptq activation-order checkpoints (desc_act: true / "
        "actorder group: groups of permuted inputs, g_idx) run with spec.parallelism.tensor 1 only, not 2: the "
        "row-parallel layers would split the permuted inputs over the ranks (pipeline parallelism runs them)"),
}


def _create(cluster, doc: dict[str, Any]) -> dict[str, Any]:
    ns = doc["metadata"]["namespace"]
    return cluster.kube.request("POST", f"{FIS_PATH}/namespaces/{ns}/inferenceservices", doc)


@pytest.mark.parametrize("case", INVALID, ids=list(INVALID))
def test_invalid_spec_is_refused_with_the_exact_message(operator_process, cluster, namespace, case):
    change, message = INVALID[case]
    doc = fis("bad", namespace, **{"autoscaling": None, **change})
    with pytest.raises(KubeError) as refused:
        _create(cluster, doc)
    assert refused.value.status == 422
    assert refused.value.message == DENIED + message
    assert cluster.kube.get(fis_path(namespace, "bad")) is None


def test_a_quantization_config_override_is_counted_at_its_bits_by_the_fit_check(operator_process, cluster,
                                                                                 namespace):
    """A 131,072-token sequence does not fit the bf16 weights (15.0 GiB) at gpuMemoryUtilization 0.3; it fits with
    an --hf-overrides W4A16 quantization_config, which the engine loads at 4 bits (5.4 GiB), and status says so."""
    change = {"scheduling": {"maxModelLen": 131072, "maxNumSeqs": 64, "maxNumBatchedTokens": 131072},
              "kvCache": {"blockSize": 16, "gpuMemoryUtilization": 0.3}, "autoscaling": None}
    with pytest.raises(KubeError) as refused:
        _create(cluster, fis("dense", namespace, **change))
    assert refused.value.status == 422 and "after weights (15.0 GiB)" in refused.value.message
    override = ["--hf-overrides", json.dumps({"quantization_config": W4A16})]
    _create(cluster, fis("quantized", namespace, engineArgs=override, **change))
    fit = wait_for(lambda: (cluster.kube.get(fis_path(namespace, "quantized")).get("status") or {}).get("fit"), 60,
                   "status.fit")
    assert fit["verdict"] != "DoesNotFit" and fit["weightBytes"] < 6 * 2**30, fit


def test_an_engine_argument_just_under_linuxs_limit_is_admitted_and_deployed(operator_process, cluster, namespace):
    """The longest argument Linux starts a program with (131,071 bytes and the NUL; one byte more is refused above) is
    admitted and reaches the Deployment's arguments unchanged."""
    template = "{{ m }}" + "a" * (131_071 - 7)
    _create(cluster, fis("edge", namespace, autoscaling=None, engineArgs=["--chat-template", template]))
    pods = wait_children(cluster, namespace, "edge", ["Deployment"])["Deployment"]["spec"]["template"]["spec"]
    assert pods["containers"][0]["args"][-1] == template


def test_an_argument_with_dollars_reaches_the_pod_escaped_from_the_kubelets_expansion(
        operator_process, cluster, namespace):
    """The kubelet rewrites `$(NAME)` in a container's args to the variable's value and `$$` to `$`: a chat template
    with LaTeX's `$$` or a `$(HOME)` would reach the engine changed (the operator's checks saw the text as written).
    The Deployment carries each '$' doubled, which the kubelet turns back into the text as written."""
    template = "{{ 'Display math: $$x$$; home: $(HOME); a lone $' }}"
    _create(cluster, fis("dollars", namespace, autoscaling=None, engineArgs=["--chat-template", template]))
    pods = wait_children(cluster, namespace, "dollars", ["Deployment"])["Deployment"]["spec"]["template"]["spec"]
    assert pods["containers"][0]["args"][-1] == (
        "{{ 'Display math: $$$$x$$$$; home: $$(HOME); a lone $$' }}")


def test_an_update_to_an_invalid_spec_is_refused_and_nothing_changes(operator_process, cluster, namespace):
    cluster.apply(fixed("bad", namespace))
    with pytest.raises(KubeError) as refused:
        cluster.apply(fis("bad", namespace, autoscaling={"minReplicas": 3, "maxReplicas": 1}))
    assert refused.value.message == DENIED + "autoscaling.minReplicas (3) must not exceed autoscaling.maxReplicas (1)"
    assert "autoscaling" not in cluster.kube.get(fis_path(namespace, "bad"))["spec"]


def _patch_warnings(cluster, path: str, patch: dict[str, Any]) -> str:
    """A merge patch of `path`, as `kubectl patch --type merge` sends it; returns the response's Warning headers (the
    admission webhooks' warnings, which kubectl prints), joined."""
    serialized = cluster.kube.api.param_serialize(
        "PATCH", path, header_params={"Accept": "application/json", "Content-Type": "application/merge-patch+json"},
        body=patch, auth_settings=["BearerToken"])
    response = cluster.kube.api.call_api(*serialized, _request_timeout=30)
    response.read()
    assert response.status == 200, response.data
    return ", ".join(response.headers.getlist("Warning"))


def test_the_replicas_warning_comes_only_with_a_request_that_sets_spec_replicas(operator_process, cluster, namespace):
    """While autoscaling is on, the operator copies the autoscaler's count into spec.replicas. An update lowering only
    maxReplicas under that count drew "spec.replicas (5) has no effect", though the user never set 5."""
    cluster.set_optional_crds(False)
    cluster.apply(fis("auto", namespace, replicas=None, autoscaling={"minReplicas": 2, "maxReplicas": 6, "target": 4}))
    wait_children(cluster, namespace, "auto", ["Deployment", "HorizontalPodAutoscaler"])
    _deployment_scaled_by_the_autoscaler(cluster, namespace, "auto", 5)
    wait_for(lambda: cluster.kube.get(fis_path(namespace, "auto"))["spec"]["replicas"] == 5, 30,
             "the autoscaler's 5 copied into spec.replicas")

    path = fis_path(namespace, "auto")
    assert _patch_warnings(cluster, path, {"spec": {"autoscaling": {"maxReplicas": 4}}}) == ""
    assert cluster.kube.get(path)["spec"]["autoscaling"]["maxReplicas"] == 4
    warned = _patch_warnings(cluster, path, {"spec": {"replicas": 9}})
    assert "spec.replicas (9) has no effect while autoscaling is set: the autoscaler keeps 2 to 4 replicas" in warned


def test_defaulting_webhook_fills_served_name_and_gpus(operator_process, cluster, namespace):
    created = _create(cluster, {"apiVersion": "serving.flotilla.dev/v1alpha1", "kind": "InferenceService",
                                "metadata": {"name": "smollm2", "namespace": namespace},
                                "spec": {"model": {"source": "pvc://models/smollm2"}}})
    assert created["spec"]["model"]["servedName"] == "smollm2"
    assert created["spec"]["resources"]["gpusPerReplica"] == 1


def test_webhook_configurations_state_failure_policy_ignore(operator_process, cluster):
    # Validation; the defaults and the admin's engine image (the session's operator runs with --engine-image).
    for kind, count in (("validatingwebhookconfigurations", 1), ("mutatingwebhookconfigurations", 2)):
        config = cluster.kube.get(f"/apis/admissionregistration.k8s.io/v1/{kind}/{WEBHOOK_CONFIGURATION}")
        assert [w["failurePolicy"] for w in config["webhooks"]] == ["Ignore"] * count
        for hook in config["webhooks"]:
            assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
            assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:")


@pytest.mark.parametrize(("namespace", "namespaces", "served"), [
    ("team-a", [], True), ("team-a", ["team-a"], True), ("team-b", ["team-a"], False), ("team-b", ["team-*"], True),
    ("other", ["team-*", "x"], False), ("", ["team-a"], True), (None, ["team-a"], True)])
def test_the_webhooks_serve_the_operators_namespaces_and_an_unnamed_one(namespace, namespaces, served):
    # A namespace the object does not name (a 1.20 apiserver passes the client's object as it came) is reviewed.
    from flotilla.operator.webhook import serves

    assert serves(namespace, namespaces) is served


def bulk_env(fill: str, size: int) -> list[dict[str, str]]:
    """`size` characters of `fill` as engine environment variables (spec.pod.env), each well under Linux's 128 KiB
    per exec string, which the webhook refuses beyond (exec_size.py): the bulk of a large but startable spec."""
    chunk = 100_000
    return [{"name": f"BULK_{i}", "value": fill * min(chunk, size - start)}
            for i, start in enumerate(range(0, size, chunk))]


@pytest.mark.parametrize("size", [600_000, 1_300_000], ids=["600kB", "1.3MB"])
def test_an_update_too_large_for_kopfs_default_limit_is_still_reviewed(operator_process, cluster, namespace, size):
    """An UPDATE's review carries the object twice. With kopf's (aiohttp's) 1 MiB request limit, two 600 kB specs drew
    a 413 and failurePolicy Ignore admitted the invalid update unreviewed. Now a review of two objects near etcd's
    1.5 MiB limit (1.3 MB each) is read and refused like any other (webhook_server.py)."""
    path = fis_path(namespace, "big")
    cluster.apply({**fixed("big", namespace), "spec": {**fixed("big", namespace)["spec"],
                                                       "pod": {"env": bulk_env("a", size)}}})
    patch = {"spec": {"autoscaling": {"minReplicas": 3, "maxReplicas": 1}, "pod": {"env": bulk_env("b", size)}}}
    with pytest.raises(KubeError) as refused:
        cluster.kube.request("PATCH", path, patch, content_type="application/merge-patch+json")
    assert refused.value.message == (DENIED.replace("InferenceService bad", "InferenceService big")
                                     + "autoscaling.minReplicas (3) must not exceed autoscaling.maxReplicas (1)")
    stored = cluster.kube.get(path)["spec"]
    assert "autoscaling" not in stored and stored["pod"]["env"][-1]["value"].endswith("a")
    assert sum(len(e["value"]) for e in stored["pod"]["env"]) == size


def test_an_admin_list_of_service_accounts_is_kept_at_admission(operator_process, cluster, namespace):
    """With --service-account (chart: operator.serviceAccounts.allowed) the engine pods may run only as a listed
    account: workload identity gives them its cloud role although no token is mounted."""
    operator_process.stop()
    try:
        operator_process.start(extra_args=("--service-account", "model-reader"))
        with pytest.raises(KubeError) as refused:
            _create(cluster, fis("bad", namespace, autoscaling=None, pod={"serviceAccountName": "cloud-admin"}))
        assert refused.value.status == 422
        assert refused.value.message == DENIED + (
            "spec.pod.serviceAccountName: cloud-admin is not a ServiceAccount this cluster allows InferenceServices "
            "(model-reader): a cloud's workload identity gives the pods the account's role; leave the field out for "
            "the namespace's default, or ask the cluster admin to allow it (operator flag --service-account, chart "
            "value operator.serviceAccounts.allowed)")
        _create(cluster, fis("good", namespace, autoscaling=None, pod={"serviceAccountName": "model-reader"}))
        pods = wait_children(cluster, namespace, "good", ["Deployment"])["Deployment"]["spec"]["template"]["spec"]
        assert pods["serviceAccountName"] == "model-reader" and pods["automountServiceAccountToken"] is False
    finally:
        operator_process.stop()
        operator_process.start()
    # The session's operator (no list): any account of the namespace, as for a Pod.
    _create(cluster, fis("any", namespace, autoscaling=None, pod={"serviceAccountName": "cloud-admin"}))


# Spellings the CRD's older quantity pattern let through that Kubernetes' quantity parser refuses: the apiserver then
# refused the engine Deployment after admission, and no pod was ever made.
NOT_QUANTITIES = ["1..0", "5kk", "1Gi5", "1e", "8gi", "1e1.5", "2Ki3"]


def make_spec(**spec: Any) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"source": "pvc://models/m"}, **spec})


@pytest.mark.parametrize("text", NOT_QUANTITIES)
def test_a_size_kubernetes_cannot_parse_is_refused_at_admission(operator_process, cluster, namespace, text):
    deployment = build_deployment(make_spec(resources={**fis("q", namespace)["spec"]["resources"], "shmSize": "1Gi"}),
                                  "q", namespace)
    deployment["spec"]["template"]["spec"]["volumes"][1]["emptyDir"]["sizeLimit"] = text
    with pytest.raises(KubeError) as refused:  # the apiserver's own parser refuses it in a pod template
        cluster.kube.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)
    assert refused.value.status == 400 and "cannot be handled as a Deployment" in refused.value.message
    for field in ("shmSize", "tmpSize", "cpu", "memory"):
        doc = fis("bad", namespace, autoscaling=None)
        doc["spec"]["resources"][field] = text
        with pytest.raises(KubeError) as refused:
            _create(cluster, doc)
        assert refused.value.status == 422, field
        # The CRD's pattern (cpu and memory, int-or-string, by the webhook's review) refuses it, naming the value.
        assert f'"{text}"' in refused.value.message or repr(text) in refused.value.message, refused.value.message
        assert cluster.kube.get(fis_path(namespace, "bad")) is None


# Secret and ConfigMap references the apiserver refuses in a pod (IsConfigMapKey, a DNS subdomain for the Secret's
# name): admitted, their Deployment was refused after admission and no pod was made. (name, key) of each.
BAD_REFS = {
    "env-secret-key": ({"pod": {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s",
                                                                                     "key": "bad key"}}}]}},
                       ("s", "bad key")),
    "env-configmap-key": ({"pod": {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c",
                                                                                           "key": "a/b"}}}]}},
                          ("c", "a/b")),
    "env-key-dot-dot": ({"pod": {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": ".."}}}]}},
                        ("s", "..")),
    "api-key-secret-key": ({"apiKeySecretRef": {"name": "s", "key": "a/b"}}, ("s", "a/b")),
    "api-key-secret-name": ({"apiKeySecretRef": {"name": "Bad_Name"}}, ("Bad_Name", "token")),
}


@pytest.mark.parametrize("case", BAD_REFS, ids=list(BAD_REFS))
def test_a_secret_or_configmap_reference_a_pod_cannot_hold_is_refused_at_admission(operator_process, cluster, namespace,
                                                                                    case):
    change, (name, key) = BAD_REFS[case]
    # The apiserver's own rule: a pod template referring to that key (or Secret name) is refused.
    deployment = build_deployment(make_spec(pod={"env": [{"name": "X", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}}}]}), "r", namespace)
    deployment["spec"]["template"]["spec"]["containers"][0]["env"][-1]["valueFrom"]["secretKeyRef"] = {
        "name": name, "key": key}
    with pytest.raises(KubeError) as refused:
        cluster.kube.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)
    assert refused.value.status == 422 and "valueFrom.secretKeyRef" in refused.value.message
    # The InferenceService is refused at admission (the CRD's pattern, or the webhook's review).
    with pytest.raises(KubeError) as refused:
        _create(cluster, fis("bad", namespace, autoscaling=None, **change))
    bad = name if case == "api-key-secret-name" else key
    assert refused.value.status == 422 and f'"{bad}"' in refused.value.message, refused.value.message
    assert cluster.kube.get(fis_path(namespace, "bad")) is None
