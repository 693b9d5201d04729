"""NVIDIA ModelOpt (TensorRT Model Optimizer) FP8 checkpoints: `quant_method: modelopt`, `quant_algo: FP8` (or
FP8_PER_CHANNEL_PER_TOKEN) in config.json's quantization_config, or the same under `quantization` in
`hf_quant_config.json` beside it (older exports; `flotilla/quantization_config.py` `with_modelopt_file`).

Under FP8 each linear layer stores an e4m3 `weight`, one fp32 `weight_scale` and one static `input_scale`: the fp8
checkpoint method with static activations (`fp8.py`), whose merged q/k/v and gate/up layers keep each part's scale
over its rows and share the largest input scale, as vLLM does. Under FP8_PER_CHANNEL_PER_TOKEN `weight_scale` has
one value a row and the activations are quantized per token: the same method with dynamic activations. With
`kv_cache_quant_algo: FP8` the checkpoint carries `self_attn.k_proj.k_scale` / `v_proj.v_scale`, which
`kv_scales.py` reads as the attention's, and `--kv-cache-dtype auto` runs an fp8 cache (vLLM's reading;
`checkpoint_kv_cache_dtype`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from flotilla.engine.quantization.fp8 import Fp8CheckpointMethod
from flotilla.engine.quantization.method import LinearMethod
from flotilla.quantization_config import check_layout, modelopt_settings


def linear_method(qcfg: dict[str, Any]) -> LinearMethod:
    """The method of a ModelOpt quantization_config, or ValueError naming what is not supported (another quant_algo,
    an excluded decoder layer: flotilla/quantization_config.py `modelopt_settings`, which the webhook runs too)."""
    check_layout(qcfg)
    return Fp8CheckpointMethod(static_input=modelopt_settings(qcfg)[0] == "FP8")


def convert_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], qcfg: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as they are: its names are the fp8 method's, and its KV scales `kv_scales.py`'s."""
    del qcfg
    return iter(tensors)
