"""`--quantization rtn`: vLLM's online round-to-nearest weight-only quantization of a dense checkpoint.

As in vLLM, `RTN_NUM_BITS` (8 or 4, default 8) and `RTN_GROUP_SIZE` (inputs per scale, default 128;
-1: one scale per output row) come from the environment, read when the engine is configured. Each
group of a weight row gets the symmetric scale `max|w| * 2 / (2^bits - 1)` and codes
`clamp(round(w / scale) + 2^(bits-1), 0, 2^bits - 1)`, so a weight is `(code - 2^(bits-1)) * scale`.
The result is stored in the weight-only layout every 4/8-bit format loads into (`packed_int.py`), so
it runs on the same kernels: Triton on CUDA, torch's packed int4 (groups of 32-256) and int8 (one
group a row) kernels on the CPU for bf16/fp16 models, the dequantizing reference otherwise.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from flotilla import engine_rules
from flotilla.engine.quantization.method import in_features, replace_parameter
from flotilla.engine.quantization.packed_int import PackedIntMethod
from flotilla.kernels.packed_int_linear import pack_codes


def rtn_settings() -> tuple[int, int | None]:
    """(bits, group size or None for one group a row) from this process's RTN_NUM_BITS / RTN_GROUP_SIZE; the
    rule (flotilla/engine_rules.py) is the one the operator applies to spec.pod.env. ValueError (RuleError)
    when they name something else."""
    return engine_rules.rtn_settings(os.environ)


def rtn_quantize(weight: torch.Tensor, bits: int, group_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsigned codes `[out, in]` (uint8) and fp32 scales `[out, in / group]` of a dense weight."""
    rows, cols = weight.shape
    groups = weight.float().reshape(rows, -1, group_size or cols)
    # One fp32 product with a constant, never a division by a Python number: CUDA divides by one as a product with
    # its fp32 reciprocal, the CPU exactly, and the scale's last bit decides the code of each group's largest weight,
    # which sits on a rounding tie (+-7.5 steps for 4 bits): the two devices ran different models (tests:
    # test_rtn_rounds_alike_on_every_device). `groups / scale` (two tensors) is IEEE division on both.
    scale = groups.abs().amax(dim=-1, keepdim=True) * (2.0 / (2**bits - 1))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero group: codes at the middle
    codes = (groups / scale).round() + 2 ** (bits - 1)
    return codes.clamp(0, 2**bits - 1).to(torch.uint8).reshape(rows, cols), scale.squeeze(-1)


class RtnMethod(PackedIntMethod):
    """Loads the dense weight, then quantizes it (`process_weights`) into packed codes and scales."""

    def __init__(self, bits: int, group_size: int | None) -> None:
        super().__init__(bits, group_size, symmetric=True)

    def create_weights(self, layer: Any) -> None:
        """Keep the dense weight for the checkpoint; refuse a layer the groups do not divide."""
        cols = in_features(layer)
        if cols % self._group(layer):
            raise ValueError(f"--quantization rtn: RTN_GROUP_SIZE={self.group_size} does not divide a layer of "
                             f"{cols} inputs; pick a divisor of it (or -1: one group a row)")

    def process_weights(self, layer: Any) -> None:
        """Quantize the loaded weight and put the packed layout in its place."""
        dtype = layer.weight.dtype
        codes, scales = rtn_quantize(layer.weight.data, self.bits, self.group_size)
        del layer.weight
        replace_parameter(layer, "weight_packed", pack_codes(codes, self.bits))
        replace_parameter(layer, "weight_scale", scales.to(dtype))
        # On the scales' device: this runs after loading, outside the model's device context (a CPU zero point
        # beside CUDA codes failed the Triton int4 kernels on the H200, session 11 call 5).
        middle = torch.full(scales.shape, 1 << (self.bits - 1), dtype=torch.uint8, device=scales.device)
        layer.register_buffer("weight_zero_point", middle)
        super().process_weights(layer)
