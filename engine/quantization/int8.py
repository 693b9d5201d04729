"""Int8 W8A8 weights: compressed-tensors `int-quantized` checkpoints (llm-compressor's W8A8 / SmoothQuant + GPTQ).

The checkpoint stores each linear weight as int8 `weight` `[out, in]` with `weight_scale` (symmetric: no zero
point; per output channel `[out, 1]`, or one per tensor spread over the rows it covers) and, for the static
scheme, one `input_scale` a layer (q, k and v of a merged layer share the largest, as vLLM does): the same
parameters as an fp8 checkpoint's, whose loaders they reuse, with int8 codes in place of e4m3 values.

At run time (`kernels/dispatch.py` `int8_linear`) a linear call of at most 16 rows (decode) runs W8A16, as fp8
weights do: the activations as they are, on the CPU through torch's int8 weight-only kernel (the layer keeps its
row scales in the activations' dtype for it, `cpu_int_weight`), on CUDA through the fp8 GEMV's kernel. Larger
calls run W8A8: the activations rounded to int8 per token (or with the static scale) and an int8 x int8 -> int32
matmul (`torch._int_mm`) scaled into the model dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from flotilla.engine.quantization.fp8 import Fp8CheckpointMethod
from flotilla.engine.quantization.method import LinearMethod, replace_parameter
from flotilla.kernels.cpu_int_linear import cpu_int8_weight
from flotilla.kernels.dispatch import int8_linear


class Int8W8A8Method(LinearMethod):
    """int8 weights with fp32 row scales; activations rounded to int8 per token, or with a static per-tensor scale
    (`static_input`), above the W8A16 rows."""

    def __init__(self, static_input: bool) -> None:
        self.static_input = static_input

    def create_weights(self, layer: Any) -> None:
        """An fp8 checkpoint's parameters and loaders (`[out, 1]` fp32 scales, a static input scale), the weight
        int8."""
        Fp8CheckpointMethod(self.static_input).create_weights(layer)
        replace_parameter(layer, "weight", torch.empty(layer.weight.shape, dtype=torch.int8))

    def process_weights(self, layer: Any) -> None:
        """On the CPU, also keep the row scales in the model dtype for torch's int8 kernel (the codes shared)."""
        layer.cpu_int_weight = None
        if layer.weight.device.type == "cpu":
            layer.cpu_int_weight = cpu_int8_weight(layer.weight, layer.weight_scale, layer.params_dtype)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """W8A16 at decode rows, W8A8 above (`kernels/dispatch.py` `int8_linear`)."""
        return int8_linear(x, layer.weight, layer.weight_scale, bias, getattr(layer, "input_scale", None),
                           getattr(layer, "cpu_int_weight", None))
