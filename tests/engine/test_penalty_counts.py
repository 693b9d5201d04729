"""The penalties' token counts are kept step by step (each token added once), and give the tokens of counting every
request's whole output again at each step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.penalty_counts import PenaltyCounts
from flotilla.engine.request import Request, RequestStatus
from flotilla.engine.sampling_params import SamplingParams

V = 40
# The tables live on the sampler's device.
NEEDS_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)]


def _request(name: str, prompt: list[int]) -> Request:
    return Request(name, prompt, SamplingParams(repetition_penalty=1.2))


@pytest.mark.parametrize("device", DEVICES)
def test_rows_hold_each_requests_counts_and_take_only_new_tokens(device):
    counts = PenaltyCounts(torch.device(device))
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


def test_a_finished_requests_row_is_cleared_for_the_next_and_the_tables_grow_when_none_is_free():
    counts = PenaltyCounts(torch.device("cpu"))
    a, b = _request("a", [3]), _request("b", [4])
    a.output_token_ids = [7, 7]
    (row_a,) = counts.rows([a], V).tolist()
    a.status = RequestStatus.FINISHED_STOPPED
    (row_b,) = counts.rows([b], V).tolist()
    assert row_b == row_a and counts.output.shape[0] == 2  # a's row, cleared
    assert not counts.output[row_b].any() and counts.prompt[row_b, :V].nonzero().flatten().tolist() == [4]
    c = _request("c", [9])
    c.output_token_ids = [1]
    rows = counts.rows([b, c], V).tolist()
    assert rows[0] == row_b and rows[1] not in (0, row_b) and counts.output.shape[0] == 4
    assert counts.output[rows[1], 1] == 1 and not counts.output[row_b].any()


def _generate(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]]) -> list[list[list[int]]]:
    ids = [engine.add_request(prompt, params).request_id for prompt, params in requests]
    done = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                done[output.request_id] = [c.token_ids for c in output.outputs]
    return [done[i] for i in ids]


@pytest.mark.parametrize("device", DEVICES)
def test_kept_counts_give_the_tokens_of_a_recount_at_every_step(tiny_model_dirs, device):
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
    kept = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), **kwargs)
    got = _generate(kept, requests)
    assert kept.scheduler.num_preemptions > 0
    recount = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), **kwargs)
    recount.runner.penalty_counts = None  # type: ignore[assignment]  # every batch counts every token again
    assert _generate(recount, requests) == got
    # Each penalised completion's prompt and outputs added once (all but its last token: no draw read it).
    penalised = [(p, o) for (p, params), outs in zip(requests, got, strict=True) if params.has_penalties for o in outs]
    assert kept.runner.penalty_counts.tokens_counted == sum(len(p) + len(o) - 1 for p, o in penalised)
