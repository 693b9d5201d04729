"""The scheduler and block manager alone (plain Python, no model): budgets, fairness, exact accounting."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla.engine.block_manager import BlockManager
from flotilla.engine.config import SchedulerConfig
from flotilla.engine.request import Request, RequestStatus
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import Scheduler


def _scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=32, chunked=True, max_model_len=128):
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        max_model_len=max_model_len,
    )
    return Scheduler(config, BlockManager(num_blocks, block_size))


def _request(i: int, prompt: list[int], max_tokens: int = 8) -> Request:
    return Request(str(i), prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def _step(s: Scheduler, rng: random.Random):
    out = s.schedule()
    sampled = {x.request.request_id: rng.randrange(100) for x in out.scheduled if x.samples}
    s.update(out, sampled)
    return out


def _check_blocks(s: Scheduler) -> None:
    """Reference counts equal the number of holders; a block held twice is a cached prefix block."""
    for r in s.requests.values():
        assert len(set(r.block_ids)) == len(r.block_ids), "a request holds a block twice"
    holders = Counter(b for r in s.requests.values() for b in r.block_ids)
    manager = s.block_manager
    for block in manager.blocks:
        assert block.ref_count == holders.get(block.block_id, 0)
        if holders.get(block.block_id, 0) > 1:
            assert block.block_hash is not None, "block shared without going through the prefix cache"
    assert manager.num_free_blocks == sum(1 for b in manager.blocks if b.ref_count == 0)


def test_budget_and_sequence_cap_hold_every_step():
    rng = random.Random(0)
    s = _scheduler(num_blocks=400, budget=20, max_num_seqs=5)
    for i in range(30):
        s.add(_request(i, [rng.randrange(100) for _ in range(rng.randint(1, 60))], max_tokens=rng.randint(1, 20)))
    while s.has_unfinished():
        out = _step(s, rng)
        assert out.num_batched_tokens <= 20
        assert len(out.scheduled) <= 5 and len(s.running) <= 5
        _check_blocks(s)


def test_decodes_go_first_and_admission_is_fifo():
    s = _scheduler(budget=16, chunked=True)
    first = _request(0, list(range(10)))
    s.add(first)
    _step(s, random.Random(0))  # prefill of the first request
    for i in range(1, 4):
        s.add(_request(i, list(range(30))))
    out = s.schedule()
    assert out.scheduled[0].request is first and out.scheduled[0].num_new_tokens == 1
    assert [x.request.request_id for x in out.scheduled[1:]] == ["1"]  # the budget's rest goes to the oldest
    assert out.scheduled[1].num_new_tokens == 15  # a chunk of its 30-token prompt


def test_without_chunked_prefill_a_prompt_waits_for_room_in_one_step():
    s = _scheduler(budget=40, chunked=False, max_model_len=40)
    s.add(_request(0, list(range(30))))
    s.add(_request(1, list(range(100, 130))))
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("0", 30)]


def test_pool_exhaustion_preempts_the_newest_and_it_resumes():
    s = _scheduler(num_blocks=6, block_size=4, budget=64, max_num_seqs=4)
    a, b = _request(0, list(range(8)), max_tokens=9), _request(1, list(range(50, 58)), max_tokens=9)
    s.add(a)
    s.add(b)
    rng = random.Random(1)
    preempted = []
    while s.has_unfinished():
        preempted += _step(s, rng).preempted
        _check_blocks(s)
    assert preempted and preempted[0] is b
    assert a.status == b.status == RequestStatus.FINISHED_LENGTH
    assert len(b.output_token_ids) == 9 and s.num_preemptions == len(preempted)


def test_no_request_starves_in_a_saturated_run():
    rng = random.Random(2)
    s = _scheduler(num_blocks=40, block_size=4, budget=24, max_num_seqs=4)
    arrival_step = {}
    finish_step = {}
    for step in range(2000):
        if step < 600 and step % 2 == 0:  # arrivals faster than service: always saturated
            i = len(arrival_step)
            s.add(_request(i, [rng.randrange(100) for _ in range(rng.randint(1, 30))], max_tokens=rng.randint(1, 12)))
            arrival_step[str(i)] = step
        out = s.schedule()
        sampled = {x.request.request_id: 0 for x in out.scheduled if x.samples}
        for r in s.update(out, sampled):
            if r.status.finished:
                finish_step[r.request_id] = step
        if not s.has_unfinished() and step >= 600:
            break
    assert set(finish_step) == set(arrival_step)
    waits = [finish_step[i] - arrival_step[i] for i in arrival_step]
    # FIFO: a request waits for those before it; nobody is overtaken indefinitely.
    assert max(waits) < 1500


OPS = st.lists(
    st.tuples(st.sampled_from(["add", "step", "abort", "finish"]), st.integers(0, 10**6)), min_size=1, max_size=80
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(8, 40), caching=st.booleans())
def test_any_interleaving_returns_every_block(ops, block_size, num_blocks, caching):
    config = SchedulerConfig(
        max_num_seqs=6, max_num_batched_tokens=24, enable_chunked_prefill=True, max_model_len=num_blocks * block_size
    )
    s = Scheduler(config, BlockManager(num_blocks, block_size, enable_prefix_caching=caching))
    rng = random.Random(0)
    shared = [1, 2, 3, 4, 5, 6, 7, 8]
    next_id = 0
    for op, arg in ops:
        if op == "add":
            n = 1 + arg % min(20, config.max_model_len - 2)
            prompt = (shared + [arg % 50 + i for i in range(n)])[: config.max_model_len - 1]
            s.add(_request(next_id, prompt, max_tokens=1 + arg % 6))
            next_id += 1
        elif op == "step":
            _step(s, rng)
        elif s.requests:
            victim = sorted(s.requests)[arg % len(s.requests)]
            if op == "abort":
                s.abort([victim])
            else:
                s.finish(s.requests[victim], RequestStatus.FINISHED_STOPPED)
        _check_blocks(s)
    s.abort(list(s.requests))
    assert s.block_manager.num_free_blocks == num_blocks
    assert all(b.ref_count == 0 for b in s.block_manager.blocks)
    assert not s.running and not s.waiting


def test_pipelined_steps_leave_requests_in_flight_alone():
    """With steps in flight (pipeline parallelism), their requests are neither scheduled nor preempted,
    and `max_seqs` caps one step so the running requests spread over the steps."""
    s = _scheduler(num_blocks=9, block_size=4, budget=64)
    for i in range(4):
        s.add(_request(i, [10 * i + t for t in range(8)], max_tokens=20))
    first = s.schedule(max_seqs=2)
    assert [x.request.request_id for x in first.scheduled] == ["0", "1"]
    s.busy = {x.request for x in first.scheduled}
    second = s.schedule(max_seqs=2)  # "0" and "1" are in flight: the other two run
    assert [x.request.request_id for x in second.scheduled] == ["2", "3"]
    s.busy = {x.request for x in first.scheduled + second.scheduled}
    assert s.schedule().is_empty
    s.busy = ()
    s.update(first, {"0": 1, "1": 2})
    s.busy = {x.request for x in second.scheduled}
    # 1 free block: "0" and "1" each need a third one, so "1" is preempted, never "2" or "3" in flight.
    third = s.schedule()
    assert [x.request.request_id for x in third.scheduled] == ["0"]
    assert [r.request_id for r in third.preempted] == ["1"]
    s.busy = ()
    s.update(second, {"2": 3, "3": 4})
    s.update(third, {"0": 5})
    _check_blocks(s)


def test_a_request_added_late_by_arrival_keeps_its_place_among_those_never_run():
    """A request that waited outside the scheduler (its grammar compiling) goes ahead of the later arrivals
    that have not run yet, behind a preempted request, and at the back of an arrival-ordered queue."""
    s = _scheduler()
    early = _request(0, [1, 2, 3])
    preempted, later, latest = _request(1, [1]), _request(2, [1]), _request(3, [1])
    preempted.arrival_time = early.arrival_time + 1
    preempted.first_scheduled_time = preempted.arrival_time  # it ran once, then was preempted
    later.arrival_time, latest.arrival_time = early.arrival_time + 2, early.arrival_time + 3
    for r in (preempted, later, latest):
        s.add(r)
    s.add(early, by_arrival=True)
    assert [r.request_id for r in s.waiting] == ["1", "0", "2", "3"]
    last = _request(4, [1])
    last.arrival_time = early.arrival_time + 4
    s.add(last, by_arrival=True)
    assert [r.request_id for r in s.waiting][-1] == "4"
