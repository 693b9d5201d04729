"""Tensor and pipeline parallelism on the CPU (gloo, spawned workers): greedy tokens equal HF
transformers under chunked prefill, prefix-cache hits and preemption, and a dead worker fails the
engine at once with an error that names it.

Every engine here spawns its workers (seconds each on a small machine), so each is built once per
module and serves several checks.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch

from flotilla.engine.executor import WorkerDiedError
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .hf_reference import hf_greedy


def _gpus_short(n: int) -> bool:
    """On a CUDA machine the workers take one GPU each (on the CPU any number of gloo ranks run)."""
    return torch.cuda.is_available() and torch.cuda.device_count() < n


pytestmark = pytest.mark.skipif(_gpus_short(2), reason="needs 2 GPUs")
MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
SYSTEM = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103]
# Chunked prefill under a 24-token budget, a 16-block pool too small for the batch (preemption),
# and a shared system prompt (prefix-cache hits): the batching test's hardest setting.
STRESS = dict(
    max_model_len=128,
    block_size=8,
    num_gpu_blocks_override=16,
    enable_chunked_prefill=True,
    max_num_batched_tokens=24,
    max_num_seqs=5,
)


def _prompts(seed: int, n: int = 8) -> list[list[int]]:
    rng = random.Random(seed)
    return [SYSTEM + [rng.randrange(3, 49152) for _ in range(rng.randint(5, 45))] for _ in range(n)]


def _engine(model_dir, **parallel):
    llm = LLM(str(model_dir), **STRESS, **parallel)
    yield llm
    llm.engine.shutdown()


@pytest.fixture(scope="module")
def llama_tp2(tiny_model_dirs):
    """Llama 3 with rope scaling and tied embeddings (the vocabulary-parallel head shares the table)."""
    yield from _engine(tiny_model_dirs["llama3-rope-tied"], tensor_parallel_size=2)


@pytest.fixture(scope="module")
def qwen3_tp2(tiny_model_dirs):
    """Qwen3 (q/k norms) with a single KV head: both ranks hold a replica of it."""
    yield from _engine(tiny_model_dirs["qwen3"], tensor_parallel_size=2)


def _check_matches_hf(llm: LLM, model_dir, seed: int) -> None:
    prompts = _prompts(seed)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(model_dir, prompts, MAX_TOKENS)
    engine = llm.engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.prefix_cache_hits > 0
    assert max(engine.stats.step_tokens) <= 24
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "a block leaked"


def test_tensor_parallel_llama_matches_hf(llama_tp2, tiny_model_dirs):
    _check_matches_hf(llama_tp2, tiny_model_dirs["llama3-rope-tied"], seed=1)


def test_tensor_parallel_replicates_a_single_kv_head(qwen3_tp2, tiny_model_dirs):
    _check_matches_hf(qwen3_tp2, tiny_model_dirs["qwen3"], seed=2)


def test_seeded_sampling_n_and_logprobs_match_a_single_rank(qwen3_tp2, tiny_model_dirs):
    """Every rank sees the whole vocabulary's logits, so seeded draws, forks and logprobs are the same."""
    prompts = [SYSTEM[:10], [11, 12, 13]]
    params = [SamplingParams(n=3, temperature=0.8, seed=7, max_tokens=6, ignore_eos=True, logprobs=2),
              SamplingParams(n=2, temperature=0.0, max_tokens=6, ignore_eos=True)]
    single = LLM(str(tiny_model_dirs["qwen3"]), **STRESS).generate(prompts, params, use_tqdm=False)
    parallel = qwen3_tp2.generate(prompts, params, use_tqdm=False)
    for one, two in zip(single, parallel, strict=True):
        assert [o.token_ids for o in one.outputs] == [o.token_ids for o in two.outputs]
    ours = parallel[0].outputs[0].logprobs[0]
    theirs = single[0].outputs[0].logprobs[0]
    assert ours.keys() == theirs.keys()
    assert all(abs(ours[t][0] - theirs[t][0]) < 1e-4 for t in ours)


def test_pipeline_parallel_qwen2_matches_hf(tiny_model_dirs):
    """Qwen2 (QKV biases), its two layers on two stages."""
    for llm in _engine(tiny_model_dirs["qwen2"], pipeline_parallel_size=2):
        _check_matches_hf(llm, tiny_model_dirs["qwen2"], seed=4)


@pytest.mark.slow
@pytest.mark.skipif(_gpus_short(4), reason="needs 4 GPUs")
def test_tensor_times_pipeline_parallel_matches_hf(tiny_model_dirs):
    """tp 2 x pp 2: four workers (one torch thread each on a small machine), one architecture."""
    for llm in _engine(tiny_model_dirs["mistral"], tensor_parallel_size=2, pipeline_parallel_size=2):
        _check_matches_hf(llm, tiny_model_dirs["mistral"], seed=5)


def test_a_dead_worker_fails_the_engine_fast(qwen3_tp2):
    """Runs last on its engine: kills tensor rank 1, then expects a clear error within seconds."""
    executor = qwen3_tp2.engine.runner
    victim = executor.workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"worker rank 1 \(pid \d+\) exited with code -9"):
        qwen3_tp2.generate(_prompts(6, n=2), GREEDY, use_tqdm=False)
    assert time.monotonic() - start < 15
    with pytest.raises(WorkerDiedError):  # and it stays failed: health checks report it too
        qwen3_tp2.engine.check_health()
    assert all(w.exitcode is not None for w in executor.workers), "the other workers were stopped"
    manager = qwen3_tp2.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks, "the failed requests' blocks returned"


@pytest.mark.parametrize("checkpoint", [False, True], ids=["online", "fp8-checkpoint"])
def test_fp8_at_two_ranks_matches_one_rank(tiny_model_dirs, tmp_path, checkpoint):
    """fp8 weights at tp=2 give the tp=1 greedy tokens: a row-parallel layer (o_proj, down) keeps its
    per-output-channel scales whole on every rank, read from an fp8 checkpoint (compressed-tensors
    FP8_DYNAMIC) or computed at load (`--quantization fp8`, the row's maximum over both ranks)."""
    path = tiny_model_dirs["llama"]
    kwargs: dict = {"quantization": "fp8"}
    if checkpoint:
        from .quant_checkpoints import compressed_tensors_checkpoint

        path, kwargs = compressed_tensors_checkpoint(path, tmp_path / "fp8", "FP8_DYNAMIC", dequantized_copy=False), {}
    prompts, params = [[5, 6, 7, 8, 9], [11, 12, 13] * 8], SamplingParams(temperature=0.0, max_tokens=6)
    single = LLM(str(path), max_model_len=64, **kwargs).generate(prompts, params, use_tqdm=False)
    llm = LLM(str(path), max_model_len=64, tensor_parallel_size=2, **kwargs)
    try:
        parallel = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.engine.shutdown()
    assert [o.outputs[0].token_ids for o in parallel] == [o.outputs[0].token_ids for o in single]
