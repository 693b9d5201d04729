"""Every rule an InferenceService spec must pass, as one pure function.

The validating webhook (webhook.py) refuses a spec with any error here, and the reconciler
(reconciler.py) applies the same review, so a spec that slipped past the webhook (failure policy
Ignore while the operator is down) is still never rolled out: it is reported in status instead.

The rules the 1.20 apiserver cannot express (no CEL): the cross-field rules of the spec model
(GPUs = tensor x pipeline, autoscaling min <= max, ...), the fp8 KV cache's dtype, a GGUF model's
source and combinations, engine flags
that are not implemented yet (flotilla/flags.py through engine_args.unsupported), and the fit
check's hopeless cases. A spec that fits with a warning is admitted, with the warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from flotilla.engine_rules import RuleError, parallel_split_problem, rtn_settings
from flotilla.operator.deployment import OPERATOR_ENV
from flotilla.operator.engine_args import unsupported
from flotilla.operator.engine_env import engine_env_problem, env_from_prefix_problem
from flotilla.operator.exec_size import exec_problems
from flotilla.operator.fit import BNB_BLOCK, GGUF_BLOCK, FitReport, check_fit, rtn_env
from flotilla.operator.lora_volumes import pod_names
from flotilla.operator.message_limit import join_errors
from flotilla.operator.names import (
    annotations_size_problem,
    common_labels,
    label_key_problem,
    label_problems,
    name_problem,
)
from flotilla.operator.policy import DEFAULT_POLICY, AdmissionPolicy
from flotilla.operator.sandbox import GPU_RUNTIME_ENV_REASON, is_gpu_runtime_name
from flotilla.operator.scheduling_rules import affinity_problems, toleration_problems, topology_spread_problems
from flotilla.operator.spec import DEFAULT_IMAGE, InferenceServiceSpec, parse_source
from flotilla.validation_messages import Location, describe, dotted


@dataclass
class Review:
    """The outcome: errors refuse the spec, warnings are shown to the user; spec and fit when parsed."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    spec: InferenceServiceSpec | None = None
    fit: FitReport | None = None

    @property
    def message(self) -> str:
        """The errors in one line, as the webhook returns them and the Valid condition shows them: as many as fit
        message_limit.MESSAGE_LIMIT, then how many more there are (a spec can hold thousands)."""
        return join_errors(self.errors)


def _spec_path(loc: Location) -> str:
    return f"spec.{dotted(loc)}" if loc else ""


# Pod annotations that the apiserver and kubelet read as a seccomp or AppArmor profile: on 1.19+ a container's
# seccomp annotation becomes its securityContext.seccompProfile and overrides the pod's RuntimeDefault.
SANDBOX_ANNOTATION_PREFIXES = (
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
    "container.apparmor.security.beta.kubernetes.io/",
)


def _label_rules(spec: InferenceServiceSpec) -> list[str]:
    # Kubernetes' own rules on what becomes labels and annotations: the apiserver would refuse the children after
    # admission (ApplyRefused in status), where `kubectl apply` should have said so.
    size = annotations_size_problem("spec.pod.annotations", spec.pod.annotations)
    return (label_problems("spec.pod.labels", spec.pod.labels)
            + label_problems("spec.pod.annotations", spec.pod.annotations, kind="annotation") + ([size] if size else [])
            + label_problems("spec.monitoring.labels", spec.monitoring.labels)
            + label_problems("spec.resources.nodeSelector", spec.resources.node_selector))


def _scheduling_rules(spec: InferenceServiceSpec) -> list[str]:
    # The core/v1 scheduling objects passed through to the pods, as the apiserver checks them (scheduling_rules.py).
    return (affinity_problems(spec.pod.affinity) + topology_spread_problems(spec.pod.topology_spread_constraints)
            + toleration_problems(spec.resources.tolerations))


def _image_rules(spec: InferenceServiceSpec) -> list[str]:
    # The apiserver checks this in pods only, not in a Deployment's template: the Deployment was applied and the
    # ReplicaSet controller's every pod refused.
    if spec.image != spec.image.strip():
        return [f"spec.image {spec.image!r} has leading or trailing whitespace, which a pod's image may not have"]
    return []


def _env_rules(spec: InferenceServiceSpec) -> list[str]:
    errors = [f"spec.pod.env: {e.name} is set by the operator" for e in spec.pod.env if e.name in OPERATOR_ENV]
    errors += [f"spec.pod.env: {e.name} cannot be set: {GPU_RUNTIME_ENV_REASON}; the pods get the GPUs they request"
               for e in spec.pod.env if is_gpu_runtime_name(e.name)]
    # The engine's own switches (engine_env.py): a flag's variable would skip the engineArgs allow-list and checks.
    errors += [f"spec.pod.env: {problem}" for e in spec.pod.env
               if e.name not in OPERATOR_ENV and (problem := engine_env_problem(e.name))]
    # A Secret's or ConfigMap's keys are not known here (and change later): only a prefix keeps them off NVIDIA_*.
    for i, source in enumerate(spec.pod.env_from):
        if is_gpu_runtime_name(source.prefix or "", prefix=True):
            given = f"with the prefix {source.prefix!r}" if source.prefix else "without a prefix"
            errors.append(f"spec.pod.envFrom[{i}]: {given}, a key of the Secret or ConfigMap could name an NVIDIA_* "
                          f"variable, and {GPU_RUNTIME_ENV_REASON}; give a prefix (e.g. APP_), or name each variable "
                          "in spec.pod.env with valueFrom")
        elif problem := env_from_prefix_problem(source.prefix or ""):
            errors.append(f"spec.pod.envFrom[{i}]: {problem}")
    return errors


def _pod_rules(spec: InferenceServiceSpec, policy: AdmissionPolicy) -> list[str]:
    errors = _image_rules(spec) + _env_rules(spec)
    own = set(common_labels("x"))
    for key in spec.pod.labels:
        if label_key_problem(key):  # no key at all: _label_rules says so
            continue
        if key in own:  # whatever the admin allows: the selector and app.kubernetes.io labels are the operator's
            errors.append(f"spec.pod.labels: {key} is set by the operator")
        elif problem := policy.pod_label_problem(key):
            errors.append(f"spec.pod.labels: {problem}")
    for key in spec.pod.annotations:
        if label_key_problem(key.lower()):
            continue
        if key.startswith(SANDBOX_ANNOTATION_PREFIXES):  # whatever the admin allows: the operator sets these
            errors.append(f"spec.pod.annotations: {key} would change the pods' seccomp or AppArmor profile, which "
                          "the operator sets")
        elif problem := policy.pod_annotation_problem(key):
            errors.append(f"spec.pod.annotations: {problem}")
    if spec.pod.priority_class_name and (problem := policy.priority_class_problem(spec.pod.priority_class_name)):
        errors.append(f"spec.pod.priorityClassName: {problem}")
    if spec.pod.service_account_name and (problem := policy.service_account_problem(spec.pod.service_account_name)):
        errors.append(f"spec.pod.serviceAccountName: {problem}")
    return errors


def _dtype_rules(spec: InferenceServiceSpec) -> list[str]:
    if spec.kv_cache.dtype.startswith("fp8") and spec.dtype == "float32":
        return [f"spec.kvCache.dtype: {spec.kv_cache.dtype} needs 16-bit activations; set spec.dtype to "
                "bfloat16, float16 or auto, or spec.kvCache.dtype to auto"]
    return []


def _lora_rules(spec: InferenceServiceSpec, name: str) -> list[str]:
    if spec.lora is None:
        return []
    names = [a.name for a in spec.lora.adapters]
    errors = [f"spec.lora.adapters: the name {n} is given twice" for n in sorted(set(names)) if names.count(n) > 1]
    if spec.served_name(name) in names:
        errors.append(f"spec.lora.adapters: {spec.served_name(name)} is the base model's served name")
    if spec.gpus_per_replica > 1:
        errors.append("spec.lora: LoRA with tensor or pipeline parallelism > 1 is not supported yet")
    # An adapter's name, with a prefix, names its volume and download container, cut to 63 characters: two long
    # names can then meet, or one end in '-', and the apiserver would refuse the Deployment after admission.
    named: dict[tuple[str, str], str] = {}
    for adapter in spec.lora.adapters:
        for what, derived in pod_names(adapter).items():
            if derived.endswith("-"):
                errors.append(f"spec.lora.adapters: {adapter.name} would name the pod's {what} {derived}, which ends "
                              "in '-' once cut to 63 characters; shorten the name")
            elif named.setdefault((what, derived), adapter.name) != adapter.name:
                errors.append(f"spec.lora.adapters: {named[(what, derived)]} and {adapter.name} would both name the "
                              f"pod's {what} {derived} (names are cut to 63 characters); shorten one")
    return errors


def _rtn_rules(spec: InferenceServiceSpec) -> list[str]:
    """With spec.quantization rtn, the engine reads RTN_NUM_BITS / RTN_GROUP_SIZE at start-up and refuses values it
    cannot use (or a group size that does not divide a layer's inputs): refuse them here, not by a crash loop."""
    if spec.quantization != "rtn":
        return []
    try:
        _, group = rtn_settings(rtn_env(spec))
    except RuleError as e:
        return [f"spec.pod.env: {e}"]
    arch = spec.architecture
    if group is None or arch is None:
        return []
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    widths = {arch.hidden_size, arch.num_attention_heads * head_dim, arch.intermediate_size}
    if all(w % group == 0 for w in widths):
        return []
    return [f"spec.pod.env: RTN_GROUP_SIZE={group} does not divide the model's layer inputs "
            f"({', '.join(map(str, sorted(widths)))}); pick a divisor of them, or -1 for one group a row"]


def _gguf_rules(spec: InferenceServiceSpec) -> list[str]:
    """A GGUF model as the engine serves it (engine/config.py `_gguf_model`, engine/quantization/gguf.py): the
    file and spec.quantization agree, and nothing is combined with it that the engine would fail on at start-up."""
    source, gguf = spec.model.source, spec.model.gguf_file
    if spec.quantization == "gguf" and gguf is None:
        return [f"spec.quantization: gguf serves one .gguf file as the model, but spec.model.source {source} names a "
                "checkpoint directory; point it at the file (pvc://claim/dir/model.gguf, hostPath:///dir/model.gguf "
                "or hf://org/name/model.gguf), or choose another quantization"]
    if gguf is None:
        return []
    errors = []
    if spec.quantization not in ("none", "gguf"):
        errors.append(f"spec.quantization: {spec.quantization}: a .gguf model ({source}) serves its own quantized "
                      "weights; leave spec.quantization out or set it to gguf")
    if spec.speculative is not None and spec.speculative.method == "draft_model":
        errors.append("spec.speculative: a draft model beside a .gguf model is not supported yet (the engine loads "
                      "the draft with the target's GGUF loader); use method ngram")
    arch = spec.architecture
    if arch is not None and arch.weight_bits != 8:
        # The engine's 4-bit layers split their inputs into blocks of 32 on every rank (GgufInt4Method).
        tensor = spec.parallelism.tensor
        head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
        inputs = {"hiddenSize": arch.hidden_size, "numAttentionHeads x headDim / tensor":
                  arch.num_attention_heads * head_dim // tensor, "intermediateSize / tensor":
                  arch.intermediate_size // tensor}
        bad = [f"{what} = {n}" for what, n in inputs.items() if n % GGUF_BLOCK]
        if bad:
            errors.append("spec.parallelism.tensor: a GGUF 4-bit (Q4_0/Q4_1/Q4_K) layer splits its inputs into "
                          f"blocks of {GGUF_BLOCK} on every GPU, but {', '.join(bad)} is not a multiple of "
                          f"{GGUF_BLOCK}; choose another tensor size")
    return errors


def _bnb_rules(spec: InferenceServiceSpec) -> list[str]:
    """bitsandbytes 4-bit (engine/quantization/bnb.py): every rank's layer inputs make whole blocks of 64 (the
    engine refuses a layer at start-up otherwise)."""
    arch = spec.architecture
    if spec.weight_quantization != "bitsandbytes" or arch is None:
        return []
    tensor = spec.parallelism.tensor
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    inputs = {"hiddenSize": arch.hidden_size,
              "numAttentionHeads x headDim / tensor": arch.num_attention_heads * head_dim // tensor,
              "intermediateSize / tensor": arch.intermediate_size // tensor}
    bad = [f"{what} = {n}" for what, n in inputs.items() if n % BNB_BLOCK]
    if not bad:
        return []
    return [f"spec.quantization: a bitsandbytes 4-bit layer takes its inputs in blocks of {BNB_BLOCK} on every GPU, "
            f"but {', '.join(bad)} is not a multiple of {BNB_BLOCK}; choose another tensor size or quantization"]


# One pod holds every rank of a replica, so a replica must fit one node; H200/H100 nodes hold 8 GPUs.
MAX_GPUS_PER_NODE = 8


def _parallel_rules(spec: InferenceServiceSpec) -> list[str]:
    """A replica fits one node; the model's heads, MLP and layers split over the ranks (when its
    numbers are given)."""
    errors = []
    if spec.gpus_per_replica > MAX_GPUS_PER_NODE:
        errors.append(f"spec.parallelism: tensor x pipeline = {spec.gpus_per_replica} GPUs, but a replica runs in "
                      f"one pod on one node (at most {MAX_GPUS_PER_NODE} GPUs); multi-node serving is not "
                      "supported yet")
    arch = spec.architecture
    if arch is None:
        return errors
    heads = arch.num_attention_heads
    problem = parallel_split_problem(heads, arch.num_key_value_heads or heads, arch.intermediate_size,
                                     arch.num_hidden_layers, spec.parallelism.tensor, spec.parallelism.pipeline)
    return errors + ([f"spec.parallelism: {problem}"] if problem else [])


def _source_rules(spec: InferenceServiceSpec, policy: AdmissionPolicy) -> list[str]:
    # A GGUF file on a node is mounted as it is named: the policy checks that path, and nothing beside it is mounted.
    sources = [("spec.model.source", spec.model.source)]
    if spec.model.tokenizer is not None:
        sources.append(("spec.model.tokenizer", spec.model.tokenizer))
    if spec.lora is not None:
        sources += [(f"spec.lora.adapters[{i}].source", a.source) for i, a in enumerate(spec.lora.adapters)]
    errors = []
    for where, source in sources:
        scheme, location, sub_path = parse_source(source)
        problem = policy.host_path_problem(location) if scheme == "hostPath" else _mounted_path_problem(
            scheme, location, sub_path)
        if problem:
            errors.append(f"{where}: {problem}")
    return errors


def _mounted_path_problem(scheme: str, location: str, sub_path: str) -> str | None:
    # A pvc:// sub-path is the mount's subPath, and an hf:// repository's org/name that of the download cache's claim
    # (hf/<org>/<name>): the apiserver refuses a '..' segment in a subPath, and '.' or '..' is no repository name.
    if scheme == "pvc" and ".." in sub_path.split("/"):
        return f"the sub-path {sub_path} has a '..' segment: a claim is mounted only within itself"
    if scheme == "hf" and {".", ".."} & set(location.split("/")):
        return f"{location} is no Hugging Face repository: its organisation or name is '.' or '..'"
    return None


def _autoscaling_rules(spec: InferenceServiceSpec, policy: AdmissionPolicy) -> list[str]:
    if spec.autoscaling is None:
        return []
    problem = policy.prometheus_address_problem(spec.autoscaling.prometheus_address)
    return [f"spec.autoscaling.prometheusAddress: {problem}"] if problem else []


def replicas_notes(spec: InferenceServiceSpec, old: Mapping[str, Any] | None) -> list[str]:
    """The webhook's warning when a request sets spec.replicas above what the autoscaler may keep (an edit or apply
    of `replicas: 20`), which would otherwise change nothing visible: only 0 overrides the autoscaler.

    `old` is the stored spec on an UPDATE (None on a CREATE). A spec.replicas the request leaves as stored is not the
    user's to be warned about: while autoscaling is on, the operator copies the autoscaler's count there, so an update
    lowering only autoscaling.maxReplicas under it would draw the warning. Only the webhook sees the request; the
    reconciler's review (and so the Valid condition) cannot tell who set the count, and does not warn.
    """
    a = spec.autoscaling
    if a is None or not spec.autoscaled or spec.replicas <= a.max_replicas:
        return []
    if old is not None and old.get("replicas") == spec.replicas:
        return []
    return [f"spec.replicas ({spec.replicas}) has no effect while autoscaling is set: the autoscaler keeps "
            f"{a.min_replicas} to {a.max_replicas} replicas (raise autoscaling.maxReplicas instead); only "
            "spec.replicas 0 overrides it, scaling to zero until it is 1 or more again"]


def _settled(spec: InferenceServiceSpec, policy: AdmissionPolicy) -> InferenceServiceSpec:
    """The spec as the children are built from it: the policy's choices for what the spec leaves to the cluster."""
    if spec.image == DEFAULT_IMAGE and policy.engine_image != DEFAULT_IMAGE:
        spec = spec.model_copy(update={"image": policy.engine_image})
    a = spec.autoscaling
    if a is None or policy.prometheus_address(a.prometheus_address) == a.prometheus_address:
        return spec
    settled = a.model_copy(update={"prometheus_address": policy.prometheus_address(a.prometheus_address)})
    return spec.model_copy(update={"autoscaling": settled})


def review(spec: dict[str, Any], name: str, policy: AdmissionPolicy = DEFAULT_POLICY) -> Review:
    """Check a spec (as on the wire, camelCase) of the InferenceService `name` under the admin's `policy`."""
    named = name_problem(name)
    name_errors = [named] if named else []
    try:
        parsed = InferenceServiceSpec.model_validate(spec)
    except ValidationError as e:
        return Review(errors=name_errors + describe(e.errors(), _spec_path))
    result = Review(spec=_settled(parsed, policy), errors=name_errors + _source_rules(parsed, policy)
                    + _autoscaling_rules(parsed, policy) + _label_rules(parsed) + _scheduling_rules(parsed)
                    + _pod_rules(parsed, policy)
                    + _dtype_rules(parsed) + _rtn_rules(parsed) + _gguf_rules(parsed) + _bnb_rules(parsed)
                    + _parallel_rules(parsed)
                    + _lora_rules(parsed, name)
                    + unsupported(parsed, name) + exec_problems(parsed, name))
    result.fit = check_fit(parsed)
    if result.fit.verdict == "DoesNotFit":
        result.errors.append(f"fit check: {result.fit.message}")
    elif result.fit.verdict == "FitsWithWarning":
        result.warnings.append(f"fit check: {result.fit.message}")
    return result
