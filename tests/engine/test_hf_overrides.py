"""--hf-overrides (vLLM's flag): keys set over config.json before the engine builds anything from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.llm import LLM
from flotilla.engine.pooling.params import matryoshka_dimensions
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.server.cli import main

from .hf_reference import hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPT = [5, 17, 230, 4000, 12, 9, 77, 301, 8, 1500, 42, 3]
# config.json's rope as transformers 5 writes it, with another base: every rotary frequency changes
ROPE = {"rope_parameters": {"rope_theta": 2.0, "rope_type": "default"}}


def _greedy(path: Path, **kwargs) -> list[int]:
    llm = LLM(str(path), max_model_len=128, **kwargs)
    return llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_an_override_is_the_length_limit_the_engine_derives(tiny_model_dirs):
    path = str(tiny_model_dirs["llama"])
    assert EngineConfig.from_kwargs(path).model.max_model_len == 512  # config.json's max_position_embeddings
    overridden = EngineConfig.from_kwargs(path, hf_overrides={"max_position_embeddings": 256})
    assert overridden.model.max_model_len == 256
    with pytest.raises(ConfigError, match="--max-model-len=300 exceeds the model's limit of 256 tokens"):
        EngineConfig.from_kwargs(path, hf_overrides={"max_position_embeddings": 256}, max_model_len=300)


def test_a_rope_override_builds_the_model_hf_builds_with_that_config(tiny_model_dirs, tmp_path):
    # The same weights, config.json edited by hand for HF: the engine's override must build that model.
    source = tiny_model_dirs["llama"]
    edited = Path(shutil.copytree(source, tmp_path / "edited"))
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps(config | ROPE))
    expected = hf_greedy(edited, [PROMPT], 8)[0]
    assert expected != hf_greedy(source, [PROMPT], 8)[0]  # the override changes what is generated
    assert _greedy(source, hf_overrides=ROPE) == expected


def test_fewer_layers_load_the_first_layers_as_hf_does(tiny_model_dirs, tmp_path):
    # num_hidden_layers 1 over a 2-layer checkpoint: layer 1's tensors are left unread (HF, too, builds one layer and
    # ignores them), so the engine runs the model HF builds from the same config.
    source = tiny_model_dirs["llama"]
    edited = Path(shutil.copytree(source, tmp_path / "one-layer"))
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 1}))
    expected = hf_greedy(edited, [PROMPT], 8)[0]
    assert expected != hf_greedy(source, [PROMPT], 8)[0]
    assert _greedy(source, hf_overrides={"num_hidden_layers": 1}) == expected


def test_an_object_replaces_the_value_whole_and_a_new_key_is_added(tiny_model_dirs):
    # vLLM sets a dict-valued key (rope_scaling, rope_parameters) whole; a key config.json lacks is added.
    path = str(tiny_model_dirs["llama3-rope-tied"])
    config = EngineConfig.from_kwargs(path, hf_overrides={"rope_parameters": {"rope_theta": 7.0},
                                                          "is_matryoshka": True})
    assert config.model.hf_config["rope_parameters"] == {"rope_theta": 7.0}  # llama3's scaling keys are gone
    assert matryoshka_dimensions(config.model.hf_config) == []  # any size: the key the pooler reads
    assert matryoshka_dimensions(EngineConfig.from_kwargs(path).model.hf_config) is None


def test_an_override_that_is_no_object_is_a_usage_error(tiny_model_dirs, capsys):
    # --port 70000 is refused after the engine's flags: nothing is ever served by this test
    assert main([str(tiny_model_dirs["llama"]), "--hf-overrides", "[1, 2]", "--port", "70000"]) == 2
    assert "flotilla serve: error: --hf-overrides must be a JSON object of config.json keys, not [1, 2]" in \
        capsys.readouterr().err


# Each override crashed after the server had started ("the engine failed to start" and a traceback), or was served:
# is_matryoshka "x" as true, rope_theta -1 as a rotary table of NaNs.
BAD_OVERRIDES = [
    ({"max_position_embeddings": 1e30},
     "max_position_embeddings must be a positive integer up to 2147483647, not 1e+30"),
    ({"max_position_embeddings": 10**30}, "max_position_embeddings must be a positive integer up to 2147483647"),
    ({"num_hidden_layers": 5}, "num_hidden_layers 5 is more than the checkpoint's 2 layers"),
    ({"hidden_size": "x"}, 'hidden_size must be a positive integer, not "x"'),
    ({"num_attention_heads": -4}, "num_attention_heads must be a positive integer, not -4"),
    ({"vocab_size": 0}, "vocab_size must be a positive integer, not 0"),
    ({"intermediate_size": 64.5}, "intermediate_size must be a positive integer, not 64.5"),
    ({"is_matryoshka": "x"}, 'is_matryoshka must be true or false, not "x"'),
    ({"rms_norm_eps": "a"}, 'rms_norm_eps must be a positive number, not "a"'),
    ({"rope_theta": -1}, "rope_theta must be a positive number, not -1"),
    ({"rope_scaling": 2}, "rope_scaling must be a JSON object, not 2"),
    ({"hidden_size": 128}, "the hidden_size would be 128, but the checkpoint's tensors were saved with 64"),
    ({"num_key_value_heads": 3}, "the key/value width (num_key_value_heads x head_dim) would be 48, but the "
                                 "checkpoint's tensors were saved with 32"),
    ({"attention_bias": True}, "the attention_bias would be true, but the checkpoint's tensors were saved with false"),
    # rope scalings the rotary embedding cannot compute (flotilla/rope_scaling.py) and dtypes the engine cannot serve
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     'rope_scaling: rope type "dynamic" is not one the engine computes (default, linear, llama3, yarn)'),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     'rope_parameters: rope type "longrope" is not one the engine computes'),
    ({"rope_scaling": {"type": {"x": 1}}}, 'rope_scaling: rope type {"x": 1} is not one the engine computes'),
    ({"rope_scaling": {"type": "linear"}}, "rope_scaling: rope type linear needs factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "rope_scaling: rope type llama3 needs low_freq_factor, high_freq_factor, original_max_position_embeddings"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 256}},
     "rope_scaling: high_freq_factor 4.0 must be more than low_freq_factor 4.0"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": "4"}}, 'rope_scaling: factor must be a positive number, not "4"'),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1.5}},
     "rope_scaling: original_max_position_embeddings must be a positive integer, not 1.5"),
    ({"torch_dtype": "int8"}, 'torch_dtype must be one of bfloat16, float16, float32, not "int8"'),
    ({"dtype": "float64"}, 'dtype must be one of bfloat16, float16, float32, not "float64"'),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_OVERRIDES, ids=lambda v: json.dumps(v)[:40])
def test_an_override_the_engine_cannot_run_is_a_usage_error_naming_the_key(tiny_model_dirs, capsys, overrides,
                                                                           message):
    # --port 70000 is refused after the engine's flags: without the check the port's message came instead
    assert main([str(tiny_model_dirs["llama"]), "--hf-overrides", json.dumps(overrides), "--port", "70000"]) == 2
    assert f"flotilla serve: error: --hf-overrides: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(("overrides", "message"), BAD_OVERRIDES[:3] + BAD_OVERRIDES[7:8],
                         ids=lambda v: json.dumps(v)[:40])
def test_the_python_api_refuses_the_same_overrides(tiny_model_dirs, overrides, message):
    with pytest.raises(ValueError) as refused:
        LLM(str(tiny_model_dirs["llama"]), hf_overrides=overrides)
    assert f"--hf-overrides: {message}" in str(refused.value)


def test_heads_regrouped_over_the_same_widths_are_allowed(tiny_model_dirs):
    # 8 heads of 8 over a checkpoint of 4 heads of 16: every tensor keeps its shape, so the model builds (as HF's)
    config = EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), hf_overrides={
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8})
    assert config.model.hf_config["num_attention_heads"] == 8


def test_an_activation_the_model_does_not_compute_is_a_usage_error(tiny_model_dirs, capsys):
    # the loader refused it after the server had started ("the engine failed to start" and a traceback)
    assert main([str(tiny_model_dirs["llama"]), "--hf-overrides", '{"hidden_act": "gelu"}', "--port", "70000"]) == 2
    assert "config.json hidden_act 'gelu' is not supported (only silu)" in capsys.readouterr().err


# A classifier's keys: a list for id2label crashed the config builder (AttributeError, a traceback), a string for
# num_labels or is_original_qwen3_reranker was read as given, and fewer labels than the checkpoint's score head failed
# in the engine process after the server had started.
BAD_CLASSIFIER_OVERRIDES = [
    ({"id2label": ["a", "b"]}, 'id2label must be a JSON object, not ["a", "b"]'),
    ({"num_labels": "x"}, 'num_labels must be a positive integer, not "x"'),
    ({"is_original_qwen3_reranker": "false"}, 'is_original_qwen3_reranker must be true or false, not "false"'),
    ({"classifier_from_token": "yes"}, 'classifier_from_token must be a list of strings, not "yes"'),
    ({"id2label": {"0": "only"}}, "the classifier would have 1 labels (id2label or num_labels), but the checkpoint's "
                                  "score head was saved with 3"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_CLASSIFIER_OVERRIDES, ids=lambda v: json.dumps(v)[:40])
def test_a_classifier_override_the_engine_cannot_run_is_a_usage_error(tiny_classifier_dirs, overrides, message):
    with pytest.raises(ConfigError) as refused:
        EngineConfig.from_kwargs(str(tiny_classifier_dirs["qwen3"]), hf_overrides=overrides)
    assert f"--hf-overrides: {message}" in str(refused.value)


def test_relabelling_a_classifier_keeps_its_head(tiny_classifier_dirs):
    config = EngineConfig.from_kwargs(str(tiny_classifier_dirs["qwen3"]),
                                      hf_overrides={"id2label": {"0": "bad", "1": "so-so", "2": "good"}})
    assert config.model.convert == "classify"


# A mixture of experts' keys (the tiny Qwen3-MoE: 4 experts of 64, top 2, layer 1 dense): each of these built a
# config, then failed as the weights loaded (a ValueError in the engine process) or, top-k above the experts, at the
# first request's routing.
BAD_MOE_OVERRIDES = [
    ({"num_experts_per_tok": "x"}, 'num_experts_per_tok must be a positive integer, not "x"'),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 is more than the model's 4 experts"),
    ({"moe_intermediate_size": 32}, "the expert widths (moe_intermediate_size, shared_expert_intermediate_size) "
                                    "would be [32], but the checkpoint's tensors were saved with [64]"),
    ({"num_local_experts": 8}, "the expert count (num_local_experts or num_experts) would be 8, but the "
                               "checkpoint's tensors were saved with 4"),
    ({"mlp_only_layers": [0]}, "decoder_sparse_step / mlp_only_layers would make layers [0] dense, but the "
                               "checkpoint's dense layers are [1]"),
    ({"mlp_only_layers": "x"}, 'mlp_only_layers must be a list of layer numbers (integers from 0), not "x"'),
    ({"norm_topk_prob": "no"}, 'norm_topk_prob must be true or false, not "no"'),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_MOE_OVERRIDES, ids=lambda v: json.dumps(v)[:40])
def test_a_moe_override_the_engine_cannot_run_is_a_usage_error(tiny_model_dirs, overrides, message):
    with pytest.raises(ConfigError) as refused:
        EngineConfig.from_kwargs(str(tiny_model_dirs["qwen3-moe"]), hf_overrides=overrides)
    assert f"--hf-overrides: {message}" in str(refused.value)


def test_fewer_moe_layers_and_top_1_are_allowed(tiny_model_dirs):
    config = EngineConfig.from_kwargs(str(tiny_model_dirs["qwen3-moe"]),
                                      hf_overrides={"num_hidden_layers": 1, "num_experts_per_tok": 1})
    assert config.model.hf_config["num_experts_per_tok"] == 1


def test_a_dtype_override_is_the_checkpoint_dtype_auto_serves(tiny_model_dirs):
    path = str(tiny_model_dirs["llama"])
    assert EngineConfig.from_kwargs(path, hf_overrides={"torch_dtype": "float16"}).model.dtype == "float16"


def test_every_rope_type_the_check_admits_is_one_the_rotary_embedding_computes():
    from flotilla.engine.layers.rotary import inverse_frequencies
    from flotilla.operator.spec import RopeScaling
    from flotilla.rope_scaling import ROPE_TYPES, rope_scaling_problem

    minimal = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    for kind, needed in ROPE_TYPES.items():
        scaling = {"rope_type": kind, **{key: minimal[key] for key in needed}}
        if kind == "yarn":  # the model fills these in from its length (engine/models/llama.py)
            scaling |= {"factor": 4.0, "original_max_position_embeddings": 64}
        assert rope_scaling_problem(scaling) is None
        assert inverse_frequencies(16, 10000.0, scaling).shape == (8,)
    with pytest.raises(ValueError, match="not supported"):
        inverse_frequencies(16, 10000.0, {"rope_type": "dynamic", "factor": 2.0})
    # the operator's spec.model.config.ropeScaling offers the same types
    assert set(RopeScaling.model_fields["rope_type"].annotation.__args__[0].__args__) == set(ROPE_TYPES)


def _ct(weights: dict, **group) -> dict:
    """A compressed-tensors quantization_config of one config group over the linear layers."""
    return {"quant_method": "compressed-tensors",
            "config_groups": {"g": {"targets": ["Linear"], "format": "pack-quantized", "weights": weights, **group}}}


_INT4 = {"num_bits": 4, "type": "int", "strategy": "channel"}


@pytest.mark.parametrize(("flag", "override"), [
    (None, {"quant_method": "gptq", "bits": 4}), ("gptq", {"quant_method": "GPTQ", "bits": 8}),
    (None, {"quant_method": "gguf"}), (None, {"quant_method": "fp8"}), (None, {"quant_method": "awq", "bits": 8}),
    ("fp8", {"quant_method": "compressed-tensors"}), (None, {"quant_method": "bitsandbytes"}),
    (None, {"quant_method": "rtn"}), ("awq", {"quant_method": "awq", "w_bit": 4}),
    # no quant_method: dense alone, a mismatch beside a flag (vLLM's config check); a null one is none too
    (None, {"bits": 4}), ("fp8", {"bits": 4}), ("gptq", {}), ("fp8", {"quant_method": ""}),
    (None, {"quant_method": None}), ("fp8", {"quant_method": None}),
    # bits as the engine's int() reads them: true is 1 bit, "8" is 8, text or null is none
    (None, {"quant_method": "gptq", "bits": True}), (None, {"quant_method": "gptq", "bits": "8"}),
    (None, {"quant_method": "awq", "w_bit": "four"}), (None, {"quant_method": "gptq", "bits": None}),
    # group sizes the same way: "64" is 64, null is none
    (None, {"quant_method": "gptq", "group_size": "64"}), (None, {"quant_method": "gptq", "group_size": None}),
    (None, {"quant_method": "awq", "q_group_size": "x"}),
    # compressed-tensors: one config group with a weights object, num_bits an integer
    (None, _ct(_INT4)), (None, _ct({**_INT4, "num_bits": "4"})), (None, _ct({**_INT4, "num_bits": 2})),
    (None, {"quant_method": "compressed-tensors", "config_groups": ["g"]}),
    (None, {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"]}}}),
    # its group size under strategy group: a positive integer (a string crashed the engine with a TypeError)
    (None, _ct({**_INT4, "strategy": "group", "group_size": 32})),
    (None, _ct({**_INT4, "strategy": "group", "group_size": "64"})),
    (None, _ct({**_INT4, "strategy": "group", "group_size": -1})), (None, _ct({**_INT4, "strategy": "group"})),
])
def test_the_engine_refuses_a_quantization_config_override_where_the_operator_does(flag, override):
    # the webhook refuses an InferenceService whose --hf-overrides quantization_config the engine would not start with
    # (flotilla/quantization_config.py), and the fit check counts the scheme the engine resolves from it; where the
    # refusal is the shared reader's, both say it in the same words
    from flotilla.engine.quantization import linear_method, resolve_quantization
    from flotilla.quantization_config import config_method, override_method_problem

    refused = override_method_problem(override, flag or "none")
    try:
        method = resolve_quantization(flag, {"quantization_config": override})
        if method is not None:
            linear_method(method, {"quantization_config": override})
    except ValueError as exc:
        assert refused is not None, exc
        if not override.get("quant_method"):
            assert str(exc) == (f"--quantization {flag} does not match the checkpoint's quantization_config (no "
                                "quant_method); leave --quantization out to use the checkpoint's")
        if refused.startswith("--hf-overrides: quantization_config: "):
            assert refused == f"--hf-overrides: quantization_config: {exc}"
    else:
        assert refused is None and method == config_method(override)


@pytest.mark.parametrize("size", ["64", -1, 0, None, True])
def test_a_compressed_tensors_group_is_a_positive_number_of_inputs_on_both_sides(size):
    # the engine took group_size as it came: "64" crashed creating the weights (a TypeError: int % str), -1 made
    # negative shapes; both refuse it now, in the shared reader's words
    from flotilla.engine.quantization import linear_method
    from flotilla.quantization_config import override_method_problem

    override = _ct({**_INT4, "strategy": "group", "group_size": size})
    words = f"compressed-tensors: weights' group_size {size!r} is not a number of inputs (strategy group)"
    assert override_method_problem(override, "none") == f"--hf-overrides: quantization_config: {words}"
    with pytest.raises(ValueError) as refused:
        linear_method("compressed-tensors", {"quantization_config": override})
    assert str(refused.value) == words


_FP8_CT = {"num_bits": 8, "type": "float", "strategy": "channel"}
_INT8_TOKENS = {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}


@pytest.mark.parametrize(("override", "words"), [
    ({"quant_method": "gptq", "desc_act": True, "bits": 3}, "gptq with 3-bit weights is not supported (4 or 8 bits)"),
    ({"quant_method": "gptq", "lm_head": True}, "gptq with a quantized LM head (lm_head: true) is not supported"),
    ({"quant_method": "awq", "version": "GEMV"}, "awq 'gemv' checkpoints are not supported (4-bit gemm is)"),
    # block-scaled fp8 runs W8A16 with dynamic activations only (vLLM's rule), in blocks of two sizes
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"},
     "fp8 checkpoints with weight_block_size and activation_scheme 'static' are not supported"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "fp8's weight_block_size [128] is not two block sizes"),
    ({"quant_method": "fp8", "ignored_layers": ["model.layers.0.mlp.down_proj"]},
     "fp8 checkpoints with unquantized decoder layers (ignored_layers ['model.layers.0.mlp.down_proj'])"),
    (_ct(_INT4, targets=["Linear", "Embedding"]), "compressed-tensors: targets ['Linear', 'Embedding']; only"),
    ({**_ct(_INT4), "ignore": ["lm_head", "re:.*self_attn.q_proj$"]},
     "compressed-tensors: ignored layers ['re:.*self_attn.q_proj$'] are not supported"),
    (_ct(_INT4, format="marlin-24"), "compressed-tensors: 4-bit int weights in format 'marlin-24' are not supported"),
    (_ct({**_INT4, "type": "float"}), "compressed-tensors: 4-bit float weights in format 'pack-quantized'"),
    (_ct({**_INT4, "strategy": "tensor"}), "compressed-tensors: integer strategy 'tensor'; group or channel"),
    (_ct({**_INT4, "strategy": "group", "group_size": 32, "actorder": "columns"}),
     "compressed-tensors: actorder 'columns' is not one of static, weight, group, dynamic or null"),
    (_ct({**_INT4, "num_bits": 8}, input_activations={"num_bits": 8, "type": "int"}),
     "compressed-tensors: pack-quantized integer weights with quantized activations are not supported"),
    # int8 W8A8 with zero points (asymmetric activations): refused by name, not loaded as symmetric
    (_ct({**_INT4, "num_bits": 8}, format="int-quantized", input_activations=_INT8_TOKENS | {"symmetric": False}),
     "compressed-tensors: asymmetric int8 activations (input_zero_point) are not supported"),
    (_ct({**_FP8_CT, "strategy": "block", "block_structure": [128, 128]}, format="float-quantized",
         input_activations={"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}),
     "compressed-tensors: fp8 block weights with static activation scales are not supported"),
    (_ct({**_FP8_CT, "strategy": "block", "block_structure": "128x128"}, format="float-quantized"),
     "compressed-tensors: weights' block_structure '128x128' is not two block sizes"),
    (_ct({**_FP8_CT, "strategy": "token"}, format="float-quantized"),
     "compressed-tensors: fp8 weight strategy 'token' is not supported; per-tensor, per-channel and block are"),
    (_ct(_FP8_CT, format="float-quantized", input_activations={"num_bits": 8, "type": "int"}),
     "compressed-tensors: fp8 weights need fp8 activations or none"),
    # an activations value that is no object: refused, not an AttributeError on either side
    (_ct(_FP8_CT, format="float-quantized", input_activations="fp8"),
     "compressed-tensors: fp8 weights need fp8 activations or none"),
])
def test_a_layout_the_engine_does_not_run_is_refused_by_the_webhook_in_its_words(override, words):
    # before, the webhook admitted these and the pod crash-looped on the engine's refusal at start-up
    from flotilla.engine.quantization import resolve_quantization
    from flotilla.quantization_config import override_method_problem

    with pytest.raises(ValueError) as refused:
        resolve_quantization(None, {"quantization_config": override})
    assert str(refused.value).startswith(words)
    assert override_method_problem(override, "none") == f"--hf-overrides: quantization_config: {refused.value}"


@pytest.mark.parametrize("override", [
    {"quant_method": "gptq", "desc_act": False, "lm_head": False}, {"quant_method": "awq", "version": "GEMM"},
    {"quant_method": "fp8", "ignored_layers": ["lm_head"], "weight_block_size": None},
    {**_ct(_INT4), "ignore": ["lm_head", "re:.*mlp.gate$"]},
    _ct({**_INT4, "strategy": "group", "group_size": 32, "actorder": "weight"}),
    # activation order (groups of permuted inputs, g_idx): sorted at load (engine/quantization/packed_int.py)
    {"quant_method": "gptq", "desc_act": True, "bits": 4, "group_size": 128},
    _ct({**_INT4, "strategy": "group", "group_size": 32, "actorder": "group"}),
    _ct(_FP8_CT, format="float-quantized", input_activations={"num_bits": 8, "type": "float", "dynamic": True}),
    _ct({**_INT4, "num_bits": 8}, format="int-quantized", input_activations=_INT8_TOKENS),
    # block-scaled fp8: Qwen3-*-FP8's quantization_config, llm-compressor's FP8_BLOCK
    {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    _ct({**_FP8_CT, "strategy": "block", "block_structure": [128, 128]}, format="float-quantized",
        input_activations={"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": True}),
])
def test_a_layout_the_engine_runs_is_admitted(override):
    from flotilla.engine.quantization import resolve_quantization
    from flotilla.quantization_config import override_method_problem

    assert resolve_quantization(None, {"quantization_config": override}) == override["quant_method"]
    assert override_method_problem(override, "none") is None


@pytest.mark.parametrize(("override", "words"), [
    ({"quant_method": "fp8", "ignored_layers": ["re:("]}, "fp8: ignored layer 're:(' is not a regular expression ("),
    ({"quant_method": "fp8", "ignored_layers": "lm_head"}, "fp8: ignored_layers 'lm_head' is not a list of layer "
     "names"),
    ({**_ct(_INT4), "ignore": [5]}, "compressed-tensors: ignored layer 5 is not a layer name"),
])
def test_ignored_layers_that_name_no_layer_are_refused_not_a_crash(override, words):
    # re.error and AttributeError escaped both the engine's start-up check and the webhook before
    from flotilla.engine.quantization import resolve_quantization
    from flotilla.quantization_config import override_method_problem

    with pytest.raises(ValueError) as refused:
        resolve_quantization(None, {"quantization_config": override})
    assert str(refused.value).startswith(words)
    assert override_method_problem(override, "none") == f"--hf-overrides: quantization_config: {refused.value}"
