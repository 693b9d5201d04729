"""The CUDA-graph path's staging writes a block table's new ids only (a decode step's staging does not grow with
the tokens so far), and the tokens stay those of the eager path through finishes, forks (copy-on-write) and
preemptions (the block manager's non-append changes make new table lists)."""

from __future__ import annotations

import torch

from flotilla.engine.block_manager import BlockManager
from flotilla.engine.cuda_graphs import StepGraphs
from flotilla.engine.input_batch import FlatBatch
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.request import Request
from flotilla.engine.sampling_params import SamplingParams

PROMPTS = [[101 + i, 2034, 887, 41 + i, 9000, 77, 5 + i, 16000, 123] for i in range(10)]


def _run(engine: LLMEngine) -> dict[str, list[list[int]]]:
    for i, prompt in enumerate(PROMPTS):
        params = SamplingParams(n=2 if i % 3 == 0 else 1, temperature=1.0 if i % 3 == 0 else 0, seed=i,
                                max_tokens=30 + 9 * i, ignore_eos=True)
        engine.add_request(prompt, params, f"r{i}")
    outputs = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = [c.token_ids for c in output.outputs]
    return outputs


def test_incremental_table_staging_keeps_the_eager_tokens(tiny_model_dirs):
    # 40 blocks of 8 tokens for up to 8 sequences of up to ~130 tokens: preemptions happen
    kwargs = dict(max_model_len=256, block_size=8, max_num_seqs=8, num_gpu_blocks_override=40,
                  enable_prefix_caching=False)
    eager = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), **kwargs)
    want = _run(eager)
    assert eager.scheduler.num_preemptions > 0
    graphed = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), **kwargs)
    runner = graphed.runner
    runner.graphs = graphs = StepGraphs(runner.model, 8, graphed.config.scheduler.max_num_batched_tokens, 256, 8,
                                        runner.device)
    staged_per_step = []
    stage = graphs._stage

    def counting(flat, key, token_slots=None):
        before = graphs.table_ids_staged
        stage(flat, key, token_slots)
        staged_per_step.append((graphs.table_ids_staged - before, sum(map(len, flat.block_tables)), flat.num_seqs,
                                flat.num_tokens))

    graphs._stage = counting  # type: ignore[method-assign]
    assert _run(graphed) == want
    assert graphed.scheduler.num_preemptions > 0
    decodes = [(staged, held) for staged, held, seqs, tokens in staged_per_step if seqs == tokens and seqs > 1]
    assert len(decodes) > 50
    # most decode steps write no id or one new block's for some rows, far fewer than the tables hold
    assert sum(staged for staged, _ in decodes) < sum(held for _, held in decodes) / 4


def _decode_step(tables: list[list[int]]) -> FlatBatch:
    n = len(tables)
    return FlatBatch(input_ids=[1] * n, positions=[8 * len(t) - 1 for t in tables],
                     slots=[8 * t[-1] + 7 for t in tables], query_start_loc=list(range(n + 1)),
                     seq_lens=[8 * len(t) for t in tables], block_tables=tables, max_query_len=1)


def test_a_grown_table_is_staged_by_its_new_ids_and_a_new_list_whole():
    graphs = StepGraphs(torch.nn.Identity(), 4, 256, 4096, 8, torch.device("cpu"))

    def stage(tables: list[list[int]]) -> int:
        flat = _decode_step(tables)
        key = graphs.pick(flat)
        before = graphs.table_ids_staged
        graphs._stage(flat, key)
        rows = graphs._metadata(key).block_tables
        assert [rows[i, : len(t)].tolist() for i, t in enumerate(tables)] == tables  # what the graph reads
        return graphs.table_ids_staged - before

    a, b = [1, 2, 3], [4, 5]
    assert stage([a, b]) == 5
    assert stage([a, b]) == 0  # nothing new
    a.append(6)
    assert stage([a, b]) == 1  # a's new block only
    trimmed = a[:2] + [9]  # the block manager's trim or copy-on-write: a new list
    assert stage([trimmed, b]) == 3
    assert stage([b, trimmed]) == 3  # b moved up (copied in the buffer); trimmed moved down: its old row is b's now
    wide = list(range(10, 10 + 200))  # a longer context: a wider table (512 blocks, not 128), its rows overlapping
    assert stage([b, trimmed, wide]) == 2 + 3 + 200
    assert stage([b, trimmed]) == 5  # back to the narrow width: its rows were overwritten, written again


def test_rows_after_a_finished_one_move_in_the_buffer_and_only_new_ids_are_written():
    graphs = StepGraphs(torch.nn.Identity(), 8, 256, 4096, 8, torch.device("cpu"))
    tables = [list(range(100 * r, 100 * r + 60 + r)) for r in range(7)]

    def stage(step: list[list[int]]) -> tuple[int, int]:
        flat = _decode_step(step)
        key = graphs.pick(flat)
        ids, rows = graphs.table_ids_staged, graphs.table_rows_moved
        graphs._stage(flat, key)
        staged = graphs._metadata(key).block_tables
        assert [staged[i, : len(t)].tolist() for i, t in enumerate(step)] == step  # what the graph reads
        return graphs.table_ids_staged - ids, graphs.table_rows_moved - rows

    assert stage(tables) == (sum(map(len, tables)), 0)
    tables[4].append(7777)
    # rows 0 and 2 finished: 1 moves to 0, 3.. to 2..; one new id; writing the moved lists took 300+ ids
    assert stage([tables[1], *tables[3:]]) == (1, 5)
    assert stage([tables[1], *tables[3:]]) == (0, 0)
    # one finished, and a table that was never staged joins at the end: the rows after the hole move, the new one
    # is written whole
    step = [tables[1], tables[3], *tables[5:], list(range(900, 950))]
    assert stage(step) == (50, 2)
    # a row moved down (a request scheduled before it): written from its list
    assert stage([tables[5], tables[1]]) == (len(tables[1]), 1)


def test_the_block_manager_never_changes_a_table_list_but_by_appending():
    """The staging's contract: trim, free and copy-on-write give the request a new list; the old one keeps its ids."""
    bm = BlockManager(16, 8, enable_prefix_caching=False)
    leader = Request("a", list(range(12)), SamplingParams())
    assert bm.allocate(leader, 20)
    before = leader.block_ids
    bm.trim(leader, 12)
    assert leader.block_ids is not before and before == [*leader.block_ids, before[-1]]
    child = Request("b", list(range(12)), SamplingParams())
    bm.fork(leader, child, 12)  # the partial second block is shared
    child.num_computed_tokens = leader.num_computed_tokens = 12
    shared = child.block_ids
    assert bm.allocate(child, 1)  # writes into the shared partial block: copy-on-write
    assert child.block_ids is not shared and shared == leader.block_ids != child.block_ids
    held = leader.block_ids
    bm.free(leader)
    assert leader.block_ids == [] and held == shared
