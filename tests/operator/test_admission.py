"""admission.review: the rules the webhook and the reconciler share (no cluster)."""

from __future__ import annotations

import pytest

from flotilla.operator.admission import replicas_notes, review
from flotilla.operator.engine_args import engine_args

BASE = {"model": {"source": "pvc://m"}}


def test_a_valid_spec_has_no_errors():
    assert review(BASE, "x").errors == []


def test_every_error_is_reported_not_only_the_first():
    result = review({**BASE, "dtype": "float32", "kvCache": {"dtype": "fp8"}, "engineArgs": ["--nope"]}, "x")
    assert len(result.errors) == 2  # fp8 KV with float32 activations, and the unknown flag
    assert result.message == "; ".join(result.errors)


def test_unparsable_spec_names_the_field():
    assert review({**BASE, "replicas": "two"}, "x").errors == [
        "spec.replicas: Input should be a valid integer, unable to parse string as an integer"]


def test_low_concurrency_is_a_warning_not_an_error():
    spec = {**BASE, "resources": {"gpuProduct": "NVIDIA-L4"}, "scheduling": {"maxModelLen": 4096, "maxNumSeqs": 256},
            "model": {"source": "pvc://m", "config": {
                "hiddenSize": 4096, "numHiddenLayers": 36, "numAttentionHeads": 32, "numKeyValueHeads": 8,
                "headDim": 128, "intermediateSize": 12288, "vocabSize": 151936}}}
    result = review(spec, "x")
    assert result.errors == [] and result.warnings[0].startswith("fit check: only ")


NOTE_20 = ("spec.replicas (20) has no effect while autoscaling is set: the autoscaler keeps 2 to 4 replicas (raise "
           "autoscaling.maxReplicas instead); only spec.replicas 0 overrides it, scaling to zero until it is 1 or more "
           "again")


@pytest.mark.parametrize(("replicas", "old", "warned"), [
    (0, None, False), (1, None, False), (4, None, False), (20, None, True),  # a CREATE
    (20, {"replicas": 3}, True),  # an UPDATE setting it
    (20, {"replicas": 20}, False),  # an UPDATE leaving it as stored (the operator's copy of the autoscaler's count)
])
def test_replicas_past_the_autoscalers_maximum_set_by_the_request_are_a_warning_that_they_change_nothing(
        replicas, old, warned):
    """An edit setting spec.replicas 20 on an autoscaled InferenceService changes nothing (only 0 overrides the
    autoscaler): the webhook says so. A count the request leaves as stored is the operator's copy of the autoscaler's,
    not the user's: lowering maxReplicas under it drew the warning."""
    spec = review({**BASE, "replicas": replicas, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}, "x").spec
    assert spec is not None
    assert replicas_notes(spec, old) == ([NOTE_20] if warned else [])


def test_the_reconcilers_review_does_not_warn_about_a_count_it_cannot_tell_the_writer_of():
    result = review({**BASE, "replicas": 20, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}, "x")
    assert (result.errors, result.warnings) == ([], [])


@pytest.mark.parametrize(("name", "problem"), [
    ("1llama", "must be a DNS-1035 label"),
    ("llama.3", "must be a DNS-1035 label"),
    ("Llama", "must be a DNS-1035 label"),
    ("llama-", "must be a DNS-1035 label"),
    ("a" * 64, "is 64 characters long; the limit is 63 (it names the Service and is a label value)"),
])
def test_names_that_cannot_name_a_service_are_refused_with_the_rule(name, problem):
    errors = review(BASE, name).errors
    assert len(errors) == 1 and errors[0].startswith(f"metadata.name {name!r} ") and problem in errors[0]


def test_the_longest_valid_name_is_admitted():
    assert review(BASE, "a" * 63).errors == []


@pytest.mark.parametrize("product", ["NVIDIA H200", "x" * 64, "-H200", "H200/"])
def test_a_gpu_product_that_is_no_label_value_is_refused(product):
    errors = review({**BASE, "resources": {"gpuProduct": product}}, "x").errors
    assert errors and errors[0].startswith("spec.resources.gpuProduct: ")


@pytest.mark.parametrize(("pod", "error"), [
    ({"env": [{"name": "HF_HUB_OFFLINE", "value": "0"}]}, "spec.pod.env: HF_HUB_OFFLINE is set by the operator"),
    ({"env": [{"name": "VLLM_API_KEY", "value": ""}]}, "spec.pod.env: VLLM_API_KEY is set by the operator"),
    ({"env": [{"name": "X"}]}, "env X: set exactly one of value, valueFrom.secretKeyRef, valueFrom.configMapKeyRef"),
    ({"env": [{"name": "X", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
     "env X: set exactly one of"),
    ({"envFrom": [{"prefix": "A"}]}, "envFrom: set exactly one of secretRef and configMapRef"),
    ({"labels": {"serving.flotilla.dev/inferenceservice": "other"}},
     "spec.pod.labels: serving.flotilla.dev/inferenceservice is set by the operator"),
    ({"labels": {"app.kubernetes.io/managed-by": "me"}}, "spec.pod.labels: app.kubernetes.io/managed-by is set by"),
    ({"serviceAccountName": "Not_A_Name"}, "spec.pod.serviceAccountName: String should match pattern"),
])
def test_pod_extras_that_would_override_the_operator_are_refused(pod, error):
    assert error in review({**BASE, "pod": pod}, "x").message


@pytest.mark.parametrize(("spec", "error"), [
    ({"pod": {"labels": {"team": "ml/x"}}},
     "spec.pod.labels: the value of team, 'ml/x', is not a valid label value"),
    ({"pod": {"labels": {"example.com/bad key": "x"}}},
     "spec.pod.labels: 'example.com/bad key' is not a valid label key: its name 'bad key' must be 1 to 63"),
    ({"pod": {"annotations": {"bad key": "any text"}}},
     "spec.pod.annotations: 'bad key' is not a valid annotation key"),
    ({"monitoring": {"labels": {"release": "kube prometheus"}}},
     "spec.monitoring.labels: the value of release, 'kube prometheus', is not a valid label value"),
    ({"resources": {"nodeSelector": {"bad key!": "x"}}},
     "spec.resources.nodeSelector: 'bad key!' is not a valid label key"),
    ({"resources": {"nodeSelector": {"pool": "v" * 64}}},
     "spec.resources.nodeSelector: the value of pool, '" + "v" * 64 + "', is not a valid label value: it is 64 "
     "characters long; the limit is 63"),
])
def test_labels_the_apiserver_would_refuse_in_the_children_are_refused_naming_the_field(spec, error):
    # Admitted, they reached status as ApplyRefused; each is one error (not also a policy one for a key that is none).
    errors = review({**BASE, **spec}, "x").errors
    assert len(errors) == 1 and errors[0].startswith(error), errors


def test_a_rollout_that_cannot_start_a_pod_is_refused():
    assert "rollout.maxSurge and rollout.maxUnavailable cannot both be 0" in review(
        {**BASE, "rollout": {"maxSurge": 0, "maxUnavailable": 0}}, "x").message


LLAMA_70B = {"hiddenSize": 8192, "numHiddenLayers": 80, "numAttentionHeads": 64, "numKeyValueHeads": 8,
             "headDim": 128, "intermediateSize": 28672, "vocabSize": 128256, "maxPositionEmbeddings": 131072}


def test_llama_70b_over_two_h200s_is_admitted_and_fits():
    spec = {"model": {"source": "pvc://m", "config": LLAMA_70B}, "parallelism": {"tensor": 2},
            "resources": {"gpusPerReplica": 2, "gpuProduct": "NVIDIA-H200"}, "scheduling": {"maxModelLen": 8192}}
    result = review(spec, "x")
    assert result.errors == []
    assert result.fit is not None and result.fit.verdict in ("Fits", "FitsWithWarning")
    alone = review({**spec, "parallelism": {"tensor": 1}, "resources": {"gpusPerReplica": 1,
                                                                        "gpuProduct": "NVIDIA-H200"}}, "x")
    assert alone.errors and alone.errors[0].startswith("fit check: weights")


def test_a_tensor_size_that_does_not_split_the_heads_is_refused():
    spec = {"model": {"source": "pvc://m", "config": LLAMA_70B}, "parallelism": {"tensor": 3},
            "resources": {"gpusPerReplica": 3, "gpuProduct": "NVIDIA-H200"}}
    assert review(spec, "x").errors == [
        "spec.parallelism: tensor parallel size 3 does not divide the model's 64 attention heads, "
        "8 KV heads (nor replicated evenly), MLP width 28672"]


def test_more_stages_than_layers_are_refused():
    config = {**LLAMA_70B, "numHiddenLayers": 2}
    spec = {"model": {"source": "pvc://m", "config": config}, "parallelism": {"pipeline": 4},
            "resources": {"gpusPerReplica": 4, "gpuProduct": "NVIDIA-H200"}}
    assert "spec.parallelism: pipeline parallel size 4 exceeds the model's 2 layers" in review(spec, "x").errors


def test_a_replica_wider_than_one_node_is_refused():
    spec = {**BASE, "parallelism": {"tensor": 8, "pipeline": 2}, "resources": {"gpusPerReplica": 16}}
    assert review(spec, "x").errors == [
        "spec.parallelism: tensor x pipeline = 16 GPUs, but a replica runs in one pod on one node (at most 8 "
        "GPUs); multi-node serving is not supported yet"]


@pytest.mark.parametrize(("env", "problem"), [
    ({"RTN_NUM_BITS": "5"}, "spec.pod.env: RTN_NUM_BITS=5: --quantization rtn quantizes to 4 or 8 bits"),
    ({"RTN_GROUP_SIZE": "0"}, "spec.pod.env: RTN_GROUP_SIZE=0: a positive number of inputs, or -1 for one group a row"),
    ({"RTN_GROUP_SIZE": "100"}, "spec.pod.env: RTN_GROUP_SIZE=100 does not divide the model's layer inputs "
                                "(576, 1536); pick a divisor of them, or -1 for one group a row"),
])
def test_rtn_settings_the_engine_would_refuse_are_refused(env, problem):
    """spec.quantization rtn with RTN_* values the engine refuses at start-up (SmolLM2-135M's widths when the
    model's numbers are given) is refused at admission, not rolled out into a crash loop."""
    arch = {"hiddenSize": 576, "intermediateSize": 1536, "numAttentionHeads": 9, "numKeyValueHeads": 3,
            "numHiddenLayers": 30, "vocabSize": 49152}
    pod = {"env": [{"name": k, "value": v} for k, v in env.items()]}
    spec = {**BASE, "model": {**BASE["model"], "config": arch}, "quantization": "rtn", "pod": pod}
    assert problem in review(spec, "x").errors
    ok = {**spec, "pod": {"env": [{"name": "RTN_NUM_BITS", "value": "4"}, {"name": "RTN_GROUP_SIZE", "value": "32"}]}}
    assert not [e for e in review(ok, "x").errors if "RTN_" in e]
    assert review({**spec, "quantization": "none"}, "x").errors == review({**BASE, "model": spec["model"]}, "x").errors


# --- GGUF models -----------------------------------------------------------------------------------
GGUF = "pvc://models/gguf/Llama-3.1-8B-Instruct-Q4_1.gguf"


@pytest.mark.parametrize("source", [GGUF, "hf://org/llama-gguf/Llama-Q4_0.gguf", "hf://org/llama-gguf/q4/L.gguf"])
@pytest.mark.parametrize("quantization", ["none", "gguf"])
def test_a_gguf_file_is_admitted_with_gguf_or_no_quantization(source, quantization):
    assert review({"model": {"source": source}, "quantization": quantization}, "x").errors == []


def test_gguf_needs_a_gguf_file():
    assert review({"model": {"source": "pvc://models/llama"}, "quantization": "gguf"}, "x").errors == [
        "spec.quantization: gguf serves one .gguf file as the model, but spec.model.source pvc://models/llama names "
        "a checkpoint directory; point it at the file (pvc://claim/dir/model.gguf, hostPath:///dir/model.gguf or "
        "hf://org/name/model.gguf), or choose another quantization"]
    # A claim whose own name ends in .gguf is still a directory: the file is a path inside the claim.
    assert review({"model": {"source": "pvc://weights.gguf"}, "quantization": "gguf"}, "x").errors[0].startswith(
        "spec.quantization: gguf serves one .gguf file")


@pytest.mark.parametrize("quantization", ["fp8", "rtn", "awq", "gptq", "compressed-tensors"])
def test_a_gguf_file_with_another_quantization_is_refused(quantization):
    assert review({"model": {"source": GGUF}, "quantization": quantization}, "x").errors == [
        f"spec.quantization: {quantization}: a .gguf model ({GGUF}) serves its own quantized weights; leave "
        "spec.quantization out or set it to gguf"]


@pytest.mark.parametrize(("extra", "error"), [
    ({"speculative": {"method": "draft_model", "draftModel": "/model/draft"}},
     "spec.speculative: a draft model beside a .gguf model is not supported yet (the engine loads the draft with "
     "the target's GGUF loader); use method ngram"),
])
def test_gguf_combinations_the_engine_cannot_start_are_refused(extra, error):
    assert review({"model": {"source": GGUF}, **extra}, "x").errors == [error]
    assert review({"model": {"source": "pvc://models/llama"}, **extra}, "x").errors == []


def test_an_ngram_proposer_beside_a_gguf_model_is_admitted():
    assert review({"model": {"source": GGUF}, "speculative": {"method": "ngram"}}, "x").errors == []


@pytest.mark.parametrize("quantization", ["none", "fp8", "rtn", "awq", "gptq", "compressed-tensors", "gguf"])
def test_lora_on_every_quantization_is_admitted(quantization):
    """The engine adds the adapters' deltas to the base layer's own quantized product (engine/lora/layers.py), so
    LoRA goes with every quantization, packed-code ones (rtn, awq, gptq, int4 compressed-tensors, gguf) included."""
    source = GGUF if quantization == "gguf" else "pvc://models/llama"
    spec = {"model": {"source": source}, "quantization": quantization,
            "lora": {"adapters": [{"name": "sql", "source": "pvc://adapters/sql"}]}}
    result = review(spec, "x")
    assert result.errors == [] and result.spec is not None
    assert "--enable-lora" in engine_args(result.spec, "x")


def test_gguf_blocks_must_split_over_the_tensor_ranks():
    """The engine's 4-bit GGUF layers take their inputs in blocks of 32 on every rank: Llama-70B's 8192 / 8 and
    28672 / 8 do; a model whose heads x head dim / tensor is not a multiple of 32 is refused (Q8_0 is dense)."""
    big = {"source": GGUF.replace("8B", "70B"), "config": LLAMA_70B}
    spec = {"model": big, "parallelism": {"tensor": 8}, "resources": {"gpuProduct": "NVIDIA-H200"}}
    assert review(spec, "x").errors == []
    odd = {**LLAMA_70B, "numAttentionHeads": 40, "numKeyValueHeads": 8, "headDim": 120}
    refused = review({**spec, "model": {**big, "config": odd}}, "x").errors
    assert refused == ["spec.parallelism.tensor: a GGUF 4-bit (Q4_0/Q4_1/Q4_K) layer splits its inputs into "
                       "blocks of 32 on every GPU, but numAttentionHeads x headDim / tensor = 600 is not a "
                       "multiple of 32; choose another tensor size"]
    dense = review({**spec, "model": {**big, "config": {**odd, "weightBits": 8}}}, "x").errors
    assert dense == []


@pytest.mark.parametrize("source", ["hf://org/name/../../etc/x.gguf", "hf://org/name/./x.gguf",
                                    "hf://org/name/x*.gguf", "hf://org/name/x.bin"])
def test_an_hf_file_path_that_could_leave_the_download_is_refused(source):
    errors = review({"model": {"source": source}}, "x").errors
    assert len(errors) == 1 and errors[0].startswith("spec.model.source: ")


def test_a_tokenizer_on_a_node_is_checked_by_the_host_path_policy():
    assert review({"model": {"source": GGUF, "tokenizer": "hostPath:///models/llama"}}, "x").errors[0].startswith(
        "spec.model.tokenizer: hostPath model sources are turned off on this cluster")
    assert review({"model": {"source": GGUF, "tokenizer": "hf://org/name/tokenizer.gguf"}}, "x").errors[0].startswith(
        "spec.model.tokenizer: String should match pattern")  # a directory, never a file


def test_a_gguf_file_on_a_node_is_checked_by_the_host_path_policy():
    from flotilla.operator.policy import AdmissionPolicy

    policy = AdmissionPolicy(host_path_prefixes=("/models/gguf/llama.gguf",))
    assert review({"model": {"source": "hostPath:///models/gguf/llama.gguf"}}, "x", policy).errors == []
    assert review({"model": {"source": "hostPath:///models/gguf/other.gguf"}}, "x", policy).errors == [
        "spec.model.source: /models/gguf/other.gguf is outside the host directories this cluster allows "
        "(/models/gguf/llama.gguf)"]


@pytest.mark.parametrize(("name", "refused"), [
    ("NVIDIA_VISIBLE_DEVICES", True), ("NVIDIA_DRIVER_CAPABILITIES", True), ("NVIDIA_REQUIRE_CUDA", True),
    ("NVIDIA_MIG_CONFIG_DEVICES", True), ("NVIDIA_TF32_OVERRIDE", False), ("CUDA_VISIBLE_DEVICES", False),
])
def test_only_the_nvidia_variables_the_container_toolkit_reads_are_refused(name, refused):
    """NVIDIA_* variables are device requests to the container toolkit, refused; NVIDIA_TF32_OVERRIDE is read by
    cuBLAS/cuDNN in the process (a precision switch, no device), so a user may set it as on any CUDA pod."""
    errors = review({**BASE, "pod": {"env": [{"name": name, "value": "0"}]}}, "x").errors
    assert bool([e for e in errors if name in e]) == refused, errors
