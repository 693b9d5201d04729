"""The Llama CPU decode step as plain calls (`engine/models/llama_cpu_decode.py`) against the module path: at every
decode step of real generations, both run from the same KV cache and must give bit-identical hidden states and
write bit-identical K/V."""

from __future__ import annotations

import pytest
import torch

import flotilla.engine.models.llama as llama
import flotilla.engine.models.llama_cpu_decode as fast
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .gguf_files import write_tiny_llama_gguf

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13] * 10, list(range(40, 60))]


def _checked(llm: LLM) -> list[int]:
    """Route the model's fast decode steps through a check against the module path; returns a list whose length
    is the number of steps checked."""
    model = llm.engine.runner.model
    attns = [layer.self_attn.attn for layer in model.layers]
    original = llama.cpu_decode_forward
    checked: list[int] = []

    def both(m, plans, hidden, positions, meta):
        before = [(a.k_cache.clone(), a.v_cache.clone()) for a in attns]
        got = original(m, plans, hidden.clone(), positions, meta)
        after = [(a.k_cache.clone(), a.v_cache.clone()) for a in attns]
        for a, (k, v) in zip(attns, before, strict=True):
            a.k_cache.copy_(k)
            a.v_cache.copy_(v)
        meta.derived.clear()
        fast.CPU_DECODE_LAYERS = False
        try:
            want = m.forward(m._cpu_input_ids, positions)
        finally:
            fast.CPU_DECODE_LAYERS = True
        assert torch.equal(got, want)
        for a, (k, v) in zip(attns, after, strict=True):
            assert torch.equal(a.k_cache, k) and torch.equal(a.v_cache, v)
        checked.append(hidden.shape[0])
        return got

    forward = model.forward

    def keep_ids(input_ids, positions):
        model._cpu_input_ids = input_ids
        return forward(input_ids, positions)

    llama.cpu_decode_forward = both
    model.forward = keep_ids
    return checked


@pytest.fixture(autouse=True)
def _restore():
    # As they were (FLOTILLA_CPU_DECODE_LAYERS may have turned the layers off), for the tests after these.
    original, layers = llama.cpu_decode_forward, fast.CPU_DECODE_LAYERS
    yield
    llama.cpu_decode_forward = original
    fast.CPU_DECODE_LAYERS = layers


def _generate(llm: LLM, prompts: list[list[int]], tokens: int = 12) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                               use_tqdm=False)]


def test_a_gguf_models_decode_steps_are_bit_identical_one_row_and_batched(tmp_path, embedded_model_dir):
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", 256)
    llm = LLM(str(path), tokenizer=str(embedded_model_dir), dtype="bfloat16", max_model_len=256,
              enable_prefix_caching=False)
    checked = _checked(llm)
    _generate(llm, PROMPTS[:1])
    _generate(llm, PROMPTS)
    assert llm.engine.runner.model._cpu_plan  # the plan was made: every linear is an int4 weight
    assert 1 in checked and 3 in checked


@pytest.mark.parametrize(("arch", "dtype"), [("llama", "bfloat16"), ("llama3-rope-tied", "bfloat16"),
                                             ("qwen2", "bfloat16"), ("llama", "float16")])
def test_dense_decode_steps_are_bit_identical(tiny_model_dirs, arch, dtype):
    # qwen2: the QKV projection's bias
    llm = LLM(str(tiny_model_dirs[arch]), dtype=dtype, max_model_len=256, enable_prefix_caching=False)
    checked = _checked(llm)
    _generate(llm, PROMPTS)
    assert checked and 3 in checked


def test_biases_everywhere_are_bit_identical(tmp_path, embedded_model_dir):
    # attention_bias and mlp_bias: the row-parallel o_proj and down_proj add theirs after the matmul
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         attention_bias=True, mlp_bias=True, initializer_range=0.1)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="bfloat16", max_model_len=256, enable_prefix_caching=False)
    checked = _checked(llm)
    _generate(llm, PROMPTS)
    assert checked and 3 in checked


def test_the_module_path_stays_where_the_plan_cannot_follow(tiny_model_dirs):
    fp32 = LLM(str(tiny_model_dirs["llama"]), dtype="float32", max_model_len=256)
    qk_norm = LLM(str(tiny_model_dirs["qwen3"]), dtype="bfloat16", max_model_len=256)
    for llm in (fp32, qk_norm):
        checked = _checked(llm)
        _generate(llm, PROMPTS[:1], 3)
        assert llm.engine.runner.model._cpu_plan is None and not checked


def test_the_switch_gives_the_same_tokens(tmp_path, embedded_model_dir):
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", 256, linear="Q4_1")
    llm = LLM(str(path), tokenizer=str(embedded_model_dir), dtype="bfloat16", max_model_len=256)
    on = _generate(llm, PROMPTS)
    fast.CPU_DECODE_LAYERS = False
    assert _generate(llm, PROMPTS) == on


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_fewer_op_rms_norm_is_the_references_bit_for_bit(dtype):
    from flotilla.kernels.layernorm import rms_norm_ref

    gen = torch.Generator().manual_seed(3)
    for size, eps in ((576, 1e-5), (64, 1e-6), (1000, 1e-5)):
        weight = (torch.randn(size, generator=gen) * 0.5 + 1).to(dtype)
        for scale in (1e-3, 0.1, 1.0, 7.0, 60.0):
            x = (torch.randn(9, size, generator=gen) * scale).to(dtype)
            got = fast._rms_norm(x, weight, fast._scalar(eps), fast._scalar(size))
            assert torch.equal(got, rms_norm_ref(x, weight, eps)[0]), (size, scale)
