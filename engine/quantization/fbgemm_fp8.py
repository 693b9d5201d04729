"""fbgemm_fp8 checkpoints (Meta's FP8 releases, e.g. Llama-3.1-405B-Instruct-FP8): `quant_method: fbgemm_fp8`.

Each linear layer stores an e4m3 `weight` with one fp32 `weight_scale` a row (`[out, 1]`); activations are quantized
per token at run time with their absolute maximum capped at `activation_scale_ub` (a token's scale is
min(amax, bound) / 448, values beyond saturating at +-448). Clipping the activations to +-bound before the fp8
method's per-token quantization computes exactly that, so the per-channel fp8 path runs it unchanged (`fp8.py`; decode
steps of at most 16 rows run W8A16 there, the clipped activations unquantized). `modules_to_not_convert` may name
the LM head only (flotilla/quantization_config.py `fbgemm_activation_ub`). A checkpoint's own `input_scale_ub`
tensors, where it has them, are dropped: the config's bound rules, as vLLM reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from flotilla.engine.quantization.fp8 import Fp8CheckpointMethod
from flotilla.quantization_config import check_layout, fbgemm_activation_ub


class FbgemmFp8Method(Fp8CheckpointMethod):
    """Per-channel fp8 weights from the checkpoint; dynamic per-token activations whose scale is capped."""

    def __init__(self, activation_ub: float) -> None:
        super().__init__(static_input=False)
        self.activation_ub = activation_ub

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """W8A8 with per-token scales of the activations clipped to the bound."""
        return super().apply(layer, x.clamp(-self.activation_ub, self.activation_ub), bias)


def linear_method(qcfg: dict[str, Any]) -> FbgemmFp8Method:
    """The method of an fbgemm_fp8 quantization_config, or ValueError naming what is not supported."""
    check_layout(qcfg)
    return FbgemmFp8Method(fbgemm_activation_ub(qcfg))


def convert_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], qcfg: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors less any `input_scale_ub` (the config's `activation_scale_ub` is the bound)."""
    del qcfg
    return ((name, t) for name, t in tensors if not name.endswith(".input_scale_ub"))
