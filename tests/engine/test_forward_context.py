"""The forward context: each thread sees the attention metadata it set, and only while it runs."""

from __future__ import annotations

import threading

import torch

from flotilla.engine.forward_context import AttentionMetadata, current_attention_metadata, forward_context


def _metadata(max_seq_len: int) -> AttentionMetadata:
    empty = torch.empty(0, dtype=torch.int32)
    return AttentionMetadata(
        slot_mapping=empty, block_tables=empty, query_start_loc=empty, seq_lens=empty,
        max_query_len=1, max_seq_len=max_seq_len,
    )


def test_context_is_set_inside_and_restored_after_nesting():
    outer, inner = _metadata(1), _metadata(2)
    assert current_attention_metadata() is None
    with forward_context(outer):
        assert current_attention_metadata() is outer
        with forward_context(inner):
            assert current_attention_metadata() is inner
        assert current_attention_metadata() is outer
    assert current_attention_metadata() is None


def test_two_engine_threads_in_one_process_each_see_their_own_step():
    """Two step threads inside their forward passes at the same time (two engines in one process)."""
    both_inside = threading.Barrier(2)
    seen: dict[int, AttentionMetadata | None] = {}

    def step(n: int) -> None:
        mine = _metadata(n)
        with forward_context(mine):
            both_inside.wait(timeout=10)  # the other thread has set its metadata by now
            seen[n] = current_attention_metadata()
            both_inside.wait(timeout=10)

    threads = [threading.Thread(target=step, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert {n: m.max_seq_len if m else None for n, m in seen.items()} == {1: 1, 2: 2}
    assert current_attention_metadata() is None
