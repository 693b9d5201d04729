"""Linear layers shaped for tensor parallelism.

Column-parallel layers split their output features over ranks, row-parallel ones their input
features (and sum the partial results). Merged layers (QKV, gate/up) load several checkpoint tensors
into one weight, each into its own slice, through the layer's `weight_loader(param, tensor, shard_id)`
(the model loader calls it for every parameter the layer owns). Quantized weights will be a
quant method attached to the layer (`quant_method`, see `engine/quantization/`), not a change to
model code.
"""

from __future__ import annotations

import torch
from torch import nn

from flotilla.engine.parallel_state import all_reduce, max_over_tp, tp_rank, tp_size
from flotilla.engine.quantization.method import LinearMethod
from flotilla.kernels.dispatch import linear


class _Linear(nn.Module):
    """A linear layer whose weight is `[out, in]` already sharded for this rank."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        # Inputs of at most this many rows may take the Triton GEMV on CUDA (kernels/dispatch.py);
        # cuBLAS until the model runner applies --triton-gemv-max-rows (`use_triton_gemv`).
        self.gemv_max_rows = 0
        # This rank's sizes and the model dtype, kept apart from the weight: a quant method may replace the
        # weight by packed codes (engine/quantization/), and LoRA still needs the layer's shape and dtype.
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.params_dtype = self.weight.dtype  # the loader builds the model under its dtype (model_loader.py)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.quant_method: LinearMethod | None = None  # set before loading by engine/quantization

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Copy a checkpoint tensor into the parameter (overridden by sharded layers)."""
        param.data.copy_(loaded)

    def check_full_size(self, loaded: torch.Tensor, dim: int, full: int) -> None:
        """A checkpoint tensor must have the parameter's whole size along the dimension the ranks split: a larger
        one would load its first rows without a word (config.json and the checkpoint disagree). Quantized
        parameters keep output rows first (engine/quantization/), so rows are checked as a dense weight's; a
        row-parallel caller passes its parameter's own width (packed codes, groups). A scale broadcast from one
        value (`scale_loader`, stride 0) fits any size."""
        if loaded.shape[dim] != full and not (loaded.dim() and loaded.stride(dim) == 0):
            raise ValueError(f"size {loaded.shape[dim]} along dimension {dim}, where config.json gives {full}")

    def scale_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Load per-output-channel scales `[rows, 1]` (or one `[1, 1]` for the whole tensor): split
        over ranks like the weight's rows."""
        if loaded.shape[0] == 1:  # every row alike; wide enough for any rank's shard of the layer
            loaded = loaded.expand(int(param.shape[0]) * tp_size(), 1)
        self.weight_loader(param, loaded, shard_id)

    def row_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """The absolute maximum of each output row of the whole weight, from this rank's part."""
        return amax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T + b`."""
        return self.matmul(x, self.bias)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`x @ W.T (+ bias)` through the quant method when the layer has one."""
        if self.quant_method is not None:
            return self.quant_method.apply(self, x, bias)
        return linear(x, self.weight, bias, self.gemv_max_rows)


class ColumnParallelLinear(_Linear):
    """Output features split over tensor-parallel ranks; no communication."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        if out_features % tp_size():
            raise ValueError(f"output size {out_features} is not divisible by tensor parallel size {tp_size()}")
        super().__init__(in_features, out_features // tp_size(), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Take this rank's rows of the full checkpoint tensor."""
        size = param.shape[0]
        self.check_full_size(loaded, 0, size * tp_size())
        param.data.copy_(loaded.narrow(0, tp_rank() * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input stored as one weight (e.g. gate and up)."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False) -> None:
        self.out_sizes = out_sizes
        super().__init__(in_features, sum(out_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Put checkpoint tensor number `shard_id` into its slice."""
        assert isinstance(shard_id, int)
        n = tp_size()
        offset = sum(self.out_sizes[:shard_id]) // n
        size = self.out_sizes[shard_id] // n
        self.check_full_size(loaded, 0, self.out_sizes[shard_id])
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, tp_rank() * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """The query, key and value projections as one weight, split by heads over ranks.

    With fewer KV heads than ranks each KV head is replicated: rank r holds KV head
    `r // (tp_size / num_kv_heads)`, so the ranks sharing it hold the query heads that read it.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool) -> None:
        n = tp_size()
        if num_heads % n or (num_kv_heads % n if num_kv_heads >= n else n % num_kv_heads):
            raise ValueError(f"{num_heads} query / {num_kv_heads} KV heads do not split over {n} ranks")
        self.head_dim = head_dim
        self.num_heads = num_heads // n
        self.num_kv_heads = max(num_kv_heads // n, 1)
        self.kv_shard = tp_rank() if num_kv_heads >= n else tp_rank() // (n // num_kv_heads)
        self.total_heads = {"q": num_heads, "k": num_kv_heads, "v": num_kv_heads}  # in the checkpoint
        # The per-rank size is computed here, not split by ColumnParallelLinear (KV heads may be replicated).
        _Linear.__init__(self, hidden_size, (self.num_heads + 2 * self.num_kv_heads) * head_dim, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Put this rank's heads of the q, k or v checkpoint tensor into its slice."""
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[str(shard_id)]
        shard = tp_rank() if shard_id == "q" else self.kv_shard
        self.check_full_size(loaded, 0, self.total_heads[str(shard_id)] * self.head_dim)
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, shard * size, size))


class RowParallelLinear(_Linear):
    """Input features split over ranks; partial outputs summed across the group."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        if in_features % tp_size():
            raise ValueError(f"input size {in_features} is not divisible by tensor parallel size {tp_size()}")
        super().__init__(in_features // tp_size(), out_features, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Take this rank's columns (the bias is whole, added once after the reduction)."""
        if param.dim() == 1:
            param.data.copy_(loaded)
            return
        size = param.shape[1]
        self.check_full_size(loaded, 1, size * tp_size())
        param.data.copy_(loaded.narrow(1, tp_rank() * size, size))

    def scale_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Output channels are not split here: every rank keeps the scales whole."""
        param.data.copy_(loaded.expand_as(param))

    def row_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """Each rank holds some columns of every row: the row's maximum is the largest over ranks."""
        return max_over_tp(amax)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Partial product on this rank, summed over ranks, then the bias."""
        y = all_reduce(self.matmul(x))
        return y + self.bias if self.bias is not None else y


def use_triton_gemv(model: nn.Module, max_rows: int) -> None:
    """Let every linear layer of `model` take the Triton GEMV for inputs of at most `max_rows` rows."""
    for module in model.modules():
        if isinstance(module, _Linear):
            module.gemv_max_rows = max_rows


def quantizable_layers(model: nn.Module) -> list[_Linear]:
    """The linear layers a quant method applies to (the LM head and embeddings are not among them)."""
    return [m for m in model.modules() if isinstance(m, _Linear)]
