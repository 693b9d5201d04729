"""NVIDIA ModelOpt FP8 and Meta fbgemm_fp8 test checkpoints of tiny HF models, and HF's dense copy of what they hold.

- ModelOpt FP8 (`quant_algo: FP8`): each linear weight rounded to e4m3 with one scale `amax / 448` (`weight_scale`,
  a 0-d tensor as ModelOpt writes it), one static `input_scale` the test chooses (FP8_PER_CHANNEL_PER_TOKEN: a scale
  a row, `[out]`, and none), and with an FP8 KV cache the
  attention's `self_attn.k_proj.k_scale` / `v_proj.v_scale`; the settings in config.json's quantization_config, or
  in `hf_quant_config.json` beside it (older exports: config.json has none).
- fbgemm_fp8: each row rounded to e4m3 with its own scale (`weight_scale` `[out, 1]`), `activation_scale_ub` in the
  config.
`dst/dequantized` holds the dense checkpoint (fp8 x scale written back, fp32) for HF to run as the oracle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from flotilla.kernels.fp8_linear import FP8_MAX, quantize_fp8_rows, quantize_fp8_static

from .quant_checkpoints import _linear_names, _save


def quantize_fp8_tensor(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` -> (e4m3 values, its one fp32 scale `amax / 448` as a 0-d tensor)."""
    scale = (weight.abs().amax().float() / FP8_MAX).reshape(())
    return quantize_fp8_static(weight, scale), scale


def modelopt_checkpoint(src: Path, dst: Path, input_scale: float = 0.05, kv_scales: tuple[float, float] | None = None,
                        hf_quant_file: bool = False, per_channel: bool = False) -> Path:
    """`src` as a ModelOpt FP8 checkpoint at `dst` (every layer's static input scale `input_scale`; `kv_scales`: each
    attention's (k, v) scales and kv_cache_quant_algo FP8, else null; `per_channel`: FP8_PER_CHANNEL_PER_TOKEN, a
    `weight_scale` `[out]` a layer and no input scale), plus `dst/dequantized` for HF."""

    def per_tensor(weight: torch.Tensor) -> dict[str, torch.Tensor]:
        if per_channel:
            w8, scales = quantize_fp8_rows(weight)
            return {"weight": w8, "weight_scale": scales.flatten()}
        w8, scale = quantize_fp8_tensor(weight)
        return {"weight": w8, "weight_scale": scale, "input_scale": torch.tensor(input_scale)}

    settings: dict[str, Any] = {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN" if per_channel else "FP8",
                                "kv_cache_quant_algo": "FP8" if kv_scales else None, "exclude_modules": ["lm_head"]}
    extra: dict[str, torch.Tensor] = {}
    if kv_scales is not None:
        layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
        for i in range(layers):
            extra[f"model.layers.{i}.self_attn.k_proj.k_scale"] = torch.tensor(kv_scales[0])
            extra[f"model.layers.{i}.self_attn.v_proj.v_scale"] = torch.tensor(kv_scales[1])
    qcfg = None if hf_quant_file else {"quant_method": "modelopt", **settings}
    _write(src, dst, per_tensor, qcfg, extra)
    if hf_quant_file:
        (dst / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.19.0"},
                                                              "quantization": settings}))
    return dst


def fbgemm_checkpoint(src: Path, dst: Path, activation_scale_ub: float = 1200.0) -> Path:
    """`src` as an fbgemm_fp8 checkpoint at `dst` (per-row e4m3 weights), plus `dst/dequantized` for HF."""

    def per_channel(weight: torch.Tensor) -> dict[str, torch.Tensor]:
        w8, scale = quantize_fp8_rows(weight)
        return {"weight": w8, "weight_scale": scale}

    qcfg = {"quant_method": "fbgemm_fp8", "activation_scale_ub": activation_scale_ub,
            "modules_to_not_convert": ["lm_head"]}
    _write(src, dst, per_channel, qcfg, {})
    return dst


def _write(src: Path, dst: Path, quantize: Any, qcfg: dict[str, Any] | None, extra: dict[str, torch.Tensor]) -> None:
    """`src`'s linear weights through `quantize` (-> the layer's tensors by suffix) saved at `dst` with `qcfg` (None:
    config.json without quantization_config) and `extra` tensors, and the dequantized model at `dst/dequantized`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    state = dict(model.state_dict())
    dequantized = dict(state)
    for name in _linear_names(model):
        tensors = quantize(state.pop(f"{name}.weight"))
        state.update({f"{name}.{k}": v for k, v in tensors.items()})
        scale = tensors["weight_scale"]
        dequantized[f"{name}.weight"] = tensors["weight"].float() * (scale.reshape(-1, 1) if scale.dim() else scale)
    _save(model, src, dst, state | extra, qcfg or {})
    if qcfg is None:
        config = json.loads((dst / "config.json").read_text())
        del config["quantization_config"]
        (dst / "config.json").write_text(json.dumps(config))
    model.load_state_dict(dequantized)
    model.save_pretrained(dst / "dequantized")
    AutoTokenizer.from_pretrained(src).save_pretrained(dst / "dequantized")
