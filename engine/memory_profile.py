"""How much GPU memory the KV cache gets: vLLM's per-instance reading of `--gpu-memory-utilization`.

The flag is a budget for this engine, not a share of what the device has left: `utilization x total` bytes, charged
with what the engine itself adds, namely its weights (torch's allocation growth across loading, the LoRA slots and
a draft model included), the peak a dummy step of the full token budget reaches above them, the growth of memory
outside torch (cuBLAS workspaces, NCCL buffers), the CUDA graphs (captured before the pool is sized as recent vLLM
does, since the real capture comes after the pool, but only the largest of each kind and two more, the rest charged
their outputs: `graph_estimate`) and, on the stage that draws, the penalties' tables (engine/penalty_counts.py).
The KV cache gets the rest, so an engine at 0.9-0.95 does not run out of memory capturing its graphs after
allocating its pool. Memory already held when the engine starts (another engine of this process, another process,
the CUDA context) is reported, never charged: two engines at 0.3 on one GPU each get the pool one alone would. What
is held still limits what the budget may be: the engine refuses to start when less than the budget is free, as vLLM
does, so the pool never asks for memory that is not there.

The arithmetic is pure (`memory_profile`, over three `MemorySnapshot`s), so it is checked with given numbers
on the CPU; `MemorySnapshot.measure` reads a CUDA device.
"""

from __future__ import annotations

from collections.abc import Hashable
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


# The least one more graph is charged beyond its output (vLLM's floor: the driver's own share of a graph).
MIN_GRAPH_BYTES = 1 << 20
# Graphs of a kind sampled already that the profile captures too: what they take beyond their outputs is what one
# more graph costs.
REPEAT_SAMPLES = 2


@dataclass(frozen=True)
class GraphSample:
    """One graph the memory profile captured: its padded token count, what its capture took on the device
    (`graph_bytes`) and the bytes of its output, which it keeps for its replays (the pool never reuses them)."""

    tokens: int
    cost: int
    output: int
    repeat: bool  # a kind (family, table width, LoRA) captured before: its one-off memory is paid already


def graph_sample_indices(kinds: list[Hashable], repeats: int = REPEAT_SAMPLES) -> list[int]:
    """Which graphs of a capture order (the most tokens first; `kinds[i]` the i-th graph's family, table width
    and LoRA) the profile captures: the first of each kind, where the shared pool grows for what that kind's
    largest graph holds in flight (later, smaller ones reuse it), and the first `repeats` graphs of a kind
    already captured, which show what one more graph costs beyond its output."""
    seen: set[Hashable] = set()
    picked, repeated = [], 0
    for i, kind in enumerate(kinds):
        if kind not in seen:
            seen.add(kind)
            picked.append(i)
        elif repeated < repeats:
            repeated += 1
            picked.append(i)
    return picked


def graph_estimate(samples: list[GraphSample], other_tokens: list[int]) -> int:
    """What capturing every graph into one pool takes: what the sampled ones took (`graph_sample_indices`; the
    first of them also sets up the input buffers and the pool's shared memory), plus for each other graph (of
    `other_tokens` tokens) its output, at the largest output a token any sample kept, and the least a repeated
    sample took beyond its output, at least `MIN_GRAPH_BYTES`.

    Not vLLM's `samples[0] + samples[1] x (n - 1)`: the graphs share one pool, where a later, smaller graph
    reuses what an earlier one held in flight, so a second sample that grew the pool (a new table width, a new
    kernel) is a one-off, not the cost of each further graph (on an H100, the 8B shape's 110 server graphs were
    estimated at 12.53 GiB from [618, 112] MiB; their outputs are 0.75 GiB)."""
    if not samples:
        return 0
    per_token = max(-(-s.output // s.tokens) for s in samples)
    rest = min((s.cost - s.output for s in samples if s.repeat), default=0)
    per_graph = max(rest, MIN_GRAPH_BYTES)
    return sum(s.cost for s in samples) + sum(t * per_token + per_graph for t in other_tokens)


def graph_capture_note(estimate: int, captured: int, profile_kept: int, block_bytes: int) -> str:
    """The log line after the real capture: what it took, and what the profile's captures left held (`profile_kept`:
    the kernels they loaded, cuBLAS's workspace for the capture stream; the real capture found it done), against
    what the profile charged for both."""
    held = captured + profile_kept
    took = f"the CUDA graphs took {captured / GIB:.2f} GiB" + \
        (f" (and the profile's captures kept {profile_kept / GIB:.2f} GiB)" if profile_kept else "")
    if held > estimate:
        return (f"{took}, {(held - estimate) / GIB:.2f} GiB more than the {estimate / GIB:.2f} GiB the memory profile "
                "charged (the engine holds that much beyond its --gpu-memory-utilization budget)")
    spare = estimate - held
    return (f"{took} of the {estimate / GIB:.2f} GiB the memory profile charged: {spare / GIB:.2f} GiB "
            f"({spare // max(block_bytes, 1)} KV blocks) charged and not used")


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
