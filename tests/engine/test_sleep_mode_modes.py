"""Sleep mode's pause modes (vLLM's `sleep(level, mode)`): "wait" lets the running requests finish and starts no new
one before it sleeps; "keep" holds the requests in flight (preempted at level 1 or 2, their KV freed) and they go on
after the wake-up with the tokens they would have had; a wake-up calls a pending sleep off; the stats snapshot
carries the level asleep at (vllm:engine_sleep_state). Levels, tags and memory: test_sleep_mode.py."""

from __future__ import annotations

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.request import RequestStatus
from flotilla.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PROMPT = list(range(300, 340))
OTHER = list(range(500, 530))


@pytest.fixture(scope="module")
def llm(tiny_model_dirs) -> LLM:
    return LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cpu", enable_sleep_mode=True)


@pytest.fixture(scope="module")
def reference(llm) -> dict[str, list[int]]:
    """Each prompt's greedy tokens, run without any sleep."""
    outputs = llm.generate([{"prompt_token_ids": PROMPT}, {"prompt_token_ids": OTHER}], GREEDY, use_tqdm=False)
    return {"prompt": list(outputs[0].outputs[0].token_ids), "other": list(outputs[1].outputs[0].token_ids)}


def _run_to_end(engine: LLMEngine) -> dict[str, list[int]]:
    finals = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = list(output.outputs[0].token_ids)
    assert not engine.take_failures()
    return finals


def _blocks_all_free(engine: LLMEngine) -> bool:
    return engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_wait_finishes_the_running_request_and_holds_a_new_one(llm, reference):
    engine = llm.engine
    engine.add_request(PROMPT, GREEDY, request_id="running")
    engine.step()
    engine.step()
    engine.sleep(1, "wait")
    assert engine.sleep_pending() and engine.is_sleeping() and engine.runner.asleep == set()
    engine.add_request(OTHER, GREEDY, request_id="new")  # arrives during the drain: it must not start
    finals = {}
    while engine.sleep_pending():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = list(output.outputs[0].token_ids)
    assert finals == {"running": reference["prompt"]}  # it ran to its end, not aborted
    assert engine.take_failures() == []
    assert engine.runner.asleep == {"weights", "kv_cache"} and engine.stats_snapshot().sleep_level == 1
    [new] = engine._groups["new"]
    assert new.status == RequestStatus.WAITING and not new.block_ids and _blocks_all_free(engine)
    engine.wake_up()
    assert engine.stats_snapshot().sleep_level is None
    assert _run_to_end(engine) == {"new": reference["other"]}


def test_wait_with_nothing_running_sleeps_at_once(llm):
    llm.sleep(level=1, mode="wait")
    assert not llm.engine.sleep_pending() and llm.engine.runner.asleep == {"weights", "kv_cache"}
    llm.wake_up()


@pytest.mark.parametrize("level", [0, 1])
def test_keep_holds_a_request_across_the_sleep(llm, reference, level):
    engine = llm.engine
    engine.add_request(PROMPT, GREEDY, request_id="kept")
    for _ in range(4):  # the prompt and a few tokens: it is mid-way
        engine.step()
    [kept] = engine._groups["kept"]
    made = len(kept.output_token_ids)
    assert 0 < made < GREEDY.max_tokens
    llm.sleep(level=level, mode="keep")
    assert engine.is_sleeping() and engine.step() == [] and engine.take_failures() == []
    if level:  # its KV is gone with the pool: preempted, to be recomputed, every block back
        assert kept.status == RequestStatus.PREEMPTED and _blocks_all_free(engine)
    else:  # a pause only: it keeps its blocks
        assert kept.status == RequestStatus.RUNNING and kept.block_ids
    llm.wake_up()
    assert _run_to_end(engine) == {"kept": reference["prompt"]}
    assert len(kept.output_token_ids) == GREEDY.max_tokens and _blocks_all_free(engine)


def test_keep_collects_the_step_in_flight_first(tiny_model_dirs, reference):
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cpu", enable_sleep_mode=True,
              async_scheduling=True)
    engine = llm.engine
    engine.add_request(PROMPT, GREEDY, request_id="kept")
    for _ in range(3):
        engine.step()
    assert engine._in_flight is not None
    engine.sleep(1, "keep")
    assert engine.sleep_pending() and engine.runner.asleep == set()  # the device still runs that step
    outputs = engine.step()  # collects it (its token is delivered), launches nothing, then sleeps
    assert [o.request_id for o in outputs] == ["kept"]
    assert not engine.sleep_pending() and engine._in_flight is None and engine.runner.asleep == {"weights",
                                                                                                   "kv_cache"}
    engine.wake_up()
    assert _run_to_end(engine) == {"kept": reference["prompt"]}


def test_a_wake_up_calls_a_pending_sleep_off(llm, reference):
    engine = llm.engine
    engine.add_request(PROMPT, GREEDY, request_id="running")
    engine.step()
    engine.sleep(2, "wait")
    assert engine.sleep_pending()
    engine.wake_up()
    assert not engine.sleep_pending() and not engine.is_sleeping() and engine.runner.asleep == set()
    assert _run_to_end(engine) == {"running": reference["prompt"]}


def test_an_abort_overrides_a_pending_wait(llm):
    engine = llm.engine
    engine.add_request(PROMPT, GREEDY, request_id="running")
    engine.step()
    engine.sleep(1, "wait")
    engine.sleep(1, "abort")
    assert not engine.sleep_pending() and [o.request_id for o in engine.take_aborted_outputs()] == ["running"]
    assert engine.runner.asleep == {"weights", "kv_cache"} and _blocks_all_free(engine)
    engine.wake_up()


def test_level_0_reports_asleep_without_a_level_label(llm):
    llm.sleep(level=0)
    assert llm.engine.stats_snapshot().sleep_level == 0
    llm.wake_up()
    assert llm.engine.stats_snapshot().sleep_level is None


def test_a_partial_wake_up_stays_asleep_at_its_level(llm):
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    assert llm.engine.is_sleeping() and llm.engine.stats_snapshot().sleep_level == 2
    llm.wake_up(tags=["kv_cache"])
    llm.collective_rpc("reload_weights")
    assert not llm.engine.is_sleeping() and llm.engine.stats_snapshot().sleep_level is None


def test_an_unknown_mode_is_refused(llm):
    with pytest.raises(ValueError, match="sleep mode must be 'abort', 'wait' or 'keep', not 'pause'"):
        llm.sleep(level=1, mode="pause")
    assert not llm.engine.is_sleeping()


def test_keep_holds_every_completion_of_an_n_request(llm):
    params = SamplingParams(temperature=0.0, max_tokens=12, n=2)
    engine = llm.engine
    [expected] = llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)
    engine.add_request(PROMPT, params, request_id="pair")
    for _ in range(4):  # the completions share the prompt's blocks and have a few tokens each
        engine.step()
    llm.sleep(level=1, mode="keep")
    assert _blocks_all_free(engine)  # every completion preempted, the shared blocks freed once
    llm.wake_up()
    finals = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = [list(c.token_ids) for c in output.outputs]
    assert finals == {"pair": [list(c.token_ids) for c in expected.outputs]}


def test_keep_with_a_draft_model_recomputes_both_pools(tiny_model_dirs, reference):
    path = str(tiny_model_dirs["llama"])
    llm = LLM(path, max_model_len=256, device="cpu", enable_sleep_mode=True,
              speculative_config={"model": path, "num_speculative_tokens": 2})
    engine = llm.engine
    engine.add_request(PROMPT, GREEDY, request_id="kept")
    for _ in range(3):
        engine.step()
    assert 0 < len(engine._groups["kept"][0].output_token_ids) < GREEDY.max_tokens
    llm.sleep(level=1, mode="keep")
    assert engine.runner.draft_kv_cache.numel() == 0
    llm.wake_up()
    assert _run_to_end(engine) == {"kept": reference["prompt"]}


def test_wait_while_paused_with_requests_held_sleeps_deeper_at_once(llm, reference):
    # A level-0 "keep" pause holds the running request with its KV; nothing steps it while paused, so a deeper
    # "wait" sleep could never drain (LLM.sleep stepped forever, a server's /sleep never answered). It sleeps at once,
    # the held request preempted as "keep" does, since its KV goes with the pool.
    engine = llm.engine
    engine.add_request(PROMPT, GREEDY, request_id="held")
    for _ in range(3):
        engine.step()
    llm.sleep(level=0, mode="keep")
    llm.sleep(level=1, mode="wait")
    [held] = engine._groups["held"]
    assert not engine.sleep_pending() and engine.runner.asleep == {"weights", "kv_cache"}
    assert held.status == RequestStatus.PREEMPTED and _blocks_all_free(engine)
    llm.wake_up()
    assert _run_to_end(engine) == {"held": reference["prompt"]}


def test_a_lighter_sleep_while_asleep_keeps_the_deeper_level(llm):
    # the weights stay discarded after a level-0 pause on top: vllm:engine_sleep_state must still say discard_all
    llm.sleep(level=2)
    llm.sleep(level=0)
    assert llm.engine.stats_snapshot().sleep_level == 2
    llm.wake_up()
    llm.collective_rpc("reload_weights")
    assert llm.engine.stats_snapshot().sleep_level is None
