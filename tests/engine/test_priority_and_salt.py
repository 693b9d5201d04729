"""`--scheduling-policy priority` in the scheduler, and `cache_salt` in the prefix-cache key (plain
Python: scheduler and block manager alone)."""

from __future__ import annotations

import pytest

from flotilla.engine.block_manager import BlockManager
from flotilla.engine.config import SchedulerConfig
from flotilla.engine.request import Request
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.scheduler import Scheduler


def _scheduler(policy: str, num_blocks: int = 64, max_num_seqs: int = 8, budget: int = 64) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=True,
                             max_model_len=128, scheduling_policy=policy)
    return Scheduler(config, BlockManager(num_blocks, 4))


def _request(name: str, prompt_len: int, priority: int = 0, arrival: float = 0.0, salt: str | None = None,
             first_token: int = 1) -> Request:
    prompt = list(range(first_token, first_token + prompt_len))
    return Request(name, prompt, SamplingParams(max_tokens=8, ignore_eos=True), priority=priority, cache_salt=salt,
                   arrival_time=arrival)


def _run_step(s: Scheduler) -> list[str]:
    out = s.schedule()
    s.update(out, {x.request.request_id: 7 for x in out.scheduled if x.samples})
    return [x.request.request_id for x in out.scheduled]


def test_priority_policy_admits_lower_values_first_then_by_arrival():
    s = _scheduler("priority", max_num_seqs=2)
    for name, priority, arrival in [("late-low", 5, 1.0), ("urgent", -1, 3.0), ("early-low", 5, 0.5), ("mid", 0, 2.0)]:
        s.add(_request(name, 4, priority, arrival))
    assert [r.request_id for r in s.waiting] == ["urgent", "mid", "early-low", "late-low"]
    assert _run_step(s) == ["urgent", "mid"]


def test_fcfs_policy_keeps_arrival_order_whatever_the_priority():
    s = _scheduler("fcfs", max_num_seqs=2)
    for name, priority in [("a", 5), ("b", -1), ("c", 0)]:
        s.add(_request(name, 4, priority))
    assert _run_step(s) == ["a", "b"]


@pytest.mark.parametrize(("policy", "victim"), [("priority", "background"), ("fcfs", "newest")])
def test_out_of_blocks_preempts_the_largest_priority_value_or_the_newest(policy, victim):
    # 6 blocks of 4 tokens: three 8-token prompts take all six, so the first decode step needs a victim.
    s = _scheduler(policy, num_blocks=6)
    # Distinct prompts, so no prefix-cache sharing frees a block.
    s.add(_request("background", 8, priority=9, arrival=0.0, first_token=100))
    s.add(_request("urgent", 8, priority=0, arrival=1.0, first_token=200))
    s.add(_request("newest", 8, priority=1, arrival=2.0, first_token=300))
    _run_step(s)
    out = s.schedule()
    assert [r.request_id for r in out.preempted] == [victim]
    assert victim in [r.request_id for r in s.waiting]


def test_cache_salt_separates_prefix_cache_hits():
    manager = BlockManager(32, 4)
    first = _request("first", 13, salt="tenant-a")
    manager.allocate(first, 13)
    manager.free(first)  # its 3 full blocks stay cached
    assert len(manager.find_cached_prefix(_request("same-salt", 13, salt="tenant-a"))) == 3
    assert manager.find_cached_prefix(_request("other-salt", 13, salt="tenant-b")) == []
    assert manager.find_cached_prefix(_request("no-salt", 13)) == []


def test_engine_runs_lower_priority_values_first_and_refuses_priority_under_fcfs(tiny_model_dirs):
    from flotilla.engine.errors import InvalidParamError
    from flotilla.engine.llm import LLM

    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, max_num_seqs=1, scheduling_policy="priority")
    params = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)
    for name, priority in [("later", 2), ("first", -5), ("second", 0)]:
        llm.engine.add_request([5, 6, 7], params, name, priority=priority)
    finished = []
    while llm.engine.has_unfinished_requests():
        finished += [o.request_id for o in llm.engine.step() if o.finished]
    assert finished == ["first", "second", "later"]

    fcfs = LLM(str(tiny_model_dirs["llama"]), max_model_len=64)
    with pytest.raises(InvalidParamError, match="--scheduling-policy priority"):
        fcfs.engine.add_request([5, 6, 7], params, "x", priority=1)


def test_a_waiting_urgent_request_takes_the_slot_of_the_lowest_priority_running_one():
    s = _scheduler("priority", max_num_seqs=2)
    s.add(_request("low-early", 4, priority=5, arrival=0.0, first_token=100))
    s.add(_request("low-late", 4, priority=5, arrival=1.0, first_token=200))
    _run_step(s)
    s.add(_request("same", 4, priority=5, arrival=2.0, first_token=300))
    out = s.schedule()  # an equal priority never preempts
    assert out.preempted == [] and [r.request_id for r in s.running] == ["low-early", "low-late"]
    s.update(out, {x.request.request_id: 7 for x in out.scheduled if x.samples})
    s.add(_request("urgent", 4, priority=0, arrival=3.0, first_token=400))
    out = s.schedule()
    assert [r.request_id for r in out.preempted] == ["low-late"]  # largest (priority, arrival)
    assert "urgent" in [x.request.request_id for x in out.scheduled]  # admitted in the same step
    assert [r.request_id for r in s.waiting] == ["low-late", "same"]


def test_a_waiting_urgent_request_preempts_for_blocks_until_it_fits():
    # 8 blocks of 4 tokens: two 13-token prompts hold 4 blocks each; the urgent 9-token prompt needs 3.
    s = _scheduler("priority", num_blocks=8)
    s.add(_request("a", 13, priority=3, arrival=0.0, first_token=100))
    s.add(_request("b", 13, priority=4, arrival=1.0, first_token=200))
    _run_step(s)
    s.add(_request("urgent", 9, priority=-1, arrival=2.0, first_token=300))
    out = s.schedule()
    assert [r.request_id for r in out.preempted] == ["b"]
    assert sorted(x.request.request_id for x in out.scheduled) == ["a", "urgent"]
    s.update(out, {x.request.request_id: 7 for x in out.scheduled if x.samples})
    for _ in range(100):  # bounded: a request whose last token never lands must fail, not hang
        if not s.has_unfinished():
            break
        _run_step(s)
    assert not s.has_unfinished()
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_a_running_urgent_request_short_of_a_block_preempts_a_lower_one_planned_before_it():
    # 4 blocks of 4 tokens: "low" (admitted first, 6 tokens) and "high" (8) fill them; two steps later
    # low's next token still fits its blocks but high's needs a fifth block.
    s = _scheduler("priority", num_blocks=4)
    s.add(_request("low", 6, priority=9, arrival=0.0, first_token=100))
    _run_step(s)
    s.add(_request("high", 8, priority=0, arrival=1.0, first_token=200))
    assert _run_step(s) == ["low", "high"]
    out = s.schedule()
    assert [r.request_id for r in out.preempted] == ["low"]
    assert [x.request.request_id for x in out.scheduled] == ["high"]


def test_engine_preempts_for_an_urgent_request_and_greedy_tokens_still_match_hf(tiny_model_dirs):
    from flotilla.engine.llm_engine import LLMEngine

    from .hf_reference import hf_greedy

    model = tiny_model_dirs["llama"]
    engine = LLMEngine.from_kwargs(str(model), max_model_len=64, max_num_seqs=2, scheduling_policy="priority",
                                   block_size=8)
    greedy = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0)
    prompts = {"low-a": [5, 6, 7, 8, 9], "low-b": [10, 11, 12, 13, 14, 15], "urgent": [20, 21, 22, 23]}
    requests = {name: engine.add_request(prompts[name], greedy, name, priority=5) for name in ("low-a", "low-b")}
    for _ in range(3):
        engine.step()
    requests["urgent"] = engine.add_request(prompts["urgent"], greedy, "urgent", priority=0)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert engine.scheduler.num_preemptions == 1
    assert finished.index("urgent") < finished.index("low-b")  # low-b gave its slot up and waited
    expected = hf_greedy(model, [prompts[n] for n in requests], 12)
    assert [requests[n].output_token_ids for n in requests] == expected
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "a block leaked"


@pytest.mark.parametrize("algo", ["sha256", "builtin"])
def test_block_hashes_chain_hash_block_over_the_prompt(algo):
    """The prompt's blocks are hashed as one run (`_block_hashes`, `hash_blocks`): the same chain as `hash_block`
    block by block, salt on the first block only; hashing up to a later block extends the chain, and blocks that
    output tokens fill continue it."""
    from flotilla.engine.block_hash import hash_block

    manager = BlockManager(64, 4, hash_algo=algo)
    request = _request("r", 23, salt="tenant-a")
    prompt = request.prompt_token_ids
    expected = [hash_block(None, prompt[0:4], ("tenant-a",), algo)]
    for i in range(1, 5):
        expected.append(hash_block(expected[-1], prompt[4 * i : 4 * i + 4], (), algo))
    assert manager._block_hashes(request, 2) == expected[:2]
    assert manager._block_hashes(request, 5) == expected
    request.output_token_ids += [7, 8, 9, 10, 11]  # blocks 5 (prompt ids 20-22, output 7) and 6
    expected.append(hash_block(expected[-1], prompt[20:23] + [7], (), algo))
    expected.append(hash_block(expected[-1], [8, 9, 10, 11], (), algo))
    assert manager._block_hashes(request, 7) == expected
