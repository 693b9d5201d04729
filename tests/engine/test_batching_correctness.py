"""Continuous batching, chunked prefill, prefix caching and preemption never change greedy outputs,
with steps run one after another or planned while the previous one is in flight (async scheduling)."""

from __future__ import annotations

import random

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams

from .hf_reference import hf_greedy

MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
SYSTEM = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103]


def _prompts(seed: int, n: int = 6, shared_prefix: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = shared_prefix or []
    return [prefix + [rng.randrange(3, 49152) for _ in range(rng.randint(5, 45))] for _ in range(n)]


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def async_scheduling(request) -> bool:
    return request.param


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return tiny_model_dirs["qwen3"]


@pytest.fixture(scope="module")
def expected(model):
    cache = {}

    def get(prompts):
        key = tuple(map(tuple, prompts))
        if key not in cache:
            cache[key] = hf_greedy(model, prompts, MAX_TOKENS)
        return cache[key]

    return get


def _generate(model, prompts, **engine_args):
    llm = LLM(str(model), max_model_len=128, **engine_args)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    manager = llm.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks, "a block leaked"
    return [o.outputs[0].token_ids for o in outs], llm


def test_chunked_prefill_with_a_tiny_token_budget(model, expected, async_scheduling):
    prompts = _prompts(1)
    tokens, llm = _generate(
        model,
        prompts,
        async_scheduling=async_scheduling,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        block_size=8,
    )
    assert tokens == expected(prompts)
    assert max(llm.engine.stats.step_tokens) <= 16


def test_prefix_hits_on_a_shared_prefix_batch(model, expected, async_scheduling):
    prompts = _prompts(2, shared_prefix=SYSTEM)
    llm = LLM(str(model), max_model_len=128, async_scheduling=async_scheduling, block_size=8)
    first = llm.generate(prompts[:1], GREEDY, use_tqdm=False)
    rest = llm.generate(prompts[1:], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first + rest] == expected(prompts)
    assert llm.engine.block_manager.prefix_cache_hits >= (len(prompts) - 1) * 24


def test_preemption_with_a_tiny_block_pool(model, expected, async_scheduling):
    prompts = _prompts(3)
    # 16 blocks of 8 tokens: not enough for six sequences of up to 55 tokens at once.
    tokens, llm = _generate(model, prompts, async_scheduling=async_scheduling, block_size=8, num_gpu_blocks_override=16)
    assert tokens == expected(prompts)
    assert llm.engine.scheduler.num_preemptions > 0


def test_all_three_at_once(model, expected, async_scheduling):
    prompts = _prompts(4, n=8, shared_prefix=SYSTEM)
    tokens, llm = _generate(
        model,
        prompts,
        async_scheduling=async_scheduling,
        block_size=8,
        num_gpu_blocks_override=16,
        enable_chunked_prefill=True,
        max_num_batched_tokens=24,
        max_num_seqs=5,
    )
    assert tokens == expected(prompts)
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.block_manager.prefix_cache_hits > 0
    assert max(llm.engine.stats.step_tokens) <= 24


def test_features_off_gives_the_same_tokens(model, expected, async_scheduling):
    prompts = _prompts(5, shared_prefix=SYSTEM)
    tokens, _ = _generate(model, prompts, async_scheduling=async_scheduling, enable_prefix_caching=False)
    assert tokens == expected(prompts)


def test_requests_arriving_while_others_decode(model, expected, async_scheduling):
    prompts = _prompts(6, n=6, shared_prefix=SYSTEM[:16])
    engine = LLMEngine.from_kwargs(
        str(model),
        max_model_len=128,
        block_size=8,
        enable_chunked_prefill=True,
        max_num_batched_tokens=32,
        async_scheduling=async_scheduling,
    )
    requests = []
    pending = list(prompts)
    steps = 0
    while pending or engine.has_unfinished_requests():
        if pending and steps % 3 == 0:  # a new request every third step, mid-decode of the others
            requests.append(engine.add_request(pending.pop(0), GREEDY))
        engine.step()
        steps += 1
    assert [r.output_token_ids for r in requests] == expected(prompts)


def test_a_prefix_hit_saves_exactly_the_hit_length(model, async_scheduling):
    prompt = SYSTEM + [500, 600, 700, 800, 900]  # 29 tokens = 3 full blocks of 8 + 5
    llm = LLM(str(model), max_model_len=128, async_scheduling=async_scheduling, block_size=8)
    runner, manager = llm.engine.runner, llm.engine.block_manager
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([prompt], params, use_tqdm=False)
    fed_cold, hits_cold = runner.num_tokens_fed, manager.prefix_cache_hits
    llm.generate([prompt[:24] + [901, 902, 903]], params, use_tqdm=False)
    assert fed_cold == 29 and hits_cold == 0
    assert runner.num_tokens_fed - fed_cold == 27 - 24
    assert manager.prefix_cache_hits == 24
    assert manager.prefix_cache_queries == 29 + 27
