"""Weight-only integer schemes (W4A16, W8A16): packed codes with group scales and zero points.

Every 4- and 8-bit checkpoint format (compressed-tensors `pack-quantized`, GPTQ, AWQ) is converted at
load into one layout (`kernels/packed_int_linear.py`): `weight_packed` int32 `[out, in * bits / 32]`,
`weight_scale` `[out, in / group]` and `weight_zero_point` uint8 `[out, in / group]`, all with output
rows first, so the layers' sharding loaders place them as they place a dense weight. Symmetric schemes
have no zero points in the checkpoint: theirs is the middle code, 2^(bits - 1).

Activation order (GPTQ `desc_act: true`, compressed-tensors actorder group; flotilla/quantization_config.py
`act_order`): the groups are of permuted inputs, and the checkpoint gives each input's group (`g_idx`, loaded as
`weight_g_idx` int32 `[in]`; a merged layer's parts share their input and must give the same one). At load the
inputs are sorted by group (a stable sort: `weight_perm`, int32 `[in]`, in the g_idx's place) and the codes' input
columns reordered with them, so the groups are contiguous again and the kernels run unchanged on the input gathered
by `weight_perm` (`x[..., weight_perm]`, one index_select before the product). A g_idx already in order (`i //
group`) keeps no permutation and gathers nothing. As vLLM's Marlin path does, but with a separate gather.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from flotilla.engine.quantization.method import LinearMethod, in_features, out_features, replace_parameter
from flotilla.kernels.cpu_int_linear import cpu_int_weight
from flotilla.kernels.dispatch import packed_int_linear
from flotilla.kernels.packed_int_linear import PackedInt4, pack_codes, unpack_codes

# Output rows unpacked at a time when the inputs are sorted at load: int32 codes of a whole large layer would take 8x
# its packed bytes of device memory at once.
_SORT_ROWS = 2048


class PackedIntMethod(LinearMethod):
    """Weight-only `bits`-bit integers in groups of `group_size` inputs (None: one group per row)."""

    def __init__(self, bits: int, group_size: int | None, symmetric: bool, act_order: bool = False) -> None:
        if bits not in (4, 8):
            raise ValueError(f"{bits}-bit weights are not supported (4 or 8)")
        self.bits = bits
        self.group_size = group_size
        self.symmetric = symmetric
        self.act_order = act_order  # the checkpoint gives each input's group (module docstring)

    def _group(self, layer: Any) -> int:
        return self.group_size or in_features(layer)

    def create_weights(self, layer: Any) -> None:
        """Packed codes, group scales and (asymmetric schemes) zero points in place of the weight."""
        rows, cols = out_features(layer), in_features(layer)
        group = self._group(layer)
        if cols % group or (cols * self.bits) % 32:
            raise ValueError(f"a layer of {cols} inputs does not split into groups of {group} "
                             f"and {32 // self.bits}-code words")
        dtype = layer.weight.dtype
        del layer.weight  # the packed codes take its place
        replace_parameter(layer, "weight_packed", torch.empty(rows, cols * self.bits // 32, dtype=torch.int32))
        replace_parameter(layer, "weight_scale", torch.empty(rows, cols // group, dtype=dtype))
        middle = torch.full((rows, cols // group), 1 << (self.bits - 1), dtype=torch.uint8)
        if self.symmetric:
            layer.register_buffer("weight_zero_point", middle)
        else:
            replace_parameter(layer, "weight_zero_point", middle)
        layer.register_buffer("weight_perm", None)  # activation order: set by process_weights where it sorts the inputs
        if self.act_order:  # -1: no part has given its g_idx yet
            replace_parameter(layer, "weight_g_idx", torch.full((cols,), -1, dtype=torch.int32),
                              partial(load_g_idx, group))

    def process_weights(self, layer: Any) -> None:
        """Activation order: sort the inputs by group. On the CPU, also keep the weight in the layout of torch's
        int4/int8 kernels when they run it."""
        if self.act_order:
            sort_inputs_by_group(layer, self.bits)
        layer.cpu_int_weight = None
        if layer.weight_packed.device.type == "cpu":
            cols = layer.weight_packed.shape[1] * 32 // self.bits
            layer.cpu_int_weight = cpu_int_weight(layer.weight_packed, layer.weight_scale, layer.weight_zero_point,
                                                  self.bits, cols // layer.weight_scale.shape[1])

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Dequantize-and-multiply (Triton on CUDA for 4 bits, torch's packed kernels on the CPU where
        they apply, the reference elsewhere)."""
        cols = layer.weight_packed.shape[1] * 32 // self.bits
        group = cols // layer.weight_scale.shape[1]
        perm = getattr(layer, "weight_perm", None)
        if perm is not None:  # the codes' inputs are sorted by group: the input's columns likewise
            x = x.index_select(-1, perm)
        return packed_int_linear(x, layer.weight_packed, layer.weight_scale, layer.weight_zero_point,
                                 self.bits, group, bias, symmetric=self.symmetric,
                                 cpu_weight=getattr(layer, "cpu_int_weight", None))


def int4_weight(layer: Any) -> PackedInt4 | None:
    """A linear layer's weight as the int4 kernels' operands when it is a 4-bit packed weight (any checkpoint format:
    they all load into one layout), else None: what the model hands to the fused one-row forms of `kernels/dispatch.py`
    (`int4_gated_gemv_takes`, `int4_qkv_rope_takes`), as it hands an fp8 layer's weight and scales."""
    method = getattr(layer, "quant_method", None)
    if not (isinstance(method, PackedIntMethod) and method.bits == 4):
        return None
    if getattr(layer, "weight_perm", None) is not None:
        return None  # the fused forms do not gather an activation-order layer's input
    group = layer.weight_packed.shape[1] * 8 // layer.weight_scale.shape[1]
    return PackedInt4(layer.weight_packed, layer.weight_scale, None if method.symmetric else layer.weight_zero_point,
                      group)


def load_g_idx(group: int, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
    """The `weight_loader` of an activation-order layer's `weight_g_idx`: each input's group (`[in]`), in which every
    group holds `group` inputs. The parts of a merged layer (q/k/v, gate/up) read one input, so they must give the
    same g_idx (as vLLM requires); the first one loaded is kept and the others compared with it."""
    if loaded.shape != param.shape:  # a row-parallel layer's inputs over tensor-parallel ranks (refused at start-up)
        raise ValueError(f"a g_idx of {loaded.numel()} inputs for a layer of {param.numel()} inputs on this rank")
    expected = torch.arange(loaded.numel(), device=loaded.device) // group
    if not torch.equal(torch.sort(loaded.long()).values, expected):
        raise ValueError(f"g_idx does not put {group} inputs in each of {loaded.numel() // group} groups")
    if bool((param.data < 0).all()):
        param.data.copy_(loaded)
    elif not torch.equal(param.data, loaded.to(param.device)):
        raise ValueError(f"g_idx of part {shard_id!r} differs from that of another part of the merged layer they "
                         "share an input with (activation order must agree across q/k/v and gate/up)")


def sort_inputs_by_group(layer: Any, bits: int) -> None:
    """Replace an activation-order layer's `weight_g_idx` by `weight_perm`, the inputs sorted by group (a stable sort),
    and reorder its codes' input columns with it; a g_idx already in order keeps none (module docstring)."""
    g_idx = layer.weight_g_idx.data
    del layer.weight_g_idx
    perm = torch.argsort(g_idx, stable=True)
    if torch.equal(perm, torch.arange(perm.numel(), device=perm.device)):
        return  # in group order: today's path, no gather
    packed = layer.weight_packed.data
    for start in range(0, packed.shape[0], _SORT_ROWS):
        rows = packed[start:start + _SORT_ROWS]
        rows.copy_(pack_codes(unpack_codes(rows, bits).index_select(1, perm), bits))
    # In the g_idx's place and of its bytes (the fit check counts 4 bytes an input of each such layer).
    layer.register_buffer("weight_perm", perm.to(torch.int32))
