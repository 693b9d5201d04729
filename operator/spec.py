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
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from flotilla.engine_rules import (
    model_len_limit,
    moe_dense_layers,
    moe_expert_widths,
    rope_positions,
    world_size,
)
from flotilla.operator.hf_overrides_arg import engine_args_hf_overrides
from flotilla.quantization_config import CHECKPOINT_METHODS, config_method, config_weight_bits

GROUP = "serving.flotilla.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"

DEFAULT_IMAGE = "ghcr.io/flotilla-dev/flotilla-engine:0.1.0"

# `pvc://claim/optional/sub/path`, `hostPath:///absolute/path`, `hf://org/name`.
# A Hugging Face repository, optionally pinned to a revision as KServe writes it (`hf://org/name:revision`: a commit
# hash, tag or branch without '/'); unpinned, its default branch at each download.
HF_REPO_PATTERN = r"hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+(:[A-Za-z0-9][-A-Za-z0-9_.]{0,99})?"
SOURCE_PATTERN = (
    r"^(pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[^/]+)*/?"
    r"|hostPath:///[^\s]*"
    rf"|{HF_REPO_PATTERN})$"
)
# A model source may also name one GGUF file of a Hugging Face repository: `hf://org/name/path/file.gguf`
# (pvc:// and hostPath:// name a file by their path already). No glob characters: the path is also the
# download's allow pattern (model_volume.py).
MODEL_SOURCE_PATTERN = SOURCE_PATTERN[:-2] + rf"|{HF_REPO_PATTERN}(/[-A-Za-z0-9_.]+)+\.gguf)$"
GGUF_SUFFIX = ".gguf"
# A Kubernetes label value (at most 63 characters, checked by the field's max_length).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Where KEDA finds Prometheus: a plain http(s) URL to a host name or IPv4 address, optional port
# and path; no credentials (user@), query or fragment that could smuggle anything into KEDA's request.
PROMETHEUS_URL_PATTERN = r"^https?://[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?(/[-A-Za-z0-9._~/]*)?$"
# The schema's default address: stands for "the cluster's Prometheus", the first the admin lists (policy.py).
DEFAULT_PROMETHEUS_ADDRESS = "http://prometheus-operated.monitoring.svc:9090"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A Secret's or ConfigMap's key as the apiserver checks a reference to one (IsConfigMapKey): letters, digits, '-', '_'
# and '.', not '.' or '..' nor starting with '..'. The Deployment of a pod referring to another key is refused.
CONFIG_KEY_PATTERN = r"^([-_a-zA-Z0-9][-._a-zA-Z0-9]*|\.[-_a-zA-Z0-9][-._a-zA-Z0-9]*)$"
# A Kubernetes resource quantity (e.g. `8`, `500m`, `64Gi`), non-negative, as the apiserver's parser reads one
# (resource.ParseQuantity): a number, then one binary or decimal suffix or a decimal exponent. A looser pattern
# ("1..0", "5kk", "8gi") let specs in whose Deployment the apiserver then refused, so no pod was ever made.
QUANTITY_PATTERN = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"


def parse_source(source: str) -> tuple[str, str, str]:
    """(scheme, location, sub-path) of a model or adapter source.

    ("pvc", claim, sub/path), ("hostPath", /path, "") or ("hf", org/name, path/of/a/file or ""); an hf:// source's
    revision is `hf_revision`'s.
    """
    scheme, _, rest = source.partition("://")
    if scheme == "pvc":
        claim, _, sub_path = rest.partition("/")
        return "pvc", claim, sub_path.strip("/")
    if scheme == "hostPath":
        return "hostPath", rest, ""
    if scheme == "hf":
        org, _, rest = rest.partition("/")
        name, _, file_path = rest.partition("/")
        return "hf", f"{org}/{name.partition(':')[0]}", file_path
    raise ValueError(f"model.source {source!r} is not pvc://claim/path, hostPath:///path or hf://org/name")


def hf_revision(source: str) -> str | None:
    """The revision an hf:// source is pinned to (`hf://org/name:revision`, also before a GGUF file's path), or
    None: the repository's default branch."""
    if not source.startswith("hf://"):
        return None
    name = source.removeprefix("hf://").split("/")[1]
    return name.partition(":")[2] or None


class _Model(BaseModel):
    """Base: camelCase on the wire, unknown fields refused (the apiserver prunes them anyway)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# Upper bounds of the architecture numbers: far beyond any checkpoint, and low enough that every fit figure
# (status.fit's byte counts, products of these numbers) stays an int64, which the apiserver requires of status.
MAX_WIDTH = 262_144
MAX_COUNT = 4096
MAX_MLP_WIDTH = 1_048_576
MAX_VOCAB = 4_194_304
MAX_POSITIONS = 1 << 30
MAX_PARAMETERS = 10**15


class RopeScaling(_Model):
    """config.json's rope_scaling, as far as it sets the model's length (engine_rules.rope_scaled_length)."""

    rope_type: Literal["default", "linear", "llama3", "yarn"] | None = Field(
        default=None, description="rope_scaling.rope_type (the engine's kinds).")
    type: Literal["default", "linear", "llama3", "yarn"] | None = Field(
        default=None, description="rope_scaling.type, the older name of ropeType.")
    factor: float | None = Field(default=None, gt=0, le=1024, description="rope_scaling.factor.")
    original_max_position_embeddings: int | None = Field(
        default=None, ge=1, le=MAX_POSITIONS, description="rope_scaling.original_max_position_embeddings (YaRN).")


# ModelArchitecture's fields that no override sets whole: the spec's own numbers, which are no config.json keys (the
# engine ignores an override of them), and rope_scaling, which `ModelArchitecture.overridden` reads apart.
_NOT_CONFIG_KEYS = frozenset({"num_parameters", "weight_bits", "rope_scaling"})


class ModelArchitecture(_Model):
    """Architecture numbers of the checkpoint (as in its config.json), used by the fit check."""

    hidden_size: int = Field(ge=1, le=MAX_WIDTH, description="Width of the residual stream (config.json hidden_size).")
    num_hidden_layers: int = Field(ge=1, le=MAX_COUNT, description="Number of transformer layers (num_hidden_layers).")
    num_attention_heads: int = Field(ge=1, le=MAX_COUNT, description="Query heads per layer (num_attention_heads).")
    num_key_value_heads: int | None = Field(
        default=None, ge=1, le=MAX_COUNT,
        description="KV heads per layer (num_key_value_heads); defaults to numAttentionHeads (no GQA).")
    head_dim: int | None = Field(
        default=None, ge=1, le=MAX_COUNT,
        description="Size of one head (head_dim); defaults to hiddenSize / numAttentionHeads. Set it for "
                    "Qwen3, whose config.json may leave head_dim out: transformers then uses 128.")
    intermediate_size: int = Field(ge=1, le=MAX_MLP_WIDTH, description="Width of the gated MLP (intermediate_size).")
    vocab_size: int = Field(ge=1, le=MAX_VOCAB, description="Vocabulary size (vocab_size).")
    tie_word_embeddings: bool = Field(
        default=False, description="Whether the LM head shares the embedding matrix (tie_word_embeddings).")
    max_position_embeddings: int | None = Field(
        default=None, ge=1, le=MAX_POSITIONS,
        description="max_position_embeddings: with ropeScaling and slidingWindow, the model's length limit as the "
                    "engine derives it, which is the default for scheduling.maxModelLen and its upper bound.")
    original_max_position_embeddings: int | None = Field(
        default=None, ge=1, le=MAX_POSITIONS,
        description="original_max_position_embeddings at config.json's top level (Phi-3 style): YaRN's pretraining "
                    "length, read before ropeScaling.originalMaxPositionEmbeddings, as transformers and the engine "
                    "read it.")
    rope_scaling: RopeScaling | None = Field(
        default=None,
        description="rope_scaling of config.json: YaRN reaches originalMaxPositionEmbeddings x factor (Qwen2.5: 4 x "
                    "32768), linear maxPositionEmbeddings x factor; llama3's maxPositionEmbeddings counts it.")
    sliding_window: int | None = Field(
        default=None, ge=1, le=MAX_POSITIONS,
        description="sliding_window of config.json: the engine caps the length there (Mistral-7B-v0.1: 4096) unless "
                    "useSlidingWindow is false.")
    use_sliding_window: bool | None = Field(
        default=None, description="use_sliding_window of config.json (Qwen2 sets false: its window is not used).")
    num_parameters: int | None = Field(
        default=None, ge=1, le=MAX_PARAMETERS,
        description="Total parameter count; overrides the count derived from the numbers above "
                    "(set it for mixture-of-experts or unusual architectures).")
    num_experts: int | None = Field(
        default=None, ge=1, le=MAX_COUNT,
        description="Experts of each sparse layer of a mixture-of-experts model (config.json num_local_experts for "
                    "Mixtral, num_experts for Qwen2-MoE/Qwen3-MoE); unset for a dense model. The fit check counts "
                    "every expert's weights and the router.")
    moe_intermediate_size: int | None = Field(
        default=None, ge=1, le=MAX_MLP_WIDTH,
        description="Width of one expert (moe_intermediate_size, Qwen-MoE); defaults to intermediateSize (Mixtral's "
                    "experts are intermediateSize wide).")
    shared_expert_intermediate_size: int | None = Field(
        default=None, ge=1, le=MAX_MLP_WIDTH,
        description="Width of Qwen2-MoE's shared expert, a dense MLP beside the routed experts "
                    "(shared_expert_intermediate_size).")
    decoder_sparse_step: int | None = Field(
        default=None, ge=1, le=MAX_COUNT,
        description="Qwen-MoE's decoder_sparse_step: layer i holds experts when (i + 1) is a multiple of it, the "
                    "others a dense MLP of intermediateSize; 1 (the default): every layer.")
    mlp_only_layers: list[Annotated[int, Field(ge=0, le=MAX_COUNT)]] | None = Field(
        default=None, max_length=MAX_COUNT,
        description="Qwen-MoE's mlp_only_layers: layers that keep a dense MLP of intermediateSize.")
    weight_bits: Literal[4, 8] | None = Field(
        default=None,
        description="Bits per linear weight of a compressed-tensors checkpoint (quantization_config's "
                    "num_bits: 8 for FP8 / W8A16, 4 for W4A16); the fit check assumes 8 when absent. Of a GPTQ "
                    "checkpoint: its bits, 4 (assumed when absent) or 8. Of a GGUF file: 4 for Q4_0/Q4_1/Q4_K linear "
                    "tensors (assumed when absent; a Q4_K_M file's Q6_K layers run dense, so 4 over-counts it), 8 "
                    "for files without 4-bit linears (Q8_0, Q5_K_M, Q6_K: dequantized at load). An --hf-overrides "
                    "quantization_config in engineArgs sets it from its own bits.")

    @property
    def length_limit(self) -> int | None:
        """The model's length as the engine derives it from these config.json numbers (engine_rules.model_len_limit:
        rope scaling, then the sliding window), or None without maxPositionEmbeddings."""
        hf_config = self.length_numbers()
        return None if hf_config is None else model_len_limit(hf_config)

    @property
    def rope_positions(self) -> int | None:
        """The positions the engine's rotary table covers for these numbers (engine_rules.rope_positions: no
        sliding-window cap), or None without maxPositionEmbeddings."""
        hf_config = self.length_numbers()
        return None if hf_config is None else rope_positions(hf_config)

    def length_numbers(self) -> dict[str, Any] | None:
        """The config.json keys the model's length is derived from (None without maxPositionEmbeddings)."""
        if self.max_position_embeddings is None:
            return None
        hf_config: dict[str, Any] = {"max_position_embeddings": self.max_position_embeddings,
                                     "sliding_window": self.sliding_window}
        if self.use_sliding_window is not None:
            hf_config["use_sliding_window"] = self.use_sliding_window
        if self.original_max_position_embeddings is not None:
            hf_config["original_max_position_embeddings"] = self.original_max_position_embeddings
        if self.rope_scaling is not None:
            hf_config["rope_scaling"] = self.rope_scaling.model_dump(exclude_none=True)
        return hf_config

    @property
    def sparse_layers(self) -> int:
        """The layers holding experts (0 for a dense model; engine_rules.moe_dense_layers)."""
        if self.num_experts is None:
            return 0
        return self.num_hidden_layers - len(moe_dense_layers(self.num_hidden_layers, self.decoder_sparse_step,
                                                             self.mlp_only_layers))

    @property
    def expert_widths(self) -> list[int] | None:
        """The widths tensor parallelism splits in the experts (engine_rules.moe_expert_widths), None if dense."""
        if self.num_experts is None:
            return None
        return moe_expert_widths({"num_experts": self.num_experts, "intermediate_size": self.intermediate_size,
                                  "moe_intermediate_size": self.moe_intermediate_size,
                                  "shared_expert_intermediate_size": self.shared_expert_intermediate_size})

    def overridden(self, overrides: dict[str, Any]) -> ModelArchitecture:
        """These numbers with --hf-overrides' keys set over them, as the engine sets them over config.json: each key
        whole (config.json's only: not numParameters or weightBits; num_local_experts as numExperts), and
        rope_parameters (transformers 5) as the rope scaling where no rope_scaling is left, as the engine reads it;
        only what rope_scaling's fields hold of a rope object (the length it reaches). ValidationError for a value
        the fields refuse."""
        values = self.model_dump(exclude_none=True)
        values.update({key: value for key, value in overrides.items()
                       if key in ModelArchitecture.model_fields and key not in _NOT_CONFIG_KEYS})
        if overrides.get("num_local_experts"):  # Mixtral's expert count, read before num_experts (moe_num_experts)
            values["num_experts"] = overrides["num_local_experts"]
        if "quantization_config" in overrides:  # replaces the checkpoint's whole: the weights load at its bits
            bits = config_weight_bits(overrides["quantization_config"])
            values["weight_bits"] = bits if bits in (4, 8) else None
        rope = overrides["rope_scaling"] if "rope_scaling" in overrides else values.get("rope_scaling")
        if not rope:
            rope = overrides.get("rope_parameters")
        values["rope_scaling"] = {key: value for key, value in rope.items() if key in RopeScaling.model_fields} \
            if isinstance(rope, dict) and rope else None
        return ModelArchitecture.model_validate(values)

    @model_validator(mode="after")
    def _heads_have_a_size(self) -> ModelArchitecture:
        # Without headDim a head is hiddenSize // numAttentionHeads wide, as transformers and the engine compute it:
        # 0 would leave no KV cache per token (the fit check divides by it) and no model the engine can build.
        if self.head_dim is None and self.hidden_size < self.num_attention_heads:
            raise ValueError(f"hiddenSize ({self.hidden_size}) is smaller than numAttentionHeads "
                             f"({self.num_attention_heads}): the head size hiddenSize / numAttentionHeads would be "
                             "0; set headDim")
        return self


class ModelCacheSpec(_Model):
    """Where an hf:// checkpoint is downloaded to: a PersistentVolumeClaim kept across pods, or the pod's own disk."""

    claim_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim to download into once, under hf/<org>/<name>, reused by every pod and "
                    "restart (ReadWriteMany for more than one replica). Absent: an emptyDir per pod.")
    size: str | None = Field(
        default=None, pattern=QUANTITY_PATTERN,
        description="sizeLimit of the per-pod emptyDir; default: 1.2 x the estimated weights when "
                    "model.config is set, else 500Gi.")


class ModelSpec(_Model):
    """Which checkpoint to serve and under which name."""

    source: str = Field(
        pattern=MODEL_SOURCE_PATTERN,
        description="Where the HF checkpoint directory lives: pvc://claim/path, hostPath:///path or hf://org/name "
                    "(hf://org/name:revision pins a commit hash, tag or branch, as KServe's storageUri does; "
                    "without one, the default branch as of each pod's download); "
                    "or one GGUF file (served with quantization gguf, which a .gguf source implies): "
                    "pvc://claim/path/model.gguf, hostPath:///path/model.gguf or hf://org/name[:revision]/path/model.gguf.")
    tokenizer: str | None = Field(
        default=None, pattern=SOURCE_PATTERN,
        description="Where an HF tokenizer directory lives (same forms as a directory source; of an hf:// "
                    "repository only the tokenizer files are downloaded): mounted read-only at /tokenizer, the "
                    "engine's --tokenizer. For a .gguf model, whose tokenizer is otherwise rebuilt from the file "
                    "(slow for large vocabularies, as vLLM warns); its generation_config.json is read from here. "
                    "Default: the model's own.")
    served_name: str | None = Field(
        default=None, min_length=1, max_length=253,
        description="Model name the OpenAI API answers to (--served-model-name); defaults to the "
                    "InferenceService's name.")
    config: ModelArchitecture | None = Field(
        default=None,
        description="Architecture numbers for the fit check, copied from the checkpoint's config.json (the "
                    "operator does not read the checkpoint); when absent the fit is reported as Unknown and "
                    "scheduling.maxModelLen cannot be checked against the model's limit.")
    cache: ModelCacheSpec | None = Field(
        default=None, description="Download cache of an hf:// source (ignored for others).")

    @field_validator("source")
    @classmethod
    def _file_path_in_normal_form(cls, source: str) -> str:
        # The file of an hf:// GGUF source lands under the download directory by this path: no `.`/`..` segment
        # may lead it elsewhere (pvc:// sub-paths and hostPath:// are checked by the review, admission.py).
        scheme, _, file_path = parse_source(source)
        if scheme == "hf" and {".", ".."} & set(file_path.split("/")):
            raise ValueError(f"{source}: the file path has a '.' or '..' segment")
        return source

    @property
    def gguf_file(self) -> str | None:
        """The path of the GGUF file the source names, within its claim, node or repository (None for a checkpoint
        directory). A pvc:// claim's own name does not count: the file is a path inside the claim."""
        scheme, location, sub_path = parse_source(self.source)
        path = location if scheme == "hostPath" else sub_path
        return path if path.endswith(GGUF_SUFFIX) else None


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
        default=None, max_length=63, pattern=LABEL_VALUE_PATTERN,
        description="GPU product as labelled by GPU feature discovery (nvidia.com/gpu.product, e.g. "
                    "NVIDIA-H200); pods are pinned to it and the fit check uses its memory. A known short "
                    "name (H200) is written as the label value (NVIDIA-H200).")
    cpu: int | str | None = Field(
        default=None, description="CPU request and limit per pod (a quantity); default: a request of 2 + 2 per GPU.")
    memory: int | str | None = Field(
        default=None, description="Memory request and limit per pod (a quantity); default: a request of 4Gi per "
                                  "GPU plus a quarter of the estimated weights (8Gi when model.config is absent).")
    shm_size: str = Field(
        default="8Gi", pattern=QUANTITY_PATTERN,
        description="Size of the in-memory /dev/shm (NCCL and tensor-parallel workers use it).")
    tmp_size: str = Field(
        default="20Gi", pattern=QUANTITY_PATTERN,
        description="sizeLimit of the /tmp emptyDir (the engine's caches: Triton, torch, Hugging Face).")
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
    calculate_scales: bool = Field(
        default=False,
        description="With dtype fp8: per-layer k/v scales computed from a calibration forward at start-up "
                    "instead of 1.0 where the checkpoint has none (--calculate-kv-scales).")


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
    draft_config: ModelArchitecture | None = Field(
        default=None,
        description="The draft model's architecture numbers (from its config.json), so the fit check adds its "
                    "weights and its KV cache (one block per target block).")


class LoraAdapter(_Model):
    """One LoRA adapter served beside the base model."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                      description="Model name clients ask for to get this adapter (a DNS-1123 label: it "
                                  "also names the adapter's volume).")
    source: str = Field(
        pattern=SOURCE_PATTERN,
        description="Where the PEFT adapter directory lives (same forms as model.source); mounted read-only "
                    "at /adapters/<name>.")


class LoraSpec(_Model):
    """LoRA adapters (--enable-lora, --lora-modules, --max-loras, --max-lora-rank)."""

    adapters: list[LoraAdapter] = Field(default_factory=list, description="Adapters to load at start.")
    max_loras: int = Field(default=4, ge=1, le=256,
                           description="Distinct adapters in one batch: device slots (--max-loras).")
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = Field(
        default=16, description="Largest adapter rank served; sizes the device slots (--max-lora-rank).")
    max_cpu_loras: int | None = Field(
        default=None, ge=1, le=1024,
        description="Adapters kept loaded in CPU memory (--max-cpu-loras); default and minimum: maxLoras.")

    @model_validator(mode="after")
    def _cpu_cache_holds_the_slots(self) -> LoraSpec:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"maxCpuLoras ({self.max_cpu_loras}) must be at least maxLoras ({self.max_loras})")
        return self


class SecretKeyRef(_Model):
    """A key of a Secret in the InferenceService's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Secret name.")
    key: str = Field(default="token", min_length=1, max_length=253, pattern=CONFIG_KEY_PATTERN,
                     description="Key within the Secret.")


AutoscalingMetric = Literal["num_requests_waiting", "num_requests_running", "kv_cache_usage_perc",
                            "ttft_p95_seconds", "inter_token_latency_p95_seconds"]
# Latency SLOs: a p95 over the whole InferenceService, from the engines' histograms (autoscaling.py).
SLO_METRICS = ("ttft_p95_seconds", "inter_token_latency_p95_seconds")


# The longest window of an SLO's p95 in KEDA's query.
MAX_SLO_WINDOW_S = 3600


class AutoscalingSpec(_Model):
    """Horizontal autoscaling on the engine's own metrics (HPA, or KEDA when installed)."""

    min_replicas: int = Field(default=1, ge=1, le=1000, description="Fewest replicas.")
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    metric: AutoscalingMetric = Field(
        default="num_requests_waiting",
        description="What to scale on: an engine gauge, per pod (vllm:<metric>), or a latency SLO over all "
                    "replicas (ttft_p95_seconds, inter_token_latency_p95_seconds).")
    target: float = Field(
        default=10, ge=0.001, le=1_000_000,
        description="Per-pod average of the gauge to hold (a fraction for kv_cache_usage_perc, at most 1), or "
                    "the SLO's p95 in seconds; at least 0.001, the finest a Kubernetes quantity (1m) can state.")
    window: str = Field(
        default="1m", pattern=r"^[1-9][0-9]*(s|m)$",
        description="Window of an SLO metric's p95 in KEDA's query (e.g. 1m), at most 1h; the HPA reads the chart's "
                    "recorded 1m series.")
    prometheus_address: str = Field(
        default=DEFAULT_PROMETHEUS_ADDRESS, max_length=253, pattern=PROMETHEUS_URL_PATTERN,
        description="Prometheus that KEDA queries (used only with KEDA): one of the addresses the cluster admin "
                    "allows (operator flag --prometheus-address); the default stands for the first of them.")

    @field_validator("window")
    @classmethod
    def _window_is_bounded(cls, window: str) -> str:
        # KEDA runs the query every polling interval on the cluster's Prometheus: a window of years would have it read
        # every bucket it keeps per poll (and past int64 nanoseconds Prometheus cannot parse the duration at all).
        seconds = int(window[:-1]) * (60 if window.endswith("m") else 1)
        if seconds > MAX_SLO_WINDOW_S:
            raise ValueError(f"{window} is longer than 1h: KEDA would have Prometheus read that much history at every "
                             "poll")
        return window


# The shortest scrape interval an InferenceService may ask of the cluster's Prometheus.
MIN_SCRAPE_INTERVAL_S = 5


class MonitoringSpec(_Model):
    """Prometheus scraping."""

    service_monitor: bool = Field(
        default=True, description="Create a ServiceMonitor when the Prometheus Operator is installed.")
    interval: str = Field(default="15s", pattern=r"^[0-9]+(ms|s|m|h)$",
                          description=f"Scrape interval, at least {MIN_SCRAPE_INTERVAL_S}s.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels on the ServiceMonitor (to match a Prometheus's selector).")

    @field_validator("interval")
    @classmethod
    def _not_too_often(cls, interval: str) -> str:
        # The scrapes are the shared Prometheus's work: 1ms would have it scrape every engine pod 1000 times a second
        # (Prometheus caps the timeout at the interval rather than refusing it), 0s means its global default.
        digits = len(interval) - len(interval.lstrip("0123456789"))  # the pattern has held: digits, then a unit
        seconds = int(interval[:digits]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[interval[digits:]]
        if seconds < MIN_SCRAPE_INTERVAL_S:
            raise ValueError(f"{interval} is shorter than {MIN_SCRAPE_INTERVAL_S}s: Prometheus would scrape every "
                             "engine pod that often")
        return interval


# Free-form Kubernetes objects (affinity, topology spread constraints) are kept as given; the apiserver
# validates them when the Deployment is applied, and a refusal reaches status (reconciler.py).
_PRESERVE: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class KeyRef(_Model):
    """A key of a Secret or ConfigMap in the InferenceService's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Object name.")
    key: str = Field(min_length=1, max_length=253, pattern=CONFIG_KEY_PATTERN, description="Key within it.")


class EnvVarSource(_Model):
    """Where an environment variable's value comes from: a Secret key or a ConfigMap key."""

    secret_key_ref: KeyRef | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")


class EnvVar(_Model):
    """An environment variable of the engine container (e.g. HF_TOKEN from a Secret for gated models)."""

    name: str = Field(min_length=1, max_length=253, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(default=None, description="Value from a Secret or ConfigMap key.")

    @model_validator(mode="after")
    def _one_value(self) -> EnvVar:
        source = self.value_from
        refs = 0 if source is None else (source.secret_key_ref is not None) + (source.config_map_key_ref is not None)
        if (self.value is not None) + refs != 1:
            raise ValueError(f"env {self.name}: set exactly one of value, valueFrom.secretKeyRef, "
                             "valueFrom.configMapKeyRef")
        return self


class NameRef(_Model):
    """A Secret or ConfigMap by name."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Object name.")


class EnvFromSource(_Model):
    """Every key of a Secret or ConfigMap as environment variables."""

    prefix: str | None = Field(default=None, max_length=253, pattern=ENV_NAME_PATTERN,
                               description="Prepended to every variable name (itself a variable name).")
    secret_ref: NameRef | None = Field(default=None, description="A Secret.")
    config_map_ref: NameRef | None = Field(default=None, description="A ConfigMap.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvFromSource:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom: set exactly one of secretRef and configMapRef")
        return self


class PodSpec(_Model):
    """What the engine pods carry beyond the engine itself, passed through to the pod template."""

    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra pod labels: keys without '/', and those the cluster admin allows (operator flag "
                    "--pod-label); the operator's own label keys never.")
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Extra pod annotations: keys without '/' or '.', and those the cluster admin allows "
                    "(operator flag --pod-annotation); seccomp and AppArmor keys never.")
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Extra environment variables of the engine (names the operator sets, and NVIDIA_* names, which "
                    "the container runtime reads as GPU requests, are refused; NVIDIA_TF32_OVERRIDE, which "
                    "cuBLAS reads, is allowed; so are an engine flag's variable, such as "
                    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE, and VLLM_ALLOW_RUNTIME_LORA_UPDATING). HF_TOKEN, "
                    "HUGGING_FACE_HUB_TOKEN and HF_ENDPOINT also reach the hf:// download init containers.")
    env_from: list[EnvFromSource] = Field(
        default_factory=list, description="Secrets or ConfigMaps whose keys become environment variables of the "
                                          "engine (not of the hf:// downloads: name HF_TOKEN in env), each under a "
                                          "prefix that keeps them off NVIDIA_* names and the engine's refused "
                                          "ones (e.g. APP_).")
    image_pull_secrets: list[str] = Field(
        default_factory=list, description="Names of Secrets with registry credentials for the engine image.")
    affinity: dict[str, Any] | None = Field(
        default=None, json_schema_extra=_PRESERVE, description="Pod affinity, as in the core/v1 Affinity.")
    topology_spread_constraints: list[dict[str, Any]] = Field(
        default_factory=list, json_schema_extra={"items": {"type": "object", **_PRESERVE}},
        description="Topology spread constraints, as in the core/v1 pod spec.")
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="PriorityClass of the pods: one the cluster admin allows (default: any but the built-in "
                    "system-* classes).")
    service_account_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="ServiceAccount the pods run as (its token is not mounted; for workload identity): one the "
                    "cluster admin allows (default: any of the namespace's). Default: the namespace's default "
                    "ServiceAccount.")


class RolloutSpec(_Model):
    """How a spec change replaces the engine pods."""

    max_surge: int = Field(
        default=1, ge=0, le=1000,
        description="Extra pods a rollout may start (needs spare GPUs); 0 on a full GPU pool.")
    max_unavailable: int = Field(
        default=0, ge=0, le=1000,
        description="Pods a rollout may take down before their replacements are ready; set 1 with maxSurge 0 "
                    "when no spare GPUs exist.")
    progress_deadline_seconds: int = Field(
        default=600, ge=1, le=86_400,
        description="Seconds a rollout may go without progress (a pod created, scheduled or getting ready) before "
                    "status says it is stuck (Progressing=False, Degraded=True, reason ProgressDeadlineExceeded): "
                    "the Deployment's progressDeadlineSeconds. Pods Pending for lack of GPUs are the usual cause; "
                    "raise it above the time a replica takes to download and load the model.")

    @model_validator(mode="after")
    def _can_progress(self) -> RolloutSpec:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("rollout.maxSurge and rollout.maxUnavailable cannot both be 0: the rollout could "
                             "not start a single new pod")
        return self


class InferenceServiceSpec(_Model):
    """Desired state of an InferenceService: one model served by a set of engine replicas."""

    model: ModelSpec = Field(description="The checkpoint and its served name.")
    replicas: int = Field(
        default=1, ge=0, le=1000,
        description="Engine pods. While autoscaling is set the autoscaler decides and the operator copies its count "
                    "here (so the scale subresource reads it and removing autoscaling keeps it), but for 0: scaled to "
                    "zero with the autoscaler suspended until it is 1 or more again (kubectl scale).")
    image: str = Field(default=DEFAULT_IMAGE, min_length=1, description="Engine container image.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="Weight and activation dtype (--dtype); auto takes the checkpoint's.")
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="GPUs and host resources per replica.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Model parallelism per replica.")
    runner: Literal["auto", "generate", "pooling"] = Field(
        default="auto", description="Runner (--runner): generate serves text, pooling serves /v1/embeddings "
                                    "(last-token pooled, normalised), or /classify and cross-encoder /score for "
                                    "*ForSequenceClassification architectures; auto picks pooling for *Model and "
                                    "*ForSequenceClassification architectures.")
    quantization: Literal["none", "fp8", "int8", "rtn", "awq", "gptq", "compressed-tensors", "gguf",
                          "bitsandbytes"] = Field(
        default="none", description="Weight quantization (--quantization); a pre-quantized checkpoint's scheme "
                                    "(awq, gptq, compressed-tensors) may also be left to the engine to detect. "
                                    "rtn: round-to-nearest at load, 8 bits unless pod.env sets RTN_NUM_BITS=4 "
                                    "(RTN_GROUP_SIZE: inputs per scale, default 128). gguf: model.source is a .gguf "
                                    "file, its Q4_0/Q4_1/Q4_K codes served as 4-bit codes, its other common "
                                    "types dequantized (implied by a .gguf source). "
                                    "bitsandbytes: nf4 in blocks of 64 at load, or a bitsandbytes 4-bit checkpoint.")
    kv_cache: KVCacheSpec = Field(default_factory=KVCacheSpec, description="Paged KV cache settings.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Batching limits.")
    speculative: SpeculativeSpec | None = Field(
        default=None, description="Speculative decoding; off when absent.")
    lora: LoraSpec | None = Field(default=None, description="LoRA adapters; off when absent.")
    engine_args: list[str] = Field(
        default_factory=list,
        description="Extra engine flags for settings that have no field (e.g. --enforce-eager); a flag "
                    "that a field sets, or that the engine does not know, is refused. The probes' /health and "
                    "the scrape's /metrics write no access-log lines (--disable-access-log-for-endpoints) unless "
                    "these set an access-log flag.")
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding the API key required on /v1 routes (VLLM_API_KEY); several "
                                  "keys, one a line, are each accepted (a key rotated without downtime).")
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="Horizontal autoscaling; replicas is fixed when absent.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="Prometheus scraping.")
    pod: PodSpec = Field(default_factory=PodSpec, description="Pod template extras: env, scheduling, identity.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rollout strategy of the engine pods.")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> InferenceServiceSpec:
        # The 1.20 apiserver cannot express these (no CEL), so they live here and the webhook calls them.
        per_replica = self.gpus_per_replica
        gpus = self.resources.gpus_per_replica
        if gpus is not None and gpus != per_replica:
            raise ValueError(
                f"resources.gpusPerReplica ({gpus}) must equal parallelism.tensor x parallelism.pipeline "
                f"({self.parallelism.tensor} x {self.parallelism.pipeline} = {per_replica})")
        if self.autoscaling and self.autoscaling.min_replicas > self.autoscaling.max_replicas:
            raise ValueError(
                f"autoscaling.minReplicas ({self.autoscaling.min_replicas}) must not exceed "
                f"autoscaling.maxReplicas ({self.autoscaling.max_replicas})")
        a = self.autoscaling
        if a and a.metric == "kv_cache_usage_perc" and a.target > 1:
            raise ValueError(f"autoscaling.target ({a.target:g}) must be at most 1 for kv_cache_usage_perc, a "
                             "fraction of the KV cache")
        if a and abs(a.target * 1000 - round(a.target * 1000)) > 1e-6:
            raise ValueError(f"autoscaling.target ({a.target:g}) must be a multiple of 0.001: the autoscaler "
                             "states it as a Kubernetes quantity in milli-units")
        if self.speculative and self.speculative.method == "draft_model" and not self.speculative.draft_model:
            raise ValueError("speculative.draftModel is required when speculative.method is draft_model")
        for quantity, where in ((self.resources.cpu, "cpu"), (self.resources.memory, "memory")):
            if isinstance(quantity, str) and not re.match(QUANTITY_PATTERN, quantity):
                raise ValueError(f"resources.{where} {quantity!r} is not a Kubernetes quantity")
            # The apiserver refuses a negative request or limit in the Deployment, after admission.
            if isinstance(quantity, int) and quantity < 0:
                raise ValueError(f"resources.{where} ({quantity}) must be at least 0")
        return self

    @property
    def effective_quantization(self) -> str:
        """The quantization the engine runs: spec.quantization, or gguf for a .gguf source left at none (the engine
        implies it from the file, and the operator renders it so the pod spec shows it)."""
        if self.quantization == "none" and self.model.gguf_file is not None:
            return "gguf"
        return self.quantization

    @property
    def weight_quantization(self) -> str:
        """The scheme the engine loads the weights with, which the fit check counts: `effective_quantization`, or
        where that is none, the one an --hf-overrides quantization_config names (the engine runs the scheme of the
        quantization_config it reads; one that disagrees with spec.quantization is refused, engine_args.py)."""
        method = config_method(self.quantization_config_override)
        if self.effective_quantization == "none" and method in CHECKPOINT_METHODS:
            return method
        return self.effective_quantization

    @property
    def quantization_config_override(self) -> Any:
        """The quantization_config engineArgs' --hf-overrides set over config.json, or None."""
        overrides = self.hf_overrides
        return overrides.get("quantization_config") if isinstance(overrides, dict) else None

    @cached_property
    def hf_overrides(self) -> Any:
        """engineArgs' --hf-overrides value as the engine's parser reads it (`engine_args_hf_overrides`), or None;
        parsed once per spec, as the fit check, the webhook and the Deployment each read it several times (a spec is
        not changed once built: admission's model_copy updates only the image and autoscaling)."""
        return engine_args_hf_overrides(self.engine_args)

    @property
    def autoscaled(self) -> bool:
        """Whether an autoscaler owns the replica count: autoscaling is set and spec.replicas is not 0.

        spec.replicas 0 (`kubectl scale --replicas 0`, the scale subresource) scales to zero whatever autoscaling
        says, as an HPA stops acting on a Deployment scaled to 0 by hand; an HPA's minReplicas (at least 1) could
        not express it.
        """
        return self.autoscaling is not None and self.replicas != 0

    @property
    def gpus_per_replica(self) -> int:
        """GPUs each pod requests: tensor x pipeline (equal to resources.gpusPerReplica when set)."""
        return world_size(self.parallelism.tensor, self.parallelism.pipeline)

    @property
    def architecture(self) -> ModelArchitecture | None:
        """The numbers of the model the engine builds, which the fit check and the admission rules read:
        model.config with engineArgs' --hf-overrides set over them (`ModelArchitecture.overridden`). model.config
        as stated where the overrides cannot be read or applied: the webhook refuses that spec (engine_args.py)."""
        return self.overridden_architecture()[0]

    def overridden_architecture(self) -> tuple[ModelArchitecture | None, ValidationError | None]:
        """model.config with engineArgs' --hf-overrides set over it, and None; or model.config as stated and the
        fields' refusal of the overridden numbers (the webhook's message, engine_args.py)."""
        arch, overrides = self.model.config, self.hf_overrides
        if arch is None or not isinstance(overrides, dict):
            return arch, None
        try:
            return arch.overridden(overrides), None
        except ValidationError as exc:
            return arch, exc

    def served_name(self, name: str) -> str:
        """The model name the API answers to, given the InferenceService's metadata.name."""
        return self.model.served_name or name
