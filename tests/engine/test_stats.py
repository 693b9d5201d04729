"""The engine's one read-only view for front ends: a frozen stats snapshot, and the Prometheus exporter
built from snapshots alone (issue 16.3)."""

from __future__ import annotations

import dataclasses

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams
from flotilla.engine.server.metrics import EngineMetrics
from flotilla.engine.stats import EngineEvents, FinishedRequest, StatsSnapshot


def test_snapshot_reports_the_run_and_drains_its_samples(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=64)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    llm.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True, temperature=0), use_tqdm=False)
    snapshot = llm.engine.stats_snapshot()
    assert (snapshot.prompt_tokens, snapshot.generation_tokens) == (7, 6)
    assert (snapshot.num_running, snapshot.num_waiting, snapshot.kv_cache_usage) == (0, 0, 0.0)
    assert snapshot.num_gpu_blocks == llm.engine.block_manager.num_blocks > 0
    assert sorted(f.generation_tokens for f in snapshot.events.finished) == [3, 3]
    assert len(snapshot.events.ttft) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.num_running = 1  # type: ignore[misc]
    again = llm.engine.stats_snapshot()
    assert again.events == EngineEvents()  # samples are reported once
    assert again.generation_tokens == 6  # counters stay cumulative


def _metrics(tiny_model_dirs) -> EngineMetrics:
    from flotilla.engine.config import EngineConfig

    return EngineMetrics(EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64), "tiny")


def test_metrics_come_from_snapshots_alone(tiny_model_dirs):
    metrics = _metrics(tiny_model_dirs)
    finished = FinishedRequest("length", 4, 3, 1.0, 0.1, 0.2, 0.7)
    metrics.update(StatsSnapshot(num_running=2, num_waiting=1, kv_cache_usage=0.25, num_gpu_blocks=40,
                                 prompt_tokens=10, generation_tokens=5,
                                 events=EngineEvents(ttft=(0.01,), finished=(finished,))))
    metrics.update(StatsSnapshot(num_gpu_blocks=40, prompt_tokens=12, generation_tokens=9))
    text = metrics.render().decode()
    assert 'vllm:num_requests_running{model_name="tiny"} 0.0' in text
    assert 'vllm:prompt_tokens_total{model_name="tiny"} 12.0' in text
    assert 'vllm:generation_tokens_total{model_name="tiny"} 9.0' in text
    assert 'vllm:request_success_total{finished_reason="length",model_name="tiny"} 1.0' in text
    assert 'vllm:time_to_first_token_seconds_count{model_name="tiny"} 1.0' in text
    assert 'num_gpu_blocks="40"' in text and 'calculate_kv_scales="False"' in text
    assert "_created" not in text


def test_every_series_exists_at_zero_before_any_event(tiny_model_dirs):
    text = _metrics(tiny_model_dirs).render().decode()
    for series in ('vllm:num_preemptions_total{model_name="tiny"} 0.0',
                   'vllm:request_success_total{finished_reason="abort",model_name="tiny"} 0.0',
                   'vllm:gpu_prefix_cache_hits_total{model_name="tiny"} 0.0',
                   'vllm:num_requests_swapped{model_name="tiny"} 0.0',
                   'vllm:request_max_num_generation_tokens_count{model_name="tiny"} 0.0'):
        assert series in text, series


def test_prefix_cache_counters_count_each_request_once_at_admission(tiny_model_dirs):
    """vllm:prefix_cache_queries / _hits count a request's look-up once, when it is admitted (vLLM PR #48860):
    not again at each step it waits for blocks, and not when a preempted request resumes on its own blocks (vLLM
    counts those apart, in counters no metric reads). Four prompts that share nothing: 160 tokens queried, 0 hit."""
    prompts = [[100 + 40 * i + j for j in range(40)] for i in range(4)]
    # 18 blocks of 8 tokens: two requests of 70 tokens at most fit, so the others wait and the batch preempts.
    llm = LLM(str(tiny_model_dirs["qwen3"]), max_model_len=128, block_size=8, num_gpu_blocks_override=18)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), use_tqdm=False)
    snapshot = llm.engine.stats_snapshot()
    assert snapshot.num_preemptions > 0
    assert (snapshot.prefix_cache_queries, snapshot.prefix_cache_hits) == (160, 0)


def test_a_forked_completion_resumed_after_preemption_counts_no_second_look_up(tiny_model_dirs):
    """Completions forked off their leader are preempted under a small pool and resume on their own prompt: each
    counted its look-up once, when it forked (it was counted again when it resumed, as if new)."""
    prompts = [[100 + 40 * i + j for j in range(40)] for i in range(3)]
    llm = LLM(str(tiny_model_dirs["qwen3"]), max_model_len=128, block_size=8, num_gpu_blocks_override=18)
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=30, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    snapshot = llm.engine.stats_snapshot()
    assert snapshot.num_preemptions > 0
    assert (snapshot.prefix_cache_queries, snapshot.prefix_cache_hits) == (3 * 2 * 40, 3 * 32)


@pytest.mark.parametrize("max_num_seqs", [8, 1], ids=["forked", "queued"])
def test_each_of_n_completions_counts_a_prefix_cache_look_up(tiny_model_dirs, max_num_seqs):
    """vLLM runs a request's n completions as n engine requests (vllm/v1/engine/parallel_sampling.py), each looked
    up in the prefix cache once (kv_cache_manager.record_prefix_cache_stats): n x the prompt queried, and the later
    completions hit the first one's full blocks below the prompt's last token. The counters read the same whether
    the completions fork off the first one's prompt at once (slots free) or wait for a slot and find its blocks in
    the cache; forked ones share the prompt's blocks and compute none of it."""
    prompt = [100 + j for j in range(29)]  # 3 full blocks of 8 and 5 tokens
    llm = LLM(str(tiny_model_dirs["qwen3"]), max_model_len=64, block_size=8, max_num_seqs=max_num_seqs)
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=4, ignore_eos=True)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    snapshot = llm.engine.stats_snapshot()
    assert (snapshot.prefix_cache_queries, snapshot.prefix_cache_hits) == (3 * 29, 2 * 24)
    assert out.num_cached_tokens == 0  # the first completion's look-up: usage's cached_tokens
    if max_num_seqs == 8:  # the prompt once, then 3 completions x 3 tokens fed after their first
        assert llm.engine.runner.num_tokens_fed == 29 + 3 * 3


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_generation_tokens_count_the_tokens_requests_received(tiny_model_dirs, async_scheduling):
    """A request that stops on a token while its next step is already in flight (asynchronous scheduling) gets
    no token from that step: vllm:generation_tokens does not count it (vLLM drops a finished request's output of
    such a step before any counter sees it)."""
    llm = LLM(str(tiny_model_dirs["qwen3"]), max_model_len=96, async_scheduling=async_scheduling)
    prompt = [5, 900, 31, 4000, 77, 12345]
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    tokens = free[0].outputs[0].token_ids
    stop = next(i for i in range(2, 10) if tokens[i] not in tokens[:i])  # the first new token from the third on
    before = llm.engine.stats.generation_tokens
    params = SamplingParams(temperature=0, max_tokens=10, n=2, stop_token_ids=[tokens[stop]])
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == [tokens[: stop + 1]] * 2
    assert llm.engine.stats.generation_tokens - before == 2 * (stop + 1)
