"""Quantized weights: which scheme a model runs (`--quantization`, or the checkpoint's
`quantization_config`), and attaching it to the linear layers around the checkpoint load.

One module per scheme or checkpoint format: `fp8.py` (quantized at load, or fp8 checkpoints), `fp8_block.py`
(block-scaled fp8 checkpoints), `int8.py` (compressed-tensors' int8 W8A8), `packed_int.py` (4/8-bit weight-only
integers), `rtn.py` (those, rounded at load),
`compressed_tensors.py`, `gptq.py`, `awq.py`, `modelopt.py` (NVIDIA ModelOpt FP8), `fbgemm_fp8.py` (Meta's FP8)
(each a format's config and tensor layout), `gguf.py` (a GGUF file's own 4-bit codes), `bnb.py` (bitsandbytes 4-bit
checkpoints, or nf4 at load). `--quantization` also takes vLLM's kernel names gptq_marlin and awq_marlin, as the
format they run (`KERNEL_ALIASES`).
The layers' hook is in `engine/layers/linear.py`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the schemes import torch: the API process validates an unquantized model's config without it
    import torch
    from torch import nn

    from flotilla.engine.quantization.method import LinearMethod

from flotilla.quantization_config import (
    check_layout,
    config_method,
    describes_checkpoint,
    flag_disagrees,
    flag_method,
    fp8_block_size,
)

# What `--quantization` accepts, and what a checkpoint's `quant_method` may say.
SUPPORTED_METHODS = ("fp8", "rtn", "compressed-tensors", "gptq", "awq", "gguf", "bitsandbytes", "modelopt",
                     "fbgemm_fp8")
# The checkpoint formats (`--quantization` names them, the checkpoint's quantization_config describes them): their
# modules, imported when a model of the format is served.
_FORMATS = {"compressed-tensors": "compressed_tensors", "gptq": "gptq", "awq": "awq", "modelopt": "modelopt",
            "fbgemm_fp8": "fbgemm_fp8"}


def _format(method: str) -> ModuleType:
    """The module of the checkpoint format `method` (one of _FORMATS)."""
    return importlib.import_module(f"{__name__}.{_FORMATS[method]}")


def checkpoint_quantization(hf_config: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's `quantization_config`, if it describes how its safetensors are stored (not gguf's, whose
    safetensors hold dequantized weights: `flotilla.quantization_config.describes_checkpoint`)."""
    qcfg = hf_config.get("quantization_config")
    return qcfg if describes_checkpoint(qcfg) else None


def resolve_quantization(flag: str | None, hf_config: dict[str, Any]) -> str | None:
    """The scheme to run: the checkpoint's `quant_method` when it has one (the flag, if given, must name
    the same; a kernel alias names its format: gptq_marlin is gptq), else the flag. Raises ValueError with the reason
    when it cannot run."""
    qcfg = checkpoint_quantization(hf_config)
    found = config_method(qcfg)
    # A quantization_config without quant_method is dense weights, and with a flag a mismatch (vLLM's check); the
    # operator's webhook refuses the same with the same reader (flotilla/quantization_config.py).
    if flag_disagrees(qcfg, flag):
        named = f"quant_method {found!r}" if found else "no quant_method"
        raise ValueError(f"--quantization {flag} does not match the checkpoint's quantization_config "
                         f"({named}); leave --quantization out to use the checkpoint's")
    method = found or flag_method(flag)
    if method is None:
        return None
    if method not in SUPPORTED_METHODS:
        raise ValueError(f"quantization method {method!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_METHODS)})")
    if method in _FORMATS and qcfg is None:  # a checkpoint format, not a scheme applied at load
        raise ValueError(f"--quantization {flag} reads a {method} checkpoint, and this one's config.json has no "
                         "quantization_config (a dense checkpoint: leave --quantization out, or fp8 / rtn quantize "
                         "it at load)")
    linear_method(method, hf_config)  # refuses unsupported variants now, not at load time
    return method


def linear_method(method: str, hf_config: dict[str, Any]) -> LinearMethod:
    """The linear layers' method for a resolved scheme."""
    from flotilla.engine.quantization.fp8 import Fp8CheckpointMethod, Fp8OnlineMethod

    qcfg = checkpoint_quantization(hf_config)
    if method == "fp8":
        if qcfg is None:
            return Fp8OnlineMethod()
        check_layout(qcfg)  # e4m3, per tensor or in blocks (flotilla/quantization_config.py; the webhook runs it too)
        block = fp8_block_size(qcfg)
        if block is not None:
            from flotilla.engine.quantization.fp8_block import Fp8BlockMethod

            return Fp8BlockMethod(block)
        return Fp8CheckpointMethod(static_input=qcfg.get("activation_scheme", "dynamic") == "static")
    if method == "rtn":
        from flotilla.engine.quantization.rtn import RtnMethod, rtn_settings

        if qcfg is not None:
            raise ValueError("--quantization rtn quantizes a dense checkpoint; this one is already quantized")
        return RtnMethod(*rtn_settings())
    if method == "bitsandbytes":  # the checkpoint's 4-bit codes, or a dense checkpoint quantized to nf4 at load
        from flotilla.engine.quantization.bnb import linear_method as bnb_method

        return bnb_method(qcfg)
    if method == "gguf":
        from flotilla.engine.quantization.gguf import GgufInt4Method

        return GgufInt4Method()  # per layer by its GGUF types: `gguf.attach_gguf_methods`
    assert qcfg is not None, f"{method} needs the checkpoint's quantization_config"
    return _format(method).linear_method(qcfg)


def attach_quant_method(model: nn.Module, method: LinearMethod) -> None:
    """Before loading: give every linear layer (not embeddings nor the LM head) `method`'s parameters."""
    from flotilla.engine.layers.linear import quantizable_layers

    for layer in quantizable_layers(model):
        layer.quant_method = method
        method.create_weights(layer)
    _attach_experts_method(model, method)


def process_quantized_weights(model: nn.Module) -> None:
    """After loading: each quantized layer converts what it loaded into its run-time form."""
    import torch

    from flotilla.engine.layers.linear import quantizable_layers

    with torch.no_grad():
        for layer in quantizable_layers(model):
            if layer.quant_method is not None:
                layer.quant_method.process_weights(layer)
        for experts in _expert_layers(model):
            if experts.quant_method is not None:
                experts.quant_method.process_weights(experts)


def _expert_layers(model: nn.Module) -> list[Any]:
    """A mixture-of-experts model's stacked experts (`FusedMoE`), one a sparse layer."""
    from flotilla.engine.layers.moe import FusedMoE

    return [m for m in model.modules() if isinstance(m, FusedMoE)]


def _attach_experts_method(model: nn.Module, method: LinearMethod) -> None:
    """Before loading: fp8 experts for the fp8 schemes (`fp8.experts_method`); the engine's config refused every
    other scheme on a mixture-of-experts model (flotilla/engine_rules.py `moe_problem`)."""
    from flotilla.engine.quantization.fp8 import experts_method

    for experts in _expert_layers(model):
        experts.quant_method = experts_method(method)
        if experts.quant_method is None:
            raise ValueError(f"{type(method).__name__} does not quantize a mixture-of-experts model's experts")
        experts.quant_method.create_weights(experts)


def convert_checkpoint(
    method: str, hf_config: dict[str, Any], tensors: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors renamed and re-laid-out as the method's parameters expect."""
    qcfg = checkpoint_quantization(hf_config)
    if method in _FORMATS and qcfg is not None:
        return _format(method).convert_tensors(tensors, qcfg)
    if method == "bitsandbytes" and qcfg is not None:  # each weight's pieces -> codes and float32 absmax
        from flotilla.engine.quantization.bnb import convert_tensors as bnb_tensors

        return bnb_tensors(tensors, qcfg)
    if method == "fp8" and fp8_block_size(qcfg) is not None:  # `weight_scale_inv` -> `weight_scale`
        from flotilla.engine.quantization.fp8_block import convert_tensors

        return convert_tensors(tensors)
    return iter(tensors)
