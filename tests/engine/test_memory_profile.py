"""--gpu-memory-utilization is this engine's budget (vLLM's rule): its own weights, activation peak and growth outside
torch are charged, memory held before it started is not, and it refuses to start when the budget is not free. An
engine that is shut down or dropped gives its KV pool back."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import weakref
from pathlib import Path

import pytest
import torch

from flotilla.engine.async_engine import AsyncEngine
from flotilla.engine.cuda_graphs import GraphKey, StepGraphs
from flotilla.engine.llm import LLM
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.memory_profile import (
    GIB,
    MIN_GRAPH_BYTES,
    GraphSample,
    MemorySnapshot,
    graph_bytes,
    graph_capture_note,
    graph_estimate,
    graph_sample_indices,
    memory_profile,
    requested_bytes,
)
from flotilla.engine.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from model_dirs import make_model_dir

TOTAL = 80 * GIB
CONTEXT = GIB // 2  # the CUDA context: outside torch, held before any engine
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _snapshot(allocated: int, reserved: int, non_torch: int) -> MemorySnapshot:
    return MemorySnapshot(TOTAL - reserved - non_torch, TOTAL, allocated, reserved)


def _start_engine(held: int, held_non_torch: int) -> tuple[int, int]:
    """One engine's profile on a device where `held` torch bytes and `held_non_torch` other bytes are in use:
    weights 2 GiB, a 3 GiB activation peak, 0.25 GiB of cuBLAS workspace. Returns (its KV bytes, all it holds)."""
    start = _snapshot(held, held, held_non_torch)
    loaded = _snapshot(held + 2 * GIB, held + 2 * GIB, held_non_torch)
    end = _snapshot(held + 2 * GIB, held + 2 * GIB, held_non_torch + GIB // 4)
    profile = memory_profile(start, loaded, end, held + 5 * GIB, 0.3, penalty_tables=GIB // 8)
    assert (profile.weights, profile.activations, profile.non_torch) == (2 * GIB, 3 * GIB, GIB // 4)
    assert profile.held_before == held + held_non_torch
    return profile.kv_cache, profile.requested


def test_two_engines_at_0_3_on_one_gpu_each_get_the_pool_one_alone_would():
    first_kv, first_holds = _start_engine(0, CONTEXT)
    assert first_kv == int(0.3 * TOTAL) - 2 * GIB - 3 * GIB - GIB // 4 - GIB // 8
    # The first engine holds its whole budget (weights, pool, workspace); the second starts beside it.
    second_kv, second_holds = _start_engine(first_holds - GIB // 4, CONTEXT + GIB // 4)
    assert second_kv == first_kv
    assert CONTEXT + first_holds + second_holds <= TOTAL  # both fit on the device


def test_a_budget_the_device_does_not_have_free_refuses_to_start():
    held = 60 * GIB  # another engine or process: 20 GiB free, less than 0.3 x 80 GiB
    with pytest.raises(ValueError, match=r"free memory on the device at start-up \(19\.50 of 80\.00 GiB\) is less "
                                         r"than --gpu-memory-utilization 0\.3 asks for \(24\.00 GiB\)"):
        _start_engine(held, CONTEXT)
    assert requested_bytes(_snapshot(held, held, CONTEXT), 0.2) == int(0.2 * TOTAL)  # a smaller budget fits


def test_the_weights_are_the_growth_across_loading_not_what_was_held():
    start = _snapshot(7 * GIB, 8 * GIB, CONTEXT)  # an earlier engine's tensors, and the allocator's cache
    loaded = _snapshot(8 * GIB, 9 * GIB, CONTEXT)
    end = _snapshot(8 * GIB, 9 * GIB, CONTEXT)
    profile = memory_profile(start, loaded, end, 8 * GIB + GIB // 2, 0.5, 0)
    assert (profile.weights, profile.activations, profile.non_torch) == (GIB, GIB // 2, 0)
    assert profile.kv_cache == 40 * GIB - GIB - GIB // 2


def test_the_graphs_captured_before_the_pool_is_sized_are_charged_so_their_capture_after_it_fits():
    # At 0.95, with the CUDA graphs' capture (after the pool) taking 1.5 GiB, 0.25 GiB of it outside torch.
    start = _snapshot(0, 0, CONTEXT)
    loaded = end = _snapshot(2 * GIB, 2 * GIB, CONTEXT)
    captured = _snapshot(2 * GIB + GIB // 4, 3 * GIB + GIB // 4, CONTEXT + GIB // 4)
    assert graph_bytes(end, captured) == GIB + GIB // 2
    assert graph_bytes(captured, end) == 0  # a capture never gives memory back
    profile = memory_profile(start, loaded, end, 3 * GIB, 0.95, 0, cuda_graphs=graph_bytes(end, captured))
    assert profile.kv_cache == int(0.95 * TOTAL) - 2 * GIB - GIB - GIB - GIB // 2
    assert "CUDA graphs 1.50 GiB" in profile.describe(0.95, TOTAL)
    # Weights, pool and graphs, all held after start-up, stay within the budget; the activation peak's room is left.
    assert CONTEXT + profile.weights + profile.kv_cache + profile.cuda_graphs == \
        CONTEXT + int(0.95 * TOTAL) - profile.activations
    uncharged = memory_profile(start, loaded, end, 3 * GIB, 0.95, 0)
    assert uncharged.kv_cache - profile.kv_cache == GIB + GIB // 2  # what a capture after the pool would overrun


MIB = 2**20
HIDDEN_BYTES = 4096 * 2  # a Llama-3.1-8B token's bf16 hidden state: what a graph keeps as its output, a token


def _server_keys() -> list[GraphKey]:
    """The 110 graphs `flotilla serve --max-model-len 4096 --max-num-seqs 512 --max-num-batched-tokens 16384
    --max-cudagraph-capture-size 4096` captures, in capture order."""
    graphs = StepGraphs(torch.nn.Identity(), 512, 16384, 4096, 16, torch.device("cpu"), max_capture_size=4096,
                        one_seq_graphs=True)
    return graphs.keys()


def _samples(keys: list[GraphKey], costs_mib: list[float]) -> tuple[list[GraphSample], list[int]]:
    """The profile's samples of `keys` (their costs given, their outputs a hidden state a token) and the other
    graphs' token counts."""
    picked = graph_sample_indices([key.kind for key in keys])
    assert len(picked) == len(costs_mib)
    samples, kinds = [], set()
    for i, cost in zip(picked, costs_mib, strict=True):
        samples.append(GraphSample(keys[i].tokens, int(cost * MIB), keys[i].tokens * HIDDEN_BYTES,
                                   keys[i].kind in kinds))
        kinds.add(keys[i].kind)
    return samples, [key.tokens for i, key in enumerate(keys) if i not in picked]


def test_the_profile_samples_each_kind_s_largest_graph_and_two_more():
    keys = _server_keys()
    assert len(keys) == 110
    picked = [keys[i] for i in graph_sample_indices([key.kind for key in keys])]
    # Mixed at 4,096 tokens at both table widths, two more of them (3,840), then the first decode and the first
    # one-sequence graphs at each width: every kind's largest, in the capture's order.
    assert [(k.kind[0], k.tokens, k.width * 16) for k in picked] == [
        ("mixed", 4096, 4096), ("mixed", 4096, 1024), ("mixed", 3840, 4096), ("mixed", 3840, 1024),
        ("decode", 512, 4096), ("decode", 512, 1024),
        ("one-sequence mixed", 128, 4096), ("one-sequence mixed", 128, 1024),
    ]
    assert graph_sample_indices(["a", "a", "b", "a", "b", "a"], repeats=1) == [0, 1, 2]
    assert graph_sample_indices([]) == []


def test_the_graphs_estimate_charges_the_graphs_not_sampled_their_outputs_not_the_second_s_cost():
    # On an H100 the 8B shape's 110 server graphs were estimated at 12.53 GiB from the first two's [618, 112] MiB
    # (vLLM's first + second x 109); their capture kept 0.75 GiB of outputs. The second grew the shared pool once
    # (a new table width); the third and fourth took their outputs' 30 MiB; the first decode and one-sequence
    # graphs took a little more than theirs.
    keys = _server_keys()
    outputs = sum(key.tokens for key in keys) * HIDDEN_BYTES
    assert round(outputs / GIB, 2) == 0.75
    samples, others = _samples(keys, [618, 112, 30, 30, 6, 6, 2, 2])
    estimate = graph_estimate(samples, others)
    assert estimate == sum(s.cost for s in samples) + sum(t * HIDDEN_BYTES for t in others) \
        + len(others) * MIN_GRAPH_BYTES
    assert 618 * MIB + outputs - 4096 * HIDDEN_BYTES < estimate < 1.6 * GIB  # every output charged; 0.75 GiB + pool
    assert 618 * MIB + 112 * MIB * 109 > 12.5 * GIB  # what the old rule charged
    # The offline run's 31 graphs (mixed up to 512 tokens): 0.64 GiB estimated from [172, 16] MiB, 0.04 GiB of outputs.
    offline = StepGraphs(torch.nn.Identity(), 512, 16384, 656, 16, torch.device("cpu"), one_seq_graphs=True).keys()
    samples, others = _samples(offline, [172, 16, 3.5, 3, 2])
    assert len(offline) == 31 and graph_estimate(samples, others) < 0.25 * GIB


def test_what_a_repeated_graph_takes_beyond_its_output_is_charged_to_each_graph_not_sampled():
    def repeat(cost_mib: float, tokens: int = 64) -> GraphSample:
        return GraphSample(tokens, int(cost_mib * MIB), tokens * HIDDEN_BYTES, repeat=True)

    first = GraphSample(512, 300 * MIB, 4 * MIB, repeat=False)
    # A repeat that took 0.5 MiB beyond its output: at least vLLM's 1 MiB floor is charged for the driver's share.
    assert graph_estimate([first, repeat(1)], [16, 16]) == 301 * MIB + 2 * (16 * HIDDEN_BYTES + MIN_GRAPH_BYTES)
    # Its output fit in the pool's free memory (it took nothing): its output is still charged to the others.
    assert graph_estimate([first, repeat(0)], [16]) == 300 * MIB + 16 * HIDDEN_BYTES + MIN_GRAPH_BYTES
    # Repeats that took 3.5 and 8.5 MiB beyond their outputs: the smaller is the steady cost (the larger grew the
    # pool once, and is charged once, as sampled).
    assert graph_estimate([first, repeat(4), repeat(9)], [16]) == 313 * MIB + 16 * HIDDEN_BYTES + 3.5 * MIB
    # No repeat sampled: the floor; one graph in all: what it took.
    assert graph_estimate([first], [16]) == 300 * MIB + 16 * HIDDEN_BYTES + MIN_GRAPH_BYTES
    assert graph_estimate([first], []) == 300 * MIB
    assert graph_estimate([], []) == 0


def test_the_real_capture_is_reported_against_what_the_profile_charged():
    block = 2 * MIB
    assert graph_capture_note(int(1.5 * GIB), GIB, 0, block) == (
        "the CUDA graphs took 1.00 GiB of the 1.50 GiB the memory profile charged: 0.50 GiB (256 KV blocks) charged "
        "and not used")
    # What the profile's captures left held (loaded kernels, cuBLAS's workspace) counts with the capture.
    assert graph_capture_note(int(1.5 * GIB), GIB, GIB // 4, block) == (
        "the CUDA graphs took 1.00 GiB (and the profile's captures kept 0.25 GiB) of the 1.50 GiB the memory profile "
        "charged: 0.25 GiB (128 KV blocks) charged and not used")
    assert graph_capture_note(GIB, int(1.25 * GIB), 0, block).startswith(
        "the CUDA graphs took 1.25 GiB, 0.25 GiB more than the 1.00 GiB the memory profile charged")


def _pool_freed_on(engine: LLMEngine, act) -> bool:
    pool = weakref.ref(engine.runner.kv_cache)
    act()
    return pool() is None


def test_a_shut_down_engine_frees_its_pool_though_a_cycle_holds_it(tmp_path):
    model = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights_seed=0)
    llm = LLM(str(model), device="cpu", max_model_len=128)
    llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    vars(llm.engine.runner)["cycle"] = llm  # a reference cycle: dropping `llm` alone would free nothing
    gc.disable()
    try:
        assert _pool_freed_on(llm.engine, llm.engine.shutdown)
    finally:
        gc.enable()


def test_a_shut_down_async_engine_shuts_its_engine_down_and_frees_the_pool(tmp_path):
    model = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights_seed=0)
    engine = AsyncEngine.build(lambda: LLMEngine.from_kwargs(str(model), device="cpu", max_model_len=128))

    async def generate() -> list[int]:
        outputs = [o async for o in engine.generate([5, 6, 7], GREEDY, "r")]
        return outputs[-1].outputs[0].token_ids

    assert len(asyncio.run(generate())) == 8
    pool = weakref.ref(engine.engine.runner.kv_cache)
    engine.shutdown()
    assert not engine.is_alive
    assert pool() is None  # the AsyncEngine (and its LLMEngine) is still referenced here: shutdown freed the pool


def test_a_dropped_engine_frees_its_pool_without_a_collection(tmp_path):
    model = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights_seed=0)
    llm = LLM(str(model), device="cpu", max_model_len=128)
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=8, repetition_penalty=1.3), use_tqdm=False)
    engine = weakref.ref(llm.engine)
    gc.disable()
    try:
        pool = weakref.ref(llm.engine.runner.kv_cache)
        del llm
        assert pool() is None and engine() is None  # no reference cycle keeps an engine alive
    finally:
        gc.enable()


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _draft_engine(tmp_path, **kwargs) -> LLM:
    """The tiny Llama with itself as its draft model (the speculative-decoding tests' draft)."""
    model = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights_seed=0)
    return LLM(str(model), max_model_len=128, speculative_config={"model": str(model), "num_speculative_tokens": 2},
               **kwargs)


def test_a_block_s_bytes_cover_the_draft_model_s_pool_too(tmp_path):
    llm = _draft_engine(tmp_path, device="cpu")
    runner = llm.engine.runner
    assert runner.draft_model is not None and len(runner.draft_layers) == len(runner.attention_layers)
    # The model drafts for itself: a block costs twice the target's, and the two pools are what the blocks cost.
    assert runner.bytes_per_block == 2 * _nbytes(runner.kv_cache) // runner.num_blocks
    assert _nbytes(runner.kv_cache) + _nbytes(runner.draft_kv_cache) == runner.num_blocks * runner.bytes_per_block
    outs = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 8 and llm.engine.speculator.counts.num_drafts > 0


def test_a_shut_down_engine_frees_its_draft_model_and_the_draft_pool(tmp_path):
    llm = _draft_engine(tmp_path, device="cpu")
    llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    runner = llm.engine.runner
    pool, weights = weakref.ref(runner.draft_kv_cache), weakref.ref(next(runner.draft_model.parameters()))
    gc.disable()  # freed by reference counting alone
    try:
        llm.engine.shutdown()
        assert pool() is None and weights() is None
    finally:
        gc.enable()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_the_draft_model_is_charged_to_the_engine_s_budget(tmp_path):
    llm = _draft_engine(tmp_path, device="cuda", dtype="float32", gpu_memory_utilization=0.3)
    runner = llm.engine.runner
    profile = runner.memory_profile
    assert profile is not None and runner.draft_model is not None
    target = sum(_nbytes(p) for p in runner.model.parameters())
    draft = sum(_nbytes(p) for p in runner.draft_model.parameters())
    assert profile.weights >= target + draft  # both loaded before the profile
    pools = _nbytes(runner.kv_cache) + _nbytes(runner.draft_kv_cache)
    assert pools <= profile.kv_cache < pools + runner.bytes_per_block  # the budget's rest, shared by the two pools
    assert _nbytes(runner.draft_kv_cache) == _nbytes(runner.kv_cache)  # float32 both: the model drafts for itself
    outs = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 8 and llm.engine.speculator.counts.num_drafts > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_two_engines_in_one_process_at_0_3_each_get_their_own_budget(tmp_path, caplog):
    model = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights_seed=0)
    kwargs = dict(device="cuda", dtype="float32", max_model_len=256, gpu_memory_utilization=0.3)
    with caplog.at_level(logging.INFO, logger="flotilla.engine.model_runner"):
        first = LLM(str(model), **kwargs)
        second = LLM(str(model), **kwargs)
    profiles = [llm.engine.runner.memory_profile for llm in (first, second)]
    assert profiles[0] is not None and profiles[1] is not None
    # The second engine is charged its own (tiny) weights, not the first engine's pool.
    assert profiles[1].weights < GIB and profiles[1].held_before > 0.9 * profiles[0].kv_cache
    assert abs(profiles[1].kv_cache - profiles[0].kv_cache) < GIB
    line = next(r.getMessage() for r in caplog.records if "was in use before it started" in r.getMessage())
    assert "KV cache" in line
    prompts = [[5, 6, 7, 8], list(range(20, 60))]
    first_tokens, second_tokens = ([o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
                                   for llm in (first, second))
    assert first_tokens == second_tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("how", ["shutdown", "del"])
def test_cuda_an_engine_shut_down_or_dropped_gives_its_pool_and_graphs_back(tmp_path, how):
    model = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights_seed=0)
    gc.collect()
    torch.cuda.empty_cache()
    before = MemorySnapshot.measure(torch.device("cuda"))
    llm = LLM(str(model), device="cuda", dtype="float32", max_model_len=256, gpu_memory_utilization=0.3)
    assert llm.engine.runner.graphs is not None  # captured graphs, freed with the pool
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=8, repetition_penalty=1.3), use_tqdm=False)
    pool_bytes = llm.engine.runner.kv_cache.numel() * llm.engine.runner.kv_cache.element_size()
    gc.disable()  # freed by reference counting alone
    try:
        if how == "shutdown":
            llm.engine.shutdown()
        else:
            del llm
        torch.cuda.empty_cache()
        after = MemorySnapshot.measure(torch.device("cuda"))
    finally:
        gc.enable()
    assert pool_bytes > GIB
    # What stays: the weights and their rotary tables until the engine is dropped, and small per-device caches.
    assert after.torch_reserved - before.torch_reserved < GIB, (before, after)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_captured_after_the_pool_stay_within_a_0_9_budget(tmp_path):
    # small-llama: 256 KiB of KV a block, so a 0.9 pool is ~3e5 blocks (the tiny one's would be millions).
    model = make_model_dir("small-llama", tmp_path / "small-llama", weights_seed=0)
    llm = LLM(str(model), device="cuda", dtype="float32", max_model_len=256, gpu_memory_utilization=0.9)
    runner = llm.engine.runner
    profile = runner.memory_profile
    assert profile is not None and runner.graphs is not None
    # The profile estimated the graphs before sizing the pool; the real capture after it, with what the profile's
    # captures left held (loaded kernels, cuBLAS's workspace), took no more than that (the driver counts in 2 MiB
    # pages, and either capture may fill a partly used segment of the allocator's: 16 MiB).
    assert profile.cuda_graphs > 0, profile
    assert runner.graph_bytes + runner.graph_profile_kept <= profile.cuda_graphs + 16 * 2**20, \
        (runner.graph_bytes, runner.graph_profile_kept, profile)
    # Nor far more: the graphs not sampled are charged their outputs and a MiB or so each, not a sampled graph's cost
    # each.
    assert profile.cuda_graphs <= 2 * (runner.graph_bytes + runner.graph_profile_kept) + 128 * 2**20, \
        (runner.graph_bytes, runner.graph_profile_kept, profile)
    outs = llm.generate([[5, 6, 7], list(range(20, 60))],
                        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, repetition_penalty=1.3),
                        use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
    torch.cuda.synchronize()
    used = MemorySnapshot.measure(torch.device("cuda")).used
    assert used <= profile.held_before + profile.requested, (used, profile)
