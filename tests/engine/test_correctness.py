"""Greedy generation is token-identical to HF transformers on every supported architecture."""

from __future__ import annotations

import random

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .hf_reference import hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _prompts(n: int, seed: int, vocab: int = 49152) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(3, 40))] for _ in range(n)]


def test_single_prompt_matches_hf(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), max_model_len=256)
    prompt = _prompts(1, seed=1)[0]
    out = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(tiny_model_dir, [prompt], 12)[0]
    assert out.outputs[0].finish_reason == "length"


def test_mixed_length_batch_matches_hf(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), max_model_len=256, block_size=8)
    prompts = _prompts(6, seed=2)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(tiny_model_dir, prompts, 12)


def test_text_prompts_and_vllm_prompt_dicts(tiny_model_dirs):
    path = tiny_model_dirs["qwen2"]
    llm = LLM(str(path), max_model_len=256)
    tok = llm.get_tokenizer()
    text = "The quick brown fox"
    ids = tok.encode(text)
    outs = llm.generate([text, {"prompt_token_ids": ids}], GREEDY, use_tqdm=False)
    assert outs[0].prompt == text and outs[0].prompt_token_ids == ids
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids == hf_greedy(path, [ids], 12)[0]
    assert outs[0].outputs[0].text == tok.decode(outs[0].outputs[0].token_ids, skip_special_tokens=True)


@pytest.mark.slow
def test_embedded_model_matches_hf_and_answers(embedded_model_dir):
    llm = LLM(str(embedded_model_dir), dtype="float32", max_model_len=512)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)[0]
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"  # EOS after the answer
    expected = hf_greedy(embedded_model_dir, [out.prompt_token_ids], 16, stop_at_eos=True)[0]
    assert out.outputs[0].token_ids == expected
