"""The paged KV cache is really used: decode feeds one token per sequence, the blocks hold the state."""

from __future__ import annotations

import torch

from flotilla.engine.llm import LLM
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.sampling_params import SamplingParams

PROMPTS = [[5, 17, 300, 4000, 21, 9], [42] * 23, list(range(100, 137))]


def test_decode_steps_feed_exactly_one_token_per_sequence(tiny_model_dirs):
    engine = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=128)
    for p in PROMPTS:
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    fed = []
    while engine.has_unfinished_requests():
        plan_sizes = []
        original = engine.runner.prepare_inputs

        def spy(flat, original=original, sizes=plan_sizes):
            inputs = original(flat)
            sizes.append((flat.num_seqs, int(inputs.input_ids.numel())))
            return inputs

        engine.runner.prepare_inputs = spy
        engine.step()
        engine.runner.prepare_inputs = original
        fed += plan_sizes
    prefill, *decodes = fed
    assert prefill == (3, sum(map(len, PROMPTS)))
    assert decodes and all(tokens == seqs for seqs, tokens in decodes)
    assert len(decodes) == 4  # 5 tokens: one from the prefill, four from decode steps


def test_corrupting_a_sequences_blocks_changes_its_next_token(tiny_model_dirs):
    engine = LLMEngine.from_kwargs(str(tiny_model_dirs["qwen2"]), max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    victim = engine.add_request(PROMPTS[2], params)
    bystander = engine.add_request(PROMPTS[1], params)
    engine.step()  # prefill both
    reference = LLM(str(tiny_model_dirs["qwen2"]), max_model_len=128).generate(
        [PROMPTS[2], PROMPTS[1]], params, use_tqdm=False
    )
    kv = engine.runner.kv_cache
    kv[:, :, victim.block_ids] = torch.randn_like(kv[:, :, victim.block_ids]) * 10
    while engine.has_unfinished_requests():
        engine.step()
    assert victim.output_token_ids[0] == reference[0].outputs[0].token_ids[0]  # sampled before corruption
    assert victim.output_token_ids[1:] != reference[0].outputs[0].token_ids[1:]
    assert bystander.output_token_ids == reference[1].outputs[0].token_ids  # other blocks untouched


def test_every_block_returns_to_the_pool(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=128, block_size=8)
    manager = llm.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=20), use_tqdm=False)
    assert manager.num_free_blocks == manager.num_blocks
    assert all(b.ref_count == 0 for b in manager.blocks)
    llm.engine.add_request(PROMPTS[0], SamplingParams(max_tokens=50))
    llm.engine.step()
    assert manager.num_free_blocks < manager.num_blocks
    llm.engine.abort(["0"] if "0" in llm.engine.scheduler.requests else list(llm.engine.scheduler.requests))
    assert manager.num_free_blocks == manager.num_blocks
    assert not llm.engine.has_unfinished_requests()
