"""NVIDIA ModelOpt FP8 and Meta fbgemm_fp8 checkpoints, and vLLM's --quantization kernel aliases (gptq_marlin,
awq_marlin).

Oracle: HF transformers on the dequantized weights with every linear input rounded to fp8 as the engine does it
(per-tensor static for ModelOpt, per token for fbgemm: test_quantization.py's hook), greedy tokens equal."""

from __future__ import annotations

import json

import pytest
import torch

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.llm import LLM
from flotilla.engine.quantization import resolve_quantization
from flotilla.engine.quantization.fbgemm_fp8 import FbgemmFp8Method
from flotilla.engine.quantization.fp8 import Fp8CheckpointMethod
from flotilla.kernels.fp8_linear import FP8_DTYPE, fp8_linear_ref, quantize_fp8_rows
from flotilla.quantization_config import check_layout

from .fp8_family_checkpoints import fbgemm_checkpoint, modelopt_checkpoint, quantize_fp8_tensor
from .test_quantization import GREEDY, PROMPTS, _engine_tokens, _hf_fp8_greedy, wide_llama  # noqa: F401  (a fixture)


def test_the_writers_round_as_computed_by_hand():
    """One per-tensor and one per-row scale, and their e4m3 codes, by hand: amax 4.48 -> scale 0.01; 1.0 / 0.01 = 100
    lies halfway between e4m3's 96 and 104 (steps of 8 in [64, 128)) and rounds to even, 96; 44.8 to 44 (steps of 4).
    Per row: row 2's amax 0.448 -> scale 0.001, -0.2 / 0.001 = -200 halfway between 192 and 208 -> even, -192."""
    w = torch.tensor([[4.48, 1.0], [0.448, -0.2]])
    codes, scale = quantize_fp8_tensor(w)
    assert scale.shape == () and scale.item() == pytest.approx(0.01)
    assert codes.dtype == FP8_DTYPE and codes.float().tolist() == [[448.0, 96.0], [44.0, -20.0]]
    rows, row_scales = quantize_fp8_rows(w)
    assert row_scales.flatten().tolist() == pytest.approx([0.01, 0.001])
    assert rows.float().tolist() == [[448.0, 96.0], [448.0, -192.0]]


def test_modelopt_fp8_matches_hf_with_the_same_rounding(wide_llama, tmp_path):  # noqa: F811
    """Detected from config.json, without --quantization; static input scales 0.05."""
    path = modelopt_checkpoint(wide_llama, tmp_path / "modelopt")
    config = EngineConfig.from_kwargs(str(path))
    assert (config.model.quantization, config.cache.kv_cache_dtype) == ("modelopt", "auto")
    assert _engine_tokens(path) == _hf_fp8_greedy(path / "dequantized", 0.05)


def test_modelopt_per_channel_per_token_matches_hf_with_the_same_rounding(wide_llama, tmp_path):  # noqa: F811
    """FP8_PER_CHANNEL_PER_TOKEN: a scale a row, activations per token (no input_scale in the checkpoint)."""
    path = modelopt_checkpoint(wide_llama, tmp_path / "modelopt-pcpt", per_channel=True)
    assert _engine_tokens(path) == _hf_fp8_greedy(path / "dequantized")


def test_modelopt_hf_quant_config_file_and_fp8_kv_cache(wide_llama, tmp_path):  # noqa: F811
    """An older export (hf_quant_config.json beside a config.json without quantization_config) is read as vLLM
    reads it; kv_cache_quant_algo FP8 with --kv-cache-dtype auto runs an fp8 cache with the checkpoint's
    `k_proj.k_scale` / `v_proj.v_scale` on each attention."""
    path = modelopt_checkpoint(wide_llama, tmp_path / "modelopt-kv", kv_scales=(0.5, 0.25), hf_quant_file=True)
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    config = EngineConfig.from_kwargs(str(path), quantization="modelopt")
    assert (config.model.quantization, config.cache.kv_cache_dtype) == ("modelopt", "fp8_e4m3")
    runner = LLM(str(path), max_model_len=256).engine.runner
    assert runner.kv_cache.dtype == FP8_DTYPE
    assert [(a.k_scale, a.v_scale) for a in runner.attention_layers] == [(0.5, 0.25), (0.5, 0.25)]
    qkv = runner.model.get_submodule("layers.0.self_attn.qkv_proj")
    assert isinstance(qkv.quant_method, Fp8CheckpointMethod) and qkv.input_scale.item() == pytest.approx(0.05)


def test_fbgemm_fp8_matches_hf_with_the_same_rounding(wide_llama, tmp_path):  # noqa: F811
    path = fbgemm_checkpoint(wide_llama, tmp_path / "fbgemm")
    assert EngineConfig.from_kwargs(str(path), quantization="fbgemm_fp8").model.quantization == "fbgemm_fp8"
    assert _engine_tokens(path) == _hf_fp8_greedy(path / "dequantized")


def test_fbgemm_activation_bound_caps_each_tokens_scale():
    """A token whose absolute maximum passes activation_scale_ub is quantized with the scale bound / 448 (its larger
    values saturate); one below it with its own; rows above the W8A16 GEMV's 16 so that W8A8 runs."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(20, 64, generator=g).clamp(-3, 3), torch.randn(32, 64, generator=g)
    x[0, 0] = 10.0  # token 0's amax 10, above the bound; the others' at most 3
    w8, ws = quantize_fp8_rows(w)
    layer = torch.nn.Module()
    layer.weight, layer.weight_scale = torch.nn.Parameter(w8, requires_grad=False), torch.nn.Parameter(ws)
    bound = 4.0
    out = FbgemmFp8Method(bound).apply(layer, x, None)
    token_scale = x.abs().amax(-1, keepdim=True).clamp(max=bound) / 448
    x8 = (x / token_scale).clamp(-448, 448).to(FP8_DTYPE)
    expected = (x8.float() * token_scale) @ (w8.float() * ws).t()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[0], fp8_linear_ref(x, w8, ws)[0])  # the bound changed token 0
    torch.testing.assert_close(out[1:], fp8_linear_ref(x, w8, ws)[1:])


@pytest.mark.parametrize(("flag", "method"), [("gptq_marlin", "gptq"), ("awq_marlin", "awq"), ("gptq", "gptq"),
                                              (None, "gptq")])
def test_kernel_aliases_name_their_format(flag, method):
    """vLLM upgrades a gptq checkpoint to gptq_marlin itself: either name beside it runs it."""
    fmt = method if flag is None else flag.removesuffix("_marlin")
    hf = {"quantization_config": {"quant_method": fmt, "bits": 4, "group_size": 128}}
    assert resolve_quantization(flag, hf) == method


def test_kernel_aliases_still_disagree_with_another_format():
    hf = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    with pytest.raises(ValueError, match="--quantization awq_marlin does not match the checkpoint's "
                                         "quantization_config \\(quant_method 'gptq'\\)"):
        resolve_quantization("awq_marlin", hf)
    with pytest.raises(ValueError, match="--quantization gptq_marlin reads a gptq checkpoint"):
        resolve_quantization("gptq_marlin", {})


@pytest.mark.parametrize(("qcfg", "message"), [
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "modelopt quant_algo 'NVFP4' is not supported; FP8"),
    ({"quant_method": "modelopt", "quant_algo": "FP8_PB_WO"}, "modelopt quant_algo 'FP8_PB_WO' is not supported"),
    ({"quant_method": "modelopt", "quant_algo": "INT4_AWQ"}, "modelopt quant_algo 'INT4_AWQ' is not supported"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "NVFP4"},
     "modelopt kv_cache_quant_algo 'NVFP4' is not supported"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head", "model.layers.0.mlp*"]},
     r"modelopt checkpoints with unquantized decoder layers \(exclude_modules \['model.layers.0.mlp\*'\]\)"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["*self_attn*"]},
     r"unquantized decoder layers \(ignore \['\*self_attn\*'\]\)"),
    # whole dotted parts of a layer's name, as vLLM's substring test reads them
    ({"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["self_attn"]},
     r"\(exclude_modules \['self_attn'\]\)"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["model.layers.3"]},
     r"\(exclude_modules \['model.layers.3'\]\)"),
    ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}, "modelopt quant_algo 'NVFP4'"),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
      "modules_to_not_convert": ["model.layers.0.self_attn.q_proj"]},
     r"fbgemm_fp8 checkpoints with unquantized decoder layers \(modules_to_not_convert "
     r"\['model.layers.0.self_attn.q_proj'\]\)"),
    ({"quant_method": "fbgemm_fp8"}, "fbgemm_fp8's activation_scale_ub None is not a positive number"),
])
def test_unsupported_fp8_family_configs_are_refused_by_name(qcfg, message):
    with pytest.raises(ValueError, match=message):
        check_layout(qcfg)
    with pytest.raises(ValueError, match=message):
        resolve_quantization(None, {"quantization_config": qcfg})


@pytest.mark.parametrize("qcfg", [
    {"quant_method": "modelopt", "quant_algo": "fp8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]},
    {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head", "*mlp.gate", "model.layers.0.mlp.gate"],
     "kv_cache_scheme": {"type": "float", "num_bits": 8}},
    {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]},
])
def test_fp8_family_configs_the_engine_runs(qcfg):
    """ModelOpt's quant_algo in any case (vLLM upper-cases it), config.json's `ignore` / `kv_cache_scheme` keys; a
    mixture-of-experts router's entry (`mlp.gate`) names no dense layer's `mlp.gate_proj`."""
    assert resolve_quantization(None, {"quantization_config": qcfg}) == qcfg["quant_method"]


def test_a_modelopt_flag_over_a_dense_checkpoint_is_refused(wide_llama):  # noqa: F811
    with pytest.raises(ConfigError, match="--quantization modelopt reads a modelopt checkpoint"):
        EngineConfig.from_kwargs(str(wide_llama), quantization="modelopt")


@pytest.mark.parametrize(("flag", "fmt"), [("gptq_marlin", "gptq"), ("awq_marlin", "awq")])
def test_a_kernel_name_flag_is_accepted_beside_its_format(wide_llama, tmp_path, flag, fmt):  # noqa: F811
    """The flag's accepted values include vLLM's kernel names (flotilla/flags.py), resolved to the format."""
    config = json.loads((wide_llama / "config.json").read_text())
    config["quantization_config"] = {"quant_method": fmt, "bits": 4, "group_size": 32}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert EngineConfig.from_kwargs(str(tmp_path), quantization=flag, tokenizer=str(wide_llama)).model.quantization \
        == fmt


@pytest.mark.slow  # two gloo ranks: 27 s on this CPU
def test_modelopt_fp8_at_two_ranks_matches_hf_with_the_same_rounding(tiny_model_dirs, tmp_path):
    """Two gloo ranks: each part of a merged layer keeps its per-tensor scale over the rows a rank holds, and the
    static input scale rounds each element as at one rank (row-parallel layers' inputs split, not re-scaled)."""
    path = modelopt_checkpoint(tiny_model_dirs["llama"], tmp_path / "modelopt")
    llm = LLM(str(path), max_model_len=256, tensor_parallel_size=2)
    try:  # the ranks' processes and gloo threads end here, not at interpreter exit (which aborted)
        tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    finally:
        llm.engine.shutdown()
    assert tokens == _hf_fp8_greedy(path / "dequantized", 0.05)


def test_the_fused_fp8_decode_forms_keep_fbgemms_activation_bound(monkeypatch):
    """llama.py's one-row fp8 forms (gate/up + SiLU-and-mul in one GEMV, qkv + rotary in its epilogue) read the
    layer's fp8 weight and scales themselves, not its `apply`: fbgemm_fp8's clipping of the activations to the bound
    must not be skipped there. The fused gated GEMV is stood in for by its reference (CUDA only) and taken wherever
    the model asks; a token beyond the bound gives the module path's output."""
    from flotilla.engine.models import llama
    from flotilla.kernels.dispatch import fp8_weight_only_linear, silu_and_mul

    arch = llama.LlamaArch(vocab_size=8, hidden_size=64, intermediate_size=32, num_layers=1, num_heads=2,
                           num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6, rope_theta=1e4, rope_scaling=None,
                           max_position=64, qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False,
                           tie_word_embeddings=False)
    mlp = llama.LlamaMLP(arch)
    g = torch.Generator().manual_seed(5)
    for layer in (mlp.gate_up_proj, mlp.down_proj):
        w8, ws = quantize_fp8_rows(torch.randn(layer.weight.shape, generator=g))
        layer.quant_method = FbgemmFp8Method(4.0)
        layer.weight, layer.weight_scale = torch.nn.Parameter(w8, requires_grad=False), torch.nn.Parameter(ws)
    monkeypatch.setattr(llama, "fp8_gated_gemv_takes", lambda *args: True)
    monkeypatch.setattr(llama, "fp8_gated_gemv",
                        lambda x, w, s, b=None: silu_and_mul(fp8_weight_only_linear(x, w, s, b)))
    x = torch.randn(1, 64, generator=g)
    x[0, 0] = 10.0  # beyond the bound 4
    want = mlp.down_proj(mlp.act(mlp.gate_up_proj(x)))
    torch.testing.assert_close(mlp(x), want)
