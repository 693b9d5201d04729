"""How much GPU memory the KV cache gets: vLLM's per-instance reading of `--gpu-memory-utilization`.

The flag is a budget for this engine, not a share of what the device has left: `utilization x total` bytes,
charged with what the engine itself adds, namely its weights (torch's allocation growth across loading, the
LoRA slots and a draft model included), the peak a dummy step of the full token budget reaches above them, the
growth of memory outside torch (cuBLAS workspaces, NCCL buffers), the CUDA graphs (the two largest captured before
the pool is sized, the rest estimated from them, as recent vLLM does: the real capture comes after the pool) and,
on the stage that draws, the penalties' tables (engine/penalty_counts.py). The KV cache gets the rest, so an engine
at 0.9-0.95 does not run out of memory capturing its graphs after allocating its pool. Memory already held when
the engine starts (another engine of this process, another process, the CUDA context) is reported, never charged:
two engines at 0.3 on one GPU each get the pool one alone would. What is held still limits what the budget may
be: the engine refuses to start when less than the budget is free, as vLLM does, so the pool never asks for memory
that is not there.

The arithmetic is pure (`memory_profile`, over three `MemorySnapshot`s), so it is checked with given numbers
on the CPU; `MemorySnapshot.measure` reads a CUDA device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GIB = 2**30


@dataclass(frozen=True)
class MemorySnapshot:
    """A device's memory at one moment: as the driver counts it and as torch's caching allocator does."""

    free: int
    total: int
    torch_allocated: int  # bytes in live tensors
    torch_reserved: int  # bytes the caching allocator holds from the driver (live tensors and its cache)

    @property
    def used(self) -> int:
        """Bytes in use on the device, by anyone."""
        return self.total - self.free

    @property
    def non_torch(self) -> int:
        """Bytes in use that torch's allocator does not hold (the CUDA context, libraries, other processes)."""
        return max(self.used - self.torch_reserved, 0)

    @classmethod
    def measure(cls, device: torch.device) -> MemorySnapshot:
        """The snapshot of a CUDA device now (call `torch.cuda.empty_cache()` first to count freed tensors as free)."""
        free, total = torch.cuda.mem_get_info(device)
        return cls(free, total, torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))


@dataclass(frozen=True)
class MemoryProfile:
    """This engine's budget and what it charged against it, in bytes; `kv_cache` is the rest."""

    requested: int  # utilization x the device's total
    held_before: int  # in use on the device when the engine started: reported, not charged
    weights: int
    activations: int  # the dummy step's peak above the allocations it started from
    non_torch: int  # growth of memory outside torch since the engine started
    penalty_tables: int
    cuda_graphs: int = 0  # what capturing the CUDA graphs takes (`graph_estimate`; 0: eager)

    @property
    def kv_cache(self) -> int:
        """What the budget leaves for the KV cache (negative: it does not fit)."""
        charged = self.weights + self.activations + self.non_torch + self.penalty_tables + self.cuda_graphs
        return self.requested - charged

    def describe(self, utilization: float, total: int) -> str:
        """The start-up log line's figures."""
        return (
            f"GPU {total / GIB:.2f} GiB x {utilization:.2f} = {self.requested / GIB:.2f} GiB for this engine "
            f"({self.held_before / GIB:.2f} GiB was in use before it started, not charged); weights "
            f"{self.weights / GIB:.2f} GiB, activation peak {self.activations / GIB:.2f} GiB, outside torch "
            f"{self.non_torch / GIB:.2f} GiB, penalty tables {self.penalty_tables / GIB:.2f} GiB, CUDA graphs "
            f"{self.cuda_graphs / GIB:.2f} GiB -> KV cache "
            f"{max(self.kv_cache, 0) / GIB:.2f} GiB"
        )


def requested_bytes(start: MemorySnapshot, utilization: float) -> int:
    """The engine's budget, `utilization` of the device; raises when less than that is free at start."""
    requested = int(start.total * utilization)
    if start.free < requested:
        raise ValueError(
            f"free memory on the device at start-up ({start.free / GIB:.2f} of {start.total / GIB:.2f} GiB) is less "
            f"than --gpu-memory-utilization {utilization} asks for ({requested / GIB:.2f} GiB); lower "
            "--gpu-memory-utilization or free the memory other engines or processes hold on the device"
        )
    return requested


# vLLM's floor for one more graph's cost (the driver's own share of it).
MIN_GRAPH_BYTES = 1 << 20


def graph_estimate(samples: list[int], num_graphs: int) -> int:
    """What capturing `num_graphs` graphs into one pool takes, from what the first two (the largest: captured most
    tokens first) took, as vLLM's `profile_cudagraph_memory` estimates it: the first's cost (the pool's shared
    memory and the input buffers) plus the second's, at least `MIN_GRAPH_BYTES`, for each of the others (each keeps
    its output and its driver memory; a smaller graph costs no more than the second)."""
    if num_graphs == 0:
        return 0
    per_graph = max(samples[1] if len(samples) > 1 else 0, MIN_GRAPH_BYTES)
    return samples[0] + per_graph * (num_graphs - 1)


def graph_bytes(before: MemorySnapshot, after: MemorySnapshot) -> int:
    """What a capture of the CUDA graphs took: the device's free memory before it less after it (the allocator's
    cache emptied both times), so the graphs' private memory pool, their kept outputs and input buffers, and the
    driver's own memory for the graphs and the kernels they load all count."""
    return max(before.free - after.free, 0)


def memory_profile(start: MemorySnapshot, loaded: MemorySnapshot, end: MemorySnapshot, peak: int,
                   utilization: float, penalty_tables: int, cuda_graphs: int = 0) -> MemoryProfile:
    """The accounting of one engine's start-up: `start` before it loaded anything, `loaded` as the dummy step
    began, `end` after it (its tensors freed and the allocator's cache emptied), `peak` the allocator's peak
    during the step, `cuda_graphs` what capturing the graphs takes (`graph_estimate`)."""
    return MemoryProfile(
        requested=requested_bytes(start, utilization),
        held_before=start.used,
        weights=max(loaded.torch_allocated - start.torch_allocated, 0),
        activations=max(peak - loaded.torch_allocated, 0),
        non_torch=max(end.non_torch - start.non_torch, 0),
        penalty_tables=penalty_tables,
        cuda_graphs=cuda_graphs,
    )
