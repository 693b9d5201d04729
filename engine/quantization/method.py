"""The quant-method hook of the linear layers: how a layer stores its weight and computes `x @ W^T`.

A linear layer with no method keeps its `[out, in]` weight in the model dtype. A method, attached by
`quantize_linear_layers` before the checkpoint loads, replaces that weight with its own parameters
(each may carry a `weight_loader` of its own; otherwise the layer's sharding loader places it), turns
what was loaded into its run-time form in `process_weights`, and computes the product in `apply`.
Model code never sees the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class LinearMethod:
    """One quantization scheme of a linear layer's weight (subclasses: `fp8.py`, `packed_int.py`).

    `layer` is the `_Linear` of `engine/layers/linear.py` (typed Any: that module imports this one, and
    the parameters a method reads are its own, added by `create_weights`)."""

    def create_weights(self, layer: Any) -> None:
        """Give `layer` the parameters the checkpoint fills (default: keep the dense weight)."""

    def process_weights(self, layer: Any) -> None:
        """After loading: convert the loaded parameters into the form `apply` reads."""

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """`x @ W^T + bias`."""
        raise NotImplementedError


def replace_parameter(layer: Any, name: str, tensor: torch.Tensor,
                      loader: Callable[..., None] | None = None) -> nn.Parameter:
    """Register `tensor` as the frozen parameter `name` of `layer` (replacing one of that name)."""
    if hasattr(layer, name):
        delattr(layer, name)
    param = nn.Parameter(tensor, requires_grad=False)
    if loader is not None:
        param.weight_loader = loader  # type: ignore[attr-defined]  # read by model_loader
    layer.register_parameter(name, param)
    return param


def out_features(layer: Any) -> int:
    """The layer's output features on this rank (`_Linear` keeps them apart from its weight, which a method may
    replace by packed codes)."""
    return int(layer.out_features)


def in_features(layer: Any) -> int:
    """The layer's input features on this rank."""
    return int(layer.in_features)
