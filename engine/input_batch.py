"""A scheduled step flattened into host lists: the new tokens of every request in scheduling order,
with their positions, KV slots, one block table per sequence and the rows that draw a token.

Both the eager path (which turns these lists into tensors) and the CUDA-graph path (which writes
them into the captured graphs' persistent buffers) start from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flotilla.engine.request import Request
from flotilla.engine.sampling_metadata import SamplingRow
from flotilla.engine.scheduler import SchedulerOutput
from flotilla.engine.spec_decode.rejection_sampler import DraftGroup


@dataclass
class FlatBatch:
    """A step's inputs as host lists: tokens flattened in scheduling order, one table per sequence."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    query_start_loc: list[int] = field(default_factory=lambda: [0])
    seq_lens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)  # unpadded; every id a real block
    rows: list[SamplingRow] = field(default_factory=list)
    # (request, flattened index of its first prompt position this step, number of positions)
    prompt_spans: list[tuple[Request, int, int]] = field(default_factory=list)
    max_query_len: int = 0
    # (flattened index, request id) of inputs whose token the step in flight is still drawing: the
    # runner fills them in on the device from that step's sampled ids (asynchronous scheduling).
    pending: list[tuple[int, str]] = field(default_factory=list)
    # Speculative decoding: requests whose inputs end in draft tokens, by their rows (one per draft,
    # then the bonus row).
    draft_groups: list[DraftGroup] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens fed to the model this step."""
        return len(self.input_ids)

    @property
    def num_seqs(self) -> int:
        """Sequences in the step."""
        return len(self.seq_lens)


def flatten(out: SchedulerOutput, block_size: int) -> FlatBatch:
    """Every scheduled request's new tokens, with positions, KV slots and sampling rows."""
    f = FlatBatch()
    for s in out.scheduled:
        req, start, end = s.request, s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
        blocks = req.block_ids
        known = req.num_tokens
        drafts = s.spec_token_ids
        if drafts:
            f.input_ids += req.token_ids(start, known) + drafts
        elif end > known:  # the last input is the token the step in flight draws for this request
            f.input_ids += req.token_ids(start, known)
            f.pending.append((len(f.input_ids), req.request_id))
            f.input_ids.append(0)
        else:
            f.input_ids += req.token_ids(start, end)
        if end - start == 1:  # a decode row (most rows of a large batch): one position, one slot
            f.positions.append(start)
            f.slots.append(blocks[start // block_size] * block_size + start % block_size)
        else:
            f.positions += range(start, end)
            f.slots += [blocks[p // block_size] * block_size + p % block_size for p in range(start, end)]
        f.query_start_loc.append(len(f.input_ids))
        f.seq_lens.append(end)
        f.block_tables.append(blocks)
        if s.num_new_tokens > f.max_query_len:
            f.max_query_len = s.num_new_tokens
        if drafts:  # a row per position from the last known token on, drafting output token `drawn` on
            drawn = known - req.num_prompt_tokens
            f.draft_groups.append(DraftGroup(len(f.rows), tuple(drafts)))
            last = len(f.input_ids) - len(drafts) - 1
            f.rows += [SamplingRow(req, last + j, drawn + j) for j in range(len(drafts) + 1)]
        elif s.samples:
            drawn = end - req.num_prompt_tokens
            if req.fork_children:
                f.rows += [SamplingRow(r, len(f.input_ids) - 1, drawn) for r in (req, *req.fork_children)]
            else:
                f.rows.append(SamplingRow(req, len(f.input_ids) - 1, drawn))
        if req.sampling_params.prompt_logprobs is not None and start < req.num_prompt_tokens - 1:
            count = min(end, req.num_prompt_tokens - 1) - start
            f.prompt_spans.append((req, len(f.input_ids) - (end - start), count))
    return f
