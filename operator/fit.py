"""The fit check: will the engine start on these GPUs, and how many full-length sequences fit?

A pure function of the spec (and the checkpoint's architecture numbers), applying vLLM's start-up
rule: after the weights and the activation peak of a profiling step, the KV cache left within
`gpusPerReplica x GPU memory x gpuMemoryUtilization` must hold at least one `maxModelLen` sequence.
The figures are estimates from the architecture, not a measurement; they land in status.

What is counted, per replica:
- Weights: linear layers (attention q/k/v/o and the gated MLP of every layer) at the quantized
  width, embeddings and an untied LM head at the model dtype (vLLM keeps them unquantized); norms
  and biases are ignored (<0.1 %). `model.config.numParameters` overrides the derived count. With tensor
  parallelism wider than the KV heads, the engine replicates KV heads so every GPU holds one (QKVParallelLinear):
  k and v weights of max(KV heads, tensor) heads in all (added to numParameters too). With pipeline
  parallelism a stage builds only what it runs, as vLLM does (engine/models/llama.py): its decoder layers, the
  embedding on the first stage, the final norm and the LM head on the last; so an untied model's embedding and
  head count once, while a tied one's table counts twice (the first stage's embedding and the last stage's head).
  Bytes per linear weight: model dtype (2 for bf16/fp16, 4 for fp32); quantized ones as the engine holds them
  (`linear_storage`): a code, plus a scale (and zero point) per group of inputs or per output row, whose count is
  exact for the derived architecture (each linear's rows; o and down, row-parallel, keep every row on each
  tensor rank), an estimate (linear parameters / hiddenSize) with numParameters. fp8 and int8: 1 + a float32 scale
  a row (engine/quantization/fp8.py); block-scaled fp8 (an fp8 quantization_config with weight_block_size,
  compressed-tensors FP8_BLOCK): 1 + a float32 scale a block of each rank's merged q/k/v and gate/up and its part of
  o and down, partial blocks counted whole (`block_scales`; engine/quantization/fp8_block.py). AWQ/GPTQ
  (engine/quantization/packed_int.py): bits / 8 (weightBits, 4 when absent) + a model-dtype scale and a uint8 zero
  point per group (symmetric schemes keep theirs too): 0.5 + 3/128
  = 0.5234 in bf16 at groups of 128, the size assumed without a quantization_config; 0.5 + 3/32 at 32; one
  group a row (GPTQ's -1) 0.5 + 3 bytes a row; activation order (GPTQ desc_act, compressed-tensors actorder group)
  adds an int32 an input of each layer (q/k/v and gate/up once each: `act_order_inputs`; a checkpoint whose g_idx
  turns out in group order keeps none, 4 bytes an input over). compressed-tensors: `model.config.weightBits` 4: the
  int4 figure at groups of 128; 8 or absent: fp8's. An --hf-overrides quantization_config in spec.engineArgs
  replaces the checkpoint's whole, as the engine reads it (flotilla/quantization_config.py): its quant_method is
  the scheme counted where spec.quantization is none, its bits (compressed-tensors' num_bits, GPTQ/AWQ's bits) are
  weightBits, and its group size the one counted: GPTQ/AWQ's group_size (`packed_group_size`: GPTQ -1 and AWQ 128
  when absent, -1 one group a row), compressed-tensors' config group's weights (`compressed_tensors_group_size`:
  group_size under strategy "group", a row under "channel"; type "float", and int8 W8A8 in format int-quantized:
  fp8's figure).
  bitsandbytes (a 4-bit checkpoint, or nf4 at load): 0.5 + a float32 absmax a block of 64 inputs (4/64), a
  checkpoint's double-quantized absmax as the engine holds it, decoded (engine/quantization/bnb.py): 0.5625.
  rtn (quantized at load): RTN_NUM_BITS and RTN_GROUP_SIZE from spec.pod.env (default 8 bits in groups of
  128: 1 + 3/128 in bf16; 4 bits: 0.5 + 3/128; group -1: one scale and zero a row).
  gguf (a .gguf file, engine/quantization/gguf.py): what the engine holds on a GPU, not the file's bytes. A
  Q4_0/Q4_1/Q4_K linear keeps its codes (int32-packed, 0.5 byte a weight) with a float32 scale and offset a
  block of 32 (0.25) and, on CUDA, also the weight dequantized once at load at the model dtype (2 for bf16):
  2.75 bytes a weight in bf16, more than the dense checkpoint. `model.config.weightBits` 8 (Q8_0 linears,
  dequantized at load, codes not kept; also Q5_*/Q6_K files): the model dtype. Assumed 4 (Q4_0/Q4_1/Q4_K) when
  absent.
  The file itself (the hf:// download's emptyDir size, deployment.py): Q4_0 18 bytes a block of 32, Q4_1
  20 (counted: the larger), Q8_0 34; embeddings and an untied LM head as llama.cpp's Q4/Q8 files commonly
  hold them, counted at Q8_0 (the embedded SmolLM2 file's; Q6_K is smaller, F16 larger).
- Mixture-of-experts models (model.config.numExperts; Mixtral, Qwen2-MoE, Qwen3-MoE): a sparse layer's MLP is
  every expert's gate, up and down (numExperts x 3 x hidden x moeIntermediateSize, or intermediateSize for
  Mixtral), Qwen2-MoE's shared expert (3 x hidden x sharedExpertIntermediateSize) and the router (numExperts x
  hidden, plus the shared expert's one-logit gate), the router whole on every tensor-parallel rank; the layers
  decoderSparseStep and mlpOnlyLayers leave dense keep the gated MLP of intermediateSize. Under fp8 (at load or
  an fp8 checkpoint) every expert is fp8 with a float32 scale a row (gate/up rows split over the ranks, down's
  hidden rows on each) and the router stays at the model dtype (`moe_fp8_linear_bytes`). The engine refuses other
  quantization schemes and LoRA for them (admission too). The activation allowance below keeps intermediateSize
  (Mixtral's expert width; above a Qwen-MoE expert's: an over-estimate).
- LoRA adapter slots (with spec.lora), counted with the weights: maxLoras x maxLoraRank x (inputs +
  outputs of q/k/v/o/gate/up/down) per layer at the model dtype, as the engine allocates them.
- KV cache per token: 2 (K and V) x layers x KV heads x head dim x KV dtype bytes (model dtype, or
  1 for fp8). With tensor parallelism wider than the KV heads, vLLM replicates heads so every GPU
  holds one: max(KV heads, tensor) heads in all. One sequence takes maxModelLen rounded up to a
  whole KV block.
- A draft model (speculative.method draft_model with speculative.draftConfig): its weights at the
  model dtype (drafts are not quantized) and its KV per token at the model dtype (an fp8 cache is the
  target's only), since the engine gives it a block in its own pool for every block of the target's.
  An n-gram proposer costs no GPU memory.
- Activation allowance (documented estimate of vLLM's profiling peak plus what lives outside
  torch): 1 GiB per GPU for the CUDA context, cuBLAS/NCCL workspaces and CUDA-graph pools, plus per
  GPU a step of `maxNumBatchedTokens` tokens through the MLP (gate and up outputs,
  2 x intermediate / tensor) and four residual-sized buffers (4 x hidden) at the activation dtype,
  plus fp32 logits for maxNumSeqs sampled rows (vocab / tensor each).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from flotilla.engine_rules import RuleError, default_max_num_batched_tokens, rtn_settings
from flotilla.operator.gpus import GPU, lookup
from flotilla.operator.spec import InferenceServiceSpec, ModelArchitecture
from flotilla.operator.status import FitStatus
from flotilla.quantization_config import (
    act_order,
    checkpoint_kv_cache_dtype,
    compressed_tensors_group,
    compressed_tensors_group_size,
    compressed_tensors_int8_w8a8,
    config_method,
    config_weight_bits,
    fp8_block_size,
    modelopt_settings,
    packed_group_size,
)

GIB = 1 << 30
FIXED_OVERHEAD_PER_GPU = 1 * GIB
# The group size assumed for AWQ / GPTQ / compressed-tensors int4 without a quantization_config to read (the common
# one; the operator does not read the checkpoint's config.json).
ASSUMED_GROUP = 128
GGUF_BLOCK = 32
# On the device: int32-packed 4-bit codes plus a float32 scale and offset a block (GgufInt4Method.create_weights).
GGUF_INT4_CODE_BYTES_PER_WEIGHT = 0.5 + 2 * 4 / GGUF_BLOCK
# In the file: bytes a block of 32 weights (ggml's block_q4_0: fp16 d + 16 bytes; block_q4_1: + fp16 m;
# block_q8_0: fp16 d + 32 bytes).
GGUF_FILE_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}

Verdict = Literal["Fits", "FitsWithWarning", "DoesNotFit", "Unknown"]


@dataclass(frozen=True)
class FitReport:
    """The outcome of the fit check; byte figures are per replica (all its GPUs together)."""

    verdict: Verdict
    reason: str
    message: str
    weight_bytes: int | None = None
    kv_bytes_per_token: int | None = None
    activation_bytes: int | None = None
    budget_bytes: int | None = None
    kv_budget_bytes: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None

    @property
    def condition_status(self) -> str:
        """The `FitChecked` condition's status: True (fits, maybe with a warning), False or Unknown."""
        return {"Fits": "True", "FitsWithWarning": "True", "DoesNotFit": "False"}.get(self.verdict, "Unknown")

    def to_status(self) -> FitStatus:
        """The report as the `status.fit` model (concurrency to two decimals)."""
        figures = asdict(self)
        if self.max_concurrency is not None:
            figures["max_concurrency"] = round(self.max_concurrency, 2)
        return FitStatus.model_validate(figures)


def _dtype_bytes(dtype: str) -> int:
    # `auto` takes the checkpoint's dtype; current checkpoints are bf16, so assume 2 bytes.
    return 4 if dtype == "float32" else 2


def parameter_counts(arch: ModelArchitecture, tensor: int = 1) -> tuple[int, int]:
    """(linear-layer parameters, embedding + LM-head parameters) of the decoder, over `tensor` ranks: with more
    ranks than KV heads each rank holds one KV head's k and v weights (the engine replicates them), and every rank
    a whole router of each sparse layer of a mixture-of-experts model."""
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    kv_heads = max(arch.num_key_value_heads or arch.num_attention_heads, tensor)
    q_width, kv_width = arch.num_attention_heads * head_dim, kv_heads * head_dim
    attention = arch.hidden_size * (2 * q_width + 2 * kv_width)  # q and o, k and v
    mlp = 3 * arch.hidden_size * arch.intermediate_size  # gate, up, down
    embeddings = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    sparse = arch.sparse_layers
    if arch.num_parameters is not None:
        replicated = arch.num_hidden_layers * arch.hidden_size * 2 * (kv_heads - (arch.num_key_value_heads or
                                                                               arch.num_attention_heads)) * head_dim
        replicated += sparse * (tensor - 1) * _router_parameters(arch)
        return max(arch.num_parameters - embeddings, 0) + replicated, embeddings
    mlps = (arch.num_hidden_layers - sparse) * mlp + sparse * (_experts_parameters(arch) +
                                                             tensor * _router_parameters(arch))
    return arch.num_hidden_layers * attention + mlps, embeddings


def _experts_parameters(arch: ModelArchitecture) -> int:
    """One sparse layer's expert weights, split over tensor ranks (engine/layers/moe.py): every expert's gate, up
    and down, and Qwen2-MoE's shared expert."""
    width = arch.moe_intermediate_size or arch.intermediate_size
    shared = arch.shared_expert_intermediate_size or 0
    return 3 * arch.hidden_size * ((arch.num_experts or 0) * width + shared)


def _router_parameters(arch: ModelArchitecture) -> int:
    """One sparse layer's router (a logit an expert) and Qwen2-MoE's shared-expert gate (one logit): whole on every
    tensor rank."""
    if arch.num_experts is None:
        return 0
    return arch.hidden_size * (arch.num_experts + (1 if arch.shared_expert_intermediate_size else 0))


def rtn_env(spec: InferenceServiceSpec) -> dict[str, str]:
    """The literal RTN_* values of spec.pod.env, the last one of a name winning as in a pod (a value from a
    Secret or ConfigMap is not known here)."""
    return {e.name: e.value for e in spec.pod.env if e.name.startswith("RTN_") and e.value is not None}


def rtn_scheme(spec: InferenceServiceSpec) -> tuple[int, int | None]:
    """The (bits, group size or None for one group a row) `--quantization rtn` quantizes to in this spec's pods
    (engine_rules.rtn_settings over spec.pod.env; the engine's defaults, 8 bits in groups of 128, when they are
    not valid: admission refuses that spec)."""
    try:
        return rtn_settings(rtn_env(spec))
    except RuleError:
        return 8, 128


@dataclass(frozen=True)
class LinearStorage:
    """How the engine holds a quantized linear layer's weight: a code of `bits` a weight, and per `group` inputs of an
    output row (None: one per row) `scale_bytes` of scale and zero point; with `block` (`[rows, inputs]`, block-scaled
    fp8) one scale a block of each rank's weight instead."""

    bits: int
    group: int | None
    scale_bytes: int
    # Activation order (GPTQ desc_act, compressed-tensors actorder group): each layer also keeps its inputs' order,
    # an int32 an input (engine/quantization/packed_int.py `weight_perm`).
    act_order: bool = False
    block: tuple[int, int] | None = None
    # A static activation scheme (ModelOpt FP8): each linear layer also keeps one float32 input scale.
    input_scale: bool = False


def packed_int_storage(bits: int, group: int | None, dtype: str = "auto") -> LinearStorage:
    """Packed-integer codes (GPTQ, AWQ, compressed-tensors W4A16/W8A16, rtn): a scale at the model dtype and a uint8
    zero point a group (symmetric schemes keep theirs too, packed_int.py)."""
    return LinearStorage(bits, group, _dtype_bytes(dtype) + 1)


# fp8 weights (--quantization fp8 at load, fp8 and compressed-tensors float checkpoints) and compressed-tensors int8
# W8A8 (engine/quantization/int8.py): one float32 scale an output row (engine/quantization/fp8.py; a per-tensor
# checkpoint scale is spread over the rows).
FP8_STORAGE = LinearStorage(8, None, 4)
# bitsandbytes 4-bit (a checkpoint's nf4 / fp4, or --quantization bitsandbytes at load; engine/quantization/bnb.py):
# two codes a byte and a float32 absmax a block of 64 inputs, a checkpoint's double-quantized absmax decoded at load.
# The block is kernels/nf4_linear.py's BLOCK (that module imports torch; tests/operator/test_admission.py compares).
BNB_BLOCK = 64
BNB_STORAGE = LinearStorage(4, BNB_BLOCK, 4)
# An activation-order layer's input order: an int32 an input.
ACT_ORDER_INDEX_BYTES = 4
# A static activation scheme's input scale (engine/quantization/fp8.py `input_scale`): a float32 a linear layer.
INPUT_SCALE_BYTES = 4


def linear_storage(quantization: str, arch: ModelArchitecture, quantization_config: Any = None,
                   rtn: tuple[int, int | None] = (8, 128), dtype: str = "auto") -> LinearStorage | None:
    """How the engine stores the linear weights under `quantization` (None: dense or gguf, counted apart), reading
    a GPTQ/AWQ group size and a compressed-tensors config group from `quantization_config` (an --hf-overrides one)
    with the engine's readers; without one, groups of ASSUMED_GROUP (compressed-tensors: W4A16 at weightBits 4, fp8
    otherwise). A quantization_config the engine refuses counts as absent (the webhook refuses that spec)."""
    block = _fp8_block(quantization, quantization_config)
    if block is not None:
        return LinearStorage(8, None, 4, block=block)
    if quantization in ("fp8", "int8", "fbgemm_fp8"):  # fbgemm_fp8: a float32 scale a row, dynamic activations
        return FP8_STORAGE
    if quantization == "modelopt":  # one scale a tensor spread over its rows (or a row's own); FP8's input scale
        return replace(FP8_STORAGE, input_scale=_modelopt_static(quantization_config))
    if quantization == "rtn":
        return packed_int_storage(*rtn, dtype)
    if quantization == "bitsandbytes":
        return BNB_STORAGE
    qcfg = quantization_config if config_method(quantization_config) == quantization else None
    bits = config_weight_bits(qcfg) or arch.weight_bits
    if quantization in ("gptq", "awq"):
        return replace(packed_int_storage(bits or 4, _packed_group(qcfg), dtype), act_order=act_order(qcfg))
    if quantization == "compressed-tensors":
        weights = _compressed_tensors_weights(qcfg)
        if weights is None:
            return packed_int_storage(4, ASSUMED_GROUP, dtype) if bits == 4 else FP8_STORAGE
        if weights.get("type") == "float" or (qcfg is not None and compressed_tensors_int8_w8a8(qcfg)):  # int8 W8A8
            return FP8_STORAGE
        try:
            storage = packed_int_storage(bits or 8, compressed_tensors_group_size(weights), dtype)
            return replace(storage, act_order=act_order(qcfg))
        except ValueError:  # the engine refuses the group size (the webhook too): count the assumed one
            return packed_int_storage(bits or 8, ASSUMED_GROUP, dtype)
    return None


def _modelopt_static(quantization_config: Any) -> bool:
    """Whether a ModelOpt quantization_config's layers keep a static input scale (quant_algo FP8; assumed without
    one to read, or where the engine refuses it)."""
    if config_method(quantization_config) != "modelopt":
        return True
    try:
        return modelopt_settings(quantization_config)[0] == "FP8"
    except ValueError:
        return True


def _fp8_block(quantization: str, quantization_config: Any) -> tuple[int, int] | None:
    """The fp8 block (`fp8_block_size`) of a quantization_config of the scheme `quantization` (an fp8 checkpoint with
    weight_block_size, compressed-tensors FP8_BLOCK), None for another layout or one the engine refuses."""
    if config_method(quantization_config) != quantization:
        return None
    try:
        return fp8_block_size(quantization_config)
    except ValueError:
        return None


def block_scales(arch: ModelArchitecture, block: tuple[int, int], tensor: int = 1) -> int:
    """Block scales of the decoder's linear layers over `tensor` ranks, as the engine holds them
    (engine/quantization/fp8_block.py): each rank's merged q/k/v and gate/up weights, and its part of o's and down's
    inputs, in whole and partial blocks. Estimated as the linear parameters over a block's for numParameters or a
    mixture-of-experts model."""
    if arch.num_parameters is not None or arch.num_experts is not None:
        return math.ceil(parameter_counts(arch, tensor)[0] / (block[0] * block[1]))
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    kv_heads = max((arch.num_key_value_heads or arch.num_attention_heads) // tensor, 1)
    q, mlp, hidden = arch.num_attention_heads * head_dim // tensor, arch.intermediate_size // tensor, arch.hidden_size

    def count(rows: int, inputs: int) -> int:
        return math.ceil(rows / block[0]) * math.ceil(inputs / block[1])

    rank = count(q + 2 * kv_heads * head_dim, hidden) + count(hidden, q) + count(2 * mlp, hidden) + count(hidden, mlp)
    return arch.num_hidden_layers * tensor * rank


def _packed_group(quantization_config: Any) -> int | None:
    """A GPTQ/AWQ quantization_config's group size as the engine reads it (`packed_group_size`), ASSUMED_GROUP
    without one or where the engine refuses its group_size."""
    if quantization_config is None:
        return ASSUMED_GROUP
    try:
        return packed_group_size(quantization_config)
    except ValueError:
        return ASSUMED_GROUP


def _compressed_tensors_weights(quantization_config: Any) -> dict[str, Any] | None:
    """compressed-tensors' one config group's `weights`, or None without a quantization_config or where the engine
    refuses its config groups."""
    if quantization_config is None:
        return None
    try:
        return compressed_tensors_group(quantization_config)["weights"]
    except ValueError:
        return None


def act_order_inputs(arch: ModelArchitecture) -> int:
    """Inputs of the decoder's linear layers as the engine builds them, each keeping one index under activation
    order: the shared input of q/k/v and that of gate/up (hidden each, once a merged layer), o's (attention heads x
    head dim) and down's (intermediate). One tensor rank: the engine refuses activation order over more."""
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    width = 2 * arch.hidden_size + arch.num_attention_heads * head_dim + arch.intermediate_size
    return arch.num_hidden_layers * width


def linear_rows(arch: ModelArchitecture, tensor: int = 1) -> int:
    """Output rows of the decoder's linear layers over `tensor` ranks, each holding its scales when a row has one:
    q/k/v and gate/up split their rows over the ranks, o and down (row-parallel) keep every row on each. Estimated
    as the linear parameters over hiddenSize for numParameters or a mixture-of-experts model."""
    linear, _ = parameter_counts(arch, tensor)
    if arch.num_parameters is not None or arch.num_experts is not None:
        return linear // arch.hidden_size
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    kv_heads = max(arch.num_key_value_heads or arch.num_attention_heads, tensor)
    column = (arch.num_attention_heads + 2 * kv_heads) * head_dim + 2 * arch.intermediate_size
    return arch.num_hidden_layers * (column + tensor * 2 * arch.hidden_size)


def linear_layers(arch: ModelArchitecture, tensor: int = 1) -> int:
    """The decoder's linear layers as the engine builds them (merged q/k/v, o, merged gate/up, down), on every one of
    `tensor` ranks."""
    return 4 * arch.num_hidden_layers * tensor


def weight_bytes(arch: ModelArchitecture, quantization: str, dtype: str = "auto",
                 rtn: tuple[int, int | None] = (8, 128), tensor: int = 1, pipeline: int = 1,
                 quantization_config: Any = None) -> int:
    """Bytes of the weights of one replica for a quantization method (see the module docstring); `rtn` is
    `rtn_scheme`'s (bits, group); `tensor` the replica's tensor-parallel ranks (KV heads replicated over them),
    `pipeline` its stages (the first holds the embedding, the last the LM head: a tied table twice);
    `quantization_config` an --hf-overrides one (`linear_storage`)."""
    linear, embeddings = parameter_counts(arch, tensor)
    if arch.tie_word_embeddings and pipeline > 1:
        embeddings += arch.vocab_size * arch.hidden_size  # the last stage's head, a copy of the first's embedding
    dense = embeddings * _dtype_bytes(dtype)
    storage = linear_storage(quantization, arch, quantization_config, rtn, dtype)
    if storage is not None and storage.block is not None:
        return linear * storage.bits // 8 + block_scales(arch, storage.block, tensor) * storage.scale_bytes + dense
    if storage == FP8_STORAGE and arch.num_experts is not None and arch.num_parameters is None:
        return moe_fp8_linear_bytes(arch, tensor, dtype) + dense
    if storage is not None:
        scales = linear // storage.group if storage.group else linear_rows(arch, tensor)
        order = ACT_ORDER_INDEX_BYTES * act_order_inputs(arch) if storage.act_order else 0
        inputs = INPUT_SCALE_BYTES * linear_layers(arch, tensor) if storage.input_scale else 0
        return linear * storage.bits // 8 + scales * storage.scale_bytes + order + inputs + dense
    # CUDA keeps a GGUF 4-bit layer's codes beside its dequantized weight (module docstring).
    gguf = _dtype_bytes(dtype) + (GGUF_INT4_CODE_BYTES_PER_WEIGHT if arch.weight_bits != 8 else 0)
    per_weight = {"none": _dtype_bytes(dtype), "gguf": gguf}[quantization]
    return int(linear * per_weight + dense)


def moe_fp8_linear_bytes(arch: ModelArchitecture, tensor: int = 1, dtype: str = "auto") -> int:
    """Bytes of a mixture-of-experts model's linear layers under fp8 over `tensor` ranks, as the engine holds them
    (engine/quantization/fp8.py): every linear weight and expert a byte a weight with a float32 scale a row — the
    experts' gate/up rows split over the ranks, their down rows (hidden) whole on each, as a dense layer's o and
    down — and each sparse layer's router (and Qwen2-MoE's shared-expert gate) whole on every rank at the model
    dtype, unquantized."""
    linear, _ = parameter_counts(arch, tensor)
    router = arch.sparse_layers * tensor * _router_parameters(arch)
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    kv_heads = max(arch.num_key_value_heads or arch.num_attention_heads, tensor)
    whole = tensor * arch.hidden_size  # a row-parallel layer's rows, on every rank
    attention = (arch.num_attention_heads + 2 * kv_heads) * head_dim + whole
    width = arch.moe_intermediate_size or arch.intermediate_size
    shared = arch.shared_expert_intermediate_size or 0
    experts = (arch.num_experts or 0) * (2 * width + whole) + (2 * shared + whole if shared else 0)
    dense_mlp = 2 * arch.intermediate_size + whole
    rows = (arch.num_hidden_layers * attention + arch.sparse_layers * experts
            + (arch.num_hidden_layers - arch.sparse_layers) * dense_mlp)
    return (linear - router) * FP8_STORAGE.bits // 8 + rows * FP8_STORAGE.scale_bytes + router * _dtype_bytes(dtype)


def gguf_file_bytes(arch: ModelArchitecture) -> int:
    """Bytes of a GGUF file of this architecture: linears at Q4_1 (or Q8_0 with weightBits 8), embeddings and an
    untied LM head at Q8_0 (see the module docstring)."""
    linear, embeddings = parameter_counts(arch)
    linear_block = GGUF_FILE_BLOCK_BYTES["Q8_0" if arch.weight_bits == 8 else "Q4_1"]
    return int((linear * linear_block + embeddings * GGUF_FILE_BLOCK_BYTES["Q8_0"]) / GGUF_BLOCK)


def lora_slot_bytes(arch: ModelArchitecture, spec: InferenceServiceSpec) -> int:
    """Device bytes of the LoRA adapter slots (0 without spec.lora; see the module docstring)."""
    if spec.lora is None:
        return 0
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    q = arch.num_attention_heads * head_dim
    kv = (arch.num_key_value_heads or arch.num_attention_heads) * head_dim
    h, i = arch.hidden_size, arch.intermediate_size
    # A and B of q/k/v/o/gate/up/down, per unit of rank: inputs 3h (qkv) + q (o) + 2h (gate/up) + i (down),
    # outputs q + 2kv + h + 2i + h.
    per_rank = (3 * h + q + 2 * h + i) + (q + 2 * kv + h + 2 * i + h)
    slots = spec.lora.max_loras * spec.lora.max_lora_rank
    return arch.num_hidden_layers * per_rank * slots * _dtype_bytes(spec.dtype)


def kv_bytes_per_token(arch: ModelArchitecture, kv_dtype: str, dtype: str = "auto", tensor: int = 1) -> int:
    """KV-cache bytes of one token over all of a replica's GPUs."""
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    kv_heads = max(arch.num_key_value_heads or arch.num_attention_heads, tensor)
    element = 1 if kv_dtype.startswith("fp8") else _dtype_bytes(dtype)
    return 2 * arch.num_hidden_layers * kv_heads * head_dim * element


def activation_bytes(arch: ModelArchitecture, spec: InferenceServiceSpec, max_model_len: int) -> int:
    """The activation allowance of one replica (see the module docstring)."""
    sched, tensor = spec.scheduling, spec.parallelism.tensor
    tokens = sched.max_num_batched_tokens or default_max_num_batched_tokens(max_model_len, sched.chunked_prefill)
    per_token = (2 * arch.intermediate_size // tensor + 4 * arch.hidden_size) * _dtype_bytes(spec.dtype)
    logits = sched.max_num_seqs * (arch.vocab_size // tensor) * 4
    return spec.gpus_per_replica * (FIXED_OVERHEAD_PER_GPU + tokens * per_token + logits)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_fit(spec: InferenceServiceSpec, arch: ModelArchitecture | None = None) -> FitReport:
    """Apply vLLM's start-up rule to a spec; `arch` defaults to spec.architecture (model.config with engineArgs'
    --hf-overrides set over it)."""
    arch = arch or spec.architecture
    if arch is None:
        return FitReport(
            "Unknown", "ArchitectureUnknown",
            "no architecture numbers: set spec.model.config (from the checkpoint's config.json) for the "
            "operator to check the fit; the operator does not read the checkpoint itself")
    gpu = lookup(spec.resources.gpu_product)
    if gpu is None:
        product = spec.resources.gpu_product
        return FitReport("Unknown", "GPUUnknown",
                         f"GPU product {product!r} has no known memory size" if product
                         else "spec.resources.gpuProduct is not set, so the GPU memory is unknown")
    max_model_len = spec.scheduling.max_model_len or arch.length_limit
    if max_model_len is None:
        return FitReport("Unknown", "MaxModelLenUnknown",
                         "set spec.scheduling.maxModelLen or model.config.maxPositionEmbeddings")
    return _verdict(spec, gpu, _memory(spec, arch, gpu, max_model_len))


@dataclass(frozen=True)
class _Memory:
    """A replica's memory as the start-up rule counts it, all its GPUs together (named as FitReport's figures)."""

    weight_bytes: int
    kv_bytes_per_token: int
    activation_bytes: int
    budget_bytes: int  # what the engine may use: the GPUs' memory times gpuMemoryUtilization
    kv_budget_bytes: int  # what the weights and activations leave of it for the KV cache
    max_model_len: int


def _memory(spec: InferenceServiceSpec, arch: ModelArchitecture, gpu: GPU, max_model_len: int) -> _Memory:
    """The weights (with the LoRA slots and a draft model's), the KV bytes a token (the draft's too), the
    activations and the budget of `spec` on `gpu`."""
    tensor, pipeline = spec.parallelism.tensor, spec.parallelism.pipeline
    weights = weight_bytes(arch, spec.weight_quantization, spec.dtype, rtn_scheme(spec), tensor, pipeline,
                           spec.quantization_config_override)
    weights += lora_slot_bytes(arch, spec)
    # auto over a ModelOpt quantization_config with an FP8 KV cache is fp8, as the engine reads it
    kv_dtype = checkpoint_kv_cache_dtype(spec.kv_cache.dtype, spec.quantization_config_override)
    per_token = kv_bytes_per_token(arch, kv_dtype, spec.dtype, spec.parallelism.tensor)
    draft = spec.speculative.draft_config if spec.speculative and spec.speculative.method == "draft_model" else None
    if draft is not None:
        weights += weight_bytes(draft, "none", spec.dtype, tensor=tensor, pipeline=pipeline)
        # the engine keeps the draft's pool in the model dtype whatever the target's cache dtype (fp8 included)
        per_token += kv_bytes_per_token(draft, "auto", spec.dtype, spec.parallelism.tensor)
    activations = activation_bytes(arch, spec, max_model_len)
    budget = int(spec.gpus_per_replica * gpu.memory_bytes * spec.kv_cache.gpu_memory_utilization)
    return _Memory(weights, per_token, activations, budget, budget - weights - activations, max_model_len)


def _verdict(spec: InferenceServiceSpec, gpu: GPU, mem: _Memory) -> FitReport:
    """DoesNotFit unless one max-length sequence's KV cache fits what the weights and activations leave; then
    FitsWithWarning if fewer sequences fit than scheduling.maxNumSeqs, else Fits."""
    figures = asdict(mem)
    kv_budget, max_model_len = mem.kv_budget_bytes, mem.max_model_len
    block = spec.kv_cache.block_size
    sequence = math.ceil(max_model_len / block) * block * mem.kv_bytes_per_token
    where = (f"{spec.gpus_per_replica} x {gpu.product} at gpuMemoryUtilization "
             f"{spec.kv_cache.gpu_memory_utilization:g} ({_gib(mem.budget_bytes)})")
    if kv_budget < sequence:
        return FitReport("DoesNotFit", "InsufficientGPUMemory", _does_not_fit(mem, sequence, block, where),
                         max_concurrency=max(kv_budget, 0) / sequence, **figures)

    concurrency = kv_budget / sequence
    if concurrency < spec.scheduling.max_num_seqs:
        return FitReport(
            "FitsWithWarning", "LowConcurrency",
            f"only {concurrency:.2f} sequences of {max_model_len} tokens fit in the KV cache on {where}, "
            f"below scheduling.maxNumSeqs ({spec.scheduling.max_num_seqs}); long requests will queue or be "
            "preempted", max_concurrency=concurrency, **figures)
    return FitReport("Fits", "Fits",
                     f"{concurrency:.2f} sequences of {max_model_len} tokens fit in the KV cache on {where}",
                     max_concurrency=concurrency, **figures)


def _does_not_fit(mem: _Memory, sequence: int, block: int, where: str) -> str:
    """What a DoesNotFit verdict says: the weights and activations alone too large, or the longest context that
    would fit."""
    weights, activations, kv_budget = mem.weight_bytes, mem.activation_bytes, mem.kv_budget_bytes
    if kv_budget <= 0:
        return (f"weights ({_gib(weights)}) and activations ({_gib(activations)}) do not fit {where}; "
                "add GPUs (parallelism), quantize, or use a larger GPU")
    fitting = kv_budget // mem.kv_bytes_per_token // block * block
    return (f"one {mem.max_model_len}-token sequence needs {_gib(sequence)} of KV cache but only "
            f"{_gib(kv_budget)} is left after weights ({_gib(weights)}) and activations "
            f"on {where}; "
            f"lower scheduling.maxModelLen to {fitting} or less, add GPUs, or quantize")
