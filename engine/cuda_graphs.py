"""Steps replayed from CUDA graphs, over persistent input buffers.

An eager step launches ~15 kernels a layer from Python (~680 launches for an 8B Llama), so a step of
few tokens costs host time, not GPU time: on an H200 a 20-token extend after a prefix-cache hit took
~30 ms of Python for ~5 ms of GPU work. Replaying a captured graph launches them all at once.

Two families of graphs, each captured per (padded token count, block-table width):

- decode: one new token per sequence. Batch sizes come from a ladder and steps are padded up to the
  next captured size. Attention is the split-KV decode kernel, which picks its split count from the
  table's width; a short context in a table sized for the longest one would run on a single split,
  hence a few widths.
- mixed: steps that hold a prefill or an extend (a prompt after a prefix-cache hit, short prompts
  beside decodes), by default up to `MIXED_SIZES[-1]` tokens. Sequence slots are min(tokens,
  max_num_seqs) and attention is the prefill kernel, which derives its tiles on the device (once a
  step: the first layer leaves the tile map in the step's metadata for the others); with
  FLOTILLA_MIXED_DECODE_SPLIT (default on), the prefill kernel for the prompts and the decode kernel for the sequences
  of one new token, told apart on the device too (`kernels/mixed_attention.py`). Sizes up to
  `ONE_SEQ_MAX_TOKENS` have a second graph of one sequence slot, for a lone prompt or extend. Steps of
  hundreds of decode rows beside a few short prompts (requests that arrive one by one) are not
  compute-bound enough to hide an eager step's ~700 launches; `--max-cudagraph-capture-size` (vLLM's
  flag) extends the mixed ladder (`MIXED_LADDER`, padding at most 12.5 %) to cover them. Steps above
  the largest size run eagerly.

Padding writes nothing and reads nothing harmful. Padding token rows are token 0 at position 0 with
slot -1 (the KV write skips it). In a decode graph each padding row is a sequence of one query token
and context length 0 (the decode kernel attends to nothing). In a mixed graph padding sequences have
no query tokens and context 0, and padding token rows belong to no sequence, so the prefill kernel
never touches them. Padding outputs are dropped. Block-table entries inside a real sequence's length
are its real block ids; entries beyond it are never dereferenced.

With `--enable-lora`, every shape is captured twice: without LoRA (the base model's steps pay
nothing) and with it. A LoRA graph reads each token's adapter slot from a persistent buffer staged
like the inputs (-1 for base-model and padding tokens), and the adapters' matrices from the layers'
stacked slot tensors, which loading an adapter overwrites in place: one graph per shape serves any
mix of resident adapters.

A step no graph holds runs eagerly, and the first step of each such kind says why in the log.

The same staging runs on the CPU without capture, so CI checks the padding and buffer layout against
the eager path with the reference attention.
"""

from __future__ import annotations

import bisect
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from flotilla.engine.forward_context import AttentionMetadata, forward_context
from flotilla.engine.input_batch import FlatBatch
from flotilla.engine.lora.slots import lora_slots
from flotilla.kernels.switches import env_flag

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

logger = logging.getLogger(__name__)

# vLLM-style ladder: fine steps at small batches, where padding costs most in relative terms.
CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
# Token counts of mixed (prefill/extend) graphs by default.
MIXED_SIZES = (16, 32, 64, 128, 256, 512)
# Above 512 tokens (--max-cudagraph-capture-size): padding a step up to the next size costs GPU time in
# every GEMM, so the sizes go in eighths of each power of two (576, 640, ..., 1024, 1152, ...): a step is
# padded by at most 12.5 %.
MIXED_LADDER = MIXED_SIZES + tuple(o + i * o // 8 for o in (512, 1024, 2048, 4096, 8192) for i in range(1, 9))
CONTEXT_BUCKETS = (1024, 4096, 16384, 65536)  # tokens of block table per graph, plus max_model_len
# Mixed graphs of up to this many tokens are captured a second time with one sequence slot, for a lone
# request's prompt or extend (a prefix-cache hit's new tokens: its time to first token). With
# min(tokens, max_num_seqs) slots, the prefill kernel's grid holds a query tile for every slot, and at
# these sizes it also splits each tile's keys (few tiles leave the SMs idle), so a 20-token extend in
# the 32-token graph launched 33 x 8 x 16 programs to run 8 x 16 (Llama-3.1-8B on an H200).
# FLOTILLA_ONE_SEQ_GRAPHS=0 captures none (the before of the A/B).
ONE_SEQ_MAX_TOKENS = 128


def capture_sizes(max_batch: int, max_capture: int | None = None) -> list[int]:
    """The decode ladder up to `max_batch` rows (always included), or up to `max_capture` below that."""
    top = max_batch if max_capture is None else min(max_batch, max_capture)
    return sorted({s for s in CAPTURE_SIZES if s < top} | {top})


def mixed_sizes(max_tokens: int, max_capture: int | None = None) -> list[int]:
    """Token counts of the mixed graphs, within a step's token budget: up to `MIXED_SIZES[-1]`, or up to
    `max_capture` (--max-cudagraph-capture-size) on `MIXED_LADDER`."""
    top = min(max_tokens, MIXED_SIZES[-1] if max_capture is None else max_capture)
    ladder = MIXED_SIZES if max_capture is None else MIXED_LADDER
    return sorted({s for s in ladder if s < top} | {top})


def table_widths(max_model_len: int, block_size: int) -> list[int]:
    """Block-table widths (in blocks) of the captured graphs."""
    most = -(-max_model_len // block_size)
    return sorted({min(-(-t // block_size), most) for t in CONTEXT_BUCKETS} | {most})


@dataclass(frozen=True)
class GraphKey:
    """One captured graph's shape: padded token rows, padded sequence slots, block-table width, and
    whether it computes the LoRA deltas."""

    decode: bool
    tokens: int
    seqs: int
    width: int
    lora: bool = False

    @property
    def kind(self) -> tuple[str, int, bool]:
        """The graph's family (decode, mixed, one-sequence mixed), table width and LoRA: graphs of one kind run the
        same kernels over buffers that shrink with the token count (the memory profile samples each kind's largest)."""
        family = "decode" if self.decode else "one-sequence mixed" if self.seqs == 1 else "mixed"
        return family, self.width, self.lora


class StepGraphs:
    """Persistent input buffers, the captured graphs, and their replay."""

    def __init__(
        self,
        model: nn.Module,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        block_size: int,
        device: torch.device,
        lora: bool = False,
        max_decode_rows: int | None = None,
        max_capture_size: int | None = None,
        one_seq_graphs: bool | None = None,
        sizes: list[int] | None = None,
    ) -> None:
        self.model = model
        self.lora = lora
        if one_seq_graphs is None:
            one_seq_graphs = env_flag("FLOTILLA_ONE_SEQ_GRAPHS", True)
        self.device = device
        self.block_size = block_size
        # Speculative decoding's verification steps are decode steps of up to k + 1 rows a request.
        rows = max(max_num_seqs, max_decode_rows or 0)
        if sizes:  # vLLM's cudagraph_capture_sizes: exactly these (its config check keeps one within max_num_seqs)
            self.decode_sizes = [s for s in sorted(sizes) if s <= rows]
            self.mixed_sizes = [s for s in sorted(sizes) if s <= max_num_batched_tokens]
        else:
            self.decode_sizes = capture_sizes(rows, max_capture_size)
            self.mixed_sizes = mixed_sizes(max_num_batched_tokens, max_capture_size)
        self.widths = table_widths(max_model_len, block_size)
        self.max_seqs = self.decode_sizes[-1]
        # Mixed sizes that also have a one-sequence graph (`ONE_SEQ_MAX_TOKENS`).
        one_seq = [t for t in self.mixed_sizes if t <= ONE_SEQ_MAX_TOKENS and min(t, self.max_seqs) > 1]
        self.one_seq_sizes = frozenset(one_seq if one_seq_graphs else ())
        # Lookups for `pick`: the decode size that holds n rows, the width that holds n blocks.
        self._decode_size_for = [next(b for b in self.decode_sizes if b >= n) for n in range(self.max_seqs + 1)]
        self._width_for = [next(w for w in self.widths if w >= n) for n in range(self.widths[-1] + 1)]
        self._keys: dict[tuple[bool, int, int, int, bool], GraphKey] = {}
        t, s, w = max(self.decode_sizes[-1], self.mixed_sizes[-1]), self.max_seqs, self.widths[-1]
        # Offsets in the int32 part: query start locations, context lengths, then the block table
        # (row-major with the graph's width). The int64 part holds input ids, positions, KV slots
        # and each token's LoRA adapter slot. Both parts live in one buffer (int64 first), so staging a
        # step is one contiguous host-to-device copy (all int64 rows, 4 x 8 x T bytes, then the int32 part up
        # to the step's last table row): on a speculating step the staging sits between two device
        # steps, and each copy call costs host time there. The table area only ever holds block ids
        # (padding sequences' rows are stale ones, which the CPU's reference attention may read).
        self._lens, self._table = s + 1, 2 * s + 1
        num_ints = 2 * s + 1 + s * w
        pin = device.type == "cuda"
        self._buf = torch.zeros(4 * t + -(-num_ints // 2), dtype=torch.long, device=device)
        self._host_buf = torch.zeros(self._buf.shape, dtype=torch.long, pin_memory=pin)
        self._i64, self._i32 = _split(self._buf, t, num_ints)
        self._host_i64, self._host_i32 = _split(self._host_buf, t, num_ints)
        self._h64, self._h32 = self._host_i64.numpy(), self._host_i32.numpy()
        self._decode_starts = np.arange(s + 1, dtype=np.int32)  # query start locations, one token a sequence
        # Per sequence row: (the block table list, ids written, the row's offset) of the last write there. A table
        # list only ever grows (the block manager replaces the list on any other change), so the same list at the
        # same offset needs only its new ids: a decode step's staging stays O(new blocks), not O(blocks so far).
        self._rows: list[tuple[list[int] | None, int, int]] = [(None, 0, -1)] * s
        self._rows_width = 0  # the table width they were written at (a wider row overwrites others' old places)
        # Rows from this one on hold nothing written (steps had fewer rows since): a step's search for the rows its
        # tables held last step looks at these only (a lone request's step: one row, not `max_num_seqs`).
        self._rows_end = 0
        self.table_ids_staged = 0  # block ids written into the table area so far (what the above saves shows here)
        # Rows whose table moved up with the rows before it (a request before them finished): copied in the host
        # buffer by the run, not written again from their lists (`_move_rows`).
        self.table_rows_moved = 0
        # The buffers' slices a step reads or copies, made once per shape (slicing costs microseconds).
        self._copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._input_views: dict[GraphKey, tuple[torch.Tensor, torch.Tensor]] = {}
        # Marks the last staging copy: the host buffers are rewritten only once it has landed.
        self._copied = torch.cuda.Event() if pin else None
        self._graphs: dict[GraphKey, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: _POOL_HANDLE | None = None  # the memory pool every graph of these captures into
        self.capture_seconds = 0.0
        self._eager_logged: set[str] = set()  # kinds of eager steps already explained in the log
        self.last_tokens = 0  # padded token count of the last step `run` held (the step trace reads it)

    # --- shapes ---------------------------------------------------------------------------------

    def keys(self) -> list[GraphKey]:
        """Every graph to capture, the most tokens first (smaller graphs reuse the largest's memory)."""
        variants = (False, True) if self.lora else (False,)
        decode = [GraphKey(True, b, b, w, v) for b in self.decode_sizes for w in self.widths for v in variants]
        mixed = [GraphKey(False, t, min(t, self.max_seqs), w, v)
                 for t in self.mixed_sizes for w in self.widths for v in variants]
        mixed += [GraphKey(False, t, 1, w, v) for t in self.one_seq_sizes for w in self.widths for v in variants]
        return sorted(decode + mixed, key=lambda k: (k.tokens, k.width, k.seqs, k.lora), reverse=True)

    def pick(self, flat: FlatBatch, lora: bool = False) -> GraphKey | None:
        """The smallest graph that holds the step (with the LoRA deltas when `lora`), or None (it runs
        eagerly; `eager_reason` says why)."""
        if lora and not self.lora:
            return None
        blocks = -(-max(flat.seq_lens) // self.block_size)
        width = self._width_for[blocks] if blocks < len(self._width_for) else None
        if width is None:
            return None
        n = flat.num_tokens
        if flat.max_query_len == 1:
            size = self._decode_size_for[n] if n < len(self._decode_size_for) else None
            return None if size is None else self._key(True, size, size, width, lora)
        i = bisect.bisect_left(self.mixed_sizes, n)
        if i == len(self.mixed_sizes):
            return None
        size = self.mixed_sizes[i]
        if flat.num_seqs > min(size, self.max_seqs):
            return None
        seqs = 1 if flat.num_seqs == 1 and size in self.one_seq_sizes else min(size, self.max_seqs)
        return self._key(False, size, seqs, width, lora)

    def _key(self, decode: bool, tokens: int, seqs: int, width: int, lora: bool) -> GraphKey:
        """The one GraphKey of a shape (a frozen dataclass costs microseconds to build; decode steps
        pick one every step, a speculating one on its critical path)."""
        shape = (decode, tokens, seqs, width, lora)
        key = self._keys.get(shape)
        if key is None:
            key = self._keys[shape] = GraphKey(*shape)
        return key

    def eager_reason(self, flat: FlatBatch, lora: bool = False) -> str:
        """Why `pick` found no graph for the step."""
        if lora and not self.lora:
            return "LoRA graphs were not captured"
        longest = max(flat.seq_lens) if flat.seq_lens else 0
        if -(-longest // self.block_size) > self.widths[-1]:
            return f"a sequence of {longest} tokens is longer than the widest graph's block table"
        if flat.max_query_len == 1:
            return f"{flat.num_tokens} decode rows, above the largest decode graph ({self.decode_sizes[-1]})"
        if flat.num_tokens > self.mixed_sizes[-1]:
            return f"a prefill/extend step of {flat.num_tokens} tokens, above the largest mixed graph " \
                   f"({self.mixed_sizes[-1]}; --max-cudagraph-capture-size captures more)"
        return f"{flat.num_seqs} sequences, more than the mixed graph's sequence slots"

    def log_eager(self, flat: FlatBatch, lora: bool = False) -> None:
        """Say why a step runs eagerly: once at INFO per kind of reason, then at DEBUG."""
        reason = self.eager_reason(flat, lora)
        kind = f"{lora}:{re.sub(r'[0-9]+', 'N', reason)}"  # one INFO line per kind, whatever the sizes
        level = logging.DEBUG if kind in self._eager_logged else logging.INFO
        self._eager_logged.add(kind)
        logger.log(level, "%s step runs eagerly: %s", "a LoRA" if lora else "a", reason)

    def _metadata(self, key: GraphKey) -> AttentionMetadata:
        s, table = key.seqs, self._table
        return AttentionMetadata(
            slot_mapping=self._i64[2, : key.tokens],
            block_tables=self._i32[table : table + s * key.width].view(s, key.width),
            query_start_loc=self._i32[: s + 1],
            seq_lens=self._i32[self._lens : self._lens + s],
            max_query_len=1 if key.decode else key.tokens,
            max_seq_len=key.width * self.block_size,
        )

    # --- staging --------------------------------------------------------------------------------

    def _stage(self, flat: FlatBatch, key: GraphKey, token_slots: list[int] | None = None) -> None:
        """Write the step into the pinned host buffers (padding included), then copy them over.
        `token_slots`: each token's LoRA adapter slot (-1: base model), for a LoRA graph.

        No host sync: the copies are asynchronous; the event wait returns at once whenever the
        previous step synced on its sampled ids, and guards the host buffers when it did not.
        """
        if self._copied is not None:
            self._copied.synchronize()
        n, s, t = flat.num_tokens, flat.num_seqs, key.tokens
        h64, h32, lens = self._h64, self._h32, self._lens
        # Padding rows appended to the lists: one numpy write, not two. (On the way to a lone request's first
        # token the staging runs cold, and each numpy operation of another kind costs microseconds then.)
        pad = t - n
        if pad:
            h64[:3, :t] = flat.input_ids + [0] * pad, flat.positions + [0] * pad, flat.slots + [-1] * pad
        else:
            h64[:3, :n] = flat.input_ids, flat.positions, flat.slots
        if key.lora:
            h64[3, :n] = -1 if token_slots is None else token_slots
            h64[3, n:t] = -1  # padding rows read no adapter
        h32[: s + 1] = flat.query_start_loc
        h32[lens : lens + s] = flat.seq_lens
        if s < key.seqs:
            # Padding sequences: one query token each in a decode graph, none in a mixed one.
            h32[s + 1 : key.seqs + 1] = self._decode_starts[s + 1 : key.seqs + 1] if key.decode else n
            h32[lens + s : lens + key.seqs] = 0
        first, width, written = self._table, key.width, self._rows
        if width != self._rows_width:  # rows of another width overlap the old ones: nothing written is known
            written[:] = [(None, 0, -1)] * len(written)
            self._rows_width, self._rows_end = width, 0
        rows_end = self._rows_end = max(self._rows_end, s)
        tables, i = flat.block_tables, 0
        moves: dict[int, int] | None = None  # id(table list) -> its row last step, made at the first row that moved
        while i < s:  # a request's verification rows share its table (one list): written at once
            blocks, j = tables[i], i + 1
            while j < s and tables[j] is blocks:
                j += 1
            row, n = first + i * width, len(blocks)
            if j == i + 1:  # a row of its own: a flat slice (no reshaped view; see the padding above)
                table, done, at = written[i]
                if table is blocks and at == row and done <= n:  # written here before: only its new ids
                    if done < n:
                        h32[row + done : row + n] = blocks[done:]
                        self.table_ids_staged += n - done
                    written[i] = (blocks, n, row)
                    i = j
                    continue
                if moves is None:
                    moves = {id(t): k for k, (t, _, _) in enumerate(written[:rows_end]) if t is not None}
                moved = self._move_rows(tables, i, moves.get(id(blocks), -1))
                if moved:
                    i += moved
                    continue
                h32[row : row + n] = blocks
                self.table_ids_staged += n
                written[i] = (blocks, n, row)
            else:
                h32[row : row + (j - i) * width].reshape(j - i, width)[:, :n] = blocks
                written[i:j] = [(None, 0, -1)] * (j - i)
                self.table_ids_staged += (j - i) * n
            i = j
        dst, src = self._copy_views(self._table + s * key.width)
        dst.copy_(src, non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def _move_rows(self, tables: list[list[int]], i: int, k: int) -> int:
        """Rows from `i` on whose table lists sat alone at rows from `k` (> i) last step (requests before them
        finished; the rows after moved up): the run's old rows copied to their new place in the host buffer at once
        (a memmove of bytes the step copies to the device anyway, not a Python list per row), then each row's new
        ids. The rows keep the scheduler's order, as every other part of the step. Returns how many rows moved
        (0: the table was not at a later row last step)."""
        written, s = self._rows, len(tables)
        if k <= i or written[k][0] is not tables[i]:  # not written last step, or at a row rewritten already
            return 0
        m = 1  # the run: each row's list alone at the next row last step
        while (i + m < s and k + m < len(written) and written[k + m][0] is tables[i + m]
               and (i + m + 1 == s or tables[i + m + 1] is not tables[i + m])):
            m += 1
        first, width, h32 = self._table, self._rows_width, self._h32
        h32[first + i * width : first + (i + m) * width] = h32[first + k * width : first + (k + m) * width]
        done = [written[k + r][1] for r in range(m)]  # read before the rows from i are overwritten
        for r in range(m):
            blocks, row = tables[i + r], first + (i + r) * width
            n = len(blocks)
            if done[r] < n:
                h32[row + done[r] : row + n] = blocks[done[r] :]
                self.table_ids_staged += n - done[r]
            written[i + r] = (blocks, n, row)
        self.table_rows_moved += m
        return m

    def _copy_views(self, num_ints: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(device, pinned host) spans of one staging copy: the int64 rows and the first `num_ints`
        of the int32 part."""
        pair = self._copies.get(num_ints)
        if pair is None:
            used = self._i64.numel() + -(-num_ints // 2)
            pair = self._copies[num_ints] = self._buf[:used], self._host_buf[:used]
        return pair

    def _stage_empty(self, key: GraphKey) -> None:
        """A step with no real tokens, for warm-up and capture: every row and sequence is padding."""
        self._stage(FlatBatch(), key)

    # --- capture and replay ---------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self, keys: list[GraphKey] | None = None) -> None:
        """Capture every graph (or `keys`, some of `keys()` in its order: the memory profile's samples), sharing one
        memory pool across calls."""
        start = time.perf_counter()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        pool = self._pool
        before = torch.cuda.memory_allocated()
        log = logger.info if keys is None else logger.debug  # the memory profile's samples: not worth a line each
        keys = self.keys() if keys is None else keys
        log("capturing %d CUDA graphs", len(keys))
        for i, key in enumerate(keys):
            logger.debug("graph %d/%d %s at %.1f s", i + 1, len(keys), key, time.perf_counter() - start)
            ids, pos = self._i64[0, : key.tokens], self._i64[1, : key.tokens]
            self._stage_empty(key)
            with lora_slots(self._lora_slots(key)):
                with forward_context(self._metadata(key)):
                    self.model(ids, pos)  # compile Triton kernels for these shapes outside the capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                # Fresh metadata: what layers derive from it once a step (`AttentionMetadata.derived`)
                # must be computed inside the graph, not taken over from the warm-up pass.
                with forward_context(self._metadata(key)), torch.cuda.graph(graph, pool=pool):
                    out = self.model(ids, pos)
            self._graphs[key] = (graph, out)
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        log(
            "captured %d CUDA graphs (decode batch sizes %s, mixed token counts %s, one-sequence mixed %s, x table "
            "widths %s tokens%s) in %.1f s (their outputs: %.2f GiB)",
            len(self._graphs),
            self.decode_sizes,
            self.mixed_sizes,
            sorted(self.one_seq_sizes),
            [w * self.block_size for w in self.widths],
            ", x without and with LoRA" if self.lora else "",
            self.capture_seconds,
            (torch.cuda.memory_allocated() - before) / 2**30,
        )

    def output_bytes(self, key: GraphKey) -> int:
        """The bytes of a captured graph's output, which it keeps for its replays."""
        out = self._graphs[key][1]
        return out.numel() * out.element_size()

    def _lora_slots(self, key: GraphKey) -> torch.Tensor | None:
        """The staged per-token adapter slots a LoRA graph reads (None: the graph skips LoRA)."""
        return self._i64[3, : key.tokens] if key.lora else None

    def run(self, flat: FlatBatch, fill_pending: Callable[[torch.Tensor, FlatBatch], None],
            token_slots: list[int] | None = None) -> torch.Tensor | None:
        """Final hidden states `[num_tokens, hidden]` of the step, or None when no graph holds it.

        `fill_pending(input_ids, flat)` writes, on the device, the inputs whose tokens the host
        does not know yet (`flat.pending`) into the staged input ids. `token_slots`: each token's
        LoRA adapter slot, or None when no token of the step uses an adapter.
        """
        key = self.pick(flat, token_slots is not None)
        if key is None:
            return None
        self._stage(flat, key, token_slots)
        self.last_tokens = key.tokens
        views = self._input_views.get(key)
        if views is None:
            views = self._input_views[key] = self._i64[0, : key.tokens], self._i64[1, : key.tokens]
        fill_pending(views[0], flat)
        if self._graphs:
            graph, out = self._graphs[key]
            graph.replay()
        else:  # CPU (or before capture): the same padded buffers, run eagerly
            with forward_context(self._metadata(key)), lora_slots(self._lora_slots(key)):
                out = self.model(*views)
        return out[: flat.num_tokens]


def _split(buf: torch.Tensor, tokens: int, num_ints: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `[4, tokens]` int64 rows at the start of `buf` and the `num_ints` int32 after them."""
    return buf[: 4 * tokens].view(4, tokens), buf[4 * tokens :].view(torch.int32)[:num_ints]
