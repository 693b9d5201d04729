"""bitsandbytes 4-bit weights (nf4 / fp4): pre-quantized checkpoints (`*-bnb-4bit`) and `--quantization
bitsandbytes` over a dense checkpoint.

A checkpoint stores each quantized linear layer's weight as bitsandbytes serializes a 4-bit parameter: `weight`
uint8, the row-major `[out, in]` codes two a byte (flattened); `weight.absmax`, one scale a block of 64
consecutive weights; `weight.quant_map`, the 16-value table; `weight.quant_state.bitsandbytes__nf4` (or `__fp4`),
a JSON object in a uint8 tensor (quant_type, blocksize, shape, dtype and, with double quantization, the nested
blocksize, dtype and offset). With double quantization (`bnb_4bit_use_double_quant`) `weight.absmax` is itself
uint8 codes of a 256-value table (`weight.nested_quant_map`) with one float32 scale a block of 256 absmax values
(`weight.nested_absmax`), plus the offset: `absmax = nested_quant_map[code] * nested_absmax[i // 256] + offset`.

At load (`convert_tensors`) each layer's pieces are decoded into the engine's layout (`kernels/nf4_linear.py`):
`weight_packed` uint8 `[out, in / 2]` and `weight_absmax` float32 `[out, in / 64]` (double quantization undone
in float32, as bitsandbytes dequantizes it), output rows first, so the layers' sharding loaders place them as they
place a dense weight. Blocks of 64 within a row: a layer's inputs (a row-parallel rank's part) a multiple of 64.

`--quantization bitsandbytes` over a dense checkpoint quantizes each loaded weight to nf4 in blocks of 64 with
bitsandbytes' rounding (`quantize_4bit_blocks`), as vLLM's in-flight bitsandbytes does; the absmax stays float32
(no double quantization at load: it would save 0.06 - 0.008 bytes a weight and round the scales once more).

The product is computed in the model's dtype (bnb_4bit_compute_dtype is not read). 8-bit bitsandbytes
(`load_in_8bit`) is refused (flotilla/quantization_config.py `check_layout`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from flotilla.engine.quantization.method import LinearMethod, in_features, out_features, replace_parameter
from flotilla.kernels.dispatch import nf4_linear
from flotilla.kernels.nf4_linear import BLOCK, quantize_4bit_blocks, table
from flotilla.quantization_config import bnb_quant_type, check_layout

_STATE = "quant_state.bitsandbytes__"
# A quantized weight's pieces beside `weight` itself, by their suffix after `weight.`.
_PIECES = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")


class BnbMethod(LinearMethod):
    """4-bit `quant_type` (nf4 / fp4) codes with a float32 absmax a block of 64 inputs; `prequantized`: the
    checkpoint holds them, else the dense weight is quantized at load."""

    def __init__(self, quant_type: str, prequantized: bool) -> None:
        self.quant_type = quant_type
        self.prequantized = prequantized
        # The 16 table values, one tensor on the codes' device shared by every layer of the method (not a buffer
        # of each: 64 bytes a layer the fit check would have to count).
        self.values: torch.Tensor | None = None

    def create_weights(self, layer: Any) -> None:
        """The codes and block scales in place of the weight (pre-quantized), or the dense weight kept for
        `process_weights`; ValueError where the layer's inputs do not make whole blocks."""
        rows, cols = out_features(layer), in_features(layer)
        if cols % BLOCK:
            raise ValueError(f"bitsandbytes 4-bit: a layer of {cols} inputs (on this rank) does not split into blocks "
                             f"of {BLOCK}")
        if self.prequantized:
            del layer.weight
            replace_parameter(layer, "weight_packed", torch.zeros(rows, cols // 2, dtype=torch.uint8))
            replace_parameter(layer, "weight_absmax", torch.zeros(rows, cols // BLOCK, dtype=torch.float32))

    def process_weights(self, layer: Any) -> None:
        """Quantize a dense weight (in-flight); put the table on the codes' device."""
        if not self.prequantized:
            packed, absmax = quantize_4bit_blocks(layer.weight.data, self.quant_type)
            del layer.weight
            replace_parameter(layer, "weight_packed", packed)
            replace_parameter(layer, "weight_absmax", absmax)
        if self.values is None or self.values.device != layer.weight_packed.device:
            self.values = table(self.quant_type, layer.weight_packed.device)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """W4A16 through the table (Triton on CUDA, the reference elsewhere)."""
        assert self.values is not None, "process_weights has run"
        return nf4_linear(x, layer.weight_packed, layer.weight_absmax, self.values, bias)


def linear_method(qcfg: dict[str, Any] | None) -> LinearMethod:
    """A checkpoint's method (its quantization_config; ValueError for a layout the engine refuses), or nf4 at load
    (None: a dense checkpoint)."""
    if qcfg is None:
        return BnbMethod("nf4", prequantized=False)
    check_layout(qcfg)
    return BnbMethod(bnb_quant_type(qcfg), prequantized=True)


def convert_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], qcfg: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each quantized weight's pieces (module docstring), held until all have come, as `weight_packed` and
    `weight_absmax`; every other tensor as it is. ValueError for a weight whose pieces do not all come, or whose
    quant state the engine does not run."""
    quant_type = bnb_quant_type(qcfg)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        key, piece = _piece(name, tensor)
        if key is None:
            yield name, tensor
            continue
        parts = pending.setdefault(key, {})
        parts[piece] = tensor
        if _complete(parts):
            del pending[key]
            prefix = key.removesuffix(".weight")
            packed, absmax = decode_weight(key, parts, quant_type)
            yield f"{prefix}.weight_packed", packed
            yield f"{prefix}.weight_absmax", absmax
    if pending:
        key, parts = next(iter(pending.items()))
        raise ValueError(f"bitsandbytes: {key} lacks {sorted(set(_needed(parts)) - set(parts))} in the checkpoint")


def _piece(name: str, tensor: torch.Tensor) -> tuple[str | None, str]:
    """(the quantized weight's name, which piece) for a piece of one, else (None, "")."""
    if name.endswith(".weight") and tensor.dtype == torch.uint8:
        return name, "weight"
    head, _, leaf = name.rpartition(".weight.")
    if not head:
        return None, ""
    if leaf.startswith(_STATE):
        return f"{head}.weight", "state"
    if leaf in _PIECES:
        return f"{head}.weight", leaf
    return None, ""


def _needed(parts: dict[str, torch.Tensor]) -> tuple[str, ...]:
    """The pieces a weight needs: the nested ones too where its quant state (once come) says it is double quantized."""
    base = ("weight", "state", "absmax", "quant_map")
    if "state" in parts and "nested_offset" in _state(parts["state"]):
        return (*base, "nested_absmax", "nested_quant_map")
    return base


def _complete(parts: dict[str, torch.Tensor]) -> bool:
    return "state" in parts and all(piece in parts for piece in _needed(parts))


def _state(blob: torch.Tensor) -> dict[str, Any]:
    """The JSON object bitsandbytes serializes into a uint8 tensor."""
    return dict(json.loads(bytes(blob.cpu().to(torch.uint8).tolist()).decode("utf-8")))


def decode_weight(key: str, parts: dict[str, torch.Tensor], quant_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight_packed` `[out, in / 2]` and float32 `weight_absmax` `[out, in / 64]` of one weight's pieces;
    ValueError, naming it, for a quant state or table other than the config's blocks of 64."""
    state = _state(parts["state"])
    shape = state.get("shape")
    if state.get("quant_type") != quant_type or state.get("blocksize") != BLOCK:
        raise ValueError(f"bitsandbytes: {key} is {state.get('quant_type')} in blocks of {state.get('blocksize')}; "
                         f"the engine loads {quant_type} (the quantization_config's) in blocks of {BLOCK}")
    if not (isinstance(shape, list) and len(shape) == 2 and shape[1] % BLOCK == 0):
        raise ValueError(f"bitsandbytes: {key} has shape {shape}; a 2-d weight of whole blocks of {BLOCK} inputs a "
                         "row is loaded")
    if not torch.equal(parts["quant_map"].float().cpu(), table(quant_type)):
        raise ValueError(f"bitsandbytes: {key}'s quant_map is not bitsandbytes' {quant_type} table")
    rows, cols = shape
    absmax = parts["absmax"]
    if "nested_offset" in state:  # double quantization: the absmax are 8-bit codes of 256-value blocks
        nested = parts["nested_absmax"].float()
        codes = parts["nested_quant_map"].float()[absmax.long()]
        size = int(state["nested_blocksize"])
        blocks = torch.arange(absmax.numel(), device=absmax.device) // size
        absmax = codes * nested[blocks] + torch.tensor(float(state["nested_offset"]), dtype=torch.float32)
    packed = parts["weight"].reshape(-1)
    if packed.numel() * 2 != rows * cols or absmax.numel() * BLOCK != rows * cols:
        raise ValueError(f"bitsandbytes: {key} holds {packed.numel()} bytes and {absmax.numel()} scales, not those "
                         f"of a {shape} weight")
    return packed.reshape(rows, cols // 2), absmax.float().reshape(rows, cols // BLOCK)
