"""Sleep mode offline (vLLM's `enable_sleep_mode=True`, `LLM.sleep` / `wake_up`): the tiny Llama's greedy tokens
are the same after a level-1 sleep (its weights restored bit for bit) and after a level-2 sleep once the weights are
reloaded; asleep, the weights' storages and the KV pool hold no memory and every KV block is free; a request in
flight finishes with finish_reason "abort" (as vLLM's abort-mode pause) and leaks no block. The server's routes:
tests/engine/server/test_sleep_routes.py; the GPU's memory and CUDA graphs: test_sleep_mode_gpu.py."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from flotilla.engine.config import ConfigError
from flotilla.engine.errors import InvalidParamError
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PROMPT = {"prompt_token_ids": list(range(300, 340))}  # two full 16-token blocks and a tail: prefix-cacheable


@pytest.fixture(scope="module")
def llm(tiny_model_dirs) -> LLM:
    return LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cpu", enable_sleep_mode=True)


def _tokens(llm: LLM) -> list[int]:
    return list(llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids)


def _weights(llm: LLM) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in llm.engine.runner.model.state_dict().items()}


def _resident_weight_bytes(llm: LLM) -> int:
    model = llm.engine.runner.model
    return sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers()])


def _hits(llm: LLM) -> int:
    blocks = llm.engine.block_manager
    before = blocks.prefix_cache_hits
    _tokens(llm)
    return blocks.prefix_cache_hits - before


def test_level_1_frees_weights_and_kv_and_restores_them_exactly(llm):
    tokens, weights = _tokens(llm), _weights(llm)
    assert _hits(llm) == 32  # the prompt's two full blocks are cached before the sleep
    engine, runner = llm.engine, llm.engine.runner
    pool = weakref.ref(runner.kv_cache)
    llm.sleep(level=1)
    gc.collect()
    assert pool() is None  # nothing holds the old pool: its memory is really freed
    assert engine.is_sleeping() and runner.asleep == {"weights", "kv_cache"}
    assert _resident_weight_bytes(llm) == 0
    assert runner.kv_cache.numel() == 0 and all(a.k_cache.numel() == 0 for a in runner.attention_layers)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    with pytest.raises(RuntimeError, match="asleep"):
        _tokens(llm)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # the refused request left none
    llm.wake_up()
    assert not engine.is_sleeping() and runner.asleep == set()
    after = _weights(llm)
    assert all(torch.equal(after[name], weights[name]) for name in weights)
    assert _hits(llm) == 0  # the prefix cache forgot its blocks: their contents were discarded
    assert _tokens(llm) == tokens


def test_level_2_then_reload_weights_gives_the_same_tokens(llm):
    tokens = _tokens(llm)
    runner = llm.engine.runner
    full = _resident_weight_bytes(llm)
    buffers = sum(b.untyped_storage().nbytes() for b in runner.model.buffers())
    llm.sleep(level=2)
    kept = sum(host.numel() for w in runner._sleeping for _, _, host in w._parked if host is not None)
    assert 0 < kept == buffers < full  # level 2 keeps the buffers only: the weights are discarded
    llm.wake_up(tags=["weights"])  # vLLM's order: weights, the update, then the KV cache
    assert llm.engine.is_sleeping() and runner.asleep == {"kv_cache"}
    with pytest.raises(RuntimeError, match="asleep"):
        _tokens(llm)
    assert llm.collective_rpc("reload_weights") == [None]
    llm.wake_up(tags=["kv_cache"])
    assert not llm.engine.is_sleeping()
    assert _tokens(llm) == tokens


def test_reload_weights_reads_the_checkpoint_again(llm):
    tokens = _tokens(llm)
    with torch.no_grad():
        for param in llm.engine.runner.model.parameters():
            param.zero_()
    assert _tokens(llm) != tokens
    llm.collective_rpc("reload_weights")
    assert _tokens(llm) == tokens


def test_reload_weights_refuses_while_the_weights_sleep(llm):
    llm.sleep(level=2)
    try:
        with pytest.raises(RuntimeError, match=r"wake_up\(tags=\['weights'\]\)"):
            llm.collective_rpc("reload_weights")
    finally:
        llm.wake_up()
        llm.collective_rpc("reload_weights")


@pytest.mark.parametrize("output_kind", ["cumulative", "final_only"])  # final_only: decoded only at its end
def test_a_request_in_flight_finishes_abort_with_its_tokens_and_frees_its_blocks(llm, output_kind):
    # vLLM's abort-mode pause finishes the requests in flight (finish_reason "abort"), not an error
    engine = llm.engine
    tokens = _tokens(llm)
    params = GREEDY.model_copy(update={"output_kind": output_kind})
    engine.add_request(PROMPT["prompt_token_ids"], params, request_id="in-flight")
    engine.step()
    engine.step()
    assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    engine.stats.drain_events()
    llm.sleep(level=1)
    assert not engine.take_failures()
    # counted as vLLM counts its pause's abort outputs: vllm:request_success_total{finished_reason="abort"}
    [finished] = engine.stats.drain_events().finished
    assert (finished.finish_reason, finished.prompt_tokens, finished.generation_tokens) == ("abort", 40, 2)
    assert finished.e2e_seconds >= finished.queue_seconds + finished.prefill_seconds + finished.decode_seconds
    assert min(finished.queue_seconds, finished.prefill_seconds, finished.decode_seconds) >= 0
    [final] = engine.take_aborted_outputs()
    assert final.request_id == "in-flight" and final.finished
    [completion] = final.outputs
    assert completion.finish_reason == "abort" and completion.token_ids == tokens[:2]  # what it had generated
    assert completion.text == llm.get_tokenizer().decode(tokens[:2])
    assert not engine.has_unfinished_requests() and not engine.take_aborted_outputs()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    llm.wake_up()


def test_a_request_not_started_yet_finishes_abort_in_every_completion(llm):
    engine = llm.engine
    engine.add_request(PROMPT["prompt_token_ids"], SamplingParams(n=2, max_tokens=4), request_id="queued")
    engine.stats.drain_events()
    llm.sleep(level=1)
    events = engine.stats.drain_events()
    # one request counted (its first completion, as every finish here), all its time queued
    [finished] = events.finished
    assert (finished.finish_reason, finished.generation_tokens, finished.prefill_seconds, finished.decode_seconds) \
        == ("abort", 0, 0.0, 0.0)
    assert finished.queue_seconds == finished.e2e_seconds > 0
    assert [(g.n, g.max_generation_tokens) for g in events.finished_groups] == [(2, 0)]
    [final] = engine.take_aborted_outputs()
    assert [(c.finish_reason, c.token_ids) for c in final.outputs] == [("abort", []), ("abort", [])]
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    llm.wake_up()


def test_requests_added_while_asleep_wait_for_wake_up(llm):
    engine = llm.engine
    tokens = _tokens(llm)
    llm.sleep(level=1)
    engine.add_request(PROMPT["prompt_token_ids"], GREEDY, request_id="waits")
    assert engine.step() == [] and not engine.can_step() and engine.has_unfinished_requests()
    llm.wake_up()
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert list(outputs[-1].outputs[0].token_ids) == tokens


def test_level_0_pauses_without_freeing(llm):
    llm.sleep(level=0)
    assert llm.engine.is_sleeping() and llm.engine.runner.asleep == set()
    assert _resident_weight_bytes(llm) > 0
    llm.wake_up(tags=["scheduling"])
    assert not llm.engine.is_sleeping()


@pytest.mark.parametrize(("call", "message"), [
    (lambda llm: llm.sleep(level=3), "sleep level must be 0, 1 or 2"),
    (lambda llm: llm.wake_up(tags=["weight"]), "unknown wake_up tag"),
    (lambda llm: llm.collective_rpc("init_device"), "only 'reload_weights'"),
])
def test_bad_arguments_are_refused(llm, call, message):
    with pytest.raises(ValueError, match=message):
        call(llm)
    assert not llm.engine.is_sleeping()


def test_sleep_needs_the_flag(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cpu")
    with pytest.raises(InvalidParamError, match="--enable-sleep-mode"):
        llm.sleep(level=1)
    assert _tokens(llm)


def test_sleep_mode_needs_one_rank(tiny_model_dirs):
    with pytest.raises(ConfigError, match="--enable-sleep-mode works with --tensor-parallel-size 1"):
        LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cpu", enable_sleep_mode=True,
            tensor_parallel_size=2)


@pytest.mark.parametrize("method", ["fp8", "rtn"])
def test_a_quantized_model_sleeps_and_wakes_but_does_not_reload(tiny_model_dirs, method, monkeypatch):
    monkeypatch.setenv("RTN_GROUP_SIZE", "32")  # the tiny model's 64-wide layers (the default groups are 128)
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cpu", enable_sleep_mode=True,
              quantization=method)
    tokens = _tokens(llm)
    llm.sleep(level=1)
    assert _resident_weight_bytes(llm) == 0
    llm.wake_up()
    assert _tokens(llm) == tokens
    with pytest.raises(ValueError, match=f"unquantized checkpoints only, not --quantization {method}"):
        llm.collective_rpc("reload_weights")


def test_async_scheduling_sleeps_with_a_step_in_flight(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cpu", enable_sleep_mode=True,
              async_scheduling=True)
    engine = llm.engine
    tokens = _tokens(llm)
    engine.add_request(PROMPT["prompt_token_ids"], GREEDY, request_id="in-flight")
    engine.step()
    engine.step()
    assert engine._in_flight is not None  # a launched step not yet collected
    llm.sleep(level=1)
    assert [o.request_id for o in engine.take_aborted_outputs()] == ["in-flight"] and not engine.take_failures()
    assert engine._in_flight is None and not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    llm.wake_up()
    assert _tokens(llm) == tokens


def test_a_draft_model_sleeps_with_the_target(tiny_model_dirs):
    path = str(tiny_model_dirs["llama"])
    llm = LLM(path, max_model_len=256, device="cpu", enable_sleep_mode=True,
              speculative_config={"model": path, "num_speculative_tokens": 2})
    runner = llm.engine.runner
    tokens = _tokens(llm)
    draft = {name: t.detach().clone() for name, t in runner.draft_model.state_dict().items()}
    llm.sleep(level=2)
    assert runner.draft_kv_cache.numel() == 0
    assert all(p.untyped_storage().nbytes() == 0 for p in runner.draft_model.parameters())
    llm.wake_up()
    llm.collective_rpc("reload_weights")  # the target's; the draft's came back from its host copy
    assert all(torch.equal(t, draft[name]) for name, t in runner.draft_model.state_dict().items())
    assert runner.draft_kv_cache.numel() > 0
    assert _tokens(llm) == tokens


def test_reload_weights_refuses_lora(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=256, device="cpu", enable_sleep_mode=True,
              enable_lora=True)
    with pytest.raises(ValueError, match="does not support --enable-lora yet"):
        llm.collective_rpc("reload_weights")
    llm.sleep(level=1)  # sleeping and waking work: the adapter slots stay on the device
    llm.wake_up()
    assert _tokens(llm)


def test_the_embedded_gguf_model_sleeps_and_wakes():
    llm = LLM(None, max_model_len=256, device="cpu", enable_sleep_mode=True)  # SmolLM2-135M's GGUF, 4-bit codes
    params = SamplingParams(temperature=0.0, max_tokens=8)
    before = llm.generate("The capital of France is", params, use_tqdm=False)[0].outputs[0].text
    llm.sleep(level=1)
    assert _resident_weight_bytes(llm) == 0
    llm.wake_up()
    assert llm.generate("The capital of France is", params, use_tqdm=False)[0].outputs[0].text == before
