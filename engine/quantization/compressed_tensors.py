"""compressed-tensors checkpoints (what llm-compressor writes), read from `quantization_config`.

Supported: one config group over the linear layers (`targets: ["Linear"]`; `ignore` may list the LM
head, and anything else that names none of the decoder's linear layers), with
- `float-quantized` / `naive-quantized` 8-bit float weights scaled per tensor or per channel (FP8 W8A8 with
  dynamic per-token or static per-tensor activations, or FP8 weight-only when `input_activations` is null;
  FP8_BLOCK's 128 x 128 block scales are refused),
- `pack-quantized` 4- or 8-bit integer weights with no activation quantization (W4A16, W8A16), per
  channel or in groups, symmetric or asymmetric; GPTQ's `actorder` null, `static` or `weight`
  (contiguous groups; `group`, which permutes them with `weight_g_idx`, is refused).
The checkpoint's packed codes are stored signed-plus-offset (`code + 2^(bits-1)`), the engine's
unsigned layout already; asymmetric zero points are packed the same way along the output dimension
and are unpacked here; `weight_shape` is implied by the layer and dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from flotilla.engine.quantization.fp8 import Fp8CheckpointMethod
from flotilla.engine.quantization.method import LinearMethod
from flotilla.engine.quantization.packed_int import PackedIntMethod
from flotilla.kernels.packed_int_linear import unpack_codes
from flotilla.quantization_config import compressed_tensors_group, compressed_tensors_group_size, weight_bits

_FLOAT_FORMATS = ("float-quantized", "naive-quantized")


def _scheme(qcfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    group = compressed_tensors_group(qcfg)  # one group with a weights object (flotilla/quantization_config.py)
    if group.get("targets") != ["Linear"]:
        raise ValueError(f"compressed-tensors: targets {group.get('targets')}; only [\"Linear\"] is supported")
    unsupported = [name for name in qcfg.get("ignore") or [] if ignores_a_decoder_linear(name)]
    if unsupported:
        raise ValueError(f"compressed-tensors: ignored layers {unsupported[:3]} are not supported "
                         "(only the LM head may be left unquantized)")
    fmt = group.get("format") or qcfg.get("format") or ""
    return group["weights"], group.get("input_activations"), fmt


# The decoder's linear layers as a checkpoint names them (layer numbers up to _LAYERS), which an `ignore` entry may
# not leave unquantized: one quant method runs them all.
_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                "mlp.up_proj", "mlp.down_proj")
_LAYERS = 512


def ignores_a_decoder_linear(entry: str) -> bool:
    """Whether an `ignore` entry names one of the decoder's linear layers, matched as compressed-tensors does: `re:`
    a regular expression (`re.match`) on the layer's name, else the name itself or its class (`Linear`). Entries
    that name none (the LM head, `re:.*lm_head$`, a mixture-of-experts router `re:.*mlp.gate$`) leave nothing of
    this model unquantized."""
    if entry == "Linear":
        return True
    if entry.startswith("re:"):
        pattern = re.compile(entry[3:])
        return any(pattern.match(f"model.layers.{i}.{p}") for i in range(_LAYERS) for p in _PROJECTIONS)
    return entry.removeprefix("model.").startswith("layers.") and entry.endswith(_PROJECTIONS)


def linear_method(qcfg: dict[str, Any]) -> LinearMethod:
    """The linear method of a compressed-tensors `quantization_config`, or ValueError naming what is not
    supported."""
    weights, activations, fmt = _scheme(qcfg)
    bits, kind = weight_bits(qcfg), weights.get("type")  # 4 or 8 (ValueError for others, as the webhook refuses)
    if kind == "float" and bits == 8 and fmt in _FLOAT_FORMATS:
        if weights.get("strategy", "tensor") not in ("tensor", "channel"):
            # A block scale `[out / 128, in / 128]` read as per-row scales fails on most shapes but loads as garbage
            # where in = 128 x 128 (Llama-3.1-405B's hidden size).
            raise ValueError(f"compressed-tensors: fp8 weight strategy {weights['strategy']!r} "
                             f"(block_structure {weights.get('block_structure')}) is not supported; "
                             "per-tensor and per-channel are")
        if activations is None:
            return Fp8CheckpointMethod(static_input=False, weight_only=True)
        if activations.get("type") != "float" or activations.get("num_bits") != 8:
            raise ValueError("compressed-tensors: fp8 weights need fp8 activations or none")
        return Fp8CheckpointMethod(static_input=not activations.get("dynamic", False))
    if kind == "int" and bits in (4, 8) and fmt == "pack-quantized":
        if activations is not None:
            raise ValueError("compressed-tensors: integer weights with quantized activations (W8A8 int) "
                             "are not supported; W4A16 and W8A16 are")
        strategy = weights.get("strategy")
        if strategy not in ("group", "channel"):
            raise ValueError(f"compressed-tensors: integer strategy {strategy!r}; group or channel is supported")
        if weights.get("actorder") in ("group", "dynamic"):
            # The groups follow a permutation (`weight_g_idx`); `static`/`weight` order only changes
            # GPTQ's calibration and stores contiguous groups, as with none.
            raise ValueError(f"compressed-tensors: actorder {weights['actorder']!r} (permuted groups, "
                             "weight_g_idx) is not supported; actorder null, static or weight is")
        return PackedIntMethod(bits, compressed_tensors_group_size(weights), bool(weights.get("symmetric", True)))
    raise ValueError(f"compressed-tensors: {bits}-bit {kind} weights in format {fmt!r} are not supported "
                     "(supported: FP8 float-quantized W8A8 / W8A16, int4 / int8 pack-quantized W4A16 / W8A16)")


def convert_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], qcfg: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors in the engine's layout (`packed_int.py`): zero points unpacked to
    unsigned codes `[out, groups]`; `weight_shape` dropped."""
    weights, _, _ = _scheme(qcfg)
    bits = weight_bits(qcfg)
    assert bits is not None, "compressed-tensors weights have num_bits"  # weight_bits refuses them otherwise
    for name, tensor in tensors:
        if name.endswith(".weight_shape"):
            continue
        if name.endswith(".weight_zero_point"):
            if weights.get("type") == "float":
                continue  # symmetric fp8: zero everywhere
            # `[out * bits / 32, groups]` packed along the output rows, codes offset by 2^(bits-1).
            tensor = unpack_codes(tensor.t().contiguous(), bits).t().to(torch.uint8).contiguous()
        yield name, tensor
