"""Draft slots and their rollback in the scheduler and block manager alone (plain Python, no model):
exact block accounting through any mix of acceptances, stops, aborts and preemption."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla.engine.block_manager import BlockManager
from flotilla.engine.config import SchedulerConfig
from flotilla.engine.request import Request, RequestStatus
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import Scheduler, SchedulerOutput


def _scheduler(num_blocks=64, budget=32, max_model_len=128) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, enable_chunked_prefill=True,
                             max_model_len=max_model_len)
    return Scheduler(config, BlockManager(num_blocks, 4))


def _request(i: int, n: int = 6, max_tokens: int = 20, **params) -> Request:
    return Request(str(i), list(range(10, 10 + n)), SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params))


def _fill(out: SchedulerOutput, drafts: dict[str, list[int]]) -> None:
    """What Speculator.propose does: drafts into the reserved slots, unused slots dropped."""
    for s in out.scheduled:
        if s.num_lookahead:
            d = drafts.get(s.request.request_id, [])[: s.num_lookahead]
            s.spec_token_ids = d
            s.num_new_tokens -= s.num_lookahead - len(d)
            s.request.num_computed_tokens -= s.num_lookahead - len(d)


def test_decode_reserves_slots_and_rollback_frees_rejected_blocks():
    s = _scheduler()
    r = _request(0, n=7)
    s.add(r)
    s.update(s.schedule(4), {"0": 1})  # prefill: no lookahead, one token drawn
    assert r.num_tokens == 8 and len(r.block_ids) == 2
    out = s.schedule(4)
    (x,) = out.scheduled
    assert (x.num_lookahead, x.num_new_tokens, len(r.block_ids)) == (4, 5, 3)  # positions 7..11
    _fill(out, {"0": [5, 6, 7, 8]})
    verified = {"0": [5, 9]}  # first draft accepted, second rejected: 9 recovered
    s.update(out, {}, verified)
    assert r.output_token_ids == [1, 5, 9] and r.num_computed_tokens == 9
    assert len(r.block_ids) == 3  # 10 tokens need 3 blocks of 4; none beyond
    out = s.schedule(4)
    _fill(out, {"0": [1, 2]})
    s.update(out, {}, {"0": [1, 2, 3]})  # both accepted plus the bonus
    assert r.output_token_ids == [1, 5, 9, 1, 2, 3] and r.num_computed_tokens == r.num_tokens - 1
    s.finish(r, RequestStatus.FINISHED_ABORTED)
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_lookahead_never_exceeds_max_tokens_or_penalised_requests():
    s = _scheduler()
    short, penalised = _request(0, max_tokens=3), _request(1, presence_penalty=0.5)
    for r in (short, penalised):
        s.add(r)
    s.update(s.schedule(4), {"0": 1, "1": 1})
    out = s.schedule(4)
    assert {x.request.request_id: x.num_lookahead for x in out.scheduled} == {"0": 1, "1": 0}


def test_a_stop_among_accepted_drafts_ends_there():
    s = _scheduler()
    r = Request("0", [10, 11, 12], SamplingParams(max_tokens=20, stop_token_ids=[7]))
    s.add(r)
    s.update(s.schedule(4), {"0": 1})
    out = s.schedule(4)
    _fill(out, {"0": [7, 8, 9]})
    verified = {"0": [7, 8, 9, 4]}
    s.update(out, {}, verified)
    assert r.output_token_ids == [1, 7] and verified["0"] == [7] and r.status == RequestStatus.FINISHED_STOPPED
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_every_block_returns_through_random_acceptance_aborts_and_preemption(seed):
    rng = random.Random(seed)
    s = _scheduler(num_blocks=14, budget=24)
    for i in range(5):
        s.add(_request(i, n=rng.randint(2, 12), max_tokens=rng.randint(1, 16)))
    while s.has_unfinished():
        out = s.schedule(rng.randint(0, 4))
        drafts = {x.request.request_id: [rng.randrange(50) for _ in range(rng.randint(0, x.num_lookahead))]
                  for x in out.scheduled if x.num_lookahead}
        _fill(out, drafts)
        sampled, verified = {}, {}
        for x in out.scheduled:
            if x.spec_token_ids:
                verified[x.request.request_id] = x.spec_token_ids[: rng.randint(0, len(x.spec_token_ids))] + [3]
            elif x.samples:
                sampled[x.request.request_id] = rng.randrange(50)
        s.update(out, sampled, verified)
        for r in s.running:  # no block past a request's tokens; a verified one recomputes only its last
            assert len(r.block_ids) <= s.block_manager.blocks_needed(r.num_tokens)
            if r.request_id in verified:
                assert r.num_computed_tokens == r.num_tokens - 1
        if rng.random() < 0.1 and s.running:
            s.abort([rng.choice(s.running).request_id])
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks
    assert all(b.ref_count == 0 for b in s.block_manager.blocks)
