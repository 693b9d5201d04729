"""--calculate-kv-scales: per-layer fp8 KV scales from a calibration forward at start-up.

The oracle is HF transformers. The scales: HF's cached K (after rotary) and V of the calibration
sequence give max|K| / 200 and max|V| / 100 per layer. The greedy tokens: HF run with every cached
K and V rounded through e4m3 at the engine's calculated scales (`DynamicCache.update` wrapped), which
is what the engine's fp8 cache stores and every attention of it (prefill and decode) reads back.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.layers.attention import Attention
from flotilla.engine.llm import LLM
from flotilla.engine.quantization.kv_scale_calibration import (
    K_SCALE_CONSTANT,
    V_SCALE_CONSTANT,
    calibrate_kv_scales,
    calibration_token_ids,
    observe_kv_amax,
    scale_from_amax,
)
from flotilla.engine.sampling_params import SamplingParams
from flotilla.kernels.fp8_linear import FP8_DTYPE, FP8_MAX

from .hf_reference import _hf_model, hf_greedy
from .quant_checkpoints import with_kv_scales

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13] * 10]
TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
LENGTH = 64  # calibration tokens: --max-num-batched-tokens caps the sequence


def _hf_kv_amax(path, ids: list[int]) -> list[tuple[float, float]]:
    model = _hf_model(str(path), torch.float32)
    with torch.inference_mode():
        cache = model(torch.tensor([ids]), use_cache=True).past_key_values
    return [(float(layer.keys.abs().max()), float(layer.values.abs().max())) for layer in cache.layers]


def test_scale_from_amax_is_vllms_divisor_and_refuses_non_finite_maxima():
    assert scale_from_amax(448.0, K_SCALE_CONSTANT) == 448.0 / 200
    assert scale_from_amax(3.0, V_SCALE_CONSTANT) == 3.0 / 100
    assert scale_from_amax(0.0, K_SCALE_CONSTANT) == 1.0  # an all-zero tensor: any scale stores it exactly
    with pytest.raises(ValueError, match="non-finite"):
        scale_from_amax(float("inf"), K_SCALE_CONSTANT)
    with pytest.raises(ValueError, match="non-finite"):
        scale_from_amax(float("nan"), K_SCALE_CONSTANT)
    assert calibration_token_ids(1000, 16) == calibration_token_ids(1000, 16)  # the same every start


def test_observed_maxima_are_of_magnitudes_and_keep_a_nan():
    """A NaN must reach `scale_from_amax` (and be refused there), not vanish in a running max."""
    attn = Attention(num_heads=1, num_kv_heads=1, head_dim=2, scale=1.0)
    with observe_kv_amax([attn]) as amax:
        attn(torch.ones(1, 2), torch.tensor([[1.0, -3.0]]), torch.tensor([[0.5, 0.25]]))
        attn(torch.ones(1, 2), torch.tensor([[2.0, 0.0]]), torch.tensor([[float("nan"), 0.0]]))
    assert amax[0][0] == 3.0 and math.isnan(amax[0][1])


def test_calculated_scales_are_hf_cached_k_and_v_maxima_over_the_calibration_tokens(tiny_model_dirs):
    """On an exact (fp32) cache the calibration forward sees what HF caches: max|rotated K| / 200, max|V| / 100."""
    path = tiny_model_dirs["llama"]
    runner = LLM(str(path), max_model_len=256).engine.runner
    vocab = runner.config.model.hf_config["vocab_size"]
    calibrate_kv_scales(runner.model, runner.attention_layers, vocab, LENGTH, runner.block_size, runner.device)
    expected = [m for pair in _hf_kv_amax(path, calibration_token_ids(vocab, LENGTH)) for m in pair]
    got = [m for a in runner.attention_layers for m in (a.k_scale * K_SCALE_CONSTANT, a.v_scale * V_SCALE_CONSTANT)]
    assert got == pytest.approx(expected, rel=1e-5)


@pytest.fixture(scope="module")
def small_kv_llama(tiny_model_dirs, tmp_path_factory) -> Path:
    """The tiny Llama with k_proj/v_proj scaled by 1e-3: its K and V (~0.003) sit in e4m3's subnormal
    range at scale 1.0 (largely stored as 0), so scales 1.0 and calculated ones give different tokens."""
    from safetensors.torch import load_file, save_file

    path = tmp_path_factory.mktemp("small-kv-llama")
    shutil.copytree(tiny_model_dirs["llama"], path, dirs_exist_ok=True)
    for shard in path.glob("*.safetensors"):
        tensors = load_file(str(shard))
        small = {name: t * 1e-3 if name.endswith(("k_proj.weight", "v_proj.weight")) else t
                 for name, t in tensors.items()}
        save_file(small, str(shard), metadata={"format": "pt"})
    return path


def _round_through_e4m3(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).to(x.dtype) * scale


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_fp8_cache_with_calculated_scales_matches_hf_with_the_same_rounding(small_kv_llama, monkeypatch):
    """Token-equal to HF with the same e4m3 rounding of K/V at the calculated scales, and not to the
    same cache at scales 1.0 (this model's K/V are mostly subnormal there)."""
    path = small_kv_llama
    llm = LLM(str(path), max_model_len=LENGTH, max_num_batched_tokens=LENGTH, kv_cache_dtype="fp8",
              calculate_kv_scales=True)
    layers = llm.engine.runner.attention_layers
    scales = [(a.k_scale, a.v_scale) for a in layers]
    vocab = llm.engine.runner.config.model.hf_config["vocab_size"]
    # Layer 0 sees no earlier fp8 attention: its maxima are HF's exactly (later layers' differ by the
    # 1.0-scaled cache's rounding during calibration).
    k_amax, v_amax = _hf_kv_amax(path, calibration_token_ids(vocab, LENGTH))[0]
    assert list(scales[0]) == pytest.approx([k_amax / K_SCALE_CONSTANT, v_amax / V_SCALE_CONSTANT], rel=1e-5)
    ours = _greedy(llm)
    assert ours != _greedy(LLM(str(path), max_model_len=LENGTH, max_num_batched_tokens=LENGTH, kv_cache_dtype="fp8"))

    from transformers import DynamicCache

    update = DynamicCache.update

    def rounded_update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k_scale, v_scale = scales[layer_idx]
        return update(self, _round_through_e4m3(key_states, k_scale), _round_through_e4m3(value_states, v_scale),
                      layer_idx, *args, **kwargs)

    monkeypatch.setattr(DynamicCache, "update", rounded_update)
    assert ours == hf_greedy(path, PROMPTS, TOKENS)


def test_checkpoint_scales_are_kept_and_the_other_layers_calculated(tiny_model_dirs, tmp_path):
    path = with_kv_scales(tiny_model_dirs["llama"], tmp_path / "with-kv-scales",
                          {"model.layers.0.self_attn.k_scale": torch.tensor(0.5),
                           "model.layers.0.self_attn.v_scale": torch.tensor(2.0)})
    layers = LLM(str(path), max_model_len=LENGTH, max_num_batched_tokens=LENGTH, kv_cache_dtype="fp8",
                 calculate_kv_scales=True).engine.runner.attention_layers
    assert (layers[0].k_scale, layers[0].v_scale) == (0.5, 2.0)
    assert (layers[1].k_scale, layers[1].v_scale) != (1.0, 1.0)


def test_the_flag_without_an_fp8_cache_is_refused(tiny_model_dirs):
    """vLLM accepted it on any cache and ignored it; a flag that would silently do nothing is refused."""
    path = str(tiny_model_dirs["llama"])
    with pytest.raises(ConfigError, match="--calculate-kv-scales .*--kv-cache-dtype fp8"):
        EngineConfig.from_kwargs(path, calculate_kv_scales=True)
    assert EngineConfig.from_kwargs(path, calculate_kv_scales=True, kv_cache_dtype="fp8").cache.calculate_kv_scales
