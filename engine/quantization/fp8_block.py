"""Block-scaled fp8 checkpoints: one float32 scale a `block_n x block_k` block of each e4m3 weight.

Two formats store the same layout (`kernels/fp8_block_linear.py`): vLLM's own fp8 checkpoints with
`weight_block_size` (Qwen3-*-FP8, DeepSeek-V3; the scale tensor is named `weight_scale_inv`, though it
multiplies) and compressed-tensors' float weights under strategy `block` (llm-compressor's FP8_BLOCK;
`weight_scale`). The engine keeps the layout as it is, `weight` `[out, in]` fp8 and `weight_scale`
`[ceil(out / block_n), ceil(in / block_k)]`, and runs W8A16 at every row count (`dispatch.fp8_block_linear`):
the activation is not quantized, whatever activation scheme the checkpoint names.

A merged layer (q/k/v, gate/up) and a tensor-parallel shard hold whole blocks only: each shard's rows a
multiple of block_n (the last shard may end in a partial block where it holds its whole checkpoint tensor: at
one rank, as vLLM allows, or a single KV head replicated over the ranks), a row-parallel rank's inputs a
multiple of block_k. Other shapes are refused when the layer is
built, naming its sizes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from flotilla.engine.parallel_state import tp_rank, tp_size
from flotilla.engine.quantization.method import LinearMethod, in_features, out_features, replace_parameter
from flotilla.kernels.dispatch import fp8_block_linear
from flotilla.kernels.fp8_block_linear import block_scale_shape
from flotilla.kernels.fp8_linear import FP8_DTYPE
from flotilla.quantization_config import fp8_block_split_problem

# One rank's part of a checkpoint tensor along one dimension: (shard id, offset in the parameter, size, offset in the
# checkpoint tensor, the checkpoint tensor's whole size).
Shard = tuple[str | int | None, int, int, int, int]


class Fp8BlockMethod(LinearMethod):
    """fp8 weights with `block` (`[block_n, block_k]`) scales from the checkpoint, W8A16."""

    def __init__(self, block: tuple[int, int]) -> None:
        self.block = block

    def create_weights(self, layer: Any) -> None:
        """An fp8 weight and its block scales; ValueError where the layer's shards split a block."""
        rows, cols = _row_shards(layer), _input_shard(layer)
        _check_whole_blocks(layer, rows, cols, self.block)
        replace_parameter(layer, "weight", torch.empty(layer.weight.shape, dtype=FP8_DTYPE))
        shape = block_scale_shape(out_features(layer), in_features(layer), self.block)
        replace_parameter(layer, "weight_scale", torch.ones(shape, dtype=torch.float32),
                          loader=_block_scale_loader(rows, cols, self.block))

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """W8A16 through the block kernel (CUDA) or its reference."""
        return fp8_block_linear(x, layer.weight, layer.weight_scale, self.block, bias)


def convert_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """vLLM's fp8 format names the block scales `weight_scale_inv` (they multiply all the same): `weight_scale`."""
    for name, tensor in tensors:
        yield name.removesuffix("_inv") if name.endswith(".weight_scale_inv") else name, tensor


def _row_shards(layer: Any) -> list[Shard]:
    """The layer's output rows on this rank, one entry a checkpoint tensor it loads (as its `weight_loader` places
    them, engine/layers/linear.py)."""
    from flotilla.engine.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear

    n, rank, rows = tp_size(), tp_rank(), out_features(layer)
    if isinstance(layer, QKVParallelLinear):
        q, kv = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
        full_kv = layer.total_heads["k"] * layer.head_dim
        return [("q", 0, q, rank * q, layer.total_heads["q"] * layer.head_dim),
                ("k", q, kv, layer.kv_shard * kv, full_kv), ("v", q + kv, kv, layer.kv_shard * kv, full_kv)]
    if isinstance(layer, MergedColumnParallelLinear):
        sizes = [s // n for s in layer.out_sizes]
        return [(i, sum(sizes[:i]), size, rank * size, layer.out_sizes[i]) for i, size in enumerate(sizes)]
    if isinstance(layer, ColumnParallelLinear):
        return [(None, 0, rows, rank * rows, rows * n)]
    return [(None, 0, rows, 0, rows)]  # row-parallel: every output row on every rank


def _input_shard(layer: Any) -> Shard:
    """The layer's inputs on this rank (a row-parallel layer's part of each row)."""
    from flotilla.engine.layers.linear import RowParallelLinear

    size = in_features(layer)
    if isinstance(layer, RowParallelLinear):
        return (None, 0, size, tp_rank() * size, size * tp_size())
    return (None, 0, size, 0, size)


def _check_whole_blocks(layer: Any, rows: list[Shard], cols: Shard, block: tuple[int, int]) -> None:
    """ValueError unless every shard of the layer holds whole blocks (module docstring; the rule and its words are
    `fp8_block_split_problem`'s, which the operator's webhook applies to a spec's architecture): a block split between
    shards would need two scales."""
    last = rows[-1]
    problem = fp8_block_split_problem(block, type(layer).__name__, [shard[2] for shard in rows], last[2] == last[4],
                                      cols[2] if cols[2] != cols[4] else None, tp_size())
    if problem:
        raise ValueError(problem)


def _block_scale_loader(rows: list[Shard], cols: Shard, block: tuple[int, int]) -> Callable[..., None]:
    """A loader placing a checkpoint tensor's block scales where its weight rows (and, row-parallel, inputs) go, a
    block for every `block` of them."""
    by_id = {shard[0]: shard for shard in rows}
    _, _, width, col_src, col_full = cols

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        _, dest, size, src, full = by_id[shard_id]
        expected = block_scale_shape(full, col_full, block)
        if tuple(loaded.shape) != expected:
            raise ValueError(f"block scales {tuple(loaded.shape)}, where config.json's [{full}, {col_full}] "
                             f"weight in {list(block)} blocks has {list(expected)}")
        part = loaded.narrow(1, col_src // block[1], math.ceil(width / block[1]))
        count = math.ceil(size / block[0])
        param.data.narrow(0, dest // block[0], count).copy_(part.narrow(0, src // block[0], count))

    return load
