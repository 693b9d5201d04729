"""Verification steps as decode steps: one attention sequence per query token.

A request verifying k drafts feeds k + 1 tokens. As one sequence of k + 1 query tokens, the step
needs the prefill/extend attention kernel and, on the GPU, a mixed CUDA graph padded to 16 tokens.
The same tokens can instead be k + 1 sequences of one query token each, sharing the request's block
table, the j-th seeing the context up to and including its own token (`seq_len - k + j`). Every
layer writes the step's K/V into the cache before it attends, so each of these rows reads exactly
the keys its causal mask allows. The step is then a pure decode step: the split-KV decode kernel,
the decode graph of the next batch size up (5 rows at batch 1 and k = 4), and the same attention
kernel as the non-speculative steps.

Token order, positions, slots and sampling rows are unchanged (rows index flattened tokens), so
only the sequence layout is rewritten.
"""

from __future__ import annotations

from flotilla.engine.input_batch import FlatBatch


def as_decode_rows(flat: FlatBatch, max_query_len: int) -> FlatBatch:
    """`flat` with every query token as a sequence of its own, when it verifies drafts and no
    sequence has more than `max_query_len` new tokens (a long prefill chunk keeps the extend kernel);
    otherwise `flat` itself."""
    if not flat.draft_groups or flat.max_query_len <= 1 or flat.max_query_len > max_query_len:
        return flat
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    starts = flat.query_start_loc
    for i, (context, table) in enumerate(zip(flat.seq_lens, flat.block_tables, strict=True)):
        n = starts[i + 1] - starts[i]
        seq_lens += range(context - n + 1, context + 1)
        tables += [table] * n
    # A copy by hand: `dataclasses.replace` costs ~10 us of introspection, on a speculating step's
    # critical path between two device steps.
    return FlatBatch(input_ids=flat.input_ids, positions=flat.positions, slots=flat.slots,
                     query_start_loc=list(range(len(seq_lens) + 1)), seq_lens=seq_lens, block_tables=tables,
                     rows=flat.rows, prompt_spans=flat.prompt_spans, max_query_len=1, pending=flat.pending,
                     draft_groups=flat.draft_groups)


def max_decode_rows(max_num_seqs: int, num_speculative_tokens: int, disable_by_batch_size: int | None) -> int:
    """The most rows a decode step can have once verification steps are decode steps: every request
    that may speculate (fewer than `disable_by_batch_size` running) with k + 1 rows."""
    speculating = max_num_seqs if disable_by_batch_size is None else min(max_num_seqs, disable_by_batch_size - 1)
    return max(max_num_seqs, speculating * (num_speculative_tokens + 1))
