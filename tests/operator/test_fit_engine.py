"""The fit check's byte figures against what the engine allocates for the same config.json and flags.

One real-shaped small Llama (hidden 1024, GQA 8/2, head_dim 128) built by the engine's own loader with dummy
weights on the CPU, under every weight scheme the fit check names: its parameters and buffers (storage counted
once: a tied head, the layers' shared rotary table) against `weight_bytes`, its KV block bytes against
`kv_bytes_per_token`. Left out of the engine's side, as the fit check documents: norms and the fp32 rotary table
(max positions x head_dim, shared by the layers). The rest agrees to the byte: quantized codes and their scales (and
zero points) a group of the quantization_config's group size, or a row (fp8, GPTQ -1, compressed-tensors "channel").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic.alias_generators import to_camel

from flotilla.operator.fit import kv_bytes_per_token, weight_bytes
from flotilla.operator.spec import ModelArchitecture

HIDDEN, MLP, HEADS, KV_HEADS, HEAD_DIM, VOCAB, LAYERS = 1024, 2048, 8, 2, 128, 1024, 2
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
          "intermediate_size": MLP, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
          "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB, "max_position_embeddings": 512,
          "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}


def _compressed_tensors(bits: int, symmetric: bool, group: int | None = 128, kind: str = "int",
                        actorder: str | None = None) -> dict:
    weights = {"num_bits": bits, "type": kind, "strategy": "channel" if group is None else "group",
               "group_size": group, "symmetric": symmetric, "actorder": actorder}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized" if kind == "int" else "float-quantized",
            "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}}}


def _int8_w8a8() -> dict:
    qcfg = _compressed_tensors(8, True, None)
    group = qcfg["config_groups"]["group_0"]
    group["input_activations"] = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                  "dynamic": True}
    return qcfg | {"format": "int-quantized"}


def _gptq(bits: int, desc_act: bool = False, **group: int) -> dict:
    return {"quantization_config": {"quant_method": "gptq", "bits": bits, "desc_act": desc_act, "sym": True, **group}}


# case -> (config.json changes, engine flags, the spec's quantization, weightBits, kv cache dtype)
CASES = {
    "bf16": ({}, {}, "none", None, "auto"),
    "bf16-tied": ({"tie_word_embeddings": True}, {}, "none", None, "auto"),
    "qwen3": ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, {}, "none", None, "auto"),
    "fp8-kv-fp8": ({}, {"quantization": "fp8", "kv_cache_dtype": "fp8"}, "fp8", None, "fp8"),
    "rtn-8-default": ({}, {"quantization": "rtn"}, "rtn", None, "auto"),
    "w4a16-g128": ({"quantization_config": _compressed_tensors(4, True)}, {}, "compressed-tensors", 4, "auto"),
    "w4a16-asym-g128": ({"quantization_config": _compressed_tensors(4, False)}, {}, "compressed-tensors", 4, "auto"),
    "awq-g128": ({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
                                          "zero_point": True}}, {}, "awq", None, "auto"),
    "gptq-g128": (_gptq(4, group_size=128), {}, "gptq", None, "auto"),
    # the group size the quantization_config names: 4x the scales of g128 at 32, one a row at -1 (GPTQ's default)
    "gptq-g32": (_gptq(4, group_size=32), {}, "gptq", None, "auto"),
    "gptq-per-row": (_gptq(4, group_size=-1), {}, "gptq", None, "auto"),
    "gptq-default-group": (_gptq(4), {}, "gptq", None, "auto"),
    "gptq-8-g64": (_gptq(8, group_size=64), {}, "gptq", 8, "auto"),
    # activation order: an int32 an input of each layer besides (q/k/v and gate/up one each), in the g_idx's place
    "gptq-desc-act-g128": (_gptq(4, desc_act=True, group_size=128), {}, "gptq", None, "auto"),
    "w4a16-actorder-group-g128": ({"quantization_config": _compressed_tensors(4, False, actorder="group")}, {},
                                  "compressed-tensors", 4, "auto"),
    "awq-g64": ({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm",
                                         "zero_point": True}}, {}, "awq", None, "auto"),
    "w4a16-g32": ({"quantization_config": _compressed_tensors(4, True, 32)}, {}, "compressed-tensors", 4, "auto"),
    "w4a16-channel": ({"quantization_config": _compressed_tensors(4, True, None)}, {}, "compressed-tensors", 4,
                      "auto"),
    "w8a16-g128": ({"quantization_config": _compressed_tensors(8, True)}, {}, "compressed-tensors", 8, "auto"),
    "fp8-checkpoint": ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}, {}, "fp8",
                       None, "auto"),
    # dummy weights of an fp8 checkpoint: torch draws no fp8 normals (this crashed the dummy load)
    "fp8-channel-checkpoint": ({"quantization_config": _compressed_tensors(8, True, None, "float")}, {},
                               "compressed-tensors", 8, "auto"),
    # int8 W8A8 (int-quantized): int8 codes and a float32 scale a row, as fp8's; dummy int8 codes drawn as integers
    "w8a8-int8-checkpoint": ({"quantization_config": _int8_w8a8()}, {}, "compressed-tensors", 8, "auto"),
    # block-scaled fp8 (Qwen3-*-FP8's weight_block_size; llm-compressor's FP8_BLOCK): a float32 scale a block of the
    # merged q/k/v and gate/up; blocks of 384 inputs end partial (1024 = 2 x 384 + 256, 2048 = 5 x 384 + 128)
    "fp8-block-checkpoint": ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                      "weight_block_size": [128, 128]}}, {}, "fp8", None, "auto"),
    "fp8-block-partial": ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                   "weight_block_size": [128, 384]}}, {}, "fp8", None, "auto"),
    "fp8-block-compressed-tensors": ({"quantization_config": _compressed_tensors(8, True, None, "float") | {
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
            "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128], "symmetric": True}}}}},
        {}, "compressed-tensors", 8, "auto"),
    # bitsandbytes 4-bit: two codes a byte and a float32 absmax a block of 64 inputs, at load or from a checkpoint
    # (double quantization decoded: the same bytes)
    "bnb-at-load": ({}, {"quantization": "bitsandbytes"}, "bitsandbytes", None, "auto"),
    "bnb-nf4-checkpoint": ({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                                    "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                                                    "llm_int8_skip_modules": ["lm_head"]}}, {}, "bitsandbytes", None,
                           "auto"),
    # NVIDIA ModelOpt FP8: a float32 scale a tensor spread over its rows, and a float32 static input scale a layer;
    # kv_cache_quant_algo FP8 makes --kv-cache-dtype auto an fp8 cache
    "modelopt-fp8-kv-fp8": ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8",
                                                     "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}},
                            {}, "modelopt", None, "fp8"),
    # ModelOpt FP8_PER_CHANNEL_PER_TOKEN: a float32 scale a row, no input scale
    "modelopt-fp8-per-channel": ({"quantization_config": {"quant_method": "modelopt",
                                                          "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}},
                                 {}, "modelopt", None, "auto"),
    # Meta's fbgemm_fp8: a float32 scale a row, dynamic per-token activations
    "fbgemm-fp8": ({"quantization_config": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                                            "modules_to_not_convert": ["lm_head"]}}, {}, "fbgemm_fp8", None, "auto"),
}


def _engine_bytes(path: Path, flags: dict) -> tuple[int, int]:
    """(weight bytes, KV bytes a token) of the engine's model runner for the model at `path`."""
    from flotilla.engine.config import EngineConfig
    from flotilla.engine.model_runner import ModelRunner

    config = EngineConfig.from_kwargs(str(path), load_format="dummy", dtype="bfloat16", max_model_len=256,
                                      max_num_seqs=2, **flags)
    runner = ModelRunner(config)
    storages: dict[int, int] = {}
    for name, tensor in [*runner.model.named_parameters(), *runner.model.named_buffers()]:
        if "norm" not in name and "cos_sin_cache" not in name:
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(storages.values()), runner.bytes_per_block // runner.block_size


@pytest.mark.parametrize("case", list(CASES))
def test_fit_figures_equal_what_the_engine_allocates(tmp_path, monkeypatch, case):
    # The int4 figure counted a 4-bit zero point a group (vLLM's packed qzeros) where the engine keeps a uint8 one
    # (packed_int.py), and rtn's 8-bit default counted 1 byte a weight, leaving out its bf16 scale and zero point a
    # group of 128: the fit check under-counted both (0.75 % and 2.3 % of the linear weights).
    monkeypatch.delenv("RTN_NUM_BITS", raising=False)
    monkeypatch.delenv("RTN_GROUP_SIZE", raising=False)
    changes, flags, quantization, bits, kv_dtype = CASES[case]
    config = CONFIG | changes
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights, kv_per_token = _engine_bytes(tmp_path, flags)
    arch = ModelArchitecture.model_validate({
        "hiddenSize": HIDDEN, "numHiddenLayers": LAYERS, "numAttentionHeads": HEADS, "numKeyValueHeads": KV_HEADS,
        "headDim": HEAD_DIM, "intermediateSize": MLP, "vocabSize": VOCAB,
        "tieWordEmbeddings": config["tie_word_embeddings"], "weightBits": bits})
    # to the byte: codes, a scale (and zero point) a group of the quantization_config's group size or a row
    qcfg = config.get("quantization_config")
    assert weight_bytes(arch, quantization, "bfloat16", quantization_config=qcfg) == weights
    assert kv_bytes_per_token(arch, kv_dtype, "bfloat16") == kv_per_token


def test_fit_lora_slots_equal_what_the_engine_allocates(tmp_path):
    """`lora_slot_bytes` against the A and B stacks of every LoRA-wrapped projection (plain attributes, not
    parameters: counted from the wrappers)."""
    from flotilla.engine.config import EngineConfig
    from flotilla.engine.lora.layers import LoRALinear
    from flotilla.engine.model_runner import ModelRunner
    from flotilla.operator.fit import lora_slot_bytes
    from flotilla.operator.spec import InferenceServiceSpec

    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    config = EngineConfig.from_kwargs(str(tmp_path), load_format="dummy", dtype="bfloat16", max_model_len=256,
                                      max_num_seqs=2, enable_lora=True, max_loras=2, max_lora_rank=8)
    runner = ModelRunner(config)
    engine = sum(m.lora_a.nbytes + m.lora_b.nbytes for m in runner.model.modules() if isinstance(m, LoRALinear))
    arch = ModelArchitecture.model_validate({
        "hiddenSize": HIDDEN, "numHiddenLayers": LAYERS, "numAttentionHeads": HEADS, "numKeyValueHeads": KV_HEADS,
        "headDim": HEAD_DIM, "intermediateSize": MLP, "vocabSize": VOCAB})
    spec = InferenceServiceSpec.model_validate({"model": {"source": "hf://org/model"}, "dtype": "bfloat16",
                                                "lora": {"maxLoras": 2, "maxLoraRank": 8}})
    assert engine > 0 and lora_slot_bytes(arch, spec) == engine


# case -> (config.json changes, the same numbers as spec.model.config takes them)
LENGTHS = {
    "plain": ({}, {}),
    # Mistral-7B-v0.1: sliding_window 4096 in config.json; the engine caps its length there (full attention within
    # the window) while the fit check counted 32768-token sequences and admission let maxModelLen 32768 through.
    "sliding-window": ({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                        "max_position_embeddings": 32768, "sliding_window": 4096},
                       {"maxPositionEmbeddings": 32768, "slidingWindow": 4096}),
    # Qwen2 configs carry a window they do not use.
    "sliding-window-off": ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                            "max_position_embeddings": 32768, "sliding_window": 4096, "use_sliding_window": False},
                           {"maxPositionEmbeddings": 32768, "slidingWindow": 4096, "useSlidingWindow": False}),
    # Qwen2.5's YaRN: 4 x 32768; the fit check under-counted by 4 and admission refused maxModelLen 131072.
    "yarn": ({"max_position_embeddings": 32768,
              "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
             {"maxPositionEmbeddings": 32768,
              "ropeScaling": {"type": "yarn", "factor": 4.0, "originalMaxPositionEmbeddings": 32768}}),
    "linear": ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
               {"maxPositionEmbeddings": 4096, "ropeScaling": {"ropeType": "linear", "factor": 2.0}}),
    # original_max_position_embeddings at the top level (Phi-3 style), which transformers and the engine read first:
    # without originalMaxPositionEmbeddings the operator counted 4 x 131072 and admitted a maxModelLen the engine
    # refused.
    "yarn-top-level": ({"max_position_embeddings": 131072, "original_max_position_embeddings": 32768,
                        "rope_scaling": {"type": "yarn", "factor": 4.0}},
                       {"maxPositionEmbeddings": 131072, "originalMaxPositionEmbeddings": 32768,
                        "ropeScaling": {"type": "yarn", "factor": 4.0}}),
    # Llama 3.1: max_position_embeddings counts the factor already.
    "llama3": ({"max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
               {"maxPositionEmbeddings": 131072, "ropeScaling": {"ropeType": "llama3", "factor": 8.0,
                                                                  "originalMaxPositionEmbeddings": 8192}}),
}


@pytest.mark.parametrize("case", list(LENGTHS))
def test_the_fit_checks_default_length_is_the_engines_and_admission_refuses_only_past_it(tmp_path, case):
    from flotilla.engine.config import ConfigError, EngineConfig
    from flotilla.operator.admission import review
    from flotilla.operator.fit import check_fit
    from flotilla.operator.spec import InferenceServiceSpec

    changes, numbers = LENGTHS[case]
    (tmp_path / "config.json").write_text(json.dumps(CONFIG | changes))
    engine_len = EngineConfig.from_kwargs(str(tmp_path), load_format="dummy", dtype="bfloat16",
                                      enable_chunked_prefill=True).model.max_model_len
    arch = {"hiddenSize": HIDDEN, "numHiddenLayers": LAYERS, "numAttentionHeads": HEADS,
            "numKeyValueHeads": KV_HEADS, "headDim": HEAD_DIM, "intermediateSize": MLP, "vocabSize": VOCAB,
            "maxPositionEmbeddings": CONFIG["max_position_embeddings"], **numbers}
    spec = {"model": {"source": "pvc://m", "config": arch}, "resources": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"},
            "scheduling": {"chunkedPrefill": True}}
    assert check_fit(InferenceServiceSpec.model_validate(spec)).max_model_len == engine_len
    for length, engine_takes_it in ((engine_len, True), (engine_len + 1, False)):
        spec["scheduling"]["maxModelLen"] = length
        try:
            EngineConfig.from_kwargs(str(tmp_path), load_format="dummy", dtype="bfloat16", max_model_len=length,
                                    enable_chunked_prefill=True)
        except ConfigError:
            assert not engine_takes_it
        errors = [e for e in review(spec, "m").errors if "maxModelLen" in e]
        assert (errors == []) == engine_takes_it, (length, errors)


# YaRN's pretraining length in config.json -> the one transformers computes the rotary frequencies from
YARN_ORIGINALS = {
    "top-level": ({"original_max_position_embeddings": 8192, "rope_scaling": {"type": "yarn", "factor": 4.0}}, 8192),
    "in-rope-scaling": ({"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16384}},
                        16384),
    "both": ({"original_max_position_embeddings": 8192,
              "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16384}}, 8192),
    "neither": ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, 32768),
}


def _camel(numbers: dict) -> dict:
    return {to_camel(k): _camel(v) if isinstance(v, dict) else v for k, v in numbers.items()}


@pytest.mark.parametrize("case", list(YARN_ORIGINALS))
def test_yarns_pretraining_length_is_the_one_transformers_reads_in_the_engine_and_the_operator(tmp_path, case):
    """YaRN reaches original x factor: the operator's length (fit check, admission, a draft's positions), the
    engine's and the rotary table's all take original_max_position_embeddings where transformers does."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from flotilla.engine.config import EngineConfig
    from flotilla.engine_rules import rope_positions

    changes, original = YARN_ORIGINALS[case]
    config = CONFIG | {"max_position_embeddings": 32768} | changes
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = AutoConfig.from_pretrained(tmp_path)
    ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")  # as the model does: its rope parameters are settled here
    assert hf.rope_parameters["original_max_position_embeddings"] == original
    engine_len = EngineConfig.from_kwargs(str(tmp_path), load_format="dummy", dtype="bfloat16",
                                          enable_chunked_prefill=True).model.max_model_len
    arch = ModelArchitecture.model_validate(_camel({k: v for k, v in config.items() if k not in (
        "architectures", "model_type", "rms_norm_eps", "torch_dtype")}))
    assert engine_len == arch.length_limit == arch.rope_positions == rope_positions(config) == original * 4


def _per_rank_weight_bytes(model) -> int:
    storages: dict[int, int] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if "norm" not in name and "cos_sin_cache" not in name:
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(storages.values())


@pytest.mark.parametrize(("tensor", "pipeline", "quantization", "tied"), [
    (2, 1, "none", False), (4, 1, "none", False), (8, 1, "none", False), (4, 1, "rtn", False), (2, 1, "fp8", False),
    (4, 1, "fp8", False),
    (1, 2, "none", False), (2, 2, "none", False), (1, 2, "none", True)])
def test_fit_weights_under_model_parallelism_equal_what_the_ranks_allocate(tmp_path, monkeypatch, tensor, pipeline,
                                                                          quantization, tied):
    # With more ranks than KV heads (2 here) the engine replicates each KV head over tensor / 2 ranks
    # (QKVParallelLinear): every rank holds a k and a v head's weights, tensor heads in all, not 2. A pipeline stage
    # builds its layers, the first the embedding, the last the norm and the LM head (tied: the table on both).
    from flotilla.engine import parallel_state
    from flotilla.engine.config import EngineConfig
    from flotilla.engine.layers import linear
    from flotilla.engine.model_loader import load_model

    monkeypatch.delenv("RTN_NUM_BITS", raising=False)
    monkeypatch.delenv("RTN_GROUP_SIZE", raising=False)
    monkeypatch.setattr(linear, "max_over_tp", lambda amax: amax)  # fp8's per-row scales: no other ranks here
    (tmp_path / "config.json").write_text(json.dumps(CONFIG | {"tie_word_embeddings": tied}))
    flags = {"quantization": quantization} if quantization != "none" else {}
    config = EngineConfig.from_kwargs(str(tmp_path), load_format="dummy", dtype="bfloat16", max_model_len=256,
                                      tensor_parallel_size=tensor, pipeline_parallel_size=pipeline, **flags)
    engine = 0
    for rank in range(tensor * pipeline):
        monkeypatch.setattr(parallel_state, "_RANK", parallel_state.ParallelRank.of(rank, tensor, pipeline))
        engine += _per_rank_weight_bytes(load_model(config.model, torch.device("cpu")))
    arch = ModelArchitecture.model_validate({
        "hiddenSize": HIDDEN, "numHiddenLayers": LAYERS, "numAttentionHeads": HEADS, "numKeyValueHeads": KV_HEADS,
        "headDim": HEAD_DIM, "intermediateSize": MLP, "vocabSize": VOCAB, "tieWordEmbeddings": tied})
    # to the byte (fp8: o and down, row-parallel, keep every row's scale on each rank)
    assert weight_bytes(arch, quantization, "bfloat16", tensor=tensor, pipeline=pipeline) == engine


def test_fit_draft_model_kv_equals_what_the_engine_allocates(tmp_path):
    """A draft model's KV bytes a token in the fit check against the engine's block (`bytes_per_block`: a block id owns
    a block in the target's pool and one in the draft's), with an fp8 target cache: the engine keeps the draft's pool
    in the model dtype (`ModelRunner._allocate_draft_kv_cache`), so the draft's share is 2 bytes an element."""
    from flotilla.operator.fit import check_fit
    from flotilla.operator.spec import InferenceServiceSpec

    draft = {**CONFIG, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "head_dim": 64}
    for name, config in (("target", CONFIG), ("draft", draft)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    speculative = {"model": str(tmp_path / "draft"), "num_speculative_tokens": 2}
    flags = {"kv_cache_dtype": "fp8", "speculative_config": speculative}
    _, engine_per_token = _engine_bytes(tmp_path / "target", flags)

    def arch(c: dict) -> dict:
        return {"hiddenSize": c["hidden_size"], "numHiddenLayers": c["num_hidden_layers"],
                "numAttentionHeads": c["num_attention_heads"], "numKeyValueHeads": c["num_key_value_heads"],
                "headDim": c["head_dim"], "intermediateSize": c["intermediate_size"], "vocabSize": c["vocab_size"]}

    spec = InferenceServiceSpec.model_validate({
        "model": {"source": "pvc://models/m", "config": arch(CONFIG)},
        "resources": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        "kvCache": {"dtype": "fp8"},
        "scheduling": {"maxModelLen": 256},
        "speculative": {"method": "draft_model", "numTokens": 2, "draftModel": "/model/draft",
                        "draftConfig": arch(draft)},
    })
    target_per_token = kv_bytes_per_token(ModelArchitecture.model_validate(arch(CONFIG)), "fp8", "bfloat16")
    assert engine_per_token == target_per_token + 2 * LAYERS * 2 * KV_HEADS * 64  # the draft's K and V in bf16
    assert check_fit(spec).kv_bytes_per_token == engine_per_token


# mixture-of-experts config.json changes -> the same numbers as spec.model.config takes them
MOE = {
    "mixtral": ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4,
                 "num_experts_per_tok": 2}, {"numExperts": 4}),
    "qwen2-moe-shared": ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 4,
                          "num_experts_per_tok": 2, "moe_intermediate_size": 512,
                          "shared_expert_intermediate_size": 1024},
                         {"numExperts": 4, "moeIntermediateSize": 512, "sharedExpertIntermediateSize": 1024}),
    "qwen3-moe-step2": ({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 8,
                         "num_experts_per_tok": 2, "moe_intermediate_size": 512, "decoder_sparse_step": 2},
                        {"numExperts": 8, "moeIntermediateSize": 512, "decoderSparseStep": 2}),
    "qwen3-moe-mlp-only": ({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 8,
                            "num_experts_per_tok": 2, "moe_intermediate_size": 512, "mlp_only_layers": [1]},
                           {"numExperts": 8, "moeIntermediateSize": 512, "mlpOnlyLayers": [1]}),
}


def _moe_engine_bytes(tmp_path, monkeypatch, case: str, tensor: int, **flags) -> tuple[int, ModelArchitecture]:
    """The weight bytes every rank of MOE `case` allocates, summed, and its spec.model.config numbers."""
    from flotilla.engine import parallel_state
    from flotilla.engine.config import EngineConfig
    from flotilla.engine.model_loader import load_model

    changes, numbers = MOE[case]
    (tmp_path / "config.json").write_text(json.dumps(CONFIG | changes))
    config = EngineConfig.from_kwargs(str(tmp_path), load_format="dummy", dtype="bfloat16", max_model_len=256,
                                      tensor_parallel_size=tensor, **flags)
    engine = 0
    for rank in range(tensor):
        monkeypatch.setattr(parallel_state, "_RANK", parallel_state.ParallelRank.of(rank, tensor, 1))
        engine += _per_rank_weight_bytes(load_model(config.model, torch.device("cpu")))
    arch = ModelArchitecture.model_validate({
        "hiddenSize": HIDDEN, "numHiddenLayers": LAYERS, "numAttentionHeads": HEADS, "numKeyValueHeads": KV_HEADS,
        "headDim": HEAD_DIM, "intermediateSize": MLP, "vocabSize": VOCAB, **numbers})
    return engine, arch


@pytest.mark.parametrize("tensor", [1, 2])
@pytest.mark.parametrize("case", list(MOE))
def test_fit_weights_of_mixture_of_experts_equal_what_the_ranks_allocate(tmp_path, monkeypatch, case, tensor):
    # Every expert of every sparse layer (stacked [E, 2I, H] and [E, H, I], split over ranks by width), the router
    # whole on each rank, Qwen2-MoE's shared expert and its gate; a dense layer's MLP of intermediate_size. Counted
    # as a dense MLP of intermediate_size, the fit check said up to 2.9 times less than the engine holds (Mixtral here).
    engine, arch = _moe_engine_bytes(tmp_path, monkeypatch, case, tensor)
    assert weight_bytes(arch, "none", "bfloat16", tensor=tensor) == pytest.approx(engine, rel=0.005)


@pytest.mark.parametrize("tensor", [1, 2])
@pytest.mark.parametrize("case", list(MOE))
def test_fit_weights_of_fp8_experts_equal_what_the_ranks_allocate(tmp_path, monkeypatch, case, tensor):
    # --quantization fp8: experts, shared expert, attention and dense MLPs a byte a weight with a float32 scale a row
    # (the experts' down rows and o's on every rank); the routers at bf16. To the byte.
    from flotilla.engine.layers import linear
    from flotilla.engine.quantization import fp8

    for module in (linear, fp8):  # per-row scales over one process: no other ranks to take a maximum with
        monkeypatch.setattr(module, "max_over_tp", lambda amax: amax)
    engine, arch = _moe_engine_bytes(tmp_path, monkeypatch, case, tensor, quantization="fp8")
    # Qwen2-MoE's q/k/v biases (bf16), which the fit check leaves out for every architecture
    biases = LAYERS * (HEADS + 2 * max(KV_HEADS, tensor)) * HEAD_DIM * 2 if case.startswith("qwen2") else 0
    assert weight_bytes(arch, "fp8", "bfloat16", tensor=tensor) + biases == engine
    assert engine < 0.6 * weight_bytes(arch, "none", "bfloat16", tensor=tensor)  # about half of bf16


LLM_COMPRESSOR = Path(__file__).parents[1] / "engine" / "data" / "llmcompressor-0.14-gptq-w4a16-g64.json"


def _llm_compressor(**weights: object) -> dict:
    qcfg = json.loads(LLM_COMPRESSOR.read_text())
    qcfg["config_groups"]["group_0"]["weights"] |= weights
    return qcfg


@pytest.mark.parametrize(("qcfg", "group"), [
    (_llm_compressor(), 64),  # llm-compressor 0.14's own W4A16 config (tests/engine/data)
    (_llm_compressor(strategy="channel"), None),
    (_llm_compressor(strategy="channel", group_size=None), None),
    (_llm_compressor(num_bits=8, group_size=32), 32),
    ({"quant_method": "gptq", "bits": 4, "group_size": "32"}, 32),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, None),
    ({"quant_method": "gptq", "bits": 4}, None),
    ({"quant_method": "awq", "bits": 4, "q_group_size": 64}, 64),
    ({"quant_method": "awq", "bits": 4}, 128),
])
def test_the_fit_check_counts_the_group_the_engine_builds(qcfg, group):
    from flotilla.engine.quantization import linear_method
    from flotilla.operator.fit import linear_storage

    method = linear_method(qcfg["quant_method"], {"quantization_config": qcfg})
    arch = ModelArchitecture.model_validate({"hiddenSize": HIDDEN, "numHiddenLayers": LAYERS,
                                             "numAttentionHeads": HEADS, "intermediateSize": MLP, "vocabSize": VOCAB})
    storage = linear_storage(qcfg["quant_method"], arch, qcfg)
    assert storage is not None and storage.group == method.group_size == group
    assert storage.bits == method.bits
