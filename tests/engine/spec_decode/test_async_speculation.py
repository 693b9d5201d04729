"""Speculation under asynchronous scheduling: a step whose successor needs its tokens (drafts,
penalties) has them taken in, the next step planned and launched, and only then its detokenization,
stop strings and outputs done. Output stays what it is without speculation, and a request stopped by
a stop string found after its next step was launched leaves no block behind."""

from __future__ import annotations

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .conftest import assert_same_completions
from .test_speculative_engine import GREEDY, MAX_TOKENS, _prompts, _run


def test_async_stops_penalties_and_logprobs_as_without_speculation(tiny_model_dirs):
    model = tiny_model_dirs["llama"]
    prompts = _prompts(3, n=2)
    plain = LLM(str(model), max_model_len=128, block_size=8)
    spec = LLM(str(model), max_model_len=128, block_size=8, async_scheduling=True,
               speculative_config={"model": str(model), "num_speculative_tokens": 4})
    base = plain.generate(prompts, GREEDY, use_tqdm=False)
    text = base[-1].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # found mid-draft, after the next step was launched
    params = [
        SamplingParams(temperature=0.0, max_tokens=7, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop=[stop]),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=[base[-1].outputs[0].token_ids[9]]),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, repetition_penalty=1.5),  # never speculates
    ]
    for p in params:
        want = plain.generate(prompts, p, use_tqdm=False)
        got, _ = _run(model, prompts, None, params=p, llm=spec)  # asserts every block is back
        assert_same_completions(want, got, p)
    counts = spec.engine.speculator.counts
    assert 0 < counts.num_accepted_tokens <= counts.num_draft_tokens


def test_async_speculating_steps_overlap_post_processing_with_the_next_step(tiny_model_dirs):
    # Every step() call after the first launches a step and returns the outputs of the one before,
    # so a speculating request streams a step's tokens per call, with one step in flight.
    model = tiny_model_dirs["llama"]
    llm = LLM(str(model), max_model_len=128, block_size=8, async_scheduling=True,
              speculative_config={"model": str(model), "num_speculative_tokens": 3})
    engine = llm.engine
    engine.add_request(_prompts(4, n=1)[0], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), "r")
    calls, lengths = 0, []
    while engine.has_unfinished_requests():
        outs = engine.step()
        calls += 1
        lengths += [len(o.outputs[0].token_ids) for o in outs]
        assert engine._in_flight is not None or not engine.has_unfinished_requests()
    assert lengths[-1] == 20
    assert calls == len(lengths) + 1  # only the first call returned nothing
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
