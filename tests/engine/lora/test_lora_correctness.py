"""Greedy tokens with LoRA adapters are token-identical to HF transformers + PEFT, for mixed batches of
the base model and three adapters (more adapters than device slots), under chunked prefill, prefix
hits and preemption."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from flotilla.engine.llm import LLM
from flotilla.engine.lora.request import LoRARequest
from flotilla.engine.sampling_params import SamplingParams

from .peft_reference import ADAPTERS, peft_greedy

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
SHARED = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83]


def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [SHARED + [rng.randrange(3, 49152) for _ in range(rng.randint(3, 30))] for _ in range(n)]


@pytest.fixture(scope="module", params=["qwen3"])
def case(request, tiny_model_dirs, lora_adapters):
    """The model, its adapters as LoRARequests, and the oracle's tokens for every (prompt, adapter)."""
    arch = request.param
    model = tiny_model_dirs[arch]
    adapters = lora_adapters[arch]
    loras = {name: LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())}
    prompts = _prompts(3, 8)
    choice = [None, *ADAPTERS][:4]
    plan = [choice[i % 4] for i in range(len(prompts))]  # base, all7, attn, mlp, base, ...
    expected = []
    for name in [None, *ADAPTERS]:
        rows = [i for i, p in enumerate(plan) if p == name]
        outs = peft_greedy(model, adapters[name] if name else None, [prompts[i] for i in rows], MAX_TOKENS)
        expected += list(zip(rows, outs, strict=True))
    want = [tokens for _, tokens in sorted(expected)]
    return model, prompts, [loras[p] if p else None for p in plan], want


def _run(model, prompts, loras, **engine_args):
    engine_args.setdefault("max_model_len", 128)
    llm = LLM(str(model), enable_lora=True, max_lora_rank=16, **engine_args)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    manager = llm.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks, "a block leaked"
    return [o.outputs[0].token_ids for o in outs], llm


def test_adapters_change_the_output(case):
    """The oracle itself: every adapter moves some prompt's greedy tokens off the base model's."""
    model, prompts, loras, want = case
    base = peft_greedy(model, None, prompts, MAX_TOKENS)
    for name in ADAPTERS:
        rows = [i for i, lora in enumerate(loras) if lora is not None and lora.lora_name == name]
        assert any(want[i] != base[i] for i in rows), name


def test_mixed_batch_matches_peft(case):
    """Base and three adapters in every step, three slots: one step holds them all."""
    model, prompts, loras, want = case
    got, llm = _run(model, prompts, loras, max_loras=3)
    assert got == want
    assert llm.engine.runner.lora.num_slot_loads == 3


def test_more_adapters_than_slots_with_chunked_prefill_and_preemption(case):
    """Two slots for three adapters (the scheduler holds back the third, slots are reused LRU), a
    token budget that chunks every prompt, a KV pool so small that requests are preempted, and the
    next step planned while the current one runs (asynchronous scheduling, the GPU default)."""
    model, prompts, loras, want = case
    got, llm = _run(model, prompts, loras, max_loras=2, max_cpu_loras=2, enable_chunked_prefill=True,
                    max_num_batched_tokens=16, num_gpu_blocks_override=12, block_size=8, max_model_len=64,
                    async_scheduling=True)
    assert got == want
    assert llm.engine.runner.lora.num_slot_loads > 3  # an adapter left its slot and came back
    assert llm.engine.scheduler.num_preemptions > 0


def test_prefix_cache_keys_include_the_adapter(case):
    """The same prompts again, each under a different adapter than before: the shared prefix is cached
    per adapter (hits within one adapter, never across), and outputs stay the oracle's."""
    model, prompts, loras, want = case
    llm = LLM(str(model), max_model_len=128, enable_lora=True, max_loras=3, block_size=8)
    first = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    assert [o.outputs[0].token_ids for o in first] == want
    hits_before = llm.engine.block_manager.prefix_cache_hits
    again = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    assert [o.outputs[0].token_ids for o in again] == want
    assert llm.engine.block_manager.prefix_cache_hits > hits_before
    # One adapter for all prompts: rows that ran with another adapter (or none) must not reuse its blocks.
    all7 = next(lora for lora in loras if lora is not None and lora.lora_name == "all7")
    rows = [i for i, lora in enumerate(loras) if lora is None or lora.lora_name != "all7"][:3]
    oracle = peft_greedy(model, Path(all7.lora_path), [prompts[i] for i in rows], MAX_TOKENS)
    outs = llm.generate([prompts[i] for i in rows], GREEDY, use_tqdm=False, lora_request=all7)
    assert [o.outputs[0].token_ids for o in outs] == oracle


def test_padded_lora_graph_inputs_match_peft_on_cpu(case):
    """The CUDA-graph path without the capture: every step (prefills and decodes mixing the base model
    and three adapters) runs from the padded persistent buffers, each token's adapter slot included,
    and gives the oracle's tokens."""
    from flotilla.engine.cuda_graphs import StepGraphs

    model, prompts, loras, want = case
    llm = LLM(str(model), max_model_len=128, enable_lora=True, max_loras=3, max_lora_rank=16, block_size=8,
              max_num_seqs=8)
    runner = llm.engine.runner
    runner.graphs = StepGraphs(runner.model, 8, 512, 128, 8, runner.device, lora=True)
    picked = []
    pick = runner.graphs.pick

    def recording(flat, lora=False):
        key = pick(flat, lora)
        picked.append(key)
        return key

    runner.graphs.pick = recording  # type: ignore[method-assign]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert picked and all(key is not None and key.lora for key in picked)
    assert any(not key.decode for key in picked) and any(key.decode for key in picked)
