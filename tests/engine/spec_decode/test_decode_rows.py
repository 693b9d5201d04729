"""Verification steps as decode steps: the layout, its attention against the extend kernel's (the
Triton kernels on a GPU, the references on the CPU), and greedy drafts judged on the host."""

from __future__ import annotations

import pytest
import torch

from flotilla.engine.input_batch import FlatBatch
from flotilla.engine.request import Request
from flotilla.engine.sampling_metadata import SamplingRow, build_sampling_batch
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.spec_decode.decode_rows import as_decode_rows, max_decode_rows
from flotilla.engine.spec_decode.rejection_sampler import DraftGroup, greedy_accepted, verify
from flotilla.kernels.dispatch import paged_attention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK = 16


def _step() -> FlatBatch:
    """Request A verifies 4 drafts after 33 known tokens (5 inputs, context 37); B decodes (context 20)."""
    return FlatBatch(
        input_ids=list(range(6)), positions=[32, 33, 34, 35, 36, 19], slots=[32, 33, 34, 35, 36, 51],
        query_start_loc=[0, 5, 6], seq_lens=[37, 20], block_tables=[[0, 1, 2], [3, 4]], max_query_len=5,
        draft_groups=[DraftGroup(0, (7, 8, 9, 10))],
    )


def test_each_query_token_becomes_a_sequence_with_its_causal_context():
    flat = as_decode_rows(_step(), max_query_len=5)
    assert flat.query_start_loc == [0, 1, 2, 3, 4, 5, 6]
    assert flat.seq_lens == [33, 34, 35, 36, 37, 20]
    assert flat.block_tables == [[0, 1, 2]] * 5 + [[3, 4]]
    assert flat.max_query_len == 1
    assert (flat.input_ids, flat.positions, flat.slots) == (_step().input_ids, _step().positions, _step().slots)


def test_steps_without_drafts_or_with_long_queries_keep_their_layout():
    plain = _step()
    plain.draft_groups = []
    assert as_decode_rows(plain, 5) is plain
    long = _step()
    assert as_decode_rows(long, 4) is long  # a prefill chunk longer than k + 1 keeps the extend kernel


def test_decode_graph_ladder_covers_every_verifying_request():
    assert max_decode_rows(1, 4, None) == 5
    assert max_decode_rows(64, 4, 32) == 31 * 5  # the load rule: below 32 running requests only
    assert max_decode_rows(256, 4, 2) == 256


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_rows_attend_like_the_extend_step(dtype):
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 64
    cache = [torch.randn(6, BLOCK, kv_heads, dim, dtype=dtype, device=DEVICE) for _ in range(2)]
    step = _step()
    q = torch.randn(step.num_tokens, heads, dim, dtype=dtype, device=DEVICE)

    def attend(flat: FlatBatch) -> torch.Tensor:
        tables = [t + [0] * (3 - len(t)) for t in flat.block_tables]

        def t(v: list) -> torch.Tensor:
            return torch.tensor(v, dtype=torch.int32, device=DEVICE)

        return paged_attention(q, *cache, t(tables), t(flat.query_start_loc), t(flat.seq_lens), dim**-0.5,
                               max_query_len=flat.max_query_len).float()

    extend, rows = attend(step), attend(as_decode_rows(step, 5))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(rows, extend, atol=tol, rtol=tol)


def test_host_judging_agrees_with_verify_on_greedy_rows():
    torch.manual_seed(1)
    vocab, params = 50, SamplingParams(temperature=0.0, max_tokens=8)
    req = Request("a", [1, 2, 3], params)
    rows = [SamplingRow(req, j, j) for j in range(5)] + [SamplingRow(Request("b", [4], params), 5, 0)]
    logits = torch.randn(6, vocab)
    argmax = logits.argmax(dim=-1).tolist()
    groups = [DraftGroup(0, (argmax[0], argmax[1], (argmax[2] + 1) % vocab, argmax[3]))]
    batch = build_sampling_batch(rows, vocab, torch.device("cpu"), torch.Generator().manual_seed(0))
    out = verify(logits, batch, groups)
    assert out.accepted is not None
    assert greedy_accepted(out.token_ids.tolist(), groups) == out.accepted.tolist()
    assert greedy_accepted(argmax, groups)[:4] == [True, True, False, True]


def test_a_verification_step_replays_a_decode_graph():
    from flotilla.engine.cuda_graphs import GraphKey, StepGraphs

    graphs = StepGraphs(torch.nn.Identity(), 2, 256, 4096, BLOCK, torch.device("cpu"),
                        max_decode_rows=max_decode_rows(2, 4, None))
    assert graphs.decode_sizes == [1, 2, 4, 8, 10]
    assert graphs.pick(as_decode_rows(_step(), 5)) == GraphKey(True, 8, 8, 64)
    assert not graphs.pick(_step()).decode  # the extend layout: a mixed graph padded to 16 tokens


def test_a_verification_step_stages_one_sequence_per_row_into_the_graph_buffers():
    """The rows of a request share its block-table list, which staging writes once for all of them; the
    buffers the decode graph reads hold each row's table, context and slot, and padding rows after them.
    A wider step staged before leaves nothing behind that the graph would read."""
    from flotilla.engine.cuda_graphs import StepGraphs

    graphs = StepGraphs(torch.nn.Identity(), 2, 256, 4096, BLOCK, torch.device("cpu"),
                        max_decode_rows=max_decode_rows(2, 4, None))
    other = FlatBatch(input_ids=[9] * 10, positions=list(range(10)), slots=list(range(100, 110)),
                      query_start_loc=list(range(11)), seq_lens=list(range(1, 11)),
                      block_tables=[[7]] * 10, max_query_len=1)
    graphs._stage(other, graphs.pick(other))
    flat = as_decode_rows(_step(), 5)
    key = graphs.pick(flat)
    graphs._stage(flat, key)
    meta = graphs._metadata(key)
    assert meta.query_start_loc.tolist() == list(range(9))  # 6 rows, then 2 padding rows of one token
    assert meta.seq_lens.tolist() == [33, 34, 35, 36, 37, 20, 0, 0]
    assert meta.block_tables[:5, :3].tolist() == [[0, 1, 2]] * 5 and meta.block_tables[5, :2].tolist() == [3, 4]
    assert meta.slot_mapping.tolist() == [32, 33, 34, 35, 36, 51, -1, -1]
    assert graphs._i64[0, :8].tolist() == [0, 1, 2, 3, 4, 5, 0, 0]
    assert graphs._i64[1, :8].tolist() == [32, 33, 34, 35, 36, 19, 0, 0]
