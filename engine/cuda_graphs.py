"""Decode steps replayed from CUDA graphs, over persistent input buffers.

A pure decode step (one new token per sequence) launches ~15 kernels per layer; replaying a captured
graph launches them all at once, so the step costs GPU time, not Python time. One graph is captured
per (batch size, block-table width): batch sizes from a ladder, padded up to the next captured size;
widths from a few context buckets, because the split-KV decode kernel picks its split count and
split length from the table's width, and a short context in a table sized for the longest one would
run on a single split.

Padding rows write nothing and read nothing harmful: slot -1 (the KV write skips it), context
length 0 (the decode kernel attends to nothing and writes zeros), token 0 at position 0. Their
outputs are dropped. Block-table entries inside a real sequence's length are its real block ids;
entries beyond it are never dereferenced.

The same input staging runs on the CPU without capture, so CI exercises the padding and buffer
layout with the reference attention.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from flotilla.engine.forward_context import AttentionMetadata, forward_context

logger = logging.getLogger(__name__)

# vLLM-style ladder: fine steps at small batches, where padding costs most in relative terms.
CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
CONTEXT_BUCKETS = (1024, 4096, 16384, 65536)  # tokens of block table per graph, plus max_model_len


def capture_sizes(max_batch: int) -> list[int]:
    """The ladder up to `max_batch`, which is always included."""
    return sorted({s for s in CAPTURE_SIZES if s < max_batch} | {max_batch})


def table_widths(max_model_len: int, block_size: int) -> list[int]:
    """Block-table widths (in blocks) of the captured graphs."""
    most = -(-max_model_len // block_size)
    return sorted({min(-(-t // block_size), most) for t in CONTEXT_BUCKETS} | {most})


@dataclass
class DecodeBatch:
    """One decode step's host-side inputs, one entry per sequence."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]


class DecodeGraphs:
    """Persistent input buffers, the captured graphs, and their replay."""

    def __init__(self, model: nn.Module, max_batch: int, max_model_len: int, block_size: int,
                 device: torch.device) -> None:
        self.model = model
        self.device = device
        self.block_size = block_size
        self.sizes = capture_sizes(max_batch)
        self.widths = table_widths(max_model_len, block_size)
        self.max_batch = self.sizes[-1]
        b, w = self.max_batch, self.widths[-1]
        # Device buffers every graph reads; int64: input ids, positions, slots; int32: query start
        # locations, context lengths, then the block table (row-major with the graph's width).
        self._i64 = torch.zeros(3, b, dtype=torch.long, device=device)
        self._i32 = torch.zeros(2 * b + 1 + b * w, dtype=torch.int32, device=device)
        pin = device.type == "cuda"
        self._host_i64 = torch.zeros(3, b, dtype=torch.long, pin_memory=pin)
        self._host_i32 = torch.zeros(2 * b + 1 + b * w, dtype=torch.int32, pin_memory=pin)
        self._h64, self._h32 = self._host_i64.numpy(), self._host_i32.numpy()
        self._h32[: b + 1] = np.arange(b + 1)  # every row, padding included, has one query token
        self._h64[2] = -1
        self._i32.copy_(self._host_i32)
        self._i64.copy_(self._host_i64)
        # Marks the last staging copy: the host buffers are rewritten only once it has landed.
        self._copied = torch.cuda.Event() if pin else None
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0

    # --- buffers --------------------------------------------------------------------------------

    def _metadata(self, bs: int, width: int) -> AttentionMetadata:
        b = self.max_batch
        tables = self._i32[2 * b + 1 : 2 * b + 1 + bs * width].view(bs, width)
        return AttentionMetadata(
            slot_mapping=self._i64[2, :bs],
            block_tables=tables,
            query_start_loc=self._i32[: bs + 1],
            seq_lens=self._i32[b + 1 : b + 1 + bs],
            max_query_len=1,
            max_seq_len=width * self.block_size,
        )

    def pick(self, batch: int, max_seq_len: int) -> tuple[int, int] | None:
        """The smallest captured (batch size, width) that holds the step, or None."""
        blocks = -(-max_seq_len // self.block_size)
        bs = next((s for s in self.sizes if s >= batch), None)
        width = next((w for w in self.widths if w >= blocks), None)
        return None if bs is None or width is None else (bs, width)

    def _stage(self, d: DecodeBatch, bs: int, width: int) -> None:
        """Write the step into the pinned host buffers (padding rows included), then copy them over.

        No host sync: the copies are asynchronous; the event wait below returns at once whenever
        the previous step synced on its sampled ids, and guards the host buffers when it did not.
        """
        n, b = len(d.input_ids), self.max_batch
        if self._copied is not None:
            self._copied.synchronize()
        h64, h32 = self._h64, self._h32
        h64[0, :n], h64[0, n:bs] = d.input_ids, 0
        h64[1, :n], h64[1, n:bs] = d.positions, 0
        h64[2, :n], h64[2, n:bs] = d.slots, -1
        h32[b + 1 : b + 1 + n], h32[b + 1 + n : b + 1 + bs] = d.seq_lens, 0
        table = h32[2 * b + 1 : 2 * b + 1 + bs * width].reshape(bs, width)
        for i, blocks in enumerate(d.block_tables):
            table[i, : len(blocks)] = blocks
        used = 2 * b + 1 + n * width
        self._i64.copy_(self._host_i64, non_blocking=True)
        self._i32[:used].copy_(self._host_i32[:used], non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    # --- capture and replay ---------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every (batch size, width) graph, largest first so smaller ones reuse its memory."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        before = torch.cuda.memory_allocated()
        for bs in reversed(self.sizes):
            for width in reversed(self.widths):
                meta = self._metadata(bs, width)
                ids, pos = self._i64[0, :bs], self._i64[1, :bs]
                with forward_context(meta):
                    self.model(ids, pos)  # compile Triton kernels for these shapes outside the capture
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        out = self.model(ids, pos)
                self._graphs[(bs, width)] = (graph, out)
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        logger.info(
            "captured %d CUDA graphs (batch sizes %s x table widths %s tokens) in %.1f s, %.2f GiB",
            len(self._graphs),
            self.sizes,
            [w * self.block_size for w in self.widths],
            self.capture_seconds,
            (torch.cuda.memory_allocated() - before) / 2**30,
        )

    def run(self, d: DecodeBatch) -> torch.Tensor | None:
        """Final hidden states `[n, hidden]` of the step, or None when no graph holds it."""
        n = len(d.input_ids)
        choice = self.pick(n, max(d.seq_lens))
        if choice is None:
            return None
        bs, width = choice
        self._stage(d, bs, width)
        if self._graphs:
            graph, out = self._graphs[(bs, width)]
            graph.replay()
        else:  # CPU (or before capture): the same padded buffers, run eagerly
            with forward_context(self._metadata(bs, width)):
                out = self.model(self._i64[0, :bs], self._i64[1, :bs])
        return out[:n]
