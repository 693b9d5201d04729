"""Which tensor- and pipeline-parallel rank this process is, and the collectives between ranks.

Layers read `tp_rank()`/`tp_size()` to shard their weights and call `all_reduce`/`all_gather` on
their outputs; the model reads the pipeline stage to build and run only its layers. In the engine
process (and at `-tp 1 -pp 1`) this is rank 0 of 1 and every collective is a no-op; a worker
process (`engine/worker.py`) calls `init_model_parallel` once, before it builds the model.

Ranks are laid out stage-major, as vLLM does: global rank = pp_rank * tp_size + tp_rank, so the
ranks of one stage are one tensor-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelRank:
    """One worker's place in the `tp_size x pp_size` grid."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    @property
    def rank(self) -> int:
        """Global rank among the model's workers."""
        return self.pp_rank * self.tp_size + self.tp_rank

    @classmethod
    def of(cls, rank: int, tp_size: int, pp_size: int) -> ParallelRank:
        """The grid position of global `rank`."""
        return cls(tp_rank=rank % tp_size, tp_size=tp_size, pp_rank=rank // tp_size, pp_size=pp_size)


_RANK = ParallelRank()
_TP_GROUP: dist.ProcessGroup | None = None


def init_model_parallel(rank: ParallelRank, store: dist.Store, backend: str) -> None:
    """Join the workers' process group (`backend`: gloo on the CPU, nccl on CUDA) and build the
    tensor-parallel group of this rank's stage. Every worker calls it, with the same store."""
    global _RANK, _TP_GROUP
    world = rank.tp_size * rank.pp_size
    dist.init_process_group(backend, store=dist.PrefixStore("model", store), rank=rank.rank, world_size=world)
    # new_group is collective: every rank creates every stage's group, and keeps its own.
    for stage in range(rank.pp_size):
        ranks = list(range(stage * rank.tp_size, (stage + 1) * rank.tp_size))
        group = dist.new_group(ranks)
        if stage == rank.pp_rank:
            _TP_GROUP = group
    _RANK = rank
    if backend == "nccl":
        # NCCL builds a communicator on its first collective; do that now, not inside a CUDA graph capture.
        dist.all_reduce(torch.zeros(1, device="cuda"), group=_TP_GROUP)


def tp_rank() -> int:
    """This process's tensor-parallel rank."""
    return _RANK.tp_rank


def tp_size() -> int:
    """The tensor-parallel group size."""
    return _RANK.tp_size


def pp_rank() -> int:
    """This process's pipeline stage."""
    return _RANK.pp_rank


def pp_size() -> int:
    """The number of pipeline stages."""
    return _RANK.pp_size


def is_last_stage() -> bool:
    """True on the stage that ends with the LM head (and draws the tokens)."""
    return _RANK.pp_rank == _RANK.pp_size - 1


def stage_layers(num_layers: int) -> range:
    """The decoder layers this pipeline stage holds: an even split, earlier stages taking one fewer."""
    n = _RANK.pp_size
    if num_layers < n:
        raise ValueError(f"{num_layers} layers do not split over {n} pipeline stages")
    return range(num_layers * _RANK.pp_rank // n, num_layers * (_RANK.pp_rank + 1) // n)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum a row-parallel layer's partial outputs over the tensor-parallel group (in place)."""
    if _RANK.tp_size == 1:
        return x
    dist.all_reduce(x, group=_TP_GROUP)
    return x


def max_over_tp(x: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum of `x` over the tensor-parallel group (in place)."""
    if _RANK.tp_size == 1:
        return x
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=_TP_GROUP)
    return x


def all_gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every tensor-parallel rank's `x` along the last dimension, in rank order."""
    if _RANK.tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_RANK.tp_size)]
    dist.all_gather(parts, x.contiguous(), group=_TP_GROUP)
    return torch.cat(parts, dim=-1)


def min_over_ranks(value: int) -> int:
    """The smallest `value` any worker holds (e.g. KV blocks: the pool is what the tightest rank fits)."""
    if _RANK.tp_size * _RANK.pp_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.long)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def send_to_next_stage(tensors: list[torch.Tensor]) -> None:
    """Pass a stage's outputs (hidden states, residual) to the same tensor-parallel rank of the next stage."""
    dst = _RANK.rank + _RANK.tp_size
    for t in tensors:
        dist.send(t.contiguous(), dst=dst)


def recv_from_prev_stage(shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Receive what `send_to_next_stage` sent from the previous stage."""
    src = _RANK.rank - _RANK.tp_size
    out = []
    for shape in shapes:
        t = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(t, src=src)
        out.append(t)
    return out
