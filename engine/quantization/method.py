"""The quant-method hook of the linear layers: how a layer stores its weight and computes `x @ W^T`.

A linear layer with no method keeps its `[out, in]` weight in the model dtype. A method, attached by
`quantize_linear_layers` before the checkpoint loads, replaces that weight with its own parameters
(each may carry a `weight_loader` of its own; otherwise the layer's sharding loader places it), turns
what was loaded into its run-time form in `process_weights`, and computes the product in `apply`.
Model code never sees the difference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class LinearMethod:
    """One quantization scheme of a linear layer's weight (subclasses: `fp8.py`, `packed_int.py`)."""

    def create_weights(self, layer: nn.Module) -> None:
        """Give `layer` the parameters the checkpoint fills (default: keep the dense weight)."""

    def process_weights(self, layer: nn.Module) -> None:
        """After loading: convert the loaded parameters into the form `apply` reads."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """`x @ W^T + bias`."""
        raise NotImplementedError


def replace_parameter(layer: nn.Module, name: str, tensor: torch.Tensor,
                      loader: Callable[..., None] | None = None) -> nn.Parameter:
    """Register `tensor` as the frozen parameter `name` of `layer` (replacing one of that name)."""
    if hasattr(layer, name):
        delattr(layer, name)
    param = nn.Parameter(tensor, requires_grad=False)
    if loader is not None:
        param.weight_loader = loader  # type: ignore[attr-defined]  # read by model_loader
    layer.register_parameter(name, param)
    return param


def out_features(layer: nn.Module) -> int:
    """The layer's output features on this rank (from the dense weight it was built with)."""
    return int(layer.weight.shape[0])


def in_features(layer: nn.Module) -> int:
    """The layer's input features on this rank."""
    return int(layer.weight.shape[1])
