"""Speculative decoding never changes greedy output: both proposers, every architecture, under
chunked prefill, prefix hits and preemption; stops, max_tokens and logprobs as without it; every
KV block back in the pool after finish, abort and preemption."""

from __future__ import annotations

import random

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from ..hf_reference import hf_greedy
from .conftest import assert_same_completions

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SYSTEM = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103]


def _prompts(seed: int, n: int, shared_prefix: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = [(shared_prefix or []) + [rng.randrange(3, 49152) for _ in range(rng.randint(5, 30))] for _ in range(n)]
    block = [rng.randrange(3, 49152) for _ in range(6)]
    return [*prompts, block * 4 + block[:2]]  # one with repetitions: the lookup finds matches


def _run(model, prompts, speculative_config, params=GREEDY, llm=None, **engine_args):
    if llm is None:
        llm = LLM(str(model), max_model_len=128, block_size=8, speculative_config=speculative_config, **engine_args)
    outs = llm.generate(prompts, params, use_tqdm=False)
    manager = llm.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks, "a block leaked"
    assert all(b.ref_count == 0 for b in manager.blocks)
    return outs, llm


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_greedy_output_matches_hf_with_both_proposers(tiny_model_dir, tiny_model_dirs):
    # Deterministic (fp32 on the CPU): with these prompts and lengths every architecture's output
    # repeats itself enough for the lookup to get drafts accepted.
    prompts, params = _prompts(1, n=3), SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    expected = hf_greedy(tiny_model_dir, prompts, 24)
    outs, llm = _run(tiny_model_dir, prompts, NGRAM, params=params)
    assert _tokens(outs) == expected
    counts = llm.engine.speculator.counts
    assert counts.num_drafts > 0 and counts.num_accepted_tokens > 0
    # The model as its own draft: every draft is accepted, so each step outputs k + 1 tokens.
    outs, llm = _run(tiny_model_dir, prompts, {"model": str(tiny_model_dir), "num_speculative_tokens": 3},
                     params=params)
    assert _tokens(outs) == expected
    counts = llm.engine.speculator.counts
    assert counts.num_accepted_tokens == counts.num_draft_tokens > 0


def test_a_poor_draft_model_changes_nothing(tiny_model_dirs):
    model = tiny_model_dirs["mistral"]
    prompts = _prompts(7, n=2)
    # Another architecture as the draft (same tokenizer): mostly rejected, output unchanged.
    outs, llm = _run(model, prompts, {"model": str(tiny_model_dirs["qwen2"]), "num_speculative_tokens": 3})
    assert _tokens(outs) == hf_greedy(model, prompts, MAX_TOKENS)
    counts = llm.engine.speculator.counts
    assert counts.num_accepted_tokens < counts.num_draft_tokens


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_chunked_prefill_prefix_hits_and_preemption(tiny_model_dirs, proposer, async_scheduling):
    """Greedy output equals HF's with chunked prefill, prefix-cache hits and preemption, with the scheduler
    synchronous or asynchronous (a step's drafts taken in before the next step is launched)."""
    model = tiny_model_dirs["qwen3"]
    prompts = _prompts(2, n=4, shared_prefix=SYSTEM)
    config = NGRAM if proposer == "ngram" else {"model": str(model), "num_speculative_tokens": 3}
    outs, llm = _run(
        model, prompts, config, async_scheduling=async_scheduling,
        num_gpu_blocks_override=16, enable_chunked_prefill=True, max_num_batched_tokens=24, max_num_seqs=5,
    )
    assert _tokens(outs) == hf_greedy(model, prompts, MAX_TOKENS)
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.block_manager.prefix_cache_hits > 0
    assert max(llm.engine.stats.step_tokens) <= 24
    counts = llm.engine.speculator.counts
    assert counts.num_drafts > 0
    if proposer == "draft":  # the model as its own draft: accepted (the lookup's luck varies with prompts)
        assert counts.num_accepted_tokens == counts.num_draft_tokens


def test_stops_max_tokens_and_logprobs_as_without_speculation(tiny_model_dirs):
    model = tiny_model_dirs["llama"]
    prompts = _prompts(3, n=2)
    plain = LLM(str(model), max_model_len=128, block_size=8)
    spec = LLM(str(model), max_model_len=128, block_size=8,
               speculative_config={"model": str(model), "num_speculative_tokens": 4})
    base = plain.generate(prompts, GREEDY, use_tqdm=False)
    # A stop string from the middle of the repetitive prompt's output, which drafts will cover.
    text = base[-1].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = [
        SamplingParams(temperature=0.0, max_tokens=7, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop=[stop]),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=[base[-1].outputs[0].token_ids[9]]),
    ]
    for p in params:
        want = plain.generate(prompts, p, use_tqdm=False)
        got, _ = _run(model, prompts, None, params=p, llm=spec)
        assert_same_completions(want, got, p)
    assert spec.engine.speculator.counts.num_accepted_tokens > 0


@pytest.mark.parametrize("stop_at", [1, 2, 6])
def test_a_stop_token_inside_the_accepted_drafts_with_logprobs(tiny_model_dirs, stop_at):
    """A stop token (EOS, stop_token_ids) among the accepted drafts cuts the step's tokens there, but the
    logprobs of the cut tokens were still walked: IndexError, and the request failed instead of stopping."""
    model = tiny_model_dirs["llama"]
    prompt = [101, 2034, 887, 41, 9000, 77, 5, 16000, 123, 4567, 88, 12]
    plain = LLM(str(model), max_model_len=128, block_size=8)
    spec = LLM(str(model), max_model_len=128, block_size=8,
               speculative_config={"model": str(model), "num_speculative_tokens": 3})  # the draft is the target
    base = plain.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2, stop_token_ids=[base[stop_at]])
    want = plain.generate([prompt], params, use_tqdm=False)
    got, _ = _run(model, [prompt], None, params=params, llm=spec)
    assert_same_completions(want, got, params)
    assert len(got[0].outputs[0].token_ids) == stop_at + 1 and got[0].outputs[0].finish_reason == "stop"


def test_abort_mid_speculation_returns_every_block(tiny_model_dirs):
    model = tiny_model_dirs["llama"]
    llm = LLM(str(model), max_model_len=128, block_size=8, speculative_config={"model": str(model),
                                                                              "num_speculative_tokens": 4})
    engine, manager = llm.engine, llm.engine.block_manager
    for i, prompt in enumerate(_prompts(4, n=3)):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True), str(i))
    for _ in range(4):
        engine.step()
    assert engine.speculator.counts.num_drafts > 0
    assert manager.num_free_blocks < manager.num_blocks
    engine.abort([str(i) for i in range(4)])
    assert manager.num_free_blocks == manager.num_blocks and not engine.has_unfinished_requests()


def test_load_rule_skips_speculation_above_the_batch_size(tiny_model_dirs):
    model = tiny_model_dirs["llama"]
    prompts = _prompts(5, n=3)
    config = {"model": str(model), "num_speculative_tokens": 3, "disable_by_batch_size": 2}
    outs, llm = _run(model, prompts, config)
    assert _tokens(outs) == hf_greedy(model, prompts, MAX_TOKENS)
    # Four requests of equal output length run together to the end: never below the batch size.
    assert llm.engine.speculator.counts.num_drafts == 0
    outs, llm = _run(model, prompts[:1], config)
    assert _tokens(outs) == hf_greedy(model, prompts[:1], MAX_TOKENS)
    assert llm.engine.speculator.counts.num_drafts > 0  # alone, it speculates


def test_seeded_sampling_with_speculation_is_reproducible(tiny_model_dirs):
    model = tiny_model_dirs["llama"]
    prompts = _prompts(6, n=1)
    # A tiny random model's distribution is nearly flat at temperature 1 (top token ~3e-4 over 49k):
    # at 0.1 its top token has ~0.4, so the (argmax) drafts are sometimes accepted.
    params = SamplingParams(temperature=0.1, top_p=0.95, seed=7, max_tokens=MAX_TOKENS)
    config = {"model": str(model), "num_speculative_tokens": 3}
    first, llm = _run(model, prompts, config, params=params)
    second, _ = _run(model, prompts, config, params=params, llm=llm)
    assert _tokens(first) == _tokens(second)
    assert all(len(t) == MAX_TOKENS for t in _tokens(first))
    assert llm.engine.speculator.counts.num_accepted_tokens > 0


def test_a_seeded_request_draws_the_same_tokens_with_or_without_speculation_whatever_else_runs(tiny_model_dirs):
    """`seed` makes a request's draws reproducible whatever else runs. Verification drew a position's token by
    one rule when it was a draft row (a coin against p(draft), else the residual) and by the sampler's when
    it was not (a bonus row, or a step that did not speculate), so a seeded request's tokens depended on its
    neighbours: here the load rule (disable_by_batch_size=2) turned speculation off while another request ran."""
    model = tiny_model_dirs["llama"]
    prompt = [101, 2034, 887, 41, 9000, 77, 5, 16000, 123, 4567, 88, 12]
    # At temperature 0.1 the tiny model's top token has ~0.4: drafts (the argmax) are often accepted.
    seeded = SamplingParams(temperature=0.1, top_p=0.95, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True)
    plain = LLM(str(model), max_model_len=128, block_size=8)
    spec = LLM(str(model), max_model_len=128, block_size=8, speculative_config={
        "model": str(model), "num_speculative_tokens": 3, "disable_by_batch_size": 2})
    want = plain.generate([prompt], seeded, use_tqdm=False)[0].outputs[0].token_ids
    alone = spec.generate([prompt], seeded, use_tqdm=False)[0].outputs[0].token_ids
    accepted = spec.engine.speculator.counts.num_accepted_tokens
    beside = spec.generate([prompt, [5, 6, 7]], [seeded, GREEDY], use_tqdm=False)[0].outputs[0].token_ids
    assert accepted > 0
    assert alone == want and beside == want


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_draft_model_recomputes_a_preempted_requests_kv_when_it_resumes(tiny_model_dirs, async_scheduling):
    """A preempted request resumes in fresh blocks, recomputed by the target in steps where nothing speculates
    (its prompt again, alone): the draft's K/V there must be recomputed too before it drafts, or its drafts come
    from another request's K/V and are rejected. The model as its own draft keeps every draft accepted."""
    model = tiny_model_dirs["qwen3"]
    prompts = _prompts(5, n=2)[:2]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    llm = LLM(str(model), max_model_len=80, block_size=8, speculative_config={"model": str(model),
              "num_speculative_tokens": 3}, enable_prefix_caching=False, num_gpu_blocks_override=11, max_num_seqs=2,
              async_scheduling=async_scheduling)
    outs, _ = _run(model, prompts, None, params=params, llm=llm)
    assert _tokens(outs) == hf_greedy(model, prompts, 40)
    assert llm.engine.scheduler.num_preemptions > 0
    counts = llm.engine.speculator.counts
    assert counts.num_accepted_tokens == counts.num_draft_tokens > 0
