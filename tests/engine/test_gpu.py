"""The GPU path gives the CPU reference path's greedy tokens, CUDA graphs or not; the padded
inputs that the graphs replay give the eager path's tokens (checked on the CPU too)."""

from __future__ import annotations

import itertools
import json
import random
import sys
import weakref
from pathlib import Path

import pytest
import torch

from flotilla.engine.cuda_graphs import GraphKey, StepGraphs, capture_sizes, mixed_sizes, table_widths
from flotilla.engine.input_batch import FlatBatch
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .hf_reference import hf_greedy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from model_dirs import make_model_dir

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir("tiny-llama", tmp_path_factory.mktemp("tiny-llama"), weights_seed=0)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1024) for _ in range(rng.randint(3, 70))] for _ in range(n)]


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_capture_ladder_and_widths_cover_the_limits():
    assert capture_sizes(256)[:4] == [1, 2, 4, 8] and capture_sizes(256)[-1] == 256
    assert capture_sizes(100)[-1] == 100 and all(s <= 100 for s in capture_sizes(100))
    assert table_widths(4352, 16) == [64, 256, 272]
    assert table_widths(512, 16) == [32]
    assert mixed_sizes(8192) == [16, 32, 64, 128, 256, 512]
    assert mixed_sizes(100) == [16, 32, 64, 100]


def test_max_cudagraph_capture_size_bounds_both_ladders():
    # Above 512 the mixed ladder continues (--max-cudagraph-capture-size), steps within ~12 % of each other.
    big = mixed_sizes(16384, 4096)
    assert big[:6] == [16, 32, 64, 128, 256, 512] and big[-1] == 4096 and 576 in big and 2304 in big
    assert all(b / a <= 1.125 for a, b in itertools.pairwise(big[5:]))
    assert mixed_sizes(2000, 4096)[-1] == 2000  # the token budget still bounds it
    assert mixed_sizes(8192, 600)[-3:] == [512, 576, 600]
    assert mixed_sizes(8192, 128) == [16, 32, 64, 128]
    assert capture_sizes(512, 4096)[-1] == 512 and capture_sizes(512, 100)[-1] == 100


def _graphed_steps(llm: LLM) -> list[tuple[bool, int]]:
    """Run the engine's steps through the runner, recording (graphed, max query length) for each."""
    runner, seen = llm.engine.runner, []
    execute = runner.execute

    def recording(out, *args):
        result = execute(out, *args)
        seen.append((runner.last_step.graphed, max(s.num_new_tokens for s in out.scheduled)))
        return result

    runner.execute = recording
    return seen


def test_padded_inputs_match_the_eager_path_on_cpu(tiny_dir):
    prompts = _prompts(5)
    eager = _greedy(LLM(str(tiny_dir), device="cpu", max_model_len=256, block_size=8), prompts)
    llm = LLM(str(tiny_dir), device="cpu", max_model_len=256, block_size=8, max_num_batched_tokens=256)
    runner = llm.engine.runner
    # 5 running sequences pad to 8 decode rows; the prefill (<= 5 x 70 tokens, chunked to the 256
    # budget) pads to a mixed graph of 256 tokens and 8 sequence slots; one width of 256 tokens.
    runner.graphs = StepGraphs(runner.model, 8, 256, 256, 8, runner.device)
    steps = _graphed_steps(llm)
    assert _greedy(llm, prompts) == eager
    assert all(graphed for graphed, _ in steps)
    assert any(q > 1 for _, q in steps) and any(q == 1 for _, q in steps)


def test_extend_after_a_prefix_hit_runs_from_a_mixed_graph_on_cpu(tiny_dir):
    prefix = list(range(200, 260))
    prompts = [prefix + [7, 8, 9], prefix + [10, 11]]
    eager = _greedy(LLM(str(tiny_dir), device="cpu", max_model_len=256, block_size=8), prompts)
    llm = LLM(str(tiny_dir), device="cpu", max_model_len=256, block_size=8)
    runner = llm.engine.runner
    runner.graphs = StepGraphs(
        runner.model, 8, llm.engine.config.scheduler.max_num_batched_tokens, 256, 8, runner.device
    )
    steps = _graphed_steps(llm)
    assert _greedy(llm, prompts[:1]) == eager[:1]
    assert _greedy(llm, prompts[1:]) == eager[1:]
    assert llm.engine.block_manager.prefix_cache_hits == 56  # 7 full blocks of the prefix came from the cache
    assert all(graphed for graphed, _ in steps)


def _picked_keys(graphs: StepGraphs) -> list:
    """Record every key `graphs.pick` returns. The recorder, kept on `graphs`, reaches it through a weak proxy: a
    bound method would make a reference cycle that holds the engine's KV pool until a garbage collection."""
    picked, owner = [], weakref.proxy(graphs)

    def recording(flat, *args):
        key = StepGraphs.pick(owner, flat, *args)
        picked.append(key)
        return key

    graphs.pick = recording
    return picked


def test_a_lone_short_prompt_or_extend_picks_a_one_sequence_mixed_graph():
    graphs = StepGraphs(torch.nn.Identity(), 64, 2048, 4096, 16, torch.device("cpu"))
    assert sorted(graphs.one_seq_sizes) == [16, 32, 64, 128]
    one = FlatBatch(input_ids=[5] * 20, positions=list(range(2000, 2020)), slots=list(range(2000, 2020)),
                    query_start_loc=[0, 20], seq_lens=[2020], block_tables=[list(range(127))], max_query_len=20)
    assert graphs.pick(one) == GraphKey(False, 32, 1, 256)
    two = FlatBatch(input_ids=[5] * 21, positions=[*range(2000, 2020), 7], slots=list(range(21)),
                    query_start_loc=[0, 20, 21], seq_lens=[2020, 8], block_tables=[list(range(127)), [200]],
                    max_query_len=20)
    assert graphs.pick(two) == GraphKey(False, 32, 32, 256)  # decodes beside it: the wide graph
    long = FlatBatch(input_ids=[5] * 200, positions=list(range(200)), slots=list(range(200)), query_start_loc=[0, 200],
                     seq_lens=[200], block_tables=[list(range(13))], max_query_len=200)
    assert graphs.pick(long).seqs == 64  # above 128 tokens the query tiles fill the GPU alone
    keys = graphs.keys()
    assert sum(k.seqs == 1 and not k.decode for k in keys) == 4 * len(graphs.widths)
    without = StepGraphs(torch.nn.Identity(), 64, 2048, 4096, 16, torch.device("cpu"), one_seq_graphs=False)
    assert without.pick(one) == GraphKey(False, 32, 32, 256)
    assert len(without.keys()) == len(keys) - 4 * len(graphs.widths)


def test_cached_prefix_extends_from_one_sequence_graphs_give_the_hf_tokens_on_cpu(tiny_dir):
    """A prefix-cache hit's extend (and the lone prompt before it) run from one-sequence mixed graphs and
    give the eager path's greedy tokens, which are HF's; with the graphs switched off, the wide ones do."""
    prefix = list(range(300, 380))
    prompts = [prefix + [7, 8, 9], prefix + [10, 11, 12, 13]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    expected = hf_greedy(tiny_dir, prompts, 6)
    for one_seq in (True, False):
        llm = LLM(str(tiny_dir), device="cpu", max_model_len=256, block_size=8)
        runner = llm.engine.runner
        runner.graphs = StepGraphs(runner.model, 8, llm.engine.config.scheduler.max_num_batched_tokens, 256, 8,
                                   runner.device, one_seq_graphs=one_seq)
        picked = _picked_keys(runner.graphs)
        got = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
        assert got == expected
        assert llm.engine.block_manager.prefix_cache_hits == 80  # the second prompt's 10 full blocks
        mixed = [k for k in picked if k is not None and not k.decode]
        assert len(mixed) == 2 and all(k.seqs == (1 if one_seq else 8) for k in mixed)
        assert None not in picked


def test_steps_above_512_tokens_replay_larger_mixed_graphs_on_cpu(tiny_dir, tmp_path, monkeypatch):
    # 24 prompts, 16 sequence slots: the first step prefills 16 prompts (> 512 tokens), later steps hold
    # decodes beside the prompts admitted as slots free up; every step pads to a graph of the ladder.
    prompts = _prompts(24, seed=3)
    # Lengths 4..27: requests finish one by one, so waiting prompts join steps of running decodes.
    params = [SamplingParams(temperature=0.0, max_tokens=4 + i, ignore_eos=True) for i in range(24)]

    def greedy(llm: LLM) -> list[list[int]]:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    eager = greedy(LLM(str(tiny_dir), device="cpu", max_model_len=256, block_size=8, max_num_seqs=16))
    trace = tmp_path / "steps.jsonl"
    monkeypatch.setenv("FLOTILLA_STEP_TRACE", str(trace))
    llm = LLM(str(tiny_dir), device="cpu", max_model_len=256, block_size=8, max_num_seqs=16,
              max_num_batched_tokens=1024)
    runner = llm.engine.runner
    runner.graphs = StepGraphs(runner.model, 16, 1024, 256, 8, runner.device, max_capture_size=1024)
    steps = _graphed_steps(llm)
    assert greedy(llm) == eager
    assert all(graphed for graphed, _ in steps)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(lines) == len(steps)
    assert sum(x["tokens"] for x in lines) == runner.num_tokens_fed
    assert all(x["graph"] >= x["tokens"] for x in lines)
    assert any(x["graph"] > 512 for x in lines)  # a step no default graph holds
    assert any(x["decode"] and x["prefill"] for x in lines)  # decodes beside a new prompt
    assert sum(x["prefill"] for x in lines) >= 24 and sum(x.get("first", 0) for x in lines) == 24


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_larger_mixed_graphs_keep_greedy_tokens(tiny_dir):
    prompts = _prompts(24, seed=3)
    cpu = _greedy(LLM(str(tiny_dir), device="cpu", max_model_len=256, max_num_seqs=16), prompts)
    llm = LLM(str(tiny_dir), device="cuda", dtype="float32", max_model_len=256, max_num_seqs=16,
              max_num_batched_tokens=1024,
              max_cudagraph_capture_size=1024, gpu_memory_utilization=0.3)
    assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.mixed_sizes[-1] == 1024
    assert _greedy(llm, prompts) == cpu


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["cuda-graphs", "eager"])
def test_cuda_mixed_decode_split_keeps_greedy_tokens(tiny_dir, monkeypatch, enforce_eager):
    """FLOTILLA_MIXED_DECODE_SPLIT on (set on the module, as the switch would): mixed steps (a 128-token budget
    chunks the prompts, so early requests decode beside later prompts) attend through the two launches of
    `kernels/mixed_attention.py`, captured in the mixed graphs or eagerly, and keep the CPU reference's tokens."""
    from flotilla.kernels import dispatch, mixed_attention

    calls = []
    split = mixed_attention.mixed_split_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return split(*args, **kwargs)

    monkeypatch.setattr(dispatch, "MIXED_DECODE_SPLIT", True)
    monkeypatch.setattr(mixed_attention, "mixed_split_attention", counted)
    prompts = _prompts(24, seed=5)
    cpu = _greedy(LLM(str(tiny_dir), device="cpu", max_model_len=128, max_num_seqs=16), prompts)
    llm = LLM(str(tiny_dir), device="cuda", dtype="float32", max_model_len=128, max_num_seqs=16,
              max_num_batched_tokens=128, enforce_eager=enforce_eager, gpu_memory_utilization=0.3)  # fmt: skip
    assert _greedy(llm, prompts) == cpu
    assert calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "enforce_eager,async_scheduling",
    [(False, True), (False, False), (True, True)],
    ids=["cuda-graphs-async", "cuda-graphs-sync", "eager-async"],
)
def test_cuda_greedy_tokens_equal_the_cpu_reference(tiny_dir, enforce_eager, async_scheduling):
    prompts = _prompts(8, seed=1)
    cpu = _greedy(LLM(str(tiny_dir), device="cpu", max_model_len=256), prompts)
    llm = LLM(
        str(tiny_dir),
        device="cuda",
        dtype="float32",  # the CPU reference's (auto downcasts a float32 checkpoint on the GPU, as vLLM)
        max_model_len=256,
        enforce_eager=enforce_eager,
        async_scheduling=async_scheduling,
        gpu_memory_utilization=0.3,
    )
    assert _greedy(llm, prompts) == cpu
    assert llm.engine.runner.last_step.graphed is not enforce_eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_cached_prefix_extends_keep_greedy_tokens(tiny_dir):
    """Prefix-cache hits' extends from captured one-sequence mixed graphs (the prefill kernel's tile map
    computed once a step inside the graph) give the CPU reference's greedy tokens; the last one's new
    positions (112..141) straddle the kernel's key-split boundary at 128."""
    prefix = list(range(300, 412))
    prompts = [prefix + [7, 8, 9], prefix + [10, 11, 12, 13], prefix + list(range(20, 50))]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    def one_by_one(llm: LLM) -> list[list[int]]:
        return [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]

    cpu = one_by_one(LLM(str(tiny_dir), device="cpu", max_model_len=256))
    llm = LLM(str(tiny_dir), device="cuda", dtype="float32", max_model_len=256, gpu_memory_utilization=0.3)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.one_seq_sizes
    picked = _picked_keys(graphs)
    assert one_by_one(llm) == cpu
    assert llm.engine.block_manager.prefix_cache_hits > 0
    assert sum(1 for k in picked if k is not None and not k.decode and k.seqs == 1) == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_compilation_config_capture_sizes_keep_greedy_tokens(tiny_dir):
    """vLLM's `--compilation-config '{"cudagraph_capture_sizes": [...]}'` captures exactly those sizes (decode graphs up
    to 4 rows, mixed graphs of 1-64 tokens): steps of more rows run eagerly beside replays of the small graphs, and a
    batch of 12 prompts keeps the CPU reference's greedy tokens."""
    prompts = _prompts(12, seed=7)
    cpu = _greedy(LLM(str(tiny_dir), device="cpu", max_model_len=256, max_num_seqs=8), prompts)
    llm = LLM(str(tiny_dir), device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8,
              compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 64]}, gpu_memory_utilization=0.3)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and (graphs.decode_sizes, graphs.mixed_sizes) == ([1, 2, 4], [1, 2, 4, 64])
    assert _greedy(llm, prompts) == cpu
    # the last steps (the batch draining to 1-4 rows) replay the captured decode graphs
    assert llm.engine.runner.last_step.graphed
