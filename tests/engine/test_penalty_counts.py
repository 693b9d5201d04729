"""The penalties' token counts are kept step by step (each token added once), and give the tokens of counting every
request's whole output again at each step."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.penalty_counts import PenaltyCounts, table_bytes
from flotilla.engine.request import Request, RequestStatus
from flotilla.engine.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from model_dirs import make_model_dir

V = 40
# The tables live on the sampler's device.
NEEDS_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (vocabulary 1024) saved at test time: no package to carry to a GPU machine."""
    return make_model_dir("tiny-llama", tmp_path_factory.mktemp("tiny-llama"), weights_seed=0)


def _request(name: str, prompt: list[int]) -> Request:
    return Request(name, prompt, SamplingParams(repetition_penalty=1.2))


@pytest.mark.parametrize("device", DEVICES)
def test_rows_hold_each_requests_counts_and_take_only_new_tokens(device):
    counts = PenaltyCounts(torch.device(device), 2)
    a, b = _request("a", [1, 2, 2]), _request("b", [5])
    rng = np.random.default_rng(0)
    for step in range(30):
        for r in (a, b):
            r.output_token_ids += rng.integers(0, V, size=step % 3).tolist()  # 0, 1 or 2 new tokens a step
        before = counts.tokens_counted
        rows = counts.rows([a, None, b, a], V).tolist()
        assert rows[1] == 0 and rows[0] == rows[3] != rows[2]
        new = step % 3
        assert counts.tokens_counted - before == (2 * new if step else 2 * new + 4)  # the prompts once, at first
        for r, row in ((a, rows[0]), (b, rows[2])):
            assert counts.output[row, :V].tolist() == np.bincount(r.output_token_ids, minlength=V).tolist()
            assert counts.prompt[row, :V].tolist() == [t in r.prompt_token_ids for t in range(V)]
        assert not counts.output[0].any() and not counts.prompt[0].any()


def test_a_finished_requests_row_is_cleared_for_the_next_and_a_live_one_outside_the_batch_gives_its_row_up():
    counts = PenaltyCounts(torch.device("cpu"), 2)
    a, b = _request("a", [3]), _request("b", [4])
    a.output_token_ids = [7, 7]
    (row_a,) = counts.rows([a], V).tolist()
    a.status = RequestStatus.FINISHED_STOPPED
    (row_b,) = counts.rows([b], V).tolist()
    c = _request("c", [9])
    c.output_token_ids = [1]
    rows = counts.rows([b, c], V).tolist()
    assert rows[0] == row_b and rows[1] == row_a  # a's row, cleared for c
    assert counts.output[row_a, :V].tolist() == np.bincount([1], minlength=V).tolist()
    assert counts.prompt[row_a, :V].nonzero().flatten().tolist() == [9]
    # Both rows held by live requests: d takes the row of one outside its batch (b's, the earliest taken), and b is
    # counted again from scratch when it is drawn next.
    d = _request("d", [5])
    d.output_token_ids = [2, 2]
    b.output_token_ids = [6, 6, 6]
    (row_d,) = counts.rows([d], V).tolist()
    assert row_d == row_b and counts.output[row_d, :V].tolist() == np.bincount([2, 2], minlength=V).tolist()
    rows = counts.rows([b, d], V).tolist()
    assert rows == [row_a, row_d]  # c, outside this batch, gave its row up to b
    assert counts.output[row_a, :V].tolist() == np.bincount([6, 6, 6], minlength=V).tolist()
    assert counts.prompt[row_a, :V].nonzero().flatten().tolist() == [4]
    assert counts.output[row_d, :V].tolist() == np.bincount([2, 2], minlength=V).tolist()


@pytest.mark.parametrize("earlier", ["gone", "finished"])
def test_a_row_is_free_though_a_completion_at_its_first_draw_reuses_its_earlier_holders_id(earlier):
    # Rows are kept under the request id. An earlier request's completion `b#1` holds a row, then is collected
    # ("gone") or finishes; a new request `b` (n = 2) brings a completion `b#1` again. At the pair's first draw the
    # completion reads its leader's row and never claims the one under its id, so that row must still be free for
    # the leader when every other row is held by this batch.
    params = SamplingParams(repetition_penalty=1.2)
    counts = PenaltyCounts(torch.device("cpu"), 2)
    running, old = Request("a", [3], params), Request("b#1", [4], params)
    running.output_token_ids, old.output_token_ids = [1], [2]
    counts.rows([running, old], V)
    if earlier == "gone":
        del old
    else:
        old.status = RequestStatus.FINISHED_LENGTH
    prompt = [5, 6]
    leader, child = Request("b", prompt, params), Request("b#1", prompt, params)
    leader.fork_children = [child]
    rows = counts.rows([running, leader, child], V).tolist()  # a batch of max_num_seqs requests and one completion
    assert rows[1] == rows[2] not in (0, rows[0])
    assert counts.prompt[rows[1], :V].nonzero().flatten().tolist() == prompt and not counts.output[rows[1]].any()


def test_a_request_that_reuses_a_finished_ones_id_is_counted_from_scratch():
    counts = PenaltyCounts(torch.device("cpu"), 4)
    first = _request("x", [3, 4])
    first.output_token_ids = [7]
    counts.rows([first], V)
    first.status = RequestStatus.FINISHED_STOPPED
    again = _request("x", [9])  # the same id, a new request (the first is still referenced)
    again.output_token_ids = [1, 2, 2]  # more tokens than the first's row has counted
    (row_again,) = counts.rows([again], V).tolist()
    assert row_again != 0
    assert counts.output[row_again, :V].tolist() == np.bincount([1, 2, 2], minlength=V).tolist()
    assert counts.prompt[row_again, :V].nonzero().flatten().tolist() == [9]


def test_the_tables_never_outgrow_their_reserved_bytes():
    # The KV cache's sizing sets `table_bytes(max_num_seqs, V)` aside (model_runner._profile_gpu_blocks): the tables
    # are made at that size at the first penalised draw and stay so, however many requests come and go.
    counts = PenaltyCounts(torch.device("cpu"), 4)
    reserved = table_bytes(4, V)
    live: list[Request] = []
    for i in range(40):
        live = live[-3:] + [_request(f"r{i}", [i % V])]
        counts.rows(live, V)
        used = sum(t.numel() * t.element_size() for t in (counts.output, counts.prompt))
        assert used == reserved == 5 * 5 * (V + 1)
    with pytest.raises(RuntimeError, match="more than 4 penalised requests"):
        counts.rows([_request(f"s{i}", [1]) for i in range(5)], V)


def _generate(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]]) -> list[list[list[int]]]:
    ids = [engine.add_request(prompt, params).request_id for prompt, params in requests]
    done = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                done[output.request_id] = [c.token_ids for c in output.outputs]
    return [done[i] for i in ids]


@pytest.mark.parametrize("device", DEVICES)
def test_kept_counts_give_the_tokens_of_a_recount_at_every_step(tiny_llama, device):
    # Greedy and seeded draws, n=2, a request without penalties beside them, and preemptions (a tight pool).
    kwargs = dict(
        max_model_len=96,
        block_size=8,
        max_num_seqs=6,
        num_gpu_blocks_override=16,
        enable_prefix_caching=False,
        device=device,
    )
    rng = np.random.default_rng(1)
    requests = []
    for i in range(6):
        prompt = rng.integers(3, 900, size=8 + 3 * i).tolist()
        penalties = [
            {"repetition_penalty": 1.6},
            {"frequency_penalty": 1.1, "presence_penalty": 0.7},
            {"repetition_penalty": 0.7, "frequency_penalty": -0.8},
            {},
        ][i % 4]
        params = SamplingParams(
            temperature=0 if i % 2 else 1.0,
            seed=i,
            n=2 if i == 2 else 1,
            max_tokens=24 + 4 * i,
            ignore_eos=True,
            **penalties,
        )
        requests.append((prompt, params))
    kept = LLMEngine.from_kwargs(str(tiny_llama), **kwargs)
    got = _generate(kept, requests)
    assert kept.scheduler.num_preemptions > 0
    recount = LLMEngine.from_kwargs(str(tiny_llama), **kwargs)
    recount.runner.penalty_counts = None  # type: ignore[assignment]  # every batch counts every token again
    assert _generate(recount, requests) == got
    # Each penalised completion's prompt and outputs added once (all but its last token: no draw read it).
    penalised = [(p, o) for (p, params), outs in zip(requests, got, strict=True) if params.has_penalties for o in outs]
    assert kept.runner.penalty_counts.tokens_counted == sum(len(p) + len(o) - 1 for p, o in penalised)


def _run_with_an_urgent_arrival(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Two requests of priority 5 run a few steps; one of priority 0 then preempts one of them; all run to the end."""
    ids = [engine.add_request(p, params, priority=5).request_id for p in prompts[:2]]
    done: dict[str, list[int]] = {}
    for step in range(10**4):
        if step == 6:
            ids.append(engine.add_request(prompts[2], params, priority=0).request_id)
        elif step > 6 and not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.finished:
                done[output.request_id] = output.outputs[0].token_ids
    return [done[i] for i in ids]


def test_a_preempted_requests_row_goes_to_the_urgent_one_and_its_tokens_stay_a_recounts(tiny_model_dirs):
    # Two rows (--max-num-seqs 2), both held when the urgent request comes: the preempted request, outside the
    # batch, gives its row up, and is counted again from scratch when it runs again (more tokens counted than once
    # each); the tokens are those of counting every request's whole output at each step.
    kwargs = dict(max_model_len=96, block_size=8, max_num_seqs=2, num_gpu_blocks_override=24,
                  enable_prefix_caching=False, scheduling_policy="priority")
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 900, size=10).tolist() for _ in range(3)]
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=20, ignore_eos=True, repetition_penalty=1.5,
                            frequency_penalty=0.5)
    kept = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), **kwargs)
    got = _run_with_an_urgent_arrival(kept, prompts, params)
    assert kept.scheduler.num_preemptions > 0
    assert kept.runner.penalty_counts.output.shape[0] == 3  # row 0 and one a sequence
    once = sum(len(p) + len(o) - 1 for p, o in zip(prompts, got, strict=True))
    assert kept.runner.penalty_counts.tokens_counted > once
    recount = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), **kwargs)
    recount.runner.penalty_counts = None  # type: ignore[assignment]
    assert _run_with_an_urgent_arrival(recount, prompts, params) == got


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_kv_sizing_sets_the_tables_bytes_aside_and_the_tables_take_no_more(tiny_llama):
    # The profile (engine/memory_profile.py) charges table_bytes(max_num_seqs, logits' width) to the engine's budget
    # beside its weights, activation peak and growth outside torch; the pool gets the rest, and the tables a
    # penalised draw makes have those bytes.
    engine = LLMEngine.from_kwargs(str(tiny_llama), device="cuda", max_model_len=256, max_num_seqs=512,
                                   gpu_memory_utilization=0.3, enforce_eager=True)
    profile = engine.runner.memory_profile
    assert profile is not None
    _generate(engine, [([5, 6, 7], SamplingParams(max_tokens=4, repetition_penalty=1.3))])
    counts = engine.runner.penalty_counts
    width = counts.output.shape[1] - 1  # the logits' width
    assert sum(t.numel() * t.element_size() for t in (counts.output, counts.prompt)) == table_bytes(512, width)
    assert profile.penalty_tables == table_bytes(512, width) > 0
    pool = engine.runner.num_blocks * engine.runner.bytes_per_block
    assert pool <= profile.kv_cache < pool + engine.runner.bytes_per_block
