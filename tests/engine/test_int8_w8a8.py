"""compressed-tensors int8 W8A8 (`int-quantized`, llm-compressor's W8A8): greedy tokens equal HF with the same rounding.

The checkpoints are written by the compressed-tensors library (`quant_checkpoints.py`). The oracle, as fp8's in
test_quantization.py: HF on the library's dequantized weights with every linear layer's input rounded to int8 (per
token, or with the static scale) in the prefill forward only: the engine runs W8A8 above FP8_GEMV_MAX_ROWS rows (the
prompts' one prefill step) and W8A16 at decode (2 rows). The engine's `(x8 @ w8^T) * sx * sw` (exact int32 sums)
and HF's `(x8 * sx) @ (w8 * sw)^T` differ only in fp32 rounding order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.quantization import linear_method
from flotilla.engine.quantization.int8 import Int8W8A8Method
from flotilla.kernels import dispatch
from flotilla.kernels.fp8_linear import fp8_weight_only_linear_ref
from flotilla.kernels.int8_linear import int8_linear_ref, int8_matmul, quantize_int8_activations
from flotilla.quantization_config import check_layout, override_method_problem

from .hf_reference import hf_greedy, model_greedy
from .quant_checkpoints import compressed_tensors_checkpoint
from .test_quantization import PROMPTS, TOKENS, _engine_tokens, wide_llama  # noqa: F401  (a fixture)


def _fake_quant_int8(static_scale: float | None):
    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        x = args[0]
        if x.shape[-2] == 1:  # a decode forward: the engine's decode step is W8A16
            return None
        scale = (x.abs().amax(-1, keepdim=True) / 127).clamp(min=1e-12) if static_scale is None \
            else torch.tensor(static_scale)
        return (torch.round(x / scale).clamp(-128, 127) * scale,)

    return hook


def _hf_int8_greedy(path: Path, static_scale: float | None) -> list[list[int]]:
    """HF greedy with every linear layer's input rounded to int8 in the prefill forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            module.register_forward_pre_hook(_fake_quant_int8(static_scale))
    return model_greedy(model, PROMPTS, TOKENS)


@pytest.mark.parametrize("preset,static_scale", [("W8A8", None), ("W8A8_STATIC", 0.2)])
def test_int8_w8a8_matches_hf_with_the_same_rounding(wide_llama, tmp_path, preset, static_scale):  # noqa: F811
    """Per-token int8 rounds too finely to move this tiny model's greedy tokens; the static scale, 0.2 (codes 0.2
    apart, saturating at 25.4), does: there HF without the rounding is another model, and the engine matches the
    rounded one (per-token rounding is checked layer by layer below)."""
    path = compressed_tensors_checkpoint(wide_llama, tmp_path / preset, preset, static_scale=static_scale or 0.05)
    config = EngineConfig.from_kwargs(str(path))
    assert config.model.quantization == "compressed-tensors"
    method = linear_method("compressed-tensors", config.model.hf_config)
    assert isinstance(method, Int8W8A8Method) and method.static_input == (static_scale is not None)
    expected = _hf_int8_greedy(path / "dequantized", static_scale)
    assert _engine_tokens(path) == expected
    if static_scale is not None:
        assert expected != hf_greedy(path / "dequantized", PROMPTS, TOKENS)


def test_int8_w8a8_qwen2_with_qkv_biases_matches_hf_with_the_same_rounding(tiny_model_dirs, tmp_path):
    """Qwen2's q/k/v biases are added after the int8 product's scaling, in the engine as in HF; a static scale that
    moves the tokens, as above."""
    path = compressed_tensors_checkpoint(tiny_model_dirs["qwen2"], tmp_path / "qwen2", "W8A8_STATIC", static_scale=0.2)
    expected = _hf_int8_greedy(path / "dequantized", 0.2)
    assert _engine_tokens(path) == expected and expected != hf_greedy(path / "dequantized", PROMPTS, TOKENS)


def test_the_oracle_hook_rounds_prefill_rows_only():
    """The HF hook rounds a prefill's rows to int8 codes times their scale and leaves a decode row alone."""
    hook = _fake_quant_int8(None)
    x = torch.randn(1, 5, 64)
    (rounded,) = hook(torch.nn.Identity(), (x,))
    scale = x.abs().amax(-1, keepdim=True) / 127
    assert torch.allclose(rounded / scale, (rounded / scale).round(), atol=1e-4) and not torch.equal(rounded, x)
    assert hook(torch.nn.Identity(), (x[:, :1],)) is None


def _case(m: int, n: int, k: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
    w_scale = w.abs().amax(-1, keepdim=True) / 127
    w8 = torch.round(w / w_scale).clamp(-128, 127).to(torch.int8)
    return x, w8, w_scale, torch.randn(n, generator=g).to(dtype)


def test_reference_rounds_ties_to_even_saturates_and_sums_exactly():
    """Per-token scales are the row's maximum over 127, codes round half to even (2.5 -> 2, -1.5 -> -2), a static
    scale saturates at -128 / 127, a zero row keeps a tiny scale; the int32 sums equal the exact product."""
    rows = torch.tensor([[2.5, -1.5, 127.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    q, s = quantize_int8_activations(rows, None)
    assert q.dtype == torch.int8 and q[0].tolist() == [2, -2, 127, 0] and s[0, 0] == 1.0 and s[1, 0] > 0
    q, s = quantize_int8_activations(torch.tensor([[1000.0, -1000.0, 0.25]]), torch.tensor([0.5]))
    assert q.tolist() == [[127, -128, 0]] and s.tolist() == [[0.5]]
    x, w8, ws, b = _case(20, 24, 4096)
    x8, xs = quantize_int8_activations(x, None)
    exact = (x8.double() @ w8.double().t()) * xs.double() * ws.double().t() + b.double()
    assert torch.allclose(int8_matmul(x8, xs, w8, ws, b, torch.float64), exact, rtol=1e-6, atol=0)
    expected = (x8.float() * xs) @ (w8.float() * ws).t() + b
    torch.testing.assert_close(int8_linear_ref(x, w8, ws, b), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dispatch_runs_w8a16_up_to_the_threshold_and_w8a8_above(monkeypatch, dtype):
    """Up to FP8_GEMV_MAX_ROWS rows the activations are not rounded (bf16 on the CPU: torch's int8 weight-only kernel
    with the scales in bf16, as the layer prepares them); above, W8A8; FLOTILLA_FP8_GEMV=0 keeps W8A8 everywhere."""
    from flotilla.kernels.cpu_int_linear import cpu_int8_weight

    limit = dispatch.FP8_GEMV_MAX_ROWS
    x, w8, ws, b = _case(limit + 1, 32, 64, dtype, seed=3)
    cpu_weight = cpu_int8_weight(w8, ws, dtype)
    assert (cpu_weight is None) == (dtype == torch.float32)
    small = x[:limit].reshape(2, limit // 2, 64)  # leading dims count as rows
    out = dispatch.int8_linear(small, w8, ws, b, cpu_weight=cpu_weight)
    if cpu_weight is None:
        assert torch.equal(out, fp8_weight_only_linear_ref(small, w8, ws, b))
    else:
        assert cpu_weight.packed.data_ptr() == w8.data_ptr()  # the codes are shared, not copied
        dense = torch.nn.functional.linear(small.float(), w8.float() * ws.to(dtype).float(), b.float())
        torch.testing.assert_close(out.float(), dense, rtol=2e-2, atol=2e-2)
    assert torch.equal(dispatch.int8_linear(x, w8, ws, b, cpu_weight=cpu_weight), int8_linear_ref(x, w8, ws, b))
    monkeypatch.setattr(dispatch, "FP8_GEMV_ENABLED", False)
    assert torch.equal(dispatch.int8_linear(x[:1], w8, ws, b), int8_linear_ref(x[:1], w8, ws, b))


def _w8a8(**activations: object) -> dict:
    acts = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True} | activations
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": acts,
                                          "weights": {"num_bits": 8, "type": "int", "symmetric": True,
                                                      "strategy": "channel", "dynamic": False}}}}


@pytest.mark.parametrize("activations,message", [
    ({"symmetric": False}, "asymmetric int8 activations"),
    ({"strategy": "tensor", "dynamic": True}, "dynamic per token or static per tensor"),
    ({"strategy": "group", "group_size": 128}, "dynamic per token or static per tensor"),
    ({"type": "float"}, "need int8 input activations"),
])
def test_int8_w8a8_layouts_the_engine_does_not_run_are_refused_by_name(activations, message):
    """Zero points (asymmetric activations or weights) and other activation strategies: refused in the engine's words,
    which the operator's webhook repeats; the two schemes it runs pass."""
    check_layout(_w8a8())
    check_layout(_w8a8(strategy="tensor", dynamic=False))
    with pytest.raises(ValueError, match=message):
        check_layout(_w8a8(**activations))
    assert message in (override_method_problem(_w8a8(**activations), "none") or "")
    asym = _w8a8()
    asym["config_groups"]["group_0"]["weights"]["symmetric"] = False
    with pytest.raises(ValueError, match="asymmetric int8 weights"):
        check_layout(asym)


def test_zero_points_of_a_symmetric_checkpoint_are_dropped_and_the_rest_kept():
    """Older compressed-tensors writers kept the all-zero `weight_zero_point` / `input_zero_point` of symmetric
    schemes: nothing of the layer holds them, so the converter drops them; weights and scales pass as stored."""
    from flotilla.engine.quantization.compressed_tensors import convert_tensors

    layer = "model.layers.0.self_attn.q_proj"
    tensors = {f"{layer}.weight": torch.ones(4, 8, dtype=torch.int8), f"{layer}.weight_scale": torch.ones(4, 1),
               f"{layer}.input_scale": torch.ones(1), f"{layer}.weight_zero_point": torch.zeros(4, 1, dtype=torch.int8),
               f"{layer}.input_zero_point": torch.zeros(1, dtype=torch.int8)}
    kept = dict(convert_tensors(tensors.items(), _w8a8(strategy="tensor", dynamic=False)))
    assert sorted(kept) == [f"{layer}.input_scale", f"{layer}.weight", f"{layer}.weight_scale"]
    assert all(kept[name] is tensors[name] for name in kept)


def test_an_asymmetric_int8_checkpoint_is_refused_at_start_up(wide_llama, tmp_path):  # noqa: F811
    import json

    path = compressed_tensors_checkpoint(wide_llama, tmp_path / "w8a8", "W8A8", dequantized_copy=False)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"]["symmetric"] = False
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="asymmetric int8 activations"):
        EngineConfig.from_kwargs(str(path))
