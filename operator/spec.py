"""The InferenceService spec as one pydantic model, with its defaults.

This model is the single source of the API: the CRD's openAPIV3Schema is generated from it
(operator/crd.py), the builders take it, and the fit check reads it. Build it once per reconcile
with `InferenceServiceSpec.model_validate(body["spec"])` and pass it down.

Field names are snake_case in Python and camelCase on the wire (the CRD and YAML): the alias
generator maps `gpus_per_replica` to `gpusPerReplica`. Types, ranges and enums are checked both here
and by the apiserver (through the generated schema); the cross-field rules at the bottom are
checked only here, because the 1.20 apiserver has no CEL validation (the admission webhook calls
this model).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

GROUP = "serving.flotilla.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"

DEFAULT_IMAGE = "ghcr.io/flotilla-dev/flotilla-engine:0.1.0"

# `pvc://claim/optional/sub/path`, `hostPath:///absolute/path`, `hf://org/name`.
SOURCE_PATTERN = (
    r"^(pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[^/]+)*/?"
    r"|hostPath:///[^\s]*"
    r"|hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+)$"
)
# A Kubernetes resource quantity (e.g. `8`, `500m`, `64Gi`).
QUANTITY_PATTERN = r"^([+]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"


class _Model(BaseModel):
    """Base: camelCase on the wire, unknown fields refused (the apiserver prunes them anyway)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ModelArchitecture(_Model):
    """Architecture numbers of the checkpoint (as in its config.json), used by the fit check."""

    hidden_size: int = Field(ge=1, description="Width of the residual stream (config.json hidden_size).")
    num_hidden_layers: int = Field(ge=1, description="Number of transformer layers (num_hidden_layers).")
    num_attention_heads: int = Field(ge=1, description="Query heads per layer (num_attention_heads).")
    num_key_value_heads: int | None = Field(
        default=None, ge=1,
        description="KV heads per layer (num_key_value_heads); defaults to numAttentionHeads (no GQA).")
    head_dim: int | None = Field(
        default=None, ge=1,
        description="Size of one head (head_dim); defaults to hiddenSize / numAttentionHeads.")
    intermediate_size: int = Field(ge=1, description="Width of the gated MLP (intermediate_size).")
    vocab_size: int = Field(ge=1, description="Vocabulary size (vocab_size).")
    tie_word_embeddings: bool = Field(
        default=False, description="Whether the LM head shares the embedding matrix (tie_word_embeddings).")
    max_position_embeddings: int | None = Field(
        default=None, ge=1,
        description="Longest context the model supports; the default for scheduling.maxModelLen.")
    num_parameters: int | None = Field(
        default=None, ge=1,
        description="Total parameter count; overrides the count derived from the numbers above "
                    "(set it for mixture-of-experts or unusual architectures).")


class ModelSpec(_Model):
    """Which checkpoint to serve and under which name."""

    source: str = Field(
        pattern=SOURCE_PATTERN,

        description="Where the HF checkpoint directory lives: pvc://claim/path, hostPath:///path or hf://org/name.")
    served_name: str | None = Field(
        default=None, min_length=1, max_length=253,
        description="Model name the OpenAI API answers to (--served-model-name); defaults to the "
                    "InferenceService's name.")
    config: ModelArchitecture | None = Field(
        default=None,
        description="Architecture numbers for the fit check; when absent the operator reads config.json "
                    "if it can reach it, else reports the fit as Unknown.")


class Toleration(_Model):
    """A pod toleration, as in the core/v1 Toleration."""

    key: str | None = Field(default=None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value to match when operator is Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects.")
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated before eviction.")


class ResourcesSpec(_Model):
    """GPUs and host resources of each replica."""

    gpus_per_replica: int | None = Field(
        default=None, ge=1, le=64,
        description="nvidia.com/gpu per pod; must equal parallelism.tensor x parallelism.pipeline "
                    "(the default).")
    gpu_product: str | None = Field(
        default=None, max_length=128,
        description="GPU product as labelled by GPU feature discovery (nvidia.com/gpu.product, e.g. "
                    "NVIDIA-H200); pods are pinned to it and the fit check uses its memory.")
    cpu: int | str | None = Field(default=None, description="CPU request and limit per pod (a quantity).")
    memory: int | str | None = Field(
        default=None, description="Memory request and limit per pod (a quantity).")
    shm_size: str = Field(
        default="8Gi", pattern=QUANTITY_PATTERN,
        description="Size of the in-memory /dev/shm (NCCL and tensor-parallel workers use it).")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Extra node labels the pods must match.")
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Extra tolerations (GPU taints are tolerated already).")


class ParallelismSpec(_Model):
    """How one replica splits the model over its GPUs."""

    tensor: int = Field(default=1, ge=1, le=64, description="Tensor-parallel size (--tensor-parallel-size).")
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline stages (--pipeline-parallel-size).")


class KVCacheSpec(_Model):
    """The paged KV cache."""

    dtype: Literal["auto", "fp8", "fp8_e4m3"] = Field(
        default="auto", description="KV-cache dtype (--kv-cache-dtype); auto is the model dtype.")
    block_size: Literal[8, 16, 32, 64, 128] = Field(
        default=16, description="Tokens per KV block (--block-size).")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1,
        description="Fraction of each GPU's memory the engine may use for weights, activations and KV "
                    "cache (--gpu-memory-utilization).")
    prefix_caching: bool = Field(
        default=True, description="Automatic prefix caching (--enable-prefix-caching).")


class SchedulingSpec(_Model):
    """Continuous-batching limits."""

    max_model_len: int | None = Field(
        default=None, ge=16, le=10_485_760,
        description="Maximum tokens per sequence, prompt plus output (--max-model-len); defaults to the "
                    "model's maxPositionEmbeddings.")
    max_num_seqs: int = Field(
        default=256, ge=1, le=65_536, description="Maximum sequences in one step (--max-num-seqs).")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=16, le=10_485_760,
        description="Token budget of one step (--max-num-batched-tokens); the engine's default when absent.")
    chunked_prefill: bool = Field(
        default=False, description="Split long prompts over several steps (--enable-chunked-prefill).")


class SpeculativeSpec(_Model):
    """Speculative decoding (--speculative-config)."""

    method: Literal["ngram", "draft_model"] = Field(
        description="ngram (prompt lookup) or draft_model (a smaller model proposes).")
    num_tokens: int = Field(default=4, ge=1, le=16, description="Tokens proposed per step.")
    draft_model: str | None = Field(
        default=None, description="Path or hf:// id of the draft model (method draft_model).")


class LoraAdapter(_Model):
    """One LoRA adapter served beside the base model."""

    name: str = Field(min_length=1, description="Model name clients ask for to get this adapter.")
    source: str = Field(
        pattern=SOURCE_PATTERN, description="Where the adapter lives (same forms as model.source).")


class LoraSpec(_Model):
    """LoRA adapters (--enable-lora)."""

    adapters: list[LoraAdapter] = Field(default_factory=list, description="Adapters to load at start.")
    max_loras: int = Field(default=4, ge=1, le=256, description="Adapters resident on the GPU at once.")


class SecretKeyRef(_Model):
    """A key of a Secret in the InferenceService's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Secret name.")
    key: str = Field(default="token", min_length=1, description="Key within the Secret.")


AutoscalingMetric = Literal["num_requests_waiting", "num_requests_running", "kv_cache_usage_perc"]


class AutoscalingSpec(_Model):
    """Horizontal autoscaling on the engine's own metrics (HPA, or KEDA when installed)."""

    min_replicas: int = Field(default=1, ge=1, le=1000, description="Fewest replicas.")
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    metric: AutoscalingMetric = Field(
        default="num_requests_waiting",
        description="Engine gauge to scale on, per pod (vllm:<metric>).")
    target: float = Field(
        default=10, gt=0,
        description="Per-pod average of the metric to hold (a fraction for kv_cache_usage_perc).")
    prometheus_address: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        description="Prometheus that KEDA queries (used only with KEDA).")


class MonitoringSpec(_Model):
    """Prometheus scraping."""

    service_monitor: bool = Field(
        default=True, description="Create a ServiceMonitor when the Prometheus Operator is installed.")
    interval: str = Field(default="15s", pattern=r"^[0-9]+(ms|s|m|h)$", description="Scrape interval.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels on the ServiceMonitor (to match a Prometheus's selector).")


class InferenceServiceSpec(_Model):
    """Desired state of an InferenceService: one model served by a set of engine replicas."""

    model: ModelSpec = Field(description="The checkpoint and its served name.")
    replicas: int = Field(
        default=1, ge=0, le=1000, description="Engine pods (ignored while autoscaling is set).")
    image: str = Field(default=DEFAULT_IMAGE, min_length=1, description="Engine container image.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="Weight and activation dtype (--dtype); auto takes the checkpoint's.")
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="GPUs and host resources per replica.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Model parallelism per replica.")
    quantization: Literal["none", "fp8", "int8", "awq", "gptq"] = Field(
        default="none", description="Weight quantization (--quantization).")
    kv_cache: KVCacheSpec = Field(default_factory=KVCacheSpec, description="Paged KV cache settings.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Batching limits.")
    speculative: SpeculativeSpec | None = Field(
        default=None, description="Speculative decoding; off when absent.")
    lora: LoraSpec | None = Field(default=None, description="LoRA adapters; off when absent.")
    engine_args: list[str] = Field(
        default_factory=list,
        description="Extra engine flags for settings that have no field (e.g. --enforce-eager); a flag "
                    "that a field sets, or that the engine does not know, is refused.")
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding the API key required on /v1 routes (VLLM_API_KEY).")
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="Horizontal autoscaling; replicas is fixed when absent.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="Prometheus scraping.")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> InferenceServiceSpec:
        # The 1.20 apiserver cannot express these (no CEL), so they live here and the webhook calls them.
        per_replica = self.parallelism.tensor * self.parallelism.pipeline
        gpus = self.resources.gpus_per_replica
        if gpus is not None and gpus != per_replica:
            raise ValueError(
                f"resources.gpusPerReplica ({gpus}) must equal parallelism.tensor x parallelism.pipeline "
                f"({self.parallelism.tensor} x {self.parallelism.pipeline} = {per_replica})")
        if self.autoscaling and self.autoscaling.min_replicas > self.autoscaling.max_replicas:
            raise ValueError(
                f"autoscaling.minReplicas ({self.autoscaling.min_replicas}) must not exceed "
                f"autoscaling.maxReplicas ({self.autoscaling.max_replicas})")
        if self.speculative and self.speculative.method == "draft_model" and not self.speculative.draft_model:
            raise ValueError("speculative.draftModel is required when speculative.method is draft_model")
        for quantity, where in ((self.resources.cpu, "cpu"), (self.resources.memory, "memory")):
            if isinstance(quantity, str) and not re.match(QUANTITY_PATTERN, quantity):
                raise ValueError(f"resources.{where} {quantity!r} is not a Kubernetes quantity")
        return self

    @property
    def gpus_per_replica(self) -> int:
        """GPUs each pod requests: tensor x pipeline (equal to resources.gpusPerReplica when set)."""
        return self.parallelism.tensor * self.parallelism.pipeline

    def served_name(self, name: str) -> str:
        """The model name the API answers to, given the InferenceService's metadata.name."""
        return self.model.served_name or name
