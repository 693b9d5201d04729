"""fp8 experts of mixture-of-experts models (Mixtral, Qwen3-MoE): greedy tokens equal HF transformers' with the same
rounding, quantized at load (`--quantization fp8`) and read from vLLM's fp8 checkpoint layout.

The oracle is test_quantization.py's: the attention (and a dense layer's MLP) W8A8 on prefill, W8A16 on decode, so
HF's linear layers get their weights rounded per row and their prefill inputs rounded per token; the experts are
W8A16 always, so HF's stacked experts get their weights rounded per row (per tensor for the checkpoint) and their
inputs left alone. The router stays unquantized on both sides.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.kernels.fp8_linear import FP8_DTYPE, FP8_MAX, quantize_fp8_rows, quantize_fp8_static

from .hf_reference import model_greedy
from .test_quantization import PROMPTS, TOKENS, _engine_tokens, _fake_quant_fp8, _hf_fp8_greedy

# decoder linear weights an fp8 checkpoint holds as fp8 (the router `gate` and the norms are not among them)
_FP8_WEIGHTS = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight", ".gate_proj.weight",
                ".up_proj.weight", ".down_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")


def _round_rows(w: torch.Tensor) -> torch.Tensor:
    """`w` `[..., K]` through fp8 with a scale per row (the engine's quantizer), back in fp32."""
    w8, scale = quantize_fp8_rows(w.reshape(-1, w.shape[-1]))
    return (w8.float() * scale).reshape(w.shape)


def _hf_fp8_experts_greedy(path: Path) -> list[list[int]]:
    """HF greedy with the linear layers as test_quantization's fp8 oracle rounds them and every expert's stacked
    weights rounded per row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rounded = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            module.register_forward_pre_hook(_fake_quant_fp8(None))
            module.weight.data = _round_rows(module.weight.data)
        if name.endswith(".experts"):
            module.gate_up_proj.data = _round_rows(module.gate_up_proj.data)
            module.down_proj.data = _round_rows(module.down_proj.data)
            rounded += 1
    assert rounded, "no stacked experts found: transformers' MoE layout changed"
    return model_greedy(model, PROMPTS, TOKENS)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3-moe"])
def test_fp8_at_load_matches_hf_with_the_same_rounding(tiny_model_dirs, arch):
    path = tiny_model_dirs[arch]
    ours = _engine_tokens(path, quantization="fp8")
    assert ours == _hf_fp8_experts_greedy(path)
    if arch == "mixtral":  # the experts' rounding is there: HF with fp8 attention only differs
        assert ours != _hf_fp8_greedy(path, quantize_weights=True)


def test_experts_hold_fp8_and_per_row_scales_the_router_does_not(tiny_model_dirs):
    from flotilla.engine.model_loader import load_model

    path = tiny_model_dirs["mixtral"]
    model = load_model(EngineConfig.from_kwargs(str(path), max_model_len=64, quantization="fp8").model,
                       torch.device("cpu"))
    checkpoint = _checkpoint(path)
    block = model.layers[0].mlp
    experts = block.experts
    assert experts.w13_weight.dtype == experts.w2_weight.dtype == FP8_DTYPE
    assert tuple(experts.w13_weight_scale.shape) == (4, 256) and tuple(experts.w2_weight_scale.shape) == (4, 64)
    w1 = checkpoint["model.layers.0.block_sparse_moe.experts.2.w1.weight"]
    # expert 2's gate rows: the checkpoint's rows over their own maxima
    torch.testing.assert_close(experts.w13_weight_scale[2, :128], w1.abs().amax(-1) / FP8_MAX)
    assert block.gate.weight.dtype == torch.float32


def _checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint in `path` (its shards together)."""
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        tensors |= load_file(str(shard))
    return tensors


def _fp8_checkpoint(src: Path, dst: Path, per_channel: bool = False) -> Path:
    """vLLM's fp8 checkpoint layout (Mixtral-8x7B-Instruct-FP8's, dynamic activations) of the model in `src`: every
    decoder linear weight, each expert's projections apart, in fp8 with one `weight_scale` for the tensor; or with
    `per_channel` compressed-tensors' FP8_DYNAMIC (float-quantized, a `[rows, 1]` scale a tensor, the router left
    out as llm-compressor's MoE recipes leave it); and beside it in `dst / "dequantized"` the dense model those
    weights are (the oracle's)."""
    tensors = _checkpoint(src)
    quantized, dequantized = {}, {}
    for name, t in tensors.items():
        if name.endswith(_FP8_WEIGHTS):
            scale = (t.abs().amax(-1, keepdim=True) if per_channel else t.abs().amax()).float() / FP8_MAX
            t8 = quantize_fp8_static(t, scale)
            quantized[name], quantized[name.removesuffix("weight") + "weight_scale"] = t8, scale
            dequantized[name] = t8.float() * scale
        else:
            quantized[name] = dequantized[name] = t
    for folder, state in ((dst, quantized), (dst / "dequantized", dequantized)):
        folder.mkdir(parents=True)
        save_file(state, str(folder / "model.safetensors"))
        for f in src.iterdir():
            if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
                (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = _compressed_tensors_fp8() if per_channel else \
        {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _compressed_tensors_fp8() -> dict:
    """compressed-tensors' FP8_DYNAMIC quantization_config (per-channel e4m3 weights, per-token activations)."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    return QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized",
                              ignore=["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$"]).model_dump(
                                  exclude_none=True)


@pytest.mark.parametrize(("arch", "per_channel"), [("mixtral", False), ("qwen3-moe", True),
                                                   pytest.param("qwen3-moe", False, marks=pytest.mark.slow),
                                                   pytest.param("mixtral", True, marks=pytest.mark.slow)])
def test_fp8_checkpoint_matches_hf_on_its_weights(tiny_model_dirs, tmp_path, arch, per_channel):
    path = _fp8_checkpoint(tiny_model_dirs[arch], tmp_path / "fp8", per_channel)
    assert _engine_tokens(path) == _hf_fp8_greedy(path / "dequantized")


def test_a_static_checkpoints_expert_input_scales_are_not_used(tiny_model_dirs, tmp_path):
    # activation_scheme static: the attention reads its input_scale, the experts (W8A16) load without theirs
    path = _fp8_checkpoint(tiny_model_dirs["mixtral"], tmp_path / "fp8")
    state = load_file(str(path / "model.safetensors"))
    state |= {n.removesuffix("weight_scale") + "input_scale": torch.tensor(0.05) for n in list(state)
              if n.endswith("weight_scale")}
    save_file(state, str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["activation_scheme"] = "static"
    (path / "config.json").write_text(json.dumps(config))
    from flotilla.engine.model_loader import load_model

    model = load_model(EngineConfig.from_kwargs(str(path), max_model_len=64).model, torch.device("cpu"))
    assert model.layers[0].self_attn.qkv_proj.input_scale.item() == pytest.approx(0.05)
    assert not any(name.endswith("input_scale") for name, _ in model.layers[0].mlp.experts.named_parameters())


def test_an_fp8_checkpoint_missing_an_expert_scale_is_named(tiny_model_dirs, tmp_path):
    from flotilla.engine.llm import LLM

    path = _fp8_checkpoint(tiny_model_dirs["mixtral"], tmp_path / "fp8")
    state = load_file(str(path / "model.safetensors"))
    del state["model.layers.1.block_sparse_moe.experts.3.w3.weight_scale"]
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks tensors for: layers\.1\.mlp\.experts\.3\.up_proj"
                                         r"\.weight_scale$"):
        LLM(str(path), max_model_len=64)


def test_admission_admits_fp8_for_moe_and_refuses_rtn(tiny_model_dirs):
    # the same rule (engine_rules.moe_problem) on both sides
    from flotilla.operator.admission import review

    numbers = {"hiddenSize": 64, "numHiddenLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 2, "headDim": 32,
               "intermediateSize": 128, "vocabSize": 49152, "numExperts": 4, "moeIntermediateSize": 64}
    spec = {"model": {"source": "pvc://m", "config": numbers}}
    assert not review(spec | {"quantization": "fp8"}, "m").errors
    assert EngineConfig.from_kwargs(str(tiny_model_dirs["qwen3-moe"]), max_model_len=64,
                                    quantization="fp8").model.quantization == "fp8"
    errors = review(spec | {"quantization": "rtn"}, "m").errors
    assert any("mixture-of-experts" in e and "fp8" in e for e in errors), errors
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        EngineConfig.from_kwargs(str(tiny_model_dirs["qwen3-moe"]), max_model_len=64, quantization="rtn")


def test_admission_reads_an_overridden_quantization_config(tiny_model_dirs):
    # an --hf-overrides quantization_config is what the engine will read: block-scaled fp8 refused, per-tensor admitted
    from flotilla.operator.admission import review

    numbers = {"hiddenSize": 64, "numHiddenLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 2, "headDim": 32,
               "intermediateSize": 128, "vocabSize": 49152, "numExperts": 4, "moeIntermediateSize": 64}

    def errors(qcfg: dict) -> list[str]:
        overrides = json.dumps({"quantization_config": qcfg})
        return review({"model": {"source": "pvc://m", "config": numbers}, "quantization": "fp8",
                       "engineArgs": ["--hf-overrides", overrides]}, "m").errors

    assert not errors({"quant_method": "fp8", "activation_scheme": "dynamic"})
    refused = errors({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [64, 64]})
    assert any("mixture-of-experts" in e and "block-scaled" in e for e in refused), refused


def test_down_scales_take_the_row_maximum_over_ranks(monkeypatch):
    # down's rows are split over the tensor ranks by the expert width: their scale is the whole row's maximum (the
    # tp=2 greedy test cannot tell a rank's own maximum from it on a tiny model); gate/up rows are whole on a rank
    from flotilla.engine.layers.moe import FusedMoE
    from flotilla.engine.quantization import fp8

    others = []
    monkeypatch.setattr(fp8, "max_over_tp", lambda amax: others.append(amax) or torch.full_like(amax, 448.0))
    experts = FusedMoE(2, 8, 6)
    torch.nn.init.normal_(experts.w13_weight)
    torch.nn.init.normal_(experts.w2_weight)
    w13 = experts.w13_weight.detach().clone()
    fp8.Fp8ExpertsMethod(checkpoint=False).process_weights(experts)
    assert len(others) == 1 and tuple(others[0].shape) == (2, 8, 1)  # down's [E, H] row maxima only
    assert torch.equal(experts.w2_weight_scale, torch.ones(2, 8))
    torch.testing.assert_close(experts.w13_weight_scale, w13.abs().amax(-1) / FP8_MAX)
    assert experts.w13_weight.dtype == FP8_DTYPE and experts.w13_weight_scale.is_contiguous()
